#!/usr/bin/env bash
# bench-cpu.sh - the CPU benchmarks recorded in docs/benchmarks.md.
#
#   scripts/bench-cpu.sh core      Petrel alone: stories260K, and the ~1B dummy
#                                  Llama (TinyLlama shape) in f32 and bf16 with
#                                  1 and 2 threads.  JSON goes to $OUT
#                                  (default bench/results/).
#   scripts/bench-cpu.sh compare   Petrel against llama.cpp, same run, same
#                                  GGUF files (TinyLlama-1.1B shape, random
#                                  weights; F16, and Q8_0 / Q4_0 made by
#                                  llama-quantize): decode (tg32 at depth 0)
#                                  and prefill pp128, 2 and 1 threads, the two
#                                  engines alternated REPS times (default 3);
#                                  prints medians and Petrel/llama.cpp ratios,
#                                  each engine's decode GB/s against Petrel's
#                                  bandwidth probe (a roofline no engine may
#                                  beat) and prefill against the compute probe.
#
# compare needs the anchors (../shared/anchors, or $ANCHORS): the prebuilt
# CPU llama.cpp is unpacked into build-llama/ (ignored by git) and the model
# files are made there once (~4 GB; python3-numpy from Debian).  Settings:
# FORMATS="f16 Q8_0 Q4_0", THREADS="2 1", REPS=3.  The machine's load
# average is printed before and after: on a shared machine, compare only
# runs with a low one.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-core}
p=${PETREL:-build/petrel} # PETREL=path: another petrel binary (e.g. a copy, while build/ rebuilds)
[ -x $p ] || { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null; cmake --build build -j"$(nproc)" --target petrel; }

core() {
  local out=${OUT:-bench/results}
  mkdir -p "$out"
  for t in 1 2; do
    $p bench -t $t -p 64,256 -d 0,256 -g 64 -r 3 -o "$out/stories260k-t$t.json"
  done
  for dt in bf16 f32; do
    for t in 2 1; do
      $p bench -m dummy:llama-1b --dummy-dtype $dt -t $t -p 64 -d 0,512 -g 8 -r 2 \
        -o "$out/llama1b-$dt-t$t.json"
    done
  done
}

# ---- compare -----------------------------------------------------------------

dir=build-llama
lcpp=$dir/llama.cpp-cpu

find_anchors() {
  for a in "${ANCHORS:-}" ../shared/anchors ../../shared/anchors /work/shared/anchors; do
    [ -n "$a" ] && [ -f "$a/llama.cpp-34af94cd-cpu-debian12.tar.xz" ] && { echo "$a"; return; }
  done
  echo "bench-cpu.sh: no anchors folder (set ANCHORS=path/to/shared/anchors)" >&2
  exit 1
}

prepare() {
  local anchors
  anchors=$(find_anchors)
  mkdir -p $dir/models
  [ -x $lcpp/llama-bench ] || tar -C $dir -xJf "$anchors/llama.cpp-34af94cd-cpu-debian12.tar.xz"
  local f16=$dir/models/tinyllama-f16.gguf
  if [ ! -f $f16 ]; then
    /usr/bin/python3 -c 'import numpy' 2>/dev/null ||
      { echo "bench-cpu.sh: needs numpy: apt-get install python3-numpy" >&2; exit 1; }
    [ -d $dir/llama.cpp/gguf-py ] ||
      tar -C $dir -xJf "$anchors/llama.cpp-34af94cd-src.tar.xz" --wildcards '*/gguf-py/*'
    PYTHONPATH=$dir/llama.cpp/gguf-py /usr/bin/python3 "$anchors/make-random-llama-gguf.py" \
      tinyllama1b $f16.tmp && mv $f16.tmp $f16
  fi
  for q in Q8_0 Q4_0; do
    local m=$dir/models/tinyllama-$q.gguf
    [ -f $m ] || { LD_LIBRARY_PATH=$lcpp $lcpp/llama-quantize $f16 $m.tmp $q >/dev/null && mv $m.tmp $m; }
  done
}

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# One llama-bench run: "pp_tok_s tg_tok_s".
run_llama() {
  LD_LIBRARY_PATH=$lcpp $lcpp/llama-bench -m "$1" -t "$2" -p 128 -n ${GEN:-16} -r 1 -o json 2>/dev/null |
    jq -r '[(.[] | select(.n_prompt > 0) | .avg_ts), (.[] | select(.n_gen > 0) | .avg_ts)] | map(tostring) | join(" ")'
}

