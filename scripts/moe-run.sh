#!/bin/bash
# moe-run.sh - one device call for the MoE work of issues 16/17 (session 10,
# h-moe2), run from the repository root with a staged build beside it:
#
#   here:  nice scripts/gpu-run.sh --stage
#          mkdir -p /work/main/build-moe2
#          cp build-gpu-pack/carry.tar.xz scripts/moe-run.sh /work/main/build-moe2/
#   there: bash build-moe2/moe-run.sh      (carry build-moe2)
#
# 1. The tests of what changed: test_cuda_qmatmul's matmul_id tests (the
#    grouped GEMM among them), test_cuda_ops' MoE and attention tests,
#    test_cuda_model's GGUF families (prompts past 32 rows take the GEMM).
# 2. petrel bench on the MoE presets (q4_0 dummies), prefill 512 and decode,
#    with PETREL_CUDA_MOE_MMA=32 (the grouped GEMM, default) and =0 (the
#    exact kernels, as before), same binary, same call.
# 3. deepseek-v2-lite (bf16) at depth 0 and 32k (the latent attention);
#    qwen3-30b-a3b: a decode profile (each op timed alone), decode with
#    PETREL_CUDA_MOE_RPW=3 (moe_ffn's up kernel; 2 in step 2), a prefill
#    profile.
# Everything goes to $OUT/log.txt; the bench JSON files to $OUT/bench.tar.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-out/moe-run}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }

stamp machine
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
W=/tmp/moe-run
mkdir -p "$W" && tar -xJf "$D/carry.tar.xz" -C "$W"
BIN=$W/build-gpu-carry
. scripts/gpu-env.sh && gpu_libs "$BIN/lib"
ldd "$BIN/petrel" | grep "not found"

run_test() { # binary, cmocka filter, seconds
    stamp "$1 ($2)"
    CMOCKA_FILTER="$2" timeout "$3" "$BIN/$1"
    echo "$1 ($2): exit $?"
}
run_test test_cuda_qmatmul 'test_qmatmul_id*' 90
run_test test_cuda_ops 'test_moe*' 60
run_test test_cuda_ops 'test_attention*' 60
run_test test_cuda_ops 'test_batch_invariance' 30
run_test test_cuda_model 'test_families_gguf' 60

B=$W/bench
mkdir -p "$B"
for m in ${MOE_MODELS:-qwen3-30b-a3b gpt-oss-20b deepseek-v2-lite}; do
    for arm in 32 0; do
        stamp "bench $m PETREL_CUDA_MOE_MMA=$arm"
        PETREL_CUDA_MOE_MMA=$arm timeout 100 "$BIN/petrel" bench --device cuda -m "dummy:$m" \
            --dummy-dtype q4_0 -p 512 -d 0 -g $([ $arm = 0 ] && echo 8 || echo 32) -r 1 \
            -o "$B/$m-mma$arm.json" 2>&1 | grep -v "making dummy"
        echo "bench $m mma=$arm: exit $?"
    done
done
stamp "deepseek-v2-lite bf16 at depth 0 and 32k (the rows phase of gpu-run.sh)"
timeout 120 "$BIN/petrel" bench --device cuda -m dummy:deepseek-v2-lite --dummy-dtype bf16 \
    -p 512 -d 0,32768 -g 16 -r 1 -o "$B/deepseek-depth.json" 2>&1 | grep -v "making dummy"
stamp "profile qwen3-30b-a3b decode (each op timed alone)"
PETREL_CUDA_PROFILE=1 timeout 90 "$BIN/petrel" bench --device cuda -m dummy:qwen3-30b-a3b \
    --dummy-dtype q4_0 -p 16 -d 0 -g 8 -r 1 2>&1 | grep -v "making dummy" | tail -45
stamp "qwen3-30b-a3b decode, three gate rows a warp in moe_ffn's up kernel (default two)"
PETREL_CUDA_MOE_RPW=3 timeout 60 "$BIN/petrel" bench --device cuda -m dummy:qwen3-30b-a3b \
    --dummy-dtype q4_0 -p 16 -d 0 -g 32 -r 1 -o "$B/qwen3-30b-a3b-rpw3.json" 2>&1 | grep -v "making dummy"
stamp "profile qwen3-30b-a3b prefill 512"
PETREL_CUDA_PROFILE=512 timeout 90 "$BIN/petrel" bench --device cuda -m dummy:qwen3-30b-a3b \
    --dummy-dtype q4_0 -p 512 -d 0 -g 1 -r 1 2>&1 | grep -v "making dummy" | tail -45
tar -cf "$OUT/bench.tar" -C "$B" .
stamp summary
python3 - "$B" <<'EOF'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    try: j = json.load(open(f))
    except Exception as e: print(f, "unreadable", e); continue
    pre = " ".join(f"pp{p['tokens']} {p['tok_s']:.1f}" for p in j["prefill"])
    dec = " ".join(f"d{d['depth']} {d['tok_s']:.2f} ({100*d['fraction']:.1f}%)" for d in j["decode"])
    print(f"{os.path.basename(f)}: {pre} | {dec} | bw {j['read_bandwidth_gbs']:.0f} GB/s")
EOF
stamp done
