#!/bin/sh
# version_flags.sh PETREL_BIN - `petrel --version` / `petrel version`, the
# spellings llama.cpp users type, and the man page made from the help text
# (CTest cli/version_flags, issue 18 item 6):
#   - --version and `version` print the same lines: version, commit, build
#     type, CUDA on/off, CPU kernels;
#   - -p/--prompt, -c/--ctx-size, -ngl 0 give the same greedy text as the
#     Petrel spellings; -ngl N > 0 means cuda (an error naming CUDA in a
#     build without it), and contradicting --device is an error; a prompt
#     given twice is refused;
#   - --help says which llama.cpp spellings are accepted;
#   - scripts/gen-man.sh writes a page that groff reads without a warning,
#     with a section per command and every flag of serve in it.
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

# --- version ----------------------------------------------------------------
"$bin" --version >"$tmp/v1" 2>&1 || fail "--version exited $?"
"$bin" version >"$tmp/v2" 2>&1 || fail "version exited $?"
cmp -s "$tmp/v1" "$tmp/v2" || fail "--version and version differ"
head -n 1 "$tmp/v1" | grep -Eq '^petrel [0-9]+\.[0-9]+\.[0-9]+$' || fail "first line: $(head -n 1 "$tmp/v1")"
grep -Eq '^commit: +[0-9a-f]{12}(-dirty)?$|^commit: +unknown$' "$tmp/v1" || fail "no commit line"
grep -Eq '^build: +(Release|Debug|RelWithDebInfo|MinSizeRel)$' "$tmp/v1" || fail "no build line"
grep -Eq '^cuda: +(on|off)' "$tmp/v1" || fail "no cuda line"
grep -Eq '^cpu kernels: .*this CPU: (avx512|avx2|portable)' "$tmp/v1" || fail "no cpu kernels line"
"$bin" version extra >/dev/null 2>&1 && fail "version took an argument"

# --- llama.cpp spellings ------------------------------------------------------
gen() { "$bin" generate --temp 0 -n 24 --no-echo -t 1 "$@" 2>"$tmp/err"; }
gen --ctx 64 "Once upon a time" >"$tmp/ref" || fail "reference generate failed: $(cat "$tmp/err")"
[ -s "$tmp/ref" ] || fail "reference output is empty"
for args in "-p|Once upon a time|-c|64" "--prompt|Once upon a time|--ctx-size|64" \
            "-ngl|0|--ctx|64|Once upon a time" "--gpu-layers|0|-c|64|Once upon a time" \
            "--n-gpu-layers|0|-p|Once upon a time|-c|64"; do
    old_ifs=$IFS
    IFS='|'
    # shellcheck disable=SC2086
    gen $args >"$tmp/out"
    st=$?
    IFS=$old_ifs
    [ $st -eq 0 ] || fail "generate $args exited $st: $(cat "$tmp/err")"
    cmp -s "$tmp/ref" "$tmp/out" || fail "generate $args: output differs from the reference"
done
gen -p "Once" "upon" >/dev/null && fail "a prompt given twice was accepted"
grep -q "given twice" "$tmp/err" || fail "prompt twice: $(cat "$tmp/err")"
gen -ngl 1 --device cpu "Once" >/dev/null && fail "-ngl 1 --device cpu was accepted"
grep -qF -- "-ngl 1 means --device cuda" "$tmp/err" || fail "-ngl vs --device: $(cat "$tmp/err")"
gen -ngl -1 "Once" >/dev/null && fail "-ngl -1 was accepted"
grep -qF "out of range" "$tmp/err" || fail "-ngl -1: $(cat "$tmp/err")"
if grep -q '^cuda: *off' "$tmp/v1"; then
    gen -ngl 99 "Once" >/dev/null && fail "-ngl 99 ran without CUDA"
    grep -q "no CUDA backend" "$tmp/err" || fail "-ngl 99 without CUDA: $(cat "$tmp/err")"
fi
"$bin" --help | grep -q "llama.cpp" || fail "petrel --help does not mention llama.cpp"
for c in generate serve; do
    "$bin" $c --help >"$tmp/help" || fail "$c --help exited $?"
    for f in "--ctx-size" "--gpu-layers" "-ngl" "--host" "llama"; do
        [ $c = generate ] && [ $f = --host ] && continue
        grep -qF -- "$f" "$tmp/help" || fail "$c --help lacks $f"
    done
done
"$bin" generate --help | grep -qF -- "-p, --prompt" || fail "generate --help lacks -p, --prompt"

# --- the man page -------------------------------------------------------------
here=$(cd "$(dirname "$0")" && pwd)
sh "$here/../../scripts/gen-man.sh" "$bin" "$tmp/petrel.1" || fail "gen-man.sh exited $?"
for c in generate tokenize bench eval convert serve kvcodec; do
    grep -q "^\.SS petrel $c\$" "$tmp/petrel.1" || fail "man page has no section for $c"
done
"$bin" serve --help | sed -n 's/^ *\(-., \)\{0,1\}--\([a-z-]*\) .*/\2/p' >"$tmp/flags"
[ "$(wc -l <"$tmp/flags")" -gt 20 ] || fail "could not list serve's flags"
while read -r f; do
    grep -qF -- "\\-\\-$(printf %s "$f" | sed 's/-/\\-/g')" "$tmp/petrel.1" || fail "man page lacks --$f"
done <"$tmp/flags"
if command -v groff >/dev/null 2>&1; then
    warn=$(groff -man -Tutf8 -ww -z "$tmp/petrel.1" 2>&1)
    [ -z "$warn" ] || fail "groff warns: $warn"
    groff -man -Tutf8 "$tmp/petrel.1" 2>/dev/null | grep -q "gpu-layers" || fail "rendered page lacks gpu-layers"
fi

[ $fails -eq 0 ] && echo "version_flags: all passed"
exit $((fails > 0))
