#!/usr/bin/env bash
# quantize_fixtures.sh - Q8_0 and Q4_0 versions of the GGUF family fixtures,
# made by llama.cpp's llama-quantize, committed beside each model.gguf as
# tests/fixtures/gguf/CASE/{Q8_0,Q4_0}.gguf for test_cuda_model (quantized
# families, CPU vs GPU) and quant_check.sh (KL against the f32 file).
#
#   scripts/llama-ref/quantize_fixtures.sh [CASE...]
#       (default: gemma2 gemma3_text gpt_oss gemma4 gemma4_moe qwen35 qwen35moe deepseek2
#        minicpm3)
#
# The fixtures are tiny: many matrices have rows of 16, 24 or 48 columns,
# which no 32-wide block divides, and llama-quantize stops at the first such
# tensor.  Each refusal names the tensor; its name (layer prefix and
# ".weight" dropped) is then kept in f32 with --tensor-type and the file is
# made again, so each file quantizes every matrix that can be.  The
# arguments used are printed.  Needs scripts/llama-ref/make.sh env.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/llama-ref/make.sh env >/dev/null
lcpp=build-llama/llama.cpp-cpu
for c in ${@:-gemma2 gemma3_text gpt_oss gemma4 gemma4_moe qwen35 qwen35moe deepseek2 minicpm3}; do
  src=tests/fixtures/gguf/$c/model.gguf
  for t in Q8_0 Q4_0; do
    dst=tests/fixtures/gguf/$c/$t.gguf log=build-llama/quantize-$c-$t.log
    args=()
    for _ in $(seq 16); do
      if LD_LIBRARY_PATH=$lcpp $lcpp/llama-quantize "${args[@]}" "$src" "$dst" $t >"$log" 2>&1; then
        echo "$c $t: ${args[*]:-(every matrix)}"
        continue 2
      fi
      n=$(grep -o 'warning: [A-Za-z0-9_.]* *- ncols.*no tensor type fallback' "$log" | head -1 |
        awk '{print $2}' | sed 's/^blk\.[0-9]*\.//; s/\.weight$//')
      [ -n "$n" ] || break
      args+=(--tensor-type "$n=f32")
    done
    echo "quantize_fixtures.sh: $c $t failed ($log):" >&2
    tail -n 3 "$log" >&2
    exit 1
  done
done
