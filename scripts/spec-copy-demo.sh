#!/bin/sh
# spec-copy-demo.sh [PETREL] [REPS] - speculative decoding on a copy-heavy
# workload with the real stories260K (docs/benchmarks.md): a prompt that
# holds a TinyStories story and starts it again, decoded greedily
#   plain        --spec off
#   ngram        --spec ngram (prompt lookup)
#   predicted    --prediction: the original story as a Predicted Output
#   exact        --prediction: the plain answer itself (the best case of a
#                Predicted Output: an edit that changes nothing)
# each with --kv-type f16 and f32, alternating arms REPS times (default 5)
# and keeping each arm's best decode tok/s.  Every arm's output must equal
# the plain one (the script fails otherwise).
set -eu
petrel=${1:-build/petrel}
reps=${2:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the first two paragraphs of the sample, then its first sentence again
awk 'BEGIN{RS=""} NR<=2{printf "%s%s", (NR>1?"\n\n":""), $0}' "$here/tests/data/tinystories-sample.txt" > "$tmp/story"
first=$(sed -n '1s/\..*//p' "$tmp/story")
{ cat "$tmp/story"; printf '\n\n%s' "$first"; } > "$tmp/prompt"
tail -c +$((${#first} + 1)) "$tmp/story" > "$tmp/pred"
n=160
run() { # run NAME KVTYPE ARGS...: appends "NAME KVTYPE tok/s accepted drafted" to $tmp/res
    name=$1 kt=$2
    shift 2
    "$petrel" generate --temp 0 -n $n -t 1 --no-echo --kv-type "$kt" "$@" < "$tmp/prompt" \
        > "$tmp/out.$name.$kt" 2> "$tmp/err"
    tps=$(sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p' "$tmp/err")
    acc=$(sed -n 's/.*speculative: \([0-9]*\) of \([0-9]*\) drafted.*/\1 \2/p' "$tmp/err")
    echo "$name $kt $tps ${acc:-0 0}" >> "$tmp/res"
    if [ "$name" != plain ] && ! cmp -s "$tmp/out.$name.$kt" "$tmp/out.plain.$kt"; then
        echo "spec-copy-demo: $name output differs from plain ($kt)" >&2
        exit 1
    fi
}
for kt in f16 f32; do
    run plain $kt
    cp "$tmp/out.plain.$kt" "$tmp/exact.$kt"
done
: > "$tmp/res"
for i in $(seq "$reps"); do
    for kt in f16 f32; do
        run plain $kt
        run ngram $kt --spec ngram --spec-k 8 --ngram-min 1 --ngram-max 3
        run predicted $kt --prediction "$tmp/pred" --spec-k 8 --ngram-min 1 --ngram-max 3
        run exact $kt --prediction "$tmp/exact.$kt" --spec-k 8 --ngram-min 1 --ngram-max 3
    done
done
echo "prompt: $(wc -w < "$tmp/prompt") words; $n tokens generated greedily; best of $reps"
awk '{k=$1" "$2; if ($3 > best[k]) best[k]=$3; acc[k]=$4; dr[k]=$5}
     END {for (k in best) {split(k, a, " "); if (a[1]=="plain") plain[a[2]]=best[k]}
          printf "%-10s %-4s %10s %8s %10s\n", "arm", "kv", "decode t/s", "vs plain", "accepted"
          for (k in best) {split(k, a, " ")
              printf "%-10s %-4s %10.1f %7.2fx %5d/%-4d\n", a[1], a[2], best[k], best[k]/plain[a[2]], acc[k], dr[k]}}' "$tmp/res" | sort -k2,2 -k1,1
