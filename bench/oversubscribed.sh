#!/usr/bin/env bash
# oversubscribed.sh BEFORE AFTER [REPS] - decode speed of two petrel builds
# on two cores, with -t 1 and -t 2, alone and with a competing busy process
# (`yes > /dev/null` pinned to the second core), for the thread pool's
# behaviour when cores are oversubscribed (docs/benchmarks.md).
#
# Models: the bundled stories260K (ops of microseconds: dispatch-bound) and
# a dummy Llama of 8 layers, hidden 768, bf16 (bench/oversubscribed.json,
# about 200 MB: bandwidth-bound ops of tens of microseconds).  Each cell
# runs `petrel bench -p 8 -d 0 -g N -r 1` REPS times (N: GEN_SMALL=512
# steps for stories260K, GEN_DUMMY=32 for the dummy), the arms (build,
# threads) alternating within a repetition; the line printed per cell is the
# median decode tok/s and the range (min - max).
# CPUS overrides the two CPUs (default: the first two distinct physical
# cores of `lscpu -p`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
before=$1 after=$2 reps=${3:-5}
gens=("${GEN_SMALL:-512}" "${GEN_DUMMY:-32}")
if [ -z "${CPUS:-}" ]; then
  CPUS=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | head -2 | cut -d, -f1 | paste -sd,)
fi
second=${CPUS#*,}
models=("$here/../models/stories260K.gguf" "dummy:$here/oversubscribed.json")
names=(stories260K dummy-768x8-bf16)

decode() { # BIN MODEL THREADS STEPS -> tok/s
  taskset -c "$CPUS" "$1" bench -m "$2" --dummy-dtype bf16 -t "$3" -p 8 -d 0 -g "$4" -r 1 2>/dev/null |
    awk '/^decode/ { getline; print $2; exit }'
}

echo "# cpus $CPUS ($(lscpu | sed -n 's/^Model name: *//p')), $reps reps, ${gens[*]} decode steps, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
results=$(mktemp)
for load in alone busy; do
  ypid=
  if [ $load = busy ]; then
    taskset -c "$second" yes > /dev/null &
    ypid=$!
  fi
  for r in $(seq "$reps"); do
    for m in 0 1; do
      for t in 1 2; do
        for arm in before after; do
          bin=$before; [ $arm = after ] && bin=$after
          echo "$load ${names[$m]} -t$t $arm $(decode "$bin" "${models[$m]}" "$t" "${gens[$m]}")" >> "$results"
        done
      done
    done
  done
  [ -n "$ypid" ] && kill "$ypid"
done
# median and range per cell
sort -k1,1 -k2,2 -k3,3 -k4,4 -k5,5n "$results" | awk '
  { key = $1 " " $2 " " $3 " " $4; v[key, ++n[key]] = $5; if (!(key in seen)) { seen[key] = 1; order[++k] = key } }
  END {
    printf "%-6s %-18s %-4s %-7s %10s %20s\n", "load", "model", "-t", "build", "median", "range"
    for (i = 1; i <= k; i++) {
      key = order[i]; c = n[key]; split(key, f, " ")
      med = c % 2 ? v[key, (c + 1) / 2] : (v[key, c / 2] + v[key, c / 2 + 1]) / 2
      printf "%-6s %-18s %-4s %-7s %10.1f %9.1f - %-9.1f\n", f[1], f[2], f[3], f[4], med, v[key, 1], v[key, c]
    }
  }'
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -f "$results"
