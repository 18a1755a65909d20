# gpu-env.sh - sourced by the scripts that stage a build here and run it on
# the GPU machine (gpu-run.sh, and the one-call scripts of single pieces of
# work: qgemv-run.sh, fuse-run.sh, batch-run.sh, moe-run.sh).
#
#   gpu_stage_libs DIR   here: copies into DIR/lib the shared libraries that
#                        DIR's binaries need outside glibc, libstdc++ and
#                        CUDA (the GPU machine may lack the Debian -dev
#                        packages' jansson, pcre2, utf8proc, libevent,
#                        cmocka), then strips the binaries' debug sections
#   gpu_libs LIBDIR      there: LD_LIBRARY_PATH = LIBDIR (the staged
#                        libraries), then cuBLAS and the CUDA runtime of the
#                        toolkit or of their pip wheels, then NCCL (the
#                        toolkit's or the wheel nvidia-nccl-cu13's: 218 MB,
#                        never carried); exported with PETREL_SOURCE_DIR=$PWD
#                        and NCCL_NVLS_ENABLE=0 (never NVLink multicast on a
#                        shared GPU: the device tool's KINDS.md)

gpu_stage_libs() {
    local dir=$1 b
    mkdir -p "$dir/lib"
    for b in "$dir"/*; do [ -f "$b" ] && ldd "$b"; done |
        awk '/=> \// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux|libcuda|libcudart|libcublas|libcublasLt|libnccl)[.-]' |
        while read -r lib; do cp -L "$lib" "$dir/lib/"; done
    for b in "$dir"/*; do [ -f "$b" ] && strip --strip-debug "$b"; done
}

# The lib directory of pip wheel module $1 (nvidia.cublas, ...), or nothing.
gpu_wheel_lib() {
    python3 -c "import $1, os; print(os.path.dirname($1.__file__) + '/lib')" 2>/dev/null
}

gpu_libs() {
    local d
    LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             "$(gpu_wheel_lib nvidia.cublas)" "$(gpu_wheel_lib nvidia.cuda_runtime)"; do
        [ -n "$d" ] && [ -e "$d/libcublas.so.13" -o -e "$d/libcudart.so.13" ] &&
            LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
    done
    for d in /usr/local/cuda/lib64 "$(gpu_wheel_lib nvidia.nccl)"; do
        [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] && { LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"; break; }
    done
    export LD_LIBRARY_PATH PETREL_SOURCE_DIR=$PWD NCCL_NVLS_ENABLE=0
}
