#!/bin/sh
# spec-copy-demo.sh [PETREL] [REPS] - speculative decoding on a copy-heavy
# workload with the real stories260K (docs/benchmarks.md): a prompt that
# holds a TinyStories story and starts it again, decoded greedily:
#   plain        --spec off
#   ngram        --spec ngram (prompt lookup)
#   predicted    --prediction: the original story as a Predicted Output
#   exact        --prediction: the plain answer itself (the best case of a
#                Predicted Output: an edit that changes nothing)
# each with --kv-type f16 and f32, arms alternating REPS times (default 7).
# Every arm's output must equal the plain one (the script fails otherwise).
#
# Speed is decode tokens per CPU second (one thread): the median task-clock
# of the run (perf stat) less the median of a one-token run, which holds
# the load and the prefill.  On a loaded machine the wall clock mostly
# measures other processes' time slices; the best wall-clock decode rate
# is printed beside it.
set -eu
petrel=${1:-build/petrel}
reps=${2:-7}
here=$(cd "$(dirname "$0")/.." && pwd)
command -v perf > /dev/null || { echo "spec-copy-demo: needs perf (linux-perf)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the first two paragraphs of the sample, then its first sentence again
awk 'BEGIN{RS=""} NR<=2{printf "%s%s", (NR>1?"\n\n":""), $0}' "$here/tests/data/tinystories-sample.txt" > "$tmp/story"
first=$(sed -n '1s/\..*//p' "$tmp/story")
{ cat "$tmp/story"; printf '\n\n%s' "$first"; } > "$tmp/prompt"
tail -c +$((${#first} + 1)) "$tmp/story" > "$tmp/pred"
n=250
spec="--spec-k 8 --ngram-min 1 --ngram-max 3"
run() { # run NAME KVTYPE N ARGS...: appends "NAME KVTYPE N cpu-ms wall-tok/s accepted drafted"
    name=$1 kt=$2 nn=$3
    shift 3
    perf stat -x, -e task-clock -o "$tmp/perf" "$petrel" generate --temp 0 -n "$nn" -t 1 \
        --no-echo --kv-type "$kt" "$@" < "$tmp/prompt" > "$tmp/out.$name.$kt.$nn" 2> "$tmp/err"
    ms=$(sed -n 's/^\([0-9.]*\),msec,task-clock.*/\1/p' "$tmp/perf")
    tps=$(sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p' "$tmp/err")
    acc=$(sed -n 's/.*speculative: \([0-9]*\) of \([0-9]*\) drafted.*/\1 \2/p' "$tmp/err")
    echo "$name $kt $nn $ms ${tps:-0} ${acc:-0 0}" >> "$tmp/res"
    if [ "$nn" = $n ] && [ "$name" != plain ] && ! cmp -s "$tmp/out.$name.$kt.$nn" "$tmp/out.plain.$kt.$n"; then
        echo "spec-copy-demo: $name output differs from plain ($kt)" >&2
        exit 1
    fi
}
: > "$tmp/res"
for kt in f16 f32; do
    run plain $kt $n
    cp "$tmp/out.plain.$kt.$n" "$tmp/exact.$kt"
done
: > "$tmp/res"
for i in $(seq "$reps"); do
    for kt in f16 f32; do
        run base $kt 1
        run plain $kt $n
        run ngram $kt $n --spec ngram $spec
        run predicted $kt $n --prediction "$tmp/pred" $spec
        run exact $kt $n --prediction "$tmp/exact.$kt" $spec
    done
done
echo "prompt: $(wc -w < "$tmp/prompt") words; $n tokens generated greedily; medians of $reps runs"
awk -v n=$n '
function median(k,   m, i, j, t, a) {
    m = cnt[k]; for (i = 1; i <= m; i++) a[i] = v[k, i]
    for (i = 2; i <= m; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
    return m % 2 ? a[(m+1)/2] : (a[m/2] + a[m/2+1]) / 2 }
{ k = $1 " " $2; v[k, ++cnt[k]] = $4; if ($5 > wall[k]) wall[k] = $5; acc[k] = $6; dr[k] = $7 }
END {
    printf "%-10s %-4s %12s %9s %14s %10s\n", "arm", "kv", "cpu tok/s", "vs plain", "wall tok/s best", "accepted"
    for (k in cnt) { split(k, a, " "); if (a[1] == "base") continue
        rate[k] = (n - 1) / ((median(k) - median("base " a[2])) / 1000) }
    for (k in rate) { split(k, a, " ")
        printf "%-10s %-4s %12.0f %8.2fx %14.0f %5d/%-4d\n", a[1], a[2], rate[k], rate[k] / rate["plain " a[2]], wall[k], acc[k], dr[k] } }' "$tmp/res" | sort -k2,2 -k1,1
