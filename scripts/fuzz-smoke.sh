#!/usr/bin/env bash
# fuzz-smoke.sh - build every libFuzzer target and run each briefly on its
# seed corpus; exit 1 if any target fails to build, crashes, leaks, hangs on
# one input or runs out of memory.
#
#   scripts/fuzz-smoke.sh [SECONDS] [TARGET...]
#
# SECONDS per target: the argument, else $FUZZ_SECONDS, else 20.  TARGETs
# default to every fuzz/fuzz_*.c, so a new target needs no change here:
# add fuzz/fuzz_<name>.c (LLVMFuzzerTestOneInput) and seeds in
# fuzz/corpus/<name>/.  A comment line "fuzz-layer: <layer>" in the source
# links only petrel_<layer>; without one the target links petrel_all (see
# fuzz/CMakeLists.txt).
#
# The build (build-fuzz/, or $FUZZ_BUILD_DIR) uses clang with ASan+UBSan
# (PETREL_SANITIZE), no CUDA and no unit tests, and compiles every library
# with -fsanitize=fuzzer-no-link so that libFuzzer sees coverage inside the
# parsers, not just in the harness.  Each run works on a temporary copy of
# fuzz/corpus/<name>/ (the repository's seeds are never modified); inputs
# that crash are kept in build-fuzz/crashes/<name>/.  Extra libFuzzer flags
# go in $FUZZ_ARGS (e.g. FUZZ_ARGS="-max_len=65536").
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
secs=${1:-${FUZZ_SECONDS:-20}}
[ $# -gt 0 ] && shift
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in "$root"/fuzz/fuzz_*.c; do
        [ -e "$f" ] && targets+=("$(basename "$f" .c)")
    done
fi
[ ${#targets[@]} -gt 0 ] || { echo "fuzz-smoke: no fuzz/fuzz_*.c targets" >&2; exit 1; }

CC=${CC:-clang} cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DPETREL_FUZZ=ON -DPETREL_TESTS=OFF -DPETREL_SANITIZE=ON -DPETREL_CUDA=OFF \
    -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link" >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for t in "${targets[@]}"; do
    name=${t#fuzz_}
    if ! cmake --build "$build" --target "$t" -j "$(nproc)" >"$work/$t.build.log" 2>&1; then
        echo "fuzz-smoke: $t: build failed" >&2
        tail -20 "$work/$t.build.log" >&2
        failed+=("$t (build)")
        continue
    fi
    mkdir -p "$work/$name" "$build/crashes/$name"
    [ -d "$root/fuzz/corpus/$name" ] && cp -R "$root/fuzz/corpus/$name/." "$work/$name/"
    echo "fuzz-smoke: $t: ${secs}s on $(find "$work/$name" -type f | wc -l) seeds"
    # shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
    if "$build/fuzz/$t" -max_total_time="$secs" -timeout=25 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$build/crashes/$name/" ${FUZZ_ARGS:-} \
        "$work/$name" >"$work/$t.log" 2>&1; then
        grep -E 'DONE' "$work/$t.log" | sed "s/^/  /" || true
    else
        echo "fuzz-smoke: $t: FAILED (inputs in $build/crashes/$name/)" >&2
        tail -40 "$work/$t.log" >&2
        failed+=("$t")
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz-smoke: failed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz-smoke: all ${#targets[@]} targets ok"
