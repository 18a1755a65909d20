#!/usr/bin/env bash
# bench-cpu.sh - the core engine's CPU benchmarks recorded in
# docs/benchmarks.md: stories260K, and the ~1B dummy Llama (TinyLlama
# shape) in f32 and bf16 with 1 and 2 threads.  JSON goes to $OUT (default
# bench/results/); the tables print as they run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results}
mkdir -p "$out"
p=build/petrel
[ -x $p ] || { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null; cmake --build build -j"$(nproc)" --target petrel; }
for t in 1 2; do
  $p bench -t $t -p 64,256 -d 0,256 -g 64 -r 3 -o "$out/stories260k-t$t.json"
done
for dt in bf16 f32; do
  for t in 2 1; do
    $p bench -m dummy:llama-1b --dummy-dtype $dt -t $t -p 64 -d 0,512 -g 8 -r 2 \
      -o "$out/llama1b-$dt-t$t.json"
  done
done
