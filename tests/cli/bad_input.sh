#!/bin/sh
# bad_input.sh PETREL_BIN - the command line refuses careless input with an
# error that names what is wrong (CTest cli/bad_input, issue 10 items 5-7):
# out-of-range sampling flags name the flag and the range the server checks
# too (engine/gen_limits.h) and exit 2 before any model is loaded; a NUL
# byte in a prompt from stdin is refused; `--kv-quant` errors quote the
# whole value; `eval` takes its model with -m like every other command, and
# positionally as before.  Runs from the source tree (models/, tests/data/).
set -u
bin=$1
model=models/stories260K.gguf
text=tests/data/tinystories-sample.txt
fails=0
err=$(mktemp)
trap 'rm -f "$err"' EXIT

# expect STATUS "TEXT..." -- ARGS: petrel ARGS exits STATUS and stderr holds
# every TEXT.  timeout: on a petrel that accepted the flags, `serve` would
# run for ever.
expect() {
    want=$1
    shift
    texts=""
    while [ "$1" != "--" ]; do
        texts="$texts
$1"
        shift
    done
    shift
    timeout 60 "$bin" "$@" </dev/null >/dev/null 2>"$err"
    st=$?
    ok=1
    [ "$st" -eq "$want" ] || ok=0
    old_ifs=$IFS
    IFS='
'
    for t in $texts; do
        grep -qF -- "$t" "$err" || ok=0
    done
    IFS=$old_ifs
    if [ $ok -eq 0 ]; then
        echo "FAIL: petrel $* -> exit $st (want $want), stderr:"
        sed 's/^/    /' "$err"
        echo "    (wanted:$(echo "$texts" | tr '\n' '|'))"
        fails=$((fails + 1))
    else
        echo "ok: petrel $*"
    fi
}

gen="generate -m $model"
expect 2 "-n/--n-predict -1" "an integer >= 1" -- $gen -n -1 hi
expect 2 "-n/--n-predict 0" "an integer >= 1" -- $gen -n 0 hi
expect 2 "--temp -1" "a number between 0 and 2" -- $gen --temp -1 hi
expect 2 "--temp nan" "between 0 and 2" -- $gen --temp nan hi
expect 2 "--temp inf" "between 0 and 2" -- $gen --temp inf hi
expect 2 "--top-p 2" "between 0 and 1" -- $gen --top-p 2 hi
expect 2 "--min-p 5" "between 0 and 1" -- $gen --min-p 5 hi
expect 2 "--repeat-penalty -3" "between 0.01 and 10" -- $gen --repeat-penalty -3 hi
expect 2 "--top-k -5" "an integer >= -1" -- $gen --top-k -5 hi
expect 2 "--logprobs 100" "between 0 and 20" -- $gen --logprobs 100 hi
expect 2 "--frequency-penalty 3" "between -2 and 2" -- $gen --frequency-penalty=3 hi
expect 2 "-P/--parallel 0" "between 1 and 65536" -- serve -m $model --port 0 --parallel 0
expect 2 "-P/--parallel 100000" "between 1 and 65536" -- serve -m $model --port 0 --parallel 100000
expect 2 "--max-seqs 0" "between 1 and 65536" -- serve -m $model --port 0 --max-seqs 0
expect 2 "-P/--parallel (--max-seqs) 600" "between 1 and 512" "--batch" -- serve -m $model --port 0 -P 600
expect 2 "--parallel (--max-seqs) 100" "between 1 and 64" -- serve -m $model --port 0 -P 100 --batch 64
expect 2 "--gen 0" "an integer between 1 and" -- bench -m $model --gen 0
expect 2 "-t/--threads -3" "between 0 and" -- bench -m $model -t -3

# the edges of every range are accepted (and generation runs)
expect 0 -- $gen --temp 0 -n 2 --top-k -1 --top-p 1 --min-p 0 --repeat-penalty 10 --logprobs 20 hi
expect 0 -- $gen --temp 2 -n 2 --top-k 0 --top-p 0 --min-p 1 --repeat-penalty 0.01 --seed 1 hi

# a NUL byte in a prompt read from stdin
printf 'Once upon\000 a time' | timeout 120 "$bin" $gen --temp 0 -n 2 >/dev/null 2>"$err"
st=$?
if [ $st -ne 2 ] || ! grep -q "NUL byte at offset 9" "$err"; then
    echo "FAIL: NUL in stdin -> exit $st, stderr:"
    sed 's/^/    /' "$err"
    fails=$((fails + 1))
else
    echo "ok: NUL in stdin refused"
fi
printf 'Once upon a time' | timeout 120 "$bin" $gen --temp 0 -n 2 >/dev/null 2>"$err" ||
    { echo "FAIL: a prompt from stdin"; fails=$((fails + 1)); }

# --kv-quant errors quote the whole value
expect 1 "'turbo:k8v3:bogus'" "'bogus'" -- $gen --kv-quant turbo:k8v3:bogus -n 1 hi

# eval: -m like every other command, or positional; never both
ev="--max-tokens 64 --window 32"
expect 0 -- eval ppl -m $model $text $ev
expect 0 -- eval ppl $model $text $ev
expect 0 -- eval kl -m $model $model $text $ev
expect 0 -- eval kl $model $model $text $ev
expect 2 "given twice" -- eval ppl -m $model $model $text $ev
expect 2 "expected \`ppl [MODEL] TEXTFILE\`" -- eval ppl
if ! "$bin" eval --help | grep -qF "ppl [options] [MODEL] TEXTFILE"; then
    echo "FAIL: eval --help does not show the model as optional (-m)"
    fails=$((fails + 1))
fi

[ $fails -eq 0 ] && echo "cli bad input: all passed" && exit 0
echo "cli bad input: $fails failed"
exit 1
