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
#                                     packs ~55 MB into ~9); llama.cpp's
#                                     source into build-anchors/ (carry it
#                                     for the phases llama, batch, frows)
#   scripts/gpu-run.sh [PHASES...]    on the GPU machine; phases: tests, ops,
#                                     models, kvq, ab (default: tests ops
#                                     models kvq); kvq = decode with and
#                                     without quantized KV at 8k and 32k;
#                                     ab = graphs and PDL on/off, same run
#                                     (AB_ARMS, AB_MODELS pick arms, models);
#                                     qmodels = dummy 8B with quantized
#                                     weights (QMODEL_DTYPES); llama =
#                                     llama.cpp and Petrel on the same GGUF
#                                     files, same call (below); batch =
#                                     aggregate decode against
#                                     llama-batched-bench (below); core =
#                                     speculation and --kv-disk outputs
#                                     identical on the GPU, 8B decode,
#                                     batched decode, prefix reuse,
#                                     oracle speculation; prof = every op
#                                     timed alone, 1 and 64 sequences;
#                                     rows = qwen3.5-27b and deepseek-v2-lite
#                                     decode at depth 0 and 32k (ROWS_MODELS);
#                                     qmma = the q4_0/q8_0 tensor-core GEMM
#                                     (qmma.cu): its tests, then profile and
#                                     batched decode with PETREL_CUDA_QMMA
#                                     =0 and =1, bf16 for reference, and
#                                     prefill with it forced to 4096 rows; kvqab = the quantized
#                                     KV attention kernels alone, tensor-core
#                                     and FMA (PETREL_CUDA_KVQ_MMA=1, 0);
#                                     ncu = Nsight Compute on a few
#                                     decode layers (NCU_MODELS);
#                                     fuseab = decode with each
#                                     PETREL_CUDA_FUSE mask (FUSEAB_MASKS,
#                                     FUSEAB_MODELS), same call
#
# The llama phase: the 8B-shape F16 GGUF (make-llama8b-gguf.py, needs
# torch and llama.cpp's gguf-py), llama-quantize to LLAMA_QUANTS (default
# Q4_0 Q8_0), then per file llama-bench (-p 512 -n 128 -d 0,8192 -fa 1
# -ngl 99; LLAMA_DEPTHS, or LLAMA_DEPTHS_<file> for one file, e.g.
# LLAMA_DEPTHS_f16=0,8192,32768) and petrel bench (-p 512 -d 0,8192 -g 128), and a table of
# Petrel / llama.cpp ratios (best repetition against best repetition:
# llama-bench's samples_ts, petrel bench's kept best).  The batch phase:
# llama-batched-bench -npp 128 -ntg 128 -npl 1,8,32,64 against petrel bench
# -P 1,8,32,64 on the same files (BATCH_FILES, default q4_0 f16).  Inputs
# come from ANCHORS (default ../shared/anchors, else a carried
# build-anchors/ holding llama.cpp-34af94cd-src.tar.xz and
# make-llama8b-gguf.py): the prebuilt CUDA tools LLAMA_CPP_TAR if present,
# else llama.cpp built from LLAMA_SRC_TAR in the background at the start
# (the prebuilt 44 MB does not fit beside the tree in a 64 MiB call).
# GGUF_DIR (default /tmp/gguf8b) keeps the files, and /tmp/llama.cpp-build
# the tools, for a next call on the same warm machine.  QUICK=1: one
# repetition each (LLAMA_REPS sets the number, default 3).
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
. scripts/gpu-env.sh
STAGE=build-gpu-carry

