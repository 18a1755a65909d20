#!/usr/bin/env bash
# qmms-run.sh - one device call for the split layout's tensor-core GEMM
# (qmms.cu, issue 15 item 3; docs/cuda.md "Batched decode"): its tests, the
# kernel alone per 8B matrix shape against dequantize + cuBLAS, Nsight
# Compute on it (and on the old qmma.cu, phase ncuold), and dummy 8B
# batched decode and prefill with it on and off (same binary, same call).
#
#   here:   STAGE_BUILD=build-cuda STAGE_TARGETS="petrel test_cuda_qmatmul
#           test_cuda_model bench_cuda_ops" scripts/gpu-run.sh --stage, then
#           scripts/qmms-run.sh --stage DIR (copies the pack and this script
#           into DIR; carry DIR)
#   there:  bash DIR/run.sh [PHASES]   (from the repository root; phases:
#           tests qmm qmm1 ncu ncuold decode prefill; default: all but
#           ncuold)
# Logs under $OUT; a short table last.
set -uo pipefail
if [ "${1:-}" = --stage ]; then
    src=$(cd "$(dirname "$0")/.." && pwd)
    mkdir -p "$2" && cp "$src/build-gpu-pack/carry.tar.xz" "$2/" && cp "$0" "$2/run.sh" || exit 1
    du -sh "$2"
    exit 0
fi

D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/qmms-out}
mkdir -p "$OUT"
phases=${*:-tests qmm qmm1 ncu decode prefill}
has() { [[ " $phases " == *" $1 "* ]]; }
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }
tar -xJf "$D/carry.tar.xz" -C "$D" || exit 1
B=$D/build-gpu-carry
. scripts/gpu-env.sh && gpu_libs "$B/lib"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
uptime
ldd "$B/petrel" | grep "not found"
NS=${QMMS_NS:-32,64,128,256,512,4096}

if has tests; then
    stamp "test_cuda_qmatmul: test_qmms, the split tests (17, 40 rows take qmms)"
    CMOCKA_FILTER='test_qmms' timeout 120 "$B/test_cuda_qmatmul" 2>&1 | tail -20 | tee "$OUT/tests.txt"
    echo "test_qmms: exit ${PIPESTATUS[0]}" | tee -a "$OUT/tests.txt"
    CMOCKA_FILTER='test_q*split*' timeout 120 "$B/test_cuda_qmatmul" 2>&1 | tail -6 | tee -a "$OUT/tests.txt"
    stamp "test_cuda_model quantized dummies (40-token prefill through qmms)"
    CMOCKA_FILTER='test_quantized_weights' timeout 60 "$B/test_cuda_model" 2>&1 | tail -4 | tee -a "$OUT/tests.txt"
fi
if has qmm; then
    stamp "bench_cuda_ops qmm: qmms against dequantize + cuBLAS, n = $NS"
    BENCH_QMM_FORMATS=${QMMS_FORMATS:-q4_0,q8_0} BENCH_QMM_NS=$NS timeout 200 "$B/bench_cuda_ops" \
        "$OUT/qmm.json" qmm 2>&1 | grep -v "^$" | tee "$OUT/qmm.txt" | grep "bandwidth"
fi
if has qmm1; then
    stamp "bench_cuda_ops qmm, one m16 tile a warp (PETREL_CUDA_QMMS_MT=1), q4_0"
    PETREL_CUDA_QMMS_MT=1 BENCH_QMM_FORMATS=q4_0 BENCH_QMM_NS=${QMMS_NS1:-32,64,128} timeout 100 \
        "$B/bench_cuda_ops" "$OUT/qmm1.json" qmm 2>&1 | grep -v "^$" | sed 's/qmms /qmms1/' >"$OUT/qmm1.txt"
fi
ncu_one() { # name env... : one launch of the kernel matching $K, --set full and the stall reasons
    local name=$1; shift
    env "$@" BENCH_QMM_FORMATS=q4_0 BENCH_QMM_SHAPE=${NCU_SHAPE:-w_up} BENCH_QMM_NS=64 BENCH_QMM_GEMV_ONLY=${GO:-} \
        timeout 150 ncu --clock-control none -k "regex:$K" -s 2 -c 1 --set full \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
        "$B/bench_cuda_ops" /dev/null qmm >"$OUT/ncu-$name.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|Executed Instructions  |Grid Size|Cluster Size" "$OUT/ncu-$name.txt" | head -14
    grep -E "issue_stalled" "$OUT/ncu-$name.txt" | sort -k3 -g -r | head -8
}
if has ncu && command -v ncu >/dev/null; then
    stamp "ncu qmms_kernel q4_0 w_up n=64"
    K=qmms_kernel GO=1 ncu_one qmms
fi
if has ncuold && command -v ncu >/dev/null; then
    stamp "ncu old qmma_kernel (file layout, PETREL_CUDA_QMMA=1) q4_0 w_up n=64"
    K=qmma_kernel GO= ncu_one qmma PETREL_CUDA_REPACK=0 PETREL_CUDA_QMMA=1
fi
if has decode; then
    for arm in "1 2" "1 1" "0 2"; do
        set -- $arm
        stamp "petrel bench dummy:llama-8b q4_0 -P 1,8,32,64, PETREL_CUDA_QMMS=$1 PETREL_CUDA_QMMS_MT=$2"
        PETREL_CUDA_QMMS=$1 PETREL_CUDA_QMMS_MT=$2 timeout 150 "$B/petrel" bench --device cuda -m dummy:llama-8b \
            --dummy-dtype ${DTYPE:-q4_0} -p 128 -d 0 -g 64 -r 1 -P 1,8,32,64 -o "$OUT/decode-$1-$2.json" \
            >"$OUT/decode-$1-$2.txt" 2>&1
        tail -12 "$OUT/decode-$1-$2.txt"
    done
fi
if has prefill; then
    for on in 1 0; do
        stamp "petrel bench dummy:llama-8b q4_0 -p 512,4096, PETREL_CUDA_QMMS=$on (QMMS_MAX 4096)"
        PETREL_CUDA_QMMS=$on PETREL_CUDA_QMMS_MAX=4096 timeout 150 "$B/petrel" bench --device cuda \
            -m dummy:llama-8b --dummy-dtype ${DTYPE:-q4_0} -p 512,4096 -d 0 -g 8 -r 1 \
            -o "$OUT/prefill-$on.json" >"$OUT/prefill-$on.txt" 2>&1
        tail -8 "$OUT/prefill-$on.txt"
    done
fi
stamp "table"
grep -h "exit\|PASSED\|FAILED" "$OUT/tests.txt" 2>/dev/null
cat "$OUT/qmm.txt" "$OUT/qmm1.txt" 2>/dev/null | grep "qmms" | sed 's/qmatmul //; s/  */ /g; s/ TFLOP\/s//g'