# One petrel bench run: "pp_tok_s tg_tok_s bytes_per_token bandwidth_gbs peak_gops pp_gflops".
# One untimed prefill and decode first, as llama-bench's warmup run: without
# it Petrel's one timed prefill paid the first touch of the mmap'd weights
# (F16, 1 thread: 20.6 tok/s cold against 57.6 warm, Zen 5, 2026-12-02).
run_petrel() {
  local js
  js=$(mktemp)
  $p bench -m "$1" -t "$2" -p 128 -d 0 -g ${GEN:-16} -r 1 --warmup 1 -o "$js" >/dev/null 2>&1
  jq -r '[.prefill[0].tok_s, .decode[0].tok_s, .decode[0].bytes_per_token, .read_bandwidth_gbs,
          .compute_peak_gops, .prefill[0].gflops] | map(tostring) | join(" ")' "$js"
  rm -f "$js"
}

compare() {
  prepare
  local reps=${REPS:-3} formats=${FORMATS:-f16 Q8_0 Q4_0} threads=${THREADS:-2 1}
  local tmp
  tmp=$(mktemp -d)
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; flags: $(grep -o -w -E 'avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|avx_vnni|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "petrel $(git rev-parse --short HEAD), llama.cpp $(cat $lcpp/COMMIT_ID.txt 2>/dev/null | cut -c1-8); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  for f in $formats; do
    local m=$dir/models/tinyllama-$f.gguf
    for t in $threads; do
      : > "$tmp/l" ; : > "$tmp/p"
      for r in $(seq "$reps"); do # alternate which engine goes first
        if [ $((r % 2)) = 1 ]; then run_llama $m $t >> "$tmp/l"; run_petrel $m $t >> "$tmp/p";
        else run_petrel $m $t >> "$tmp/p"; run_llama $m $t >> "$tmp/l"; fi
      done
      local lpp ltg ppp ptg bpt bw pk pgf
      lpp=$(cut -d' ' -f1 "$tmp/l" | median); ltg=$(cut -d' ' -f2 "$tmp/l" | median)
      ppp=$(cut -d' ' -f1 "$tmp/p" | median); ptg=$(cut -d' ' -f2 "$tmp/p" | median)
      bpt=$(cut -d' ' -f3 "$tmp/p" | median); bw=$(cut -d' ' -f4 "$tmp/p" | sort -g | tail -1)
      pk=$(cut -d' ' -f5 "$tmp/p" | sort -g | tail -1); pgf=$(cut -d' ' -f6 "$tmp/p" | median)
      awk -v f=$f -v t=$t -v lpp=$lpp -v ltg=$ltg -v ppp=$ppp -v ptg=$ptg -v bpt=$bpt -v bw=$bw \
          -v pk=$pk -v pgf=$pgf -v load="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN {
        lbw = ltg * bpt / 1e9; pbw = ptg * bpt / 1e9; lgf = pgf * lpp / ppp
        printf "%-5s t=%d  decode %6.2f -> %6.2f tok/s (%.2fx)  pp128 %6.1f -> %6.1f tok/s (%.2fx)  load %s\n",
               f, t, ltg, ptg, ptg / ltg, lpp, ppp, ppp / lpp, load
        printf "          decode GB/s: llama.cpp %.1f, petrel %.1f, probe %.1f (%.0f%%, %.0f%% of it)%s\n",
               lbw, pbw, bw, 100 * lbw / bw, 100 * pbw / bw, (lbw > bw || pbw > bw) ? "  PROBE EXCEEDED" : ""
        printf "          prefill GFLOP/s: llama.cpp %.1f, petrel %.1f, peak probe %.1f GOP/s (%.0f%%, %.0f%% of it)%s\n",
               lgf, pgf, pk, 100 * lgf / pk, 100 * pgf / pk, (lgf > pk || pgf > pk) ? "  PROBE EXCEEDED" : ""
      }'
    done
  done
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf "$tmp"
}

case $mode in
  core) core ;;
  compare) compare ;;
  *) echo "usage: scripts/bench-cpu.sh [core|compare]" >&2; exit 2 ;;
esac
