#!/usr/bin/env bash
# quant_check.sh - quantized GGUF files of the converted fixtures, in Petrel
# and in llama.cpp.
#
#   scripts/llama-ref/quant_check.sh [CASE...]     (default: gemma2 gemma3_text
#                                                   gpt_oss qwen3_moe)
#   scripts/llama-ref/quant_check.sh gguf:CASE...  a GGUF fixture and its
#                                                   committed Q8_0 / Q4_0 files
#                                                   (quantize_fixtures.sh)
#
# For each Hugging Face fixture: hf_to_gguf.py writes it as an f32 GGUF,
# llama.cpp's llama-quantize makes Q8_0 and Q4_0 files of it, and both
# engines give logits on the fixture's prompts (make.sh logits,
# $BUILD/petrel-logits from petrel_logits.c, BUILD a CPU-only build, default build).  Printed per quantized file:
# its KL against the f32 file in each engine (kl.py), the two engines' KL
# on the same quantized file, and whether their greedy continuations agree
# (crosscheck.py).  Work files go to build-llama/quant/; nothing is
# committed.  Needs scripts/llama-ref/make.sh env and a Release build/.
set -euo pipefail
cd "$(dirname "$0")/../.."
ref=scripts/llama-ref
lcpp=build-llama/llama.cpp-cpu
out=build-llama/quant
mkdir -p $out
$ref/make.sh env >/dev/null
export PYTHONPATH=$PWD/build-llama/llama.cpp/gguf-py
bdir=${BUILD:-build} # a CPU-only build: petrel-logits links no CUDA
cc -O2 -std=c11 -D_GNU_SOURCE -Isrc -Iinclude $ref/petrel_logits.c $bdir/libpetrel_model.a \
  $bdir/libpetrel_kv.a $bdir/libpetrel_backend.a $bdir/libpetrel_quant.a $bdir/libpetrel_io.a \
  $bdir/libpetrel_base.a -ljansson -lxxhash -lpthread -lm -o $bdir/petrel-logits

ids() { # the prompts of reference.json $1 as "1,2,3 4,5,6"
  /usr/bin/python3 -c 'import json,sys
print(" ".join(",".join(map(str, p["tokens"])) for p in json.load(open(sys.argv[1]))["prompts"]))' "$1"
}

for c in "${@:-gemma2 gemma3_text gpt_oss qwen3_moe}"; do
  for case in $c; do
    if [ "${case#gguf:}" != "$case" ]; then # committed files
      case=${case#gguf:} fx=tests/fixtures/gguf/$case
      prompts=$(ids "$fx/reference.json")
      cp "$fx/model.gguf" "$out/$case-F32.gguf"
      for t in Q8_0 Q4_0; do cp "$fx/$t.gguf" "$out/$case-$t.gguf"; done
    else
      prompts=$(ids "tests/fixtures/hf/$case/reference.json")
      /usr/bin/python3 $ref/hf_to_gguf.py "tests/fixtures/hf/$case" "$out/$case-F32.gguf" >/dev/null
      for t in Q8_0 Q4_0; do
        LD_LIBRARY_PATH=$lcpp $lcpp/llama-quantize "$out/$case-F32.gguf" "$out/$case-$t.gguf" $t \
          >"$out/$case-$t.log" 2>&1
      done
    fi
    for t in F32 Q8_0 Q4_0; do
      f=$out/$case-$t.gguf
      # shellcheck disable=SC2086
      $ref/make.sh logits "$f" 32 $prompts >"$out/$case-$t.llama.json" 2>/dev/null
      # shellcheck disable=SC2086
      $bdir/petrel-logits "$f" 32 $prompts >"$out/$case-$t.petrel.json"
    done
    for t in Q8_0 Q4_0; do
      b=$out/$case
      echo "== $case $t"
      echo "  KL vs f32, llama.cpp:  $($ref/kl.py "$b-F32.llama.json" "$b-$t.llama.json")"
      echo "  KL vs f32, Petrel:     $($ref/kl.py "$b-F32.petrel.json" "$b-$t.petrel.json")"
      echo "  llama.cpp vs Petrel:   $($ref/kl.py "$b-$t.llama.json" "$b-$t.petrel.json")"
      echo "  greedy, 32 tokens per prompt: $($ref/crosscheck.py "$b-$t.llama.json" "$b-$t.petrel.json" |
        grep -o 'greedy same for [0-9/]*' | sed 's/greedy same for //' | tr '\n' ' ')"
    done
  done
done
