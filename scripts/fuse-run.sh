#!/usr/bin/env bash
# fuse-run.sh - the fused decode step on the GPU machine, in one call
# (docs/cuda.md, "The fused decode step").
#
#   scripts/fuse-run.sh --stage DIR   here: the binaries of build/ (petrel,
#                                     test_cuda_model, test_cuda_qmatmul,
#                                     test_cuda_ops) and the libraries they
#                                     need outside glibc and CUDA, packed
#                                     into DIR/carry.tar.xz, with this
#                                     script and the test's new model config
#   DIR/fuse-run.sh                   there, from the tree's root, DIR
#                                     carried: test_fused_step, then dummy
#                                     8B decode (FUSE_DTYPES, default q4_0
#                                     f16) at each PETREL_CUDA_FUSE of
#                                     FUSE_LIST (default 15 0 1), then
#                                     (not with QUICK=1) the CUDA profile
#                                     of one q4_0 decode step fused and
#                                     not, and the other CUDA tests.
# Results under $OUT (default out/fuse): log.txt and the bench JSONs.
set -uo pipefail
if [ "${1:-}" = --stage ]; then
    cd "$(dirname "$0")/.."
    dir=$2 st=$2/build-gpu-carry
    rm -rf "$st" && mkdir -p "$st/lib"
    cp build/petrel build/tests/test_cuda_model build/tests/test_cuda_qmatmul \
        build/tests/test_cuda_ops "$st/" || exit 1
    . scripts/gpu-env.sh && gpu_stage_libs "$st"
    tar -C "$dir" -cf - build-gpu-carry | xz -9e -T1 --lzma2=dict=192MiB >"$dir/carry.tar.xz" && rm -rf "$st"
    cp scripts/fuse-run.sh tests/cuda/tiny-llama-wide.json "$dir/"
    du -sh "$dir"/*
    exit 0
fi

D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-out/fuse}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }
stamp "machine"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
uptime
tar -xJf "$D/carry.tar.xz" -C /tmp || exit 1
BIN=/tmp/build-gpu-carry
unset LD_LIBRARY_PATH
. scripts/gpu-env.sh && gpu_libs "$BIN/lib"
ldd "$BIN/petrel" | grep "not found"
# the tree that travels is main's: the test's new config comes with us
cp "$D/tiny-llama-wide.json" tests/cuda/

stamp "test_cuda_model test_fused_step"
CMOCKA_FILTER=test_fused_step timeout 150 "$BIN/test_cuda_model"
echo "test_fused_step: exit $?"

for dt in ${FUSE_DTYPES:-q4_0 f16}; do
    for fuse in ${FUSE_LIST:-15 0 1}; do
        stamp "petrel bench dummy:llama-8b $dt PETREL_CUDA_FUSE=$fuse"
        PETREL_CUDA_FUSE=$fuse timeout 120 "$BIN/petrel" bench --device cuda -m dummy:llama-8b \
            --dummy-dtype "$dt" -p 16 -d 0 -g 128 -r 3 -o "$OUT/bench-$dt-$fuse.json" 2>&1 |
            grep -v "making dummy"
        echo "bench $dt fuse $fuse: exit $?"
    done
done
[ -n "${QUICK:-}" ] && { stamp "done"; exit 0; }
for fuse in 15 0; do
    stamp "PETREL_CUDA_PROFILE=1 q4_0 PETREL_CUDA_FUSE=$fuse"
    PETREL_CUDA_FUSE=$fuse PETREL_CUDA_PROFILE=1 timeout 120 "$BIN/petrel" bench --device cuda \
        -m dummy:llama-8b --dummy-dtype q4_0 -p 16 -d 0 -g 32 -r 1 -o /tmp/prof.json 2>&1 |
        grep -A40 "cuda profile"
done
stamp "the other CUDA tests"
CMOCKA_FILTER='test_q*split*' timeout 60 "$BIN/test_cuda_qmatmul"; echo "test_cuda_qmatmul split: exit $?"
for t in test_tiny_dummies test_quantized_weights test_stories_greedy test_multi_sequence; do
    CMOCKA_FILTER=$t timeout 60 "$BIN/test_cuda_model"; echo "test_cuda_model $t: exit $?"
done
timeout 60 "$BIN/test_cuda_ops"; echo "test_cuda_ops: exit $?"
stamp "done"
