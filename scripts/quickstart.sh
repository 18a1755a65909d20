#!/usr/bin/env bash
# quickstart.sh - install dependencies, build, and generate text with the
# bundled TinyStories model.  Extra arguments go to `petrel generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target petrel
if [ $# -eq 0 ]; then set -- --temp 0 -n 64 "Once upon a time"; fi
./build/petrel generate "$@"