# llama.cpp's trimmed source ($1) cut to llama-bench, llama-batched-bench
# and llama-quantize (their tools/ folders, tools/CMakeLists.txt naming only
# them, vendor/ without the audio and image libraries) into $2.
trim_llama_src() {
    local t
    t=$(mktemp -d) && tar -xJf "$1" -C "$t" || return 1
    local d
    d=$(ls "$t")
    (cd "$t/$d" && rm -rf vendor/miniaudio vendor/stb &&
        for x in tools/*/; do
            case $x in tools/llama-bench/ | tools/batched-bench/ | tools/quantize/) ;; *) rm -rf "$x" ;; esac
        done &&
        printf '%s\n' 'find_package(Threads REQUIRED)' 'llama_add_compile_flags()' \
            'add_subdirectory(batched-bench)' 'add_subdirectory(llama-bench)' \
            'add_subdirectory(quantize)' >tools/CMakeLists.txt) &&
        tar -C "$t" -cf - "$d" | xz -9e -T2 >"$2"
    local rc=$?
    rm -rf "$t"
    return $rc
}

if [ "${1:-}" = --stage ]; then
    # sm_90 machine code only (the H200): half the compile of the default
    # sm_90 + compute_80 PTX.  STAGE_ARCH overrides.
    # STAGE_BUILD (default build-cuda) and STAGE_TARGETS (default: all
    # below) stage a subset from an existing build directory.
    B=${STAGE_BUILD:-build-cuda}
    cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DPETREL_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="${STAGE_ARCH:-90-real}" >/dev/null || exit 1
    rm -rf "$STAGE"
    mkdir -p "$STAGE/lib"
    # Each target on its own: a half-written part of the tree must not stop
    # the others from being staged.
    for t in ${STAGE_TARGETS:-petrel test_cuda_ops test_cuda_model test_cuda_kvq test_cuda_qmatmul \
                              test_nccl_comm bench_cuda_ops}; do
        if cmake --build "$B" -j"$(nproc)" --target "$t" >"$B/stage-$t.log" 2>&1; then
            f=$B/$t; [ -x "$f" ] || f=$B/tests/$t
            cp "$f" "$STAGE/" && echo "staged $t"
        else
            echo "NOT staged $t (build failed: $B/stage-$t.log)"; tail -3 "$B/stage-$t.log"
        fi
    done
    # Libraries outside glibc, libstdc++ and CUDA: the GPU machine may lack them.
    gpu_stage_libs "$STAGE"
    du -sh "$STAGE"
    ls "$STAGE" "$STAGE/lib"
    mkdir -p build-gpu-pack
    tar -cf - "$STAGE" | xz -9 -T2 >build-gpu-pack/carry.tar.xz && du -sh build-gpu-pack/carry.tar.xz
    # The phases llama, batch and frows need llama.cpp's source (built there)
    # and the 8B file script: carry build-anchors too.  The source is cut to
    # what the three tools run there need (6 MB packed to 1.7: the tree, the
    # pack and the anchors must fit the 64 MiB a call carries).
    if [ -d ../shared/anchors ]; then
        mkdir -p build-anchors
        cp ../shared/anchors/make-llama8b-gguf.py build-anchors/
        trim_llama_src ../shared/anchors/llama.cpp-34af94cd-src.tar.xz \
            build-anchors/llama.cpp-34af94cd-src-trim.tar.xz && du -sh build-anchors
    fi
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
           test_cuda_kvq test_cuda_qmatmul test_nccl_comm bench_cuda_ops; then
        BIN=build-gpu/bin; mkdir -p "$BIN"
        cp build-gpu/petrel build-gpu/tests/test_cuda_ops build-gpu/tests/test_cuda_model \
           build-gpu/tests/test_cuda_kvq build-gpu/tests/test_cuda_qmatmul build-gpu/tests/test_nccl_comm \
           build-gpu/tests/bench_cuda_ops "$BIN/" 2>/dev/null
    else
        stamp "build here failed; trying the staged build"
    fi
fi
if [ -z "$BIN" ] && [ -d "$STAGE" ]; then
    stamp "using the staged build ($STAGE)"
    BIN=$STAGE
fi
if [ -z "$BIN" ]; then
    stamp "no build: the -dev packages are missing here and no $STAGE was carried"
    exit 1
fi
gpu_libs "$PWD/$STAGE/lib" # harmless for a build made here
for b in petrel test_cuda_ops bench_cuda_ops; do
    ldd "$BIN/$b" | grep -q "not found" && { echo "$b: missing libraries:"; ldd "$BIN/$b" | grep "not found"; }
done

# ---- llama.cpp, started early (phases llama, batch, frows) -----------------------
# The prebuilt CUDA tools (44 MB packed) do not fit beside the tree in one
# call, so without them llama.cpp is built here from the trimmed source
# (~4.5 min on 16 cores) in the background while the tests run; the 8B F16
# file is written at the same time.  Every timing phase waits for both first
# (quiet), so no benchmark shares the CPUs with the compiler.  Inputs, from
# ../shared/anchors or a carried build-anchors/ (see the header).
A=${ANCHORS:-../shared/anchors}; [ -d "$A" ] || A=build-anchors
LLAMA_SRC_TAR=${LLAMA_SRC_TAR:-$A/llama.cpp-34af94cd-src.tar.xz}
[ -f "$LLAMA_SRC_TAR" ] || LLAMA_SRC_TAR=$A/llama.cpp-34af94cd-src-trim.tar.xz
LLAMA_CPP_TAR=${LLAMA_CPP_TAR:-$A/llama.cpp-34af94cd-cuda-sm90-ubuntu24.tar.xz}
GGUF_DIR=${GGUF_DIR:-/tmp/gguf8b}
LLB=/tmp/llama.cpp-build/bin
bg_pids=
llama_tools() {
    if [ -x "$LLB/llama-bench" ]; then echo "llama.cpp: tools already here"; return 0; fi
    if [ -f "$LLAMA_CPP_TAR" ]; then
        mkdir -p /tmp/llama.cpp-bin && tar -xJf "$LLAMA_CPP_TAR" -C /tmp/llama.cpp-bin || return 1
        mkdir -p "$LLB" && cp -a "$(dirname "$(find /tmp/llama.cpp-bin -name llama-bench -type f | head -1)")"/. "$LLB/"
        return 0
    fi
    mkdir -p /tmp/llama.cpp-src &&
        tar -xJf "$LLAMA_SRC_TAR" -C /tmp/llama.cpp-src --strip-components=1 || return 1
    gen=; command -v ninja >/dev/null && gen="-G Ninja"
    cmake -S /tmp/llama.cpp-src -B /tmp/llama.cpp-build $gen -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >/dev/null &&
        cmake --build /tmp/llama.cpp-build -j"$(nproc)" \
            --target llama-bench llama-batched-bench llama-quantize
}
make_f16() {
    [ -s "$GGUF_DIR/f16.gguf" ] && return 0
    mkdir -p "$GGUF_DIR" /tmp/gguf-py-src
    tar -xJf "$LLAMA_SRC_TAR" -C /tmp/gguf-py-src --strip-components=1 --wildcards '*/gguf-py/*' &&
        PYTHONPATH=/tmp/gguf-py-src/gguf-py${PYTHONPATH:+:$PYTHONPATH} \
            python3 "$A/make-llama8b-gguf.py" "$GGUF_DIR/f16.gguf.tmp" &&
        mv "$GGUF_DIR/f16.gguf.tmp" "$GGUF_DIR/f16.gguf"
}
if has llama || has batch || has frows; then
    stamp "llama.cpp: tools and the 8B F16 file, in the background (/tmp/llama-build.log)"
    (llama_tools >/tmp/llama-build.log 2>&1; echo "llama.cpp tools: exit $?" >>/tmp/llama-build.log) &
    bg_pids="$bg_pids $!"
    if has llama || has batch; then
        (make_f16 >/tmp/make-f16.log 2>&1; echo "make f16: exit $?" >>/tmp/make-f16.log) &
        bg_pids="$bg_pids $!"
    fi
fi
# One row of the llama table: llama-bench's and petrel bench's JSON for $1.
join_row() {
    python3 - "$1" "/tmp/llama-$1.json" "/tmp/petrel-$1.json" >>"$OUT/llama.jsonl" <<'PY'
import json, sys
f, lj, pj = sys.argv[1:4]
row = {"file": f}
try: row["llama"] = json.load(open(lj))
except Exception as e: row["llama_error"] = str(e)
try: row["petrel"] = json.load(open(pj))
except Exception as e: row["petrel_error"] = str(e)
print(json.dumps(row))
PY
}
quiet() { # before any timing: the compiler and the file writer are done
    [ -n "$bg_pids" ] || return 0
    stamp "waiting for the llama.cpp build and the F16 file"
    for p in $bg_pids; do wait "$p"; done
    bg_pids=
    tail -3 /tmp/llama-build.log; tail -2 /tmp/make-f16.log 2>/dev/null
    stamp "quiet"
}

# ---- tests -----------------------------------------------------------------------
if has tests; then
    # MLX affine 4- and 8-bit versions of the transformers family fixtures,
    # made here by petrel convert, for test_cuda_model's test_families_affine.
    export PETREL_FAMILY_AFFINE_DIR=/tmp/family-affine
    mkdir -p "$PETREL_FAMILY_AFFINE_DIR"
    for c in qwen3_moe gemma2 gemma3_text gpt_oss qwen3_next qwen3_5 qwen3_5_moe gemma4_text \
        gemma4_text_moe deepseek_v3; do
        for b in 4 8; do
            "$BIN/petrel" convert -f -t 4 -q $b -g 32 "tests/fixtures/hf/$c" \
                "$PETREL_FAMILY_AFFINE_DIR/$c-a$b" >/dev/null 2>&1 || echo "convert $c to $b bits failed"
        done
    done
    for t in ${TESTS:-test_cuda_kvq test_cuda_ops test_cuda_qmatmul test_cuda_model test_nccl_comm}; do
        stamp "$t"
        timeout 300 "$BIN/$t"
        echo "$t: exit $?"
        if [ "$t" = test_cuda_kvq ]; then # the FMA kernel the tensor-core one replaced, too
            stamp "$t with PETREL_CUDA_KVQ_MMA=0"
            PETREL_CUDA_KVQ_MMA=0 timeout 300 "$BIN/$t"
            echo "$t (PETREL_CUDA_KVQ_MMA=0): exit $?"
        fi
    done
fi

# ---- kernels ---------------------------------------------------------------------
if has ops; then
    quiet
    stamp "bench_cuda_ops"
    timeout 300 "$BIN/bench_cuda_ops" "$OUT/bench_ops.json" ${OPS_ARM:-${QUICK:+quick}}
    echo "bench_cuda_ops: exit $?"
fi

# ---- models ---------------------------------------------------------------------
if has models; then
    quiet
    for m in ${MODELS:-llama-1b llama-8b qwen3-8b}; do
        stamp "petrel bench dummy:$m"
        timeout 200 "$BIN/petrel" bench --device cuda -m "dummy:$m" --dummy-dtype bf16 \
            -p "${PROMPTS:-512,4096}" -d "${DEPTHS:-0,1024,8192}" -g 32 -r "${REPS:-2}" \
            -o "$OUT/bench-$m.json"
        echo "petrel bench $m: exit $?"
    done
fi

# ---- quantized KV attention: the tensor-core kernel against the FMA one, same call ----
if has kvqab; then
    quiet
    for mma in 1 0; do
        stamp "bench_cuda_ops kvq, PETREL_CUDA_KVQ_MMA=$mma"
        PETREL_CUDA_KVQ_MMA=$mma timeout 300 "$BIN/bench_cuda_ops" "$OUT/kvq-ops-mma$mma.json" kvq
        echo "bench_cuda_ops kvq (PETREL_CUDA_KVQ_MMA=$mma): exit $?"
    done
fi

# ---- quantized KV: the same model and depths with and without --kv-quant ----
# Each depth is filled by a prefill first (quantized prefill attention runs
# the decode kernel row by row: seconds at 32k), so 32k runs one rep.
if has kvq; then
    quiet
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

# ---- quantized weights: dummy 8B models, decode and prefill ------------------
# core: the engine loop on the GPU.  Greedy output with speculation on and
# off, and with pages restored from --kv-disk, must be identical (f16 and
# TurboQuant KV); then the 8B dummy's decode, batched decode through the
# scheduler, prefix reuse cold/RAM/disk and oracle speculation.
if has core; then
    quiet
    P="Once upon a time, there was a little girl named Lily. She loved to play outside in the sun."
    for kq in none turbo:k8v3:anydim; do
        rm -rf /tmp/kvd-core
        for arm in plain spec draft disk1 disk2; do
            extra=; [ $arm = spec ] && extra="--spec ngram --spec-k 4"
            [ $arm = draft ] && extra="--draft-model $PETREL_SOURCE_DIR/models/stories260K.gguf --spec-k 4"
            [ ${arm#disk} != $arm ] && extra="--kv-disk /tmp/kvd-core"
            "$BIN/petrel" generate --device cuda --temp 0 -n 160 --kv-quant $kq $extra "$P" \
                >"/tmp/core-$arm.txt" 2>"/tmp/core-$arm.err"
            tail -2 "/tmp/core-$arm.err"
        done
        for arm in spec draft disk1 disk2; do
            if cmp -s /tmp/core-plain.txt "/tmp/core-$arm.txt"; then echo "core $kq $arm: identical";
            else echo "core $kq $arm: DIFFERS"; diff /tmp/core-plain.txt "/tmp/core-$arm.txt" | head -5; fi
        done
    done
    m=${CORE_MODEL:-llama-8b}
    stamp "petrel bench dummy:$m: decode, parallel, prefix reuse, speculation"
    timeout 300 "$BIN/petrel" bench --device cuda -m "dummy:$m" --dummy-dtype bf16 \
        -p 512 -d 0,8192 -g 32 -r 2 -P ${CORE_PAR:-1,8,32,64} \
        --prefix-reuse ${CORE_REUSE:-4096} --kv-disk /tmp/kvd-$m -o "$OUT/core-$m.json"
    echo "petrel bench core $m: exit $?"
    # A 1B-shape draft with the 8B's vocabulary (the llama-1b preset has
    # 32,000 tokens): with random weights it is never right, so this times a
    # draft + verify cycle (docs/benchmarks.md computes the break-even).
    CORE_DRAFT=${CORE_DRAFT:-scripts/dummy-llama1b-v128k.json}
    stamp "petrel bench dummy:$m --draft-model dummy:$CORE_DRAFT"
    timeout 200 "$BIN/petrel" bench --device cuda -m "dummy:$m" --dummy-dtype bf16 \
        --draft-model "dummy:$CORE_DRAFT" --spec-k 4 -p 16 -d 0 -g 128 -r 1 \
        -o "$OUT/draft-$m.json"
    echo "petrel bench draft: exit $?"
    for a in ${CORE_ORACLE:-0.5 0.8 0.95}; do
        stamp "petrel bench dummy:$m --spec oracle:$a --spec-k 4"
        timeout 200 "$BIN/petrel" bench --device cuda -m "dummy:$m" --dummy-dtype bf16 \
            -p 16 -d 0 -g 128 -r 1 --spec "oracle:$a" --spec-k 4 -o "$OUT/spec-$m-$a.json"
        echo "petrel bench spec $a: exit $?"
    done
fi

# ---- where a step's time goes: each op timed alone (PETREL_CUDA_PROFILE) --
# One sequence and PROF_PAR sequences decoding together (steps of exactly
# that many tokens are timed: the decode steps), per dummy model of
# PROF_MODELS and weight type of PROF_DTYPES: the per-kind table goes to
# $OUT/prof-<model>-<dtype>-<n>.txt.
if has prof; then
    quiet
    for m in ${PROF_MODELS:-llama-8b}; do
        for dt in ${PROF_DTYPES:-bf16}; do
            for par in 1 ${PROF_PAR:-64}; do
                stamp "PETREL_CUDA_PROFILE=$par petrel bench dummy:$m --dummy-dtype $dt -P $par"
                f="$OUT/prof-$m-$dt-$par.txt"
                PETREL_CUDA_PROFILE=$par timeout 200 "$BIN/petrel" bench --device cuda -m "dummy:$m" \
                    --dummy-dtype "$dt" -p 128 -d 0 -g 64 -r 1 -P "$par" -o /tmp/prof.json \
                    >"$f" 2>&1
                echo "profile $m $dt x$par: exit $?"; grep -v "making dummy" "$f" | tail -45
            done
        done
    done
fi

if has qmma; then
    quiet
    stamp "qmma: test_qmatmul and test_qmma"
    CMOCKA_FILTER='test_qm*' CMOCKA_SKIP='test_qmatmul_*' timeout 120 "$BIN/test_cuda_qmatmul" \
        >"$OUT/qmma-test.txt" 2>&1
    echo "test_qmatmul + test_qmma: exit $?"; grep -E "qmma|PASSED|FAILED|matmul q" "$OUT/qmma-test.txt" | tail -20
    M="--device cuda -m dummy:llama-8b"
    for q in ${QMMA_PROF-0 1}; do
        stamp "PETREL_CUDA_QMMA=$q PETREL_CUDA_PROFILE=64, q4_0, 64 sequences"
        PETREL_CUDA_QMMA=$q PETREL_CUDA_PROFILE=64 timeout 120 "$BIN/petrel" bench $M \
            --dummy-dtype q4_0 -p 128 -d 0 -g 64 -r 1 -P 64 >"$OUT/qmma-prof$q.txt" 2>&1
        echo "exit $?"; grep -v "making dummy" "$OUT/qmma-prof$q.txt" | tail -30
    done
    for arm in ${QMMA_ARMS:-q4_0:1 q4_0:0 bf16:1}; do
        dt=${arm%:*} q=${arm#*:}
        stamp "PETREL_CUDA_QMMA=$q petrel bench $dt -p 512,4096 -P 1,8,32,64"
        PETREL_CUDA_QMMA=$q timeout 200 "$BIN/petrel" bench $M --dummy-dtype "$dt" -p "${QMMA_PROMPTS:-512,4096}" -d 0 \
            -g 64 -P 1,8,32,64 >"$OUT/qmma-bench-$dt-$q.txt" 2>&1
        echo "exit $?"; grep -v "making dummy" "$OUT/qmma-bench-$dt-$q.txt" | tail -14
    done
    if [ -z "${QMMA_NO_MAX:-}" ]; then
        stamp "PETREL_CUDA_QMMA_MAX=4096: prefill on the tensor-core GEMM"
        PETREL_CUDA_QMMA_MAX=4096 timeout 120 "$BIN/petrel" bench $M --dummy-dtype q4_0 -p 512,4096 -d 0 \
            -g 16 -r 2 -P 64 >"$OUT/qmma-bench-max.txt" 2>&1
        echo "exit $?"; grep -v "making dummy" "$OUT/qmma-bench-max.txt" | tail -12
    fi
fi

if has qmodels; then
    quiet
    for dt in ${QMODEL_DTYPES:-q4_0 q8_0 affine4g64 affine8g64 q4_k}; do
        stamp "petrel bench dummy:llama-8b --dummy-dtype $dt"
        timeout 200 "$BIN/petrel" bench --device cuda -m dummy:llama-8b --dummy-dtype "$dt" \
            -p 512 -d 0,8192 -g 64 -r 2 -o "/tmp/q-$dt.json"
        echo "petrel bench llama-8b $dt: exit $?"
        cat "/tmp/q-$dt.json" | python3 -c 'import json,sys; j=json.load(sys.stdin); j["dtype"]=sys.argv[1]; print(json.dumps(j))' \
            "$dt" >>"$OUT/qmodels.jsonl" || echo "qmodels $dt: no result"
    done
fi

# ---- llama.cpp and Petrel on the same GGUF files, same call -----------------
# llama: llama-bench against petrel bench, per file.  batch: aggregate
# decode of N sequences, llama-batched-bench -npp 128 -ntg 128 against
# petrel bench -P (128 + 128 per sequence, through the scheduler).
if has llama || has batch; then
    quiet
    [ -x "$LLB/llama-bench" ] || { echo "llama: no llama.cpp tools:"; tail -20 /tmp/llama-build.log; }
    export LD_LIBRARY_PATH="$LLB:$LD_LIBRARY_PATH"
    files=f16
    for q in ${LLAMA_QUANTS:-Q4_0 Q8_0}; do
        lq=$(echo "$q" | tr 'A-Z' 'a-z')
        if [ ! -s "$GGUF_DIR/$lq.gguf" ] && [ -s "$GGUF_DIR/f16.gguf" ]; then
            stamp "llama: llama-quantize $q"
            "$LLB/llama-quantize" "$GGUF_DIR/f16.gguf" "$GGUF_DIR/$lq.gguf" "$q" "$(nproc)" \
                >"/tmp/quantize-$lq.log" 2>&1 || { echo "llama-quantize $q failed:"; tail -5 "/tmp/quantize-$lq.log"; }
        fi
        files="$lq $files"
    done
    reps=${LLAMA_REPS:-3}; [ -n "${QUICK:-}" ] && reps=1
fi
if has llama; then
    for f in ${LLAMA_FILES:-$files}; do
        g=$GGUF_DIR/$f.gguf
        [ -s "$g" ] || { echo "llama: no $g"; continue; }
        dv=LLAMA_DEPTHS_$f; depths=${!dv:-${LLAMA_DEPTHS:-0,8192}}
        stamp "llama-bench $f"
        timeout 300 "$LLB/llama-bench" -m "$g" -p 512 -n 128 -d "$depths" -fa 1 -ngl 99 \
            -r "$reps" -o json >"/tmp/llama-$f.json" 2>"/tmp/llama-$f.err"
        echo "llama-bench $f: exit $?"
        stamp "petrel bench $f"
        timeout 300 "$BIN/petrel" bench --device cuda -m "$g" -p 512 -d "$depths" -g 128 \
            -r "$reps" -o "/tmp/petrel-$f.json"
        echo "petrel bench $f: exit $?"
        join_row "$f"
    done
fi
if has batch; then
    for f in ${BATCH_FILES:-q4_0 f16}; do
        g=$GGUF_DIR/$f.gguf
        [ -s "$g" ] || { echo "batch: no $g"; continue; }
        stamp "llama-batched-bench $f"
        timeout 300 "$LLB/llama-batched-bench" -m "$g" -c 17408 -b 2048 -ub 512 -npp 128 -ntg 128 \
            -npl ${BATCH_NPL:-1,8,32,64} -fa on -ngl 99 --output-format jsonl \
            >"/tmp/batched-$f.txt" 2>"/tmp/batched-$f.err"
        echo "llama-batched-bench $f: exit $?"
        stamp "petrel bench -P $f"
        timeout 300 "$BIN/petrel" bench --device cuda -m "$g" -p 128 -d 0 -g 2 -r 1 \
            -P ${BATCH_NPL:-1,8,32,64} -o "/tmp/petrel-batch-$f.json"
        echo "petrel bench -P $f: exit $?"
        python3 - "$f" "/tmp/batched-$f.txt" "/tmp/petrel-batch-$f.json" >>"$OUT/batch.jsonl" <<'PY'
import json, sys
f, lt, pj = sys.argv[1:4]
row = {"file": f, "llama": []}
for line in open(lt):
    if line.startswith("{"): row["llama"].append(json.loads(line))
try: row["petrel"] = json.load(open(pj)).get("parallel", [])
except Exception as e: row["petrel_error"] = str(e)
print(json.dumps(row))
PY
    done
fi

# ---- the new families' real shapes, same GGUF file for both engines -------
# frows: scripts/llama-ref/dummy_gguf.py writes a random-weight GGUF of each
# preset's shapes (FROWS_MODELS) in llama.cpp's layout (FROWS_TYPE, default
# Q4_0; gpt-oss experts MXFP4), then llama-bench and petrel bench time it;
# the rows join the llama table.  Each file is deleted after its row (disk).
if has frows; then
    quiet
    export LD_LIBRARY_PATH="$LLB:$LD_LIBRARY_PATH"
    [ -d /tmp/gguf-py-src/gguf-py ] || { mkdir -p /tmp/gguf-py-src &&
        tar -xJf "$LLAMA_SRC_TAR" -C /tmp/gguf-py-src --strip-components=1 --wildcards '*/gguf-py/*'; }
    ft=${FROWS_TYPE:-Q4_0}
    for m in ${FROWS_MODELS:-qwen3-30b-a3b gpt-oss-20b gemma3-12b qwen3.5-27b deepseek-v2-lite}; do
        g=/tmp/frows-$m.gguf
        stamp "frows: dummy_gguf.py $m --type $ft"
        PYTHONPATH=/tmp/gguf-py-src/gguf-py${PYTHONPATH:+:$PYTHONPATH} \
            python3 scripts/llama-ref/dummy_gguf.py "$m" --type "$ft" "$g" >"/tmp/frows-$m.log" 2>&1 ||
            { echo "frows: dummy_gguf.py $m failed:"; tail -5 "/tmp/frows-$m.log"; continue; }
        stamp "frows: llama-bench $m"
        timeout 300 "$LLB/llama-bench" -m "$g" -p 512 -n 128 -d 0 -fa 1 -ngl 99 -r "${FROWS_REPS:-2}" \
            -o json >"/tmp/llama-$m.json" 2>"/tmp/llama-$m.err"
        echo "llama-bench $m: exit $?"; grep -i "error\|unknown\|failed" "/tmp/llama-$m.err" | head -3
        stamp "frows: petrel bench $m"
        timeout 300 "$BIN/petrel" bench --device cuda -m "$g" -p 512 -d 0 -g 128 -r "${FROWS_REPS:-2}" \
            -o "/tmp/petrel-$m.json"
        echo "petrel bench $m: exit $?"
        join_row "$m"
        rm -f "$g"
    done
fi

# ---- Nsight Compute: the kernels of a few decode layers, each alone --------
# NCU_MODELS: dummy model:dtype pairs.  Graphs off (the kernels are the
# same; ncu replays each one alone), NCU_SKIP launches skipped (dummy
# weights, repacking, the prefill: past them, decode steps), then
# NCU_COUNT kernels measured: time, DRAM bytes and share of the peak, SM
# share, grid.  The per-kernel table goes to $OUT/ncu-<model>-<dtype>.csv.
NCU_METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size
if has ncu; then
    quiet
    for md in ${NCU_MODELS:-llama-8b:q4_0 gemma3-12b:q4_0}; do
        m=${md%:*} dt=${md#*:}
        stamp "ncu: decode kernels of dummy:$m --dummy-dtype $dt"
        PETREL_CUDA_GRAPHS=0 timeout 240 ncu --clock-control none --launch-skip "${NCU_SKIP:-6000}" \
            --launch-count "${NCU_COUNT:-48}" --metrics "$NCU_METRICS" --csv \
            --log-file "$OUT/ncu-$m-$dt.csv" "$BIN/petrel" bench --device cuda -m "dummy:$m" \
            --dummy-dtype "$dt" -p 16 -d 0 -g "${NCU_STEPS:-40}" -r 1 >/dev/null 2>"/tmp/ncu-$m.err"
        echo "ncu $m $dt: exit $?"; tail -2 "/tmp/ncu-$m.err"
    done
fi

# ---- A/B: what each PETREL_CUDA_FUSE mask buys, same call (cuda_fuse.c) ----
# FUSEAB_MODELS: dummy model:dtype pairs; FUSEAB_MASKS: the masks to
# compare.  Decode at depth 0, best of 3, with the kernels of a step.
if has fuseab; then
    quiet
    for md in ${FUSEAB_MODELS:-llama-8b:q4_0 llama-8b:bf16 qwen3-30b-a3b:q4_0}; do
        for mask in ${FUSEAB_MASKS:-9 25}; do
            stamp "PETREL_CUDA_FUSE=$mask petrel bench dummy:${md%:*} --dummy-dtype ${md#*:}"
            PETREL_CUDA_FUSE=$mask timeout 150 "$BIN/petrel" bench --device cuda -m "dummy:${md%:*}" \
                --dummy-dtype "${md#*:}" -p 16 -d 0 -g 128 -r 3 -o /tmp/fuseab.json >/dev/null 2>&1
            python3 -c 'import json,sys; j=json.load(open("/tmp/fuseab.json")); j["mask"]=sys.argv[1]; j["dtype"]=sys.argv[2]; print(json.dumps(j))' \
                "$mask" "${md#*:}" >>"$OUT/fuseab.jsonl" || echo "fuseab $md $mask failed"
        done
    done
fi

# ---- A/B: what graphs and programmatic dependent launch buy, same run ----
if has ab; then
    quiet
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

# ---- the hybrid and latent-attention shapes at depth 0 and 32k (issue 17) ----
if has rows; then
    quiet
    for m in ${ROWS_MODELS:-qwen3.5-27b deepseek-v2-lite}; do
        stamp "petrel bench dummy:$m -d 0,32768"
        timeout "${ROWS_CAP:-150}" "$BIN/petrel" bench --device cuda -m "dummy:$m" --dummy-dtype bf16 \
            -p 512 -d 0,32768 -g 16 -r 1 -o "$OUT/rows-$m.json" >"$OUT/rows-$m.txt" 2>&1
        echo "petrel bench $m: exit $?"; grep -v "making dummy" "$OUT/rows-$m.txt" | tail -12
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
import csv, re
for f in sorted(glob.glob(os.path.join(out, "ncu-*.csv"))):
    rows = {}
    try:
        lines = [l for l in open(f) if l.startswith('"')]
        for r in csv.DictReader(lines):
            k = rows.setdefault(r["ID"], {"name": r["Kernel Name"]})
            v = r["Metric Value"].replace(",", "")
            try: k[r["Metric Name"]] = (float(v), r["Metric Unit"])
            except ValueError: pass
    except Exception as e:
        print(f"{f}: unreadable ({e})"); continue
    print(f"Nsight Compute, {os.path.basename(f)}: kernels in launch order (us, DRAM read MB, DRAM %, SM %, grid x block)")
    tot = 0.0
    for i, k in sorted(rows.items(), key=lambda x: int(x[0])):
        t, unit = k.get("gpu__time_duration.sum", (0, "nsecond"))
        us = t * {"nsecond": 1e-3, "usecond": 1, "msecond": 1e3}.get(unit, 1e-3)
        b, bu = k.get("dram__bytes_read.sum", (0, "byte"))
        mb = b * {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1, "Gbyte": 1e3}.get(bu, 1e-6)
        tot += us
        name = re.sub(r"\(.*", "", k["name"])[:40]
        print(f"  {name:40s} {us:8.2f} {mb:8.2f} {k.get('dram__throughput.avg.pct_of_peak_sustained_elapsed', (0,))[0]:6.1f} "
              f"{k.get('sm__throughput.avg.pct_of_peak_sustained_elapsed', (0,))[0]:6.1f} "
              f"{int(k.get('launch__grid_size', (0,))[0])}x{int(k.get('launch__block_size', (0,))[0])}")
    print(f"  {len(rows)} kernels, {tot:.1f} us")
f = os.path.join(out, "fuseab.jsonl")
if os.path.exists(f):
    print("PETREL_CUDA_FUSE masks (decode tok/s at depth 0, best of 3; kernels a decode step):")
    for line in open(f):
        j = json.loads(line)
        d = j["decode"][0]
        print(f"  {j['model']:16s} {j['dtype']:5s} mask {j['mask']:>2s}  {d['tok_s']:8.1f} tok/s "
              f"({100*d['fraction']:.1f}%)  {j.get('step_kernels', 0)} kernels")
f = os.path.join(out, "qmodels.jsonl")
if os.path.exists(f):
    print("dummy llama-8b, quantized weights (prefill 512 tok/s; decode tok/s at depth 0 / 8192, fraction of roofline):")
    for line in open(f):
        j = json.loads(line)
        d = " / ".join(f"{x['tok_s']:.1f} ({100*x['fraction']:.1f}%)" for x in j["decode"])
        print(f"  {j['dtype']:12s} {j['weight_bytes']/1e9:6.2f} GB  prefill {j['prefill'][0]['tok_s']:8.0f}  decode {d}")
f = os.path.join(out, "llama.jsonl")
if os.path.exists(f):
    print("same GGUF file, same call: Petrel / llama.cpp (tok/s, best repetition of each; llama.cpp mean in brackets)")
    print(f"  {'file':16s} {'test':14s} {'petrel':>9s} {'llama.cpp':>18s} {'ratio':>6s} {'roofline':>9s}")
    for line in open(f):
        j = json.loads(line)
        L, P = j.get("llama") or [], j.get("petrel") or {}
        def lbest(pp, tg, depth):
            for r in L:
                if r.get("n_prompt") == pp and r.get("n_gen") == tg and r.get("n_depth", 0) == depth:
                    s = r.get("samples_ts") or [r.get("avg_ts", 0)]
                    return max(s), r.get("avg_ts", 0)
            return 0, 0
        rows = []
        for p in P.get("prefill", []):
            if p["tokens"] == 512: rows.append(("pp512", p["tok_s"], lbest(512, 0, 0), None))
        for d in P.get("decode", []):
            rows.append((f"tg128 d={d['depth']}", d["tok_s"], lbest(0, 128, d["depth"]), d.get("fraction")))
        if not rows: print(f"  {j['file']:16s} (no petrel result: {j.get('petrel_error', '')})")
        for name, pt, (lb, lm), frac in rows:
            ratio = pt / lb if lb else float("nan")
            fr = f"{100*frac:8.1f}%" if frac is not None else ""
            print(f"  {j['file']:16s} {name:14s} {pt:9.1f} {lb:9.1f} [{lm:7.1f}] {ratio:6.2f} {fr:>9s}")
f = os.path.join(out, "batch.jsonl")
if os.path.exists(f):
    print("aggregate decode, N sequences of 128 + 128: Petrel / llama-batched-bench (S_TG tok/s)")
    for line in open(f):
        j = json.loads(line)
        L = {r["pl"]: r["speed_tg"] for r in j.get("llama", [])}
        for r in j.get("petrel", []):
            lb = L.get(r["seqs"], 0)
            print(f"  {j['file']:6s} {r['seqs']:3d} seqs  petrel {r['decode_tok_s']:9.1f}  llama.cpp {lb:9.1f}  "
                  f"ratio {r['decode_tok_s'] / lb if lb else float('nan'):5.2f}")
f = os.path.join(out, "bench_ops.json")
if os.path.exists(f):
    try:
        j = json.load(open(f))
        print(f"kernels on {j['device']}: read {j['read_bandwidth_gbs']:.0f} GB/s")
        for r in j["results"]:
            if r["op"] == "qmatmul":
                print(f"  qmatmul {r['format']:10s} {r['name']:7s} {r['rows']:6d}x{r['cols']:<6d} n={r['n']:<3d} qgemv {r['qgemv_us']:8.1f} us {100*r['qgemv_frac']:5.1f}%  dequant+cublas {r['blas_us']:9.1f} us {100*r['blas_frac']:5.1f}% {r['blas_tflops']:6.1f} TFLOP/s")
            elif r["op"] == "matmul":
                print(f"  matmul {r['name']:8s} {r['rows']:6d}x{r['cols']:<6d} n={r['n']:<2d} gemv {100*r['gemv_frac']:5.1f}%  cublas {100*r['cublas_frac']:5.1f}% of read bw")
            else:
                print(f"  attn {r['arm']:6s} depth {r['depth']:6d} rows {r['rows']:3d} seqs {r['seqs']:2d}: {r['us']:9.1f} us {100*r['frac']:5.1f}% bw {r['tflops']:6.2f} TFLOP/s")
    except Exception as e:
        print(f"{f}: unreadable ({e})")
EOF
stamp "done"
