#!/usr/bin/env bash
# gpu-run.sh - the one script for the GPU machine: build (or take a staged
# build), run the CUDA tests, time the kernels and the models, and print a
# summary table last.  Results go under $OUT (default out/gpu-run).
#
#   scripts/gpu-run.sh --stage        here, where nvcc is: Release build with
#                                     CUDA in build-cuda, then binaries and the
#                                     non-system libraries they need copied
#                                     into build-gpu-carry/, and packed into
#                                     build-gpu-pack/carry.tar.xz (carry that:
#                                     the binaries share their kernels, so xz
#                                     packs ~55 MB into ~7)
#   scripts/gpu-run.sh [PHASES...]    on the GPU machine; phases: tests, ops,
#                                     models, kvq, ab (default: tests ops
#                                     models kvq); kvq = decode with and
#                                     without quantized KV at 8k and 32k;
#                                     ab = graphs and PDL on/off, same run
#                                     (AB_ARMS, AB_MODELS pick arms, models)
#
# Environment: QUICK=1 (shorter benchmarks), MODELS="llama-1b llama-8b ..."
# (dummy presets to bench), DEPTHS (decode depths, default 0,1024,8192),
# PROMPTS (prefill lengths, default 512,4096).
#
# The GPU machine may lack the Debian -dev packages Petrel links (jansson,
# pcre2, utf8proc, libevent, cmocka).  A carried staged build is used first
# (compiling there costs device minutes), with the staged libraries first on
# LD_LIBRARY_PATH and cuBLAS found in the CUDA toolkit or the pip wheel of
# nvidia-cublas; without one (or with FORCE_BUILD=1) the script builds there
# (sm_90 only, all cores) if the -dev packages are all there.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE=build-gpu-carry

