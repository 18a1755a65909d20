#!/bin/sh
# tensor_parallel.sh PETREL_BIN - `--tensor-parallel N` as a user types it
# (CTest cli/tensor_parallel, docs/tensor-parallel.md):
#   - generate on the cpu with stories260K (8 heads, 4 KV heads, 172 FFN
#     rows) gives the same greedy text at N = 2 and 4 as without the flag,
#     and at N = 1 (today's path);
#   - bench runs a split dummy model (prefill and decode);
#   - N = 8 is refused naming what does not split (172 FFN rows), N = 0
#     names the flag's range, and N = 2 on cuda names the devices it needs
#     and how many it found.
# Runs from the source tree (models/).
set -u
bin=$1
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

gen() { # N: greedy text of the reference prompt at N ranks ("" for no flag)
    flag=""
    [ -n "$1" ] && flag="--tensor-parallel $1"
    # shellcheck disable=SC2086
    "$bin" generate $flag -n 40 --temp 0 -p "Once upon a time" 2>"$tmp/err.$1"
}

gen "" >"$tmp/out.whole" || fail "generate without the flag exited $?"
grep -q "Lily" "$tmp/out.whole" || fail "unexpected reference text: $(cat "$tmp/out.whole")"
for n in 1 2 4; do
    gen $n >"$tmp/out.$n" || fail "generate --tensor-parallel $n exited $?: $(cat "$tmp/err.$n")"
    cmp -s "$tmp/out.whole" "$tmp/out.$n" || fail "--tensor-parallel $n: $(cat "$tmp/out.$n")"
done

"$bin" bench -m dummy:tests/model/tp/dense.json --dummy-dtype q8_0 --tensor-parallel 4 -p 16 \
    -d 0 -g 4 -r 1 >"$tmp/bench" 2>&1 || fail "bench --tensor-parallel 4 exited $?: $(cat "$tmp/bench")"
grep -q "decode" "$tmp/bench" || fail "bench printed no decode row"

if "$bin" generate --tensor-parallel 8 -n 4 -p "Once" >/dev/null 2>"$tmp/e8"; then
    fail "--tensor-parallel 8 was accepted"
fi
grep -q "FFN intermediate rows (172) do not split evenly over 8 ranks" "$tmp/e8" ||
    fail "--tensor-parallel 8: $(cat "$tmp/e8")"

if "$bin" generate --tensor-parallel 0 -n 4 -p "Once" >/dev/null 2>"$tmp/e0"; then
    fail "--tensor-parallel 0 was accepted"
fi
grep -q "tensor-parallel" "$tmp/e0" || fail "--tensor-parallel 0: $(cat "$tmp/e0")"

# With fewer GPUs than ranks (none here, or one on the GPU machine), the
# error names both counts; a build without CUDA finds 0.
if "$bin" generate --device cuda --tensor-parallel 64 -n 4 -p "Once" >/dev/null 2>"$tmp/ec"; then
    fail "--device cuda --tensor-parallel 64 was accepted"
fi
grep -Eq "needs 64 CUDA devices, found [0-9]+" "$tmp/ec" || fail "cuda x64: $(cat "$tmp/ec")"

[ "$fails" -eq 0 ] && echo "tensor_parallel: all passed"
exit "$fails"
