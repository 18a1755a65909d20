#!/usr/bin/env bash
# batch-run.sh - batched decode on the GPU machine in one call (issue 15
# item 3): the argmax and dequantization tests, greedy output with and
# without the device's argmax, aggregate decode of 1-64 sequences with it
# on and off (dummy 8B shapes, q4_0 and f16), then every op timed alone at
# 8, 32 and 64 sequences.  Results under $OUT (default
# out/batch-run); the tables last.
#
#   here:  scripts/gpu-run.sh --stage, then copy build-gpu-pack/carry.tar.xz
#          and this script into a carried folder (e.g. build-batch/)
#   there: bash build-batch/batch-run.sh     (PACK=path of carry.tar.xz)
#
# BATCH_ARMS (dtype:argmax:sequences, below), BATCH_DTYPES
# (profiled, default "q4_0 f16"), BATCH_PROF (default 8,32,64; empty: no
# profiles).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/batch-run}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }

STAGE=build-gpu-carry
PACK=${PACK:-$(dirname "$0")/carry.tar.xz}
[ -d "$STAGE" ] || tar -xJf "$PACK" || { echo "no staged build ($PACK)"; exit 1; }
BIN=$STAGE
. scripts/gpu-env.sh && gpu_libs "$PWD/$STAGE/lib"
stamp "machine"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv
uptime
ldd "$BIN/petrel" | grep "not found"

stamp "tests: test_argmax; test_qmatmul and test_qmatmul_split (the f16 dequantization)"
CMOCKA_FILTER='test_argmax' timeout 60 "$BIN/test_cuda_ops"
echo "test_argmax: exit $?"
CMOCKA_FILTER='test_qmatmul*' CMOCKA_SKIP='test_qmatmul_?d*' timeout 90 "$BIN/test_cuda_qmatmul" |
    grep -E "^\[|matmul"
echo "test_qmatmul, test_qmatmul_split: exit $?"

# Aggregate decode, arms as DTYPE:ARGMAX:SEQUENCES (128 + 128 tokens
# a sequence, the 8B shapes, dummy weights); the json per arm under $OUT.
M="--device cuda -m dummy:llama-8b"
for arm in ${BATCH_ARMS:-q4_0:1:1,8,32,64 f16:1:1,8,32,64 q4_0:0:1,8,64 f16:0:64}; do
    IFS=: read -r dt a par <<<"$arm"
    stamp "PETREL_DEVICE_ARGMAX=$a petrel bench $dt -P $par"
    PETREL_DEVICE_ARGMAX=$a timeout 120 "$BIN/petrel" bench $M \
        --dummy-dtype "$dt" -p 16,512 -d 0 -g 64 -r 1 -P "$par" -o "$OUT/ab-$dt-$a.json" 2>&1 |
        grep -v "making dummy"
    echo "bench $arm: exit $?"
done

if [ -n "${BATCH_PROF-8,32,64}" ]; then
    for dt in ${BATCH_DTYPES:-q4_0 f16}; do
        stamp "PETREL_CUDA_PROFILE=${BATCH_PROF:-8,32,64} petrel bench $dt"
        PETREL_CUDA_PROFILE=${BATCH_PROF:-8,32,64} timeout 120 "$BIN/petrel" bench $M \
            --dummy-dtype "$dt" -p 16 -d 0 -g 8 -r 1 -P "${BATCH_PROF:-8,32,64}" \
            -o /tmp/prof.json >"$OUT/prof-$dt.txt" 2>&1
        echo "profile $dt: exit $?"
    done
fi

# Greedy output must not change when the picks move to the device.
P="Once upon a time, there was a little girl named Lily. She loved to play outside in the sun."
for a in 0 1; do
    PETREL_DEVICE_ARGMAX=$a timeout 60 "$BIN/petrel" generate --device cuda -m models/stories260K.gguf \
        --temp 0 -n 160 "$P" \
        >"/tmp/gen-$a.txt" 2>"/tmp/gen-$a.err"
    echo "generate PETREL_DEVICE_ARGMAX=$a: exit $?"
    tail -3 "/tmp/gen-$a.err"
done
if cmp -s /tmp/gen-0.txt /tmp/gen-1.txt && [ -s /tmp/gen-1.txt ]; then echo "generate: identical";
else echo "generate: DIFFERS"; diff /tmp/gen-0.txt /tmp/gen-1.txt | head -5; fi

stamp "summary"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print("aggregate decode tok/s (128 + 128 a sequence); forward and sample ms a step")
print("%-22s %5s %10s %9s %9s %9s" % ("arm (dtype-argmax)", "seqs", "tok/s", "fwd ms", "sample ms", "host ms"))
for f in sorted(os.listdir(out)):
    if not (f.startswith("ab-") and f.endswith(".json")): continue
    try: j = json.load(open(os.path.join(out, f)))
    except Exception as e: print(f, e); continue
    for p in j.get("parallel", []):
        st = max(p["steps"], 1)
        print("%-22s %5d %10.1f %9.2f %9.3f %9.3f" % (f[3:-5], p["seqs"], p["decode_tok_s"],
              1e3 * p["forward_s"] / st, 1e3 * p["sample_s"] / st, 1e3 * p["host_s"] / st))
    for d in j.get("prefill", []):
        print("%-22s %5s %10.1f  (prefill of %s tokens)" % (f[3:-5], 1, d.get("tok_s", 0), d.get("tokens")))
    for d in j.get("decode", []):
        print("%-22s %5s %10.1f  (single sequence, depth %s)" % (f[3:-5], 1, d.get("tok_s", 0), d.get("depth")))
PY
for f in "$OUT"/prof-*.txt; do
    [ -f "$f" ] && { echo "--- $f"; grep -A40 "cuda profile" "$f" | grep -v "^petrel"; }
done
stamp "done"
