#!/usr/bin/env bash
# gpu-gdn.sh - the chunkwise gated_delta's GPU checks and timings (session
# 8, docs/cuda.md): test_cuda_ops and test_cuda_model, then petrel bench of
# the Qwen3.5-27B-shape hybrid with the chunkwise kernel and with
# PETREL_CUDA_GDN_CHUNK=0 (row by row), op profiles of a 4-layer model of
# the same shape (dummy-qwen35-27b-4l.json), DeepSeek-V2-Lite decode at
# depth 0 and 32k.  Every step has a timeout; END (default 290 s) is the
# whole run's deadline.
#
# Staging, here: build petrel, test_cuda_ops and test_cuda_model (sm_90),
# copy them and their non-system libraries (as gpu-run.sh --stage does)
# into stage/ and stage/lib/, pack stage/ as carry.tar.xz (xz -9: the
# binaries share their kernels) into a git-ignored folder such as
# build-gdn/ beside copies of this script and dummy-qwen35-27b-4l.json
# (named q35-4l.json), carry that folder, and run build-gdn/gpu-gdn.sh
# there.
set -u
cd "$(dirname "$0")"
G=$PWD
OUT=${OUT:-$G/out}; mkdir -p "$OUT"
tar -xJf carry.tar.xz || python3 -c 'import lzma,tarfile; tarfile.open(fileobj=lzma.open("carry.tar.xz")).extractall()' || exit 1
B=$G/stage
LD_LIBRARY_PATH=$B/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         "$(python3 -c 'import nvidia.cublas,os;print(os.path.dirname(nvidia.cublas.__file__)+"/lib")' 2>/dev/null)" \
         "$(python3 -c 'import nvidia.cuda_runtime,os;print(os.path.dirname(nvidia.cuda_runtime.__file__)+"/lib")' 2>/dev/null)"; do
    [ -n "$d" ] && [ -e "$d/libcublas.so.13" -o -e "$d/libcudart.so.13" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
export LD_LIBRARY_PATH
export PETREL_SOURCE_DIR=$(cd ..; pwd)
t0=$(date +%s)
END=${END:-290}
st() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }
# run CAP CMD...: with a timeout of CAP seconds, less if the deadline is nearer
run() {
    local cap=$1; shift
    local left=$(( END - ($(date +%s) - t0) ))
    [ $left -lt 15 ] && { echo "SKIPPED (deadline): $*"; return 1; }
    [ $cap -gt $left ] && cap=$left
    timeout $cap "$@"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv
uptime
ldd $B/petrel | grep "not found"
st test_cuda_ops
run 120 $B/test_cuda_ops >"$OUT/ops.txt" 2>&1; echo "test_cuda_ops: exit $?"
grep -E "gated_delta.*worst" "$OUT/ops.txt" | awk '{print $NF}' | sort -g | tail -1 | sed 's/^/gated_delta worst abs diff: /'
grep -E "FAIL|ERROR|PASSED|bound" "$OUT/ops.txt" | head -20
Q="--device cuda -m dummy:qwen3.5-27b --dummy-dtype bf16"
st "qwen3.5-27b chunkwise"
run 110 $B/petrel bench $Q -p 512,4096 -d 0,32768 -g 32 -r 2 -o "$OUT/q35-after.json" >>"$OUT/bench.txt" 2>&1
echo "bench after: exit $?"; tail -12 "$OUT/bench.txt"
st "qwen3.5-27b row by row"
PETREL_CUDA_GDN_CHUNK=0 run 80 $B/petrel bench $Q -p 512,4096 -d 0 -g 32 -r 2 -o "$OUT/q35-before.json" >>"$OUT/bench.txt" 2>&1
echo "bench before: exit $?"; tail -9 "$OUT/bench.txt"
st test_cuda_model
run 120 $B/test_cuda_model >"$OUT/model.txt" 2>&1; echo "test_cuda_model: exit $?"
grep -E "FAIL|PASSED|ERROR" "$OUT/model.txt" | head -20
st "profiles, 4-layer qwen3.5-27b shape"
for p in 512 64 16 1; do
    for c in 0 1; do
        echo "### rows $p PETREL_CUDA_GDN_CHUNK=$c" >>"$OUT/prof.txt"
        n=$p; [ $p = 1 ] && n=16
        PETREL_CUDA_GDN_CHUNK=$c PETREL_CUDA_PROFILE=$p run 25 $B/petrel bench --device cuda \
            -m dummy:$G/q35-4l.json --dummy-dtype bf16 -p $n -d 0 -g 8 -r 2 >>"$OUT/prof.txt" 2>&1
    done
done
grep -E "###|gated_delta|in all" "$OUT/prof.txt"
st "deepseek-v2-lite"
run 80 $B/petrel bench --device cuda -m dummy:deepseek-v2-lite --dummy-dtype bf16 -p 512 -d 0,32768 -g 32 -r 1 \
    -o "$OUT/dsv2.json" >>"$OUT/bench.txt" 2>&1
echo "bench deepseek: exit $?"; tail -8 "$OUT/bench.txt"
st done
