#!/usr/bin/env bash
# quickstart.sh - install dependencies, build, and generate text with the
# bundled TinyStories model.  Extra arguments go to `petrel generate`.
#
# The CUDA backend is most of a full build's time (every kernel, for every
# target architecture), so the quick start builds it only where it can run:
# when `nvidia-smi -L` lists a GPU and nvcc is there.  PETREL_CUDA=ON or OFF
# in the environment decides instead.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

have_nvcc() {
  command -v nvcc >/dev/null || [ -n "${CUDACXX:-}" ] || [ -x /usr/local/cuda/bin/nvcc ]
}

cuda=${PETREL_CUDA:-}
if [ -z "$cuda" ]; then
  if nvidia-smi -L >/dev/null 2>&1; then
    if have_nvcc; then
      cuda=ON
      echo "quickstart: GPU found (nvidia-smi -L): building the CUDA backend too"
    else
      cuda=OFF
      echo "quickstart: GPU found but no CUDA toolkit (nvcc): building the CPU backend only;"
      echo "  install the toolkit, then: cmake -S . -B build -DPETREL_CUDA=ON && cmake --build build -j$(nproc)"
    fi
  else
    cuda=OFF
    echo "quickstart: no NVIDIA GPU (nvidia-smi -L lists none): building the CPU backend only (-DPETREL_CUDA=OFF)."
    echo "  To build the CUDA backend (needs nvcc): cmake -S . -B build -DPETREL_CUDA=ON && cmake --build build -j$(nproc)"
    echo "  or run PETREL_CUDA=ON scripts/quickstart.sh"
  fi
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPETREL_CUDA="$cuda" >/dev/null
cmake --build build -j"$(nproc)" --target petrel
if [ $# -eq 0 ]; then set -- --temp 0 -n 64 "Once upon a time"; fi
./build/petrel generate "$@"
