#!/usr/bin/env bash
# quant_check.sh - quantized GGUF files of the converted fixtures, in Petrel
# and in llama.cpp.
#
#   scripts/llama-ref/quant_check.sh [CASE...]     (default: gemma2 gemma3_text
#                                                   gpt_oss qwen3_moe)
#
# For each Hugging Face fixture: hf_to_gguf.py writes it as an f32 GGUF,
# llama.cpp's llama-quantize makes Q8_0 and Q4_0 files of it, and both
# engines give logits on the fixture's prompts (make.sh logits,
# build/petrel-logits from petrel_logits.c).  Printed per quantized file:
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
cc -O2 -std=c11 -D_GNU_SOURCE -Isrc -Iinclude $ref/petrel_logits.c build/libpetrel_model.a \
  build/libpetrel_kv.a build/libpetrel_backend.a build/libpetrel_quant.a build/libpetrel_io.a \
  build/libpetrel_base.a -ljansson -lxxhash -lpthread -lm -o build/petrel-logits

ids() { # the fixture's prompts as "1,2,3 4,5,6"
  /usr/bin/python3 -c 'import json,sys
print(" ".join(",".join(map(str, p["tokens"])) for p in json.load(open(sys.argv[1]))["prompts"]))' \
    "tests/fixtures/hf/$1/reference.json"
}

for c in "${@:-gemma2 gemma3_text gpt_oss qwen3_moe}"; do
  for case in $c; do
    prompts=$(ids "$case")
    /usr/bin/python3 $ref/hf_to_gguf.py "tests/fixtures/hf/$case" "$out/$case-F32.gguf" >/dev/null
    for t in F32 Q8_0 Q4_0; do
      f=$out/$case-$t.gguf
      [ $t = F32 ] || LD_LIBRARY_PATH=$lcpp $lcpp/llama-quantize "$out/$case-F32.gguf" "$f" $t \
        >"$out/$case-$t.log" 2>&1
      # shellcheck disable=SC2086
      $ref/make.sh logits "$f" 32 $prompts >"$out/$case-$t.llama.json" 2>/dev/null
      # shellcheck disable=SC2086
      build/petrel-logits "$f" 32 $prompts >"$out/$case-$t.petrel.json"
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
