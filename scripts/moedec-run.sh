#!/bin/bash
# moedec-run.sh - one device call for moe_ffn's decode kernels (issue 16,
# session 11, h-moedec), run from the repository root with a staged build:
#
#   here:  STAGE_BUILD=build-cuda STAGE_TARGETS="petrel test_cuda_ops" \
#              nice scripts/gpu-run.sh --stage
#          mkdir -p /work/main/build-moedec
#          cp build-gpu-pack/carry.tar.xz scripts/moedec-run.sh \
#             scripts/dummy-*-4l.json /work/main/build-moedec/
#   there: bash build-moedec/moedec-run.sh     (carry build-moedec)
#
# 1. test_cuda_ops test_moe_ffn with session 11's kernels (default) and
#    session 9's (PETREL_CUDA_MOE_FFN=1): against the CPU, and bit for bit
#    against the CUDA op sequence.
# 2. petrel bench decode, q4_0 dummies, PETREL_CUDA_MOE_FFN=1 then 2, same
#    binary.
# 3. Nsight Compute on the two kernels of both versions (4-layer dummies of
#    the Qwen3-30B-A3B and gpt-oss-20b shapes: quick to make), layer 0 of
#    the third decode step; then each op timed alone (PETREL_CUDA_PROFILE=1)
#    on the same 4-layer dummies.
# Logs under $OUT; a table last.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-out/moedec}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }

stamp machine
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
W=/tmp/moedec-run
mkdir -p "$W" && tar -xJf "$D/carry.tar.xz" -C "$W"
BIN=$W/build-gpu-carry
. scripts/gpu-env.sh && gpu_libs "$BIN/lib"
ldd "$BIN/petrel" | grep "not found"
P="$BIN/petrel bench --device cuda --dummy-dtype q4_0"

for v in ${TEST_ARMS:-2}; do
    stamp "test_cuda_ops test_moe* PETREL_CUDA_MOE_FFN=$v"
    PETREL_CUDA_MOE_FFN=$v CMOCKA_FILTER='test_moe*' timeout 90 "$BIN/test_cuda_ops" >"$OUT/test-v$v.txt" 2>&1
    echo "test_moe* v$v: exit $?"; tail -4 "$OUT/test-v$v.txt"
done
if [ -x "$BIN/test_cuda_model" ]; then
    stamp "test_cuda_model test_families*"
    CMOCKA_FILTER='test_families*' timeout 120 "$BIN/test_cuda_model" >"$OUT/test-model.txt" 2>&1
    echo "test_cuda_model test_families*: exit $?"; grep -E "OK|FAIL|PASSED|skipped|SKIP" "$OUT/test-model.txt" | tail -8
fi

for m in ${MODELS:-qwen3-30b-a3b gpt-oss-20b}; do
    for v in 1 2; do
        stamp "bench $m PETREL_CUDA_MOE_FFN=$v"
        PETREL_CUDA_MOE_FFN=$v timeout 120 $P -m "dummy:$m" -p 16 -d 0 -g 64 -r 2 \
            -o "$OUT/$m-v$v.json" 2>&1 | grep -v "making dummy"
    done
done

# ncu: the two kernels of layer 0 and 1 of the third decode step (4 layers:
# 8 launches a step), both versions, both shapes
NCU=${NCU:-ncu}
command -v "$NCU" >/dev/null || NCU=$(ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
ncu_sections() { # model, arm
    stamp "ncu $1 v$2"
    PETREL_CUDA_MOE_FFN=$2 timeout 100 "$NCU" --clock-control none -k regex:moe_ffn \
        --launch-skip 16 --launch-count 2 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \
        --section Occupancy --section WarpStateStats --section SchedulerStats \
        --section SourceCounters \
        $P -m "dummy:$D/dummy-$1-4l.json" -p 16 -d 0 -g 6 -r 1 >"$OUT/ncu-$1-v$2.txt" 2>&1
    echo "ncu $1 v$2: exit $?"
    grep -E "^  moe_ffn|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Waves Per SM|No Eligible|Issued Warp" "$OUT/ncu-$1-v$2.txt" | head -40
}
ncu_stalls() { # model, arm
    stamp "ncu $1 v$2: stall reasons, instructions, shared wavefronts"
    PETREL_CUDA_MOE_FFN=$2 timeout 60 "$NCU" --clock-control none -k regex:moe_ffn \
        --launch-skip 16 --launch-count 2 \
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,dram__bytes_read.sum,gpu__time_duration.sum,sm__cycles_active.avg' \
        $P -m "dummy:$D/dummy-$1-4l.json" -p 16 -d 0 -g 6 -r 1 >"$OUT/ncu-stall-$1-v$2.txt" 2>&1
    echo "ncu stall $1 v$2: exit $?"
}
ncu_sections qwen3-30b-a3b 2
ncu_sections gpt-oss-20b 2
ncu_stalls qwen3-30b-a3b 2
ncu_stalls qwen3-30b-a3b 1

for m in qwen3-30b-a3b gpt-oss-20b; do
    stamp "profile $m, 4 layers (each op timed alone), session 11 kernels"
    PETREL_CUDA_PROFILE=1 timeout 60 $P -m "dummy:$D/dummy-$m-4l.json" -p 16 -d 0 -g 8 -r 1 2>&1 |
        grep -v "making dummy" | tail -32 >"$OUT/prof-$m.txt"
    cat "$OUT/prof-$m.txt"
done

stamp summary
python3 - "$OUT" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    try: j = json.load(open(f))
    except Exception as e: print(f, "unreadable", e); continue
    dec = " ".join(f"d{d['depth']} {d['tok_s']:.2f} tok/s ({100*d['fraction']:.2f}% of {d.get('roofline_tok_s', 0):.0f})" for d in j["decode"])
    print(f"{os.path.basename(f)}: {dec} | bw {j['read_bandwidth_gbs']:.0f} GB/s")
PY
for f in "$OUT"/ncu-*.txt; do
    echo "$(basename "$f"):" $(grep -E "^  moe_ffn|Duration|DRAM Throughput" "$f" | awk '{print $1, $NF}' | tr '\n' ' ')
done
stamp done
