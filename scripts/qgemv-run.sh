#!/usr/bin/env bash
# qgemv-run.sh - one device call for the split q4_0/q8_0 GEMV (issue 15,
# docs/cuda.md "Split GEMV"): its tests, the per-matrix table with the
# split layout and with the file's (PETREL_CUDA_REPACK=0, same binary), and
# dummy 8B decode for both, each figure printed and saved under $OUT
# (text only: at most 8 files come back from a device call).
#
#   here:   scripts/qgemv-run.sh --stage DIR   (after building build/: packs
#           petrel, test_cuda_qmatmul, test_cuda_model, bench_cuda_ops and
#           the non-system libraries they need into DIR/carry.tar.xz, with
#           this script as DIR/run.sh)
#   there:  bash DIR/run.sh [PHASES]           (from the repository root;
#           phases: tests qmm models ncu; default: all but ncu)
set -uo pipefail
if [ "${1:-}" = --stage ]; then
    dir=$2
    src=$(cd "$(dirname "$0")/.." && pwd)
    rm -rf "$dir/stage" && mkdir -p "$dir/stage/lib"
    cp "$src/build/petrel" "$src/build/tests/test_cuda_qmatmul" "$src/build/tests/test_cuda_model" \
        "$src/build/tests/bench_cuda_ops" "$dir/stage/" || exit 1
    . "$src/scripts/gpu-env.sh" && gpu_stage_libs "$dir/stage"
    tar -C "$dir" -cf - stage | xz -9 -T2 >"$dir/carry.tar.xz" && rm -rf "$dir/stage"
    cp "$0" "$dir/run.sh"
    du -sh "$dir/carry.tar.xz"
    exit 0
fi

D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/qgemv-out}
mkdir -p "$OUT"
phases=${*:-tests qmm models}
has() { [[ " $phases " == *" $1 "* ]]; }
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }
tar -xJf "$D/carry.tar.xz" -C "$D" || exit 1
B=$D/stage
. scripts/gpu-env.sh && gpu_libs "$B/lib"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
uptime
ldd "$B/petrel" | grep "not found"

if has tests; then
    stamp "test_cuda_qmatmul (split tests, then the file-layout GEMV ones)"
    CMOCKA_FILTER='test_q*split*' timeout 120 "$B/test_cuda_qmatmul" 2>&1 | tail -25 | tee "$OUT/tests.txt"
    echo "split tests: exit ${PIPESTATUS[0]}" | tee -a "$OUT/tests.txt"
    CMOCKA_FILTER='test_qmatmul' timeout 60 "$B/test_cuda_qmatmul" 2>&1 | tail -4 | tee -a "$OUT/tests.txt"
    stamp "test_cuda_model quantized dummies (split layout end to end)"
    CMOCKA_FILTER='test_quantized_weights' timeout 60 "$B/test_cuda_model" 2>&1 | tail -6 | tee -a "$OUT/tests.txt"
fi
if has qmm; then
    for arm in split file; do
        stamp "bench_cuda_ops qmm, $arm layout"
        rep=1; [ $arm = file ] && rep=0
        PETREL_CUDA_REPACK=$rep BENCH_QMM_FORMATS=q4_0,q8_0 BENCH_QMM_GEMV_ONLY=1 \
            timeout 150 "$B/bench_cuda_ops" "/tmp/qmm-$arm.json" qmm 2>&1 | grep -v "^$" | tee "$OUT/qmm-$arm.txt" |
            grep "n=1 \|n=2 \|n=16 \|bandwidth"
    done
fi
if has models; then
    for dt in ${DTYPES:-q4_0 q8_0}; do
        for rep in 1 0; do
            stamp "petrel bench dummy:llama-8b $dt PETREL_CUDA_REPACK=$rep"
            PETREL_CUDA_REPACK=$rep timeout 120 "$B/petrel" bench --device cuda -m dummy:llama-8b \
                --dummy-dtype "$dt" -p 16 -d 0 -g 128 -r 2 -o "/tmp/bench-$dt-$rep.json" 2>&1 |
                tee "$OUT/bench-$dt-$rep.txt" | tail -4
        done
    done
fi
if has ncu && command -v ncu >/dev/null; then
    stamp "ncu q4_0 w_up n=1"
    BENCH_QMM_FORMATS=q4_0 BENCH_QMM_SHAPE=w_up BENCH_QMM_GEMV_ONLY=1 timeout 120 \
        ncu --clock-control none -k regex:qgemv_split -c 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        "$B/bench_cuda_ops" /tmp/x.json qmm 2>&1 | grep -v "^==PROF==" | tail -70 | tee "$OUT/ncu.txt"
fi
stamp "done"