if [ "${1:-}" = --stage ]; then
    cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DPETREL_CUDA=ON >/dev/null || exit 1
    rm -rf "$STAGE"
    mkdir -p "$STAGE/lib"
    # Each target on its own: a half-written part of the tree must not stop
    # the others from being staged.
    for t in petrel test_cuda_ops test_cuda_model test_cuda_kvq bench_cuda_ops; do
        if cmake --build build-cuda -j"$(nproc)" --target "$t" >"build-cuda/stage-$t.log" 2>&1; then
            f=build-cuda/$t; [ -x "$f" ] || f=build-cuda/tests/$t
            cp "$f" "$STAGE/" && echo "staged $t"
        else
            echo "NOT staged $t (build failed: build-cuda/stage-$t.log)"; tail -3 "build-cuda/stage-$t.log"
        fi
    done
    # Libraries outside glibc, libstdc++ and CUDA: the GPU machine may lack them.
    for b in "$STAGE"/*; do [ -f "$b" ] && ldd "$b"; done |
        awk '/=> \// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux|libcuda|libcudart|libcublas|libcublasLt)[.-]' |
        while read -r lib; do cp -L "$lib" "$STAGE/lib/"; done
    for b in "$STAGE"/*; do [ -f "$b" ] && strip --strip-debug "$b"; done
    du -sh "$STAGE"
    ls "$STAGE" "$STAGE/lib"
    mkdir -p build-gpu-pack
    tar -cf - "$STAGE" | xz -9 -T2 >build-gpu-pack/carry.tar.xz && du -sh build-gpu-pack/carry.tar.xz
    exit 0
fi

OUT=${OUT:-out/gpu-run}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
exec > >(tee -a "$LOG") 2>&1
phases=${*:-tests ops models kvq}
has() { [[ " $phases " == *" $1 "* ]]; }
t_start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t_start ))s] $*"; }

stamp "machine"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv 2>&1
command -v nvcc >/dev/null && nvcc --version | tail -2
command -v cmake >/dev/null && cmake --version | head -1
nproc

# ---- build or take the staged one -------------------------------------------
if [ ! -d "$STAGE" ] && [ -f build-gpu-pack/carry.tar.xz ]; then
    tar -xJf build-gpu-pack/carry.tar.xz || python3 -c 'import lzma,tarfile; tarfile.open(fileobj=lzma.open("build-gpu-pack/carry.tar.xz")).extractall()'
fi
BIN=
deps_ok=1
for p in jansson libpcre2-8 libutf8proc libevent cmocka; do
    pkg-config --exists "$p" 2>/dev/null || deps_ok=0
done
if [ -d "$STAGE" ] && [ -z "${FORCE_BUILD:-}" ]; then
    : # the staged build saves the device minutes of compiling
elif [ "$deps_ok" = 1 ] && command -v cmake >/dev/null && command -v nvcc >/dev/null; then
    stamp "building here (Release, sm_90)"
    gen=; command -v ninja >/dev/null && gen="-G Ninja"
    if cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DPETREL_CUDA=ON \
         -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null &&
       cmake --build build-gpu -j"$(nproc)" --target petrel test_cuda_ops test_cuda_model \
           test_cuda_kvq bench_cuda_ops; then
        BIN=build-gpu/bin; mkdir -p "$BIN"
        cp build-gpu/petrel build-gpu/tests/test_cuda_ops build-gpu/tests/test_cuda_model \
           build-gpu/tests/test_cuda_kvq build-gpu/tests/bench_cuda_ops "$BIN/" 2>/dev/null
    else
        stamp "build here failed; trying the staged build"
    fi
fi
if [ -z "$BIN" ] && [ -d "$STAGE" ]; then
    stamp "using the staged build ($STAGE)"
    BIN=$STAGE
    export LD_LIBRARY_PATH="$PWD/$STAGE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -z "$BIN" ]; then
    stamp "no build: the -dev packages are missing here and no $STAGE was carried"
    exit 1
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         "$(python3 -c 'import nvidia.cublas,os;print(os.path.dirname(nvidia.cublas.__file__)+"/lib")' 2>/dev/null)" \
         "$(python3 -c 'import nvidia.cuda_runtime,os;print(os.path.dirname(nvidia.cuda_runtime.__file__)+"/lib")' 2>/dev/null)"; do
    [ -n "$d" ] && [ -e "$d/libcublas.so.13" -o -e "$d/libcudart.so.13" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
export LD_LIBRARY_PATH
export PETREL_SOURCE_DIR=$PWD
for b in petrel test_cuda_ops bench_cuda_ops; do
    ldd "$BIN/$b" | grep -q "not found" && { echo "$b: missing libraries:"; ldd "$BIN/$b" | grep "not found"; }
done

# ---- tests -----------------------------------------------------------------------
if has tests; then
    for t in ${TESTS:-test_cuda_kvq test_cuda_ops test_cuda_model}; do
        stamp "$t"
        timeout 300 "$BIN/$t"
        echo "$t: exit $?"
    done
fi

# ---- kernels ---------------------------------------------------------------------
if has ops; then
    stamp "bench_cuda_ops"
    timeout 240 "$BIN/bench_cuda_ops" "$OUT/bench_ops.json" ${QUICK:+quick}
    echo "bench_cuda_ops: exit $?"
fi

# ---- models ---------------------------------------------------------------------
if has models; then
    for m in ${MODELS:-llama-1b llama-8b qwen3-8b}; do
        stamp "petrel bench dummy:$m"
        timeout 200 "$BIN/petrel" bench --device cuda -m "dummy:$m" --dummy-dtype bf16 \
            -p "${PROMPTS:-512,4096}" -d "${DEPTHS:-0,1024,8192}" -g 32 -r "${REPS:-2}" \
            -o "$OUT/bench-$m.json"
        echo "petrel bench $m: exit $?"
    done
fi

# ---- quantized KV: the same model and depths with and without --kv-quant ----
# Each depth is filled by a prefill first (quantized prefill attention runs
# the decode kernel row by row: seconds at 32k), so 32k runs one rep.
if has kvq; then
    m=${KVQ_MODEL:-llama-8b}
    for kq in ${KVQ_FORMATS:-none turbo}; do
        for dr in "${KVQ_DEPTHS:-0,8192}:2" "${KVQ_LONG:-32768}:1"; do
            stamp "petrel bench dummy:$m --kv-quant $kq -d ${dr%:*}"
            timeout 300 "$BIN/petrel" bench --device cuda -m "dummy:$m" --dummy-dtype bf16 \
                --kv-quant "$kq" -p 512 -d "${dr%:*}" -g 32 -r "${dr#*:}" \
                -o "$OUT/kvq-$m-$kq-${dr%:*}.json"
            echo "petrel bench $m kv-quant $kq: exit $?"
        done
    done
fi

# ---- A/B: what graphs and programmatic dependent launch buy, same run ----
if has ab; then
    for m in ${AB_MODELS:-llama-1b llama-8b}; do
        for arm in ${AB_ARMS:-default no-pdl no-graphs}; do
            case $arm in
                default) envs=();;
                no-pdl) envs=(PETREL_CUDA_PDL=0);;
                no-graphs) envs=(PETREL_CUDA_GRAPHS=0);;
                gemv-pdl) envs=(PETREL_CUDA_GEMV_PDL=1);;
                gemv-nopersist-pdl) envs=(PETREL_CUDA_GEMV_PERSIST=0 PETREL_CUDA_GEMV_PDL=1);;
                gemv-nopersist) envs=(PETREL_CUDA_GEMV_PERSIST=0);;
            esac
            stamp "A/B $m $arm"
            env "${envs[@]}" timeout 120 "$BIN/petrel" bench --device cuda -m "dummy:$m" \
                --dummy-dtype bf16 -p 512 -d 0,4096 -g 64 -r 2 -o /tmp/ab.json >/dev/null 2>&1
            python3 -c 'import json,sys; j=json.load(open("/tmp/ab.json")); j["arm"]=sys.argv[1]; print(json.dumps(j))' \
                "$arm" >>"$OUT/ab.jsonl" || echo "A/B $m $arm failed"
        done
    done
fi

# ---- summary ----------------------------------------------------------------------
stamp "summary"
python3 - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
for f in sorted(glob.glob(os.path.join(out, "bench-*.json")) + glob.glob(os.path.join(out, "kvq-*.json"))):
    try:
        j = json.load(open(f))
    except Exception as e:
        print(f"{f}: unreadable ({e})"); continue
    print(f"{j['model']} on {j['backend']}: {j['weight_bytes']/1e9:.2f} GB {j['weight_dtype']}, kv {j.get('kv_format', j['kv_type'])}, "
          f"read bw {j['read_bandwidth_gbs']:.0f} GB/s")
    for p in j["prefill"]:
        print(f"  prefill {p['tokens']:6d}: {p['tok_s']:10.1f} tok/s {p['gflops']/1e3:8.1f} TFLOP/s")
    for d in j["decode"]:
        print(f"  decode  depth {d['depth']:6d}: {d['tok_s']:8.1f} tok/s  roofline {d['roofline_tok_s']:8.1f}  {100*d['fraction']:5.1f}%")
f = os.path.join(out, "ab.jsonl")
if os.path.exists(f):
    print("A/B (decode tok/s at depth 0 / 4096, prefill 512 tok/s):")
    for line in open(f):
        j = json.loads(line)
        d = " / ".join(f"{x['tok_s']:.1f} ({100*x['fraction']:.1f}%)" for x in j["decode"])
        print(f"  {j['model']:16s} {j['arm']:10s} decode {d}   prefill {j['prefill'][0]['tok_s']:.0f}")
f = os.path.join(out, "bench_ops.json")
if os.path.exists(f):
    try:
        j = json.load(open(f))
        print(f"kernels on {j['device']}: read {j['read_bandwidth_gbs']:.0f} GB/s")
        for r in j["results"]:
            if r["op"] == "matmul":
                print(f"  matmul {r['name']:8s} {r['rows']:6d}x{r['cols']:<6d} n={r['n']:<2d} gemv {100*r['gemv_frac']:5.1f}%  cublas {100*r['cublas_frac']:5.1f}% of read bw")
            else:
                print(f"  attn {r['arm']:6s} depth {r['depth']:6d} rows {r['rows']:3d} seqs {r['seqs']:2d}: {r['us']:9.1f} us {100*r['frac']:5.1f}% bw {r['tflops']:6.2f} TFLOP/s")
    except Exception as e:
        print(f"{f}: unreadable ({e})")
EOF
stamp "done"
