#!/bin/sh
# pool-switch.sh PETREL A B [POOL_MEMORY] [ROUNDS] - the model pool's switch
# time: `petrel serve -m A -m B` with a --pool-memory that holds one of
# them, then alternating one-token completions A, B, A, B...  Each request
# for the model not loaded evicts the other and loads it; its time minus
# the same request's time with the model loaded is the switch (evict +
# load + start-up).  Prints one line per request and the median switch.
# Example: bench/pool-switch.sh build/petrel a.gguf b.gguf 1400M 5
set -eu
bin=$1 a=$2 b=$3 pool=${4:-1} rounds=${5:-5}
dir=$(mktemp -d)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
"$bin" serve --port 0 --port-file "$dir/port" -m "A=$a" -m "B=$b" --pool-memory "$pool" \
    --ctx 512 --parallel 1 2>"$dir/log" &
pid=$!
while [ ! -s "$dir/port" ]; do
    kill -0 $pid 2>/dev/null || { cat "$dir/log"; exit 1; }
    sleep 0.2
done
port=$(cat "$dir/port")
req() { # prints the seconds one completion of model $1 took
    curl -s -o /dev/null -w '%{time_total}' "http://127.0.0.1:$port/v1/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"model\": \"$1\", \"prompt\": \"Hello\", \"max_tokens\": 1, \"temperature\": 0}"
}
req A >/dev/null # warm-up
: >"$dir/switch"
for i in $(seq "$rounds"); do
    for m in B A; do
        cold=$(req $m)
        warm=$(req $m)
        echo "$m: switch request $cold s, loaded $warm s" >&2
        echo "$cold $warm" | awk '{print $1 - $2}' >>"$dir/switch"
    done
done
sort -n "$dir/switch" | awk '{v[NR] = $1} END {printf "switch (evict + load), median of %d: %.3f s (min %.3f, max %.3f)\n", NR, v[int((NR + 1) / 2)], v[1], v[NR]}'
grep -E 'loaded in|unloaded' "$dir/log" | tail -4 >&2
