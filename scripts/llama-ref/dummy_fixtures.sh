#!/usr/bin/env bash
# dummy_fixtures.sh - llama.cpp's reference for the tiny dummy_gguf.py files
# (tests/fixtures/gguf/dummy_<family>/: config.json, reference.json).
#
#   scripts/llama-ref/dummy_fixtures.sh [FAMILY...]
#
# For each family: dummy_gguf.py writes the config's random model (seed 0,
# Q8_0 blocks) decoded to f32 (--decoded) as CASE/model.gguf, record.py
# takes llama.cpp's logits on it (one 12-token prompt, longer than the
# 4-token windows, and 8 greedy tokens), and the file is removed again: the
# test regenerates it (test_hf_reference, the dummy_* cases), so only the
# config and the reference are committed.  Tolerances: 1e-4 where both
# engines compute in f32 (measured: at most 1.0e-5); Gemma 2/3 0.006 and
# gpt-oss 0.008, about 3-4x what was measured (1.5e-3, 2.6e-3): llama.cpp's
# CPU GELU is an fp16 table (gemma4.py says more), and gpt-oss's fixtures
# show the same 2e-3 (gpt_oss_mxfp4).  Needs scripts/llama-ref/make.sh env.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/llama-ref/make.sh env >/dev/null
prompt=5,77,300,12,250,9,33,101,250,311,7,64
for fam in ${@:-llama qwen3_moe gemma2 gemma3_text gpt_oss deepseek_v2 qwen3_5_text minicpm3}; do
  d=tests/fixtures/gguf/dummy_$fam
  case $fam in
    gemma*) tol=0.006 ;;
    gpt_oss) tol=0.008 ;;
    *) tol=1e-4 ;;
  esac
  /usr/bin/python3 scripts/llama-ref/dummy_gguf.py $d/config.json --type Q8_0 --decoded $d/model.gguf >/dev/null
  scripts/llama-ref/record.py $d 8 $tol $tol $prompt
  rm $d/model.gguf
done
