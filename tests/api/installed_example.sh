#!/bin/sh
# installed_example.sh BUILD_DIR SOURCE_DIR [SANITIZE] - libpetrel as a user
# gets it (CTest api/installed_example, issue 18 item 3):
#   - `cmake --install BUILD_DIR --prefix TMP` puts libpetrel.so, libpetrel.a,
#     include/petrel/petrel.h, lib/pkgconfig/petrel.pc and petrel.1 there;
#   - the example of docs/api.md (the C block after "<!-- example.c -->")
#     builds with `pkg-config --cflags --libs petrel` against TMP only, runs
#     on models/stories260K.gguf and prints `greedy batched == alone: yes`;
#     linked with libpetrel.a it prints the same;
#   - libpetrel.so exports exactly the header's PETREL_API functions;
#   - petrel.h compiles alone as C99 -pedantic (and as C++ if there is one).
# SANITIZE=1: the build has ASan/UBSan, so the example is built with them.
set -u
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
san=${3:-0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
command -v pkg-config >/dev/null 2>&1 || { echo "pkg-config not found; skipped"; exit 77; }
cc=${CC:-cc}
extra=""
[ "$san" = 1 ] && extra="-fsanitize=address,undefined"

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || {
    cat "$tmp/install.log"
    fail "cmake --install failed"
    exit 1
}
libdir=$(dirname "$(find "$prefix" -name petrel.pc | head -n 1)")/..
for f in "$libdir/libpetrel.so" "$libdir/libpetrel.a" "$prefix/include/petrel/petrel.h" \
         "$libdir/pkgconfig/petrel.pc" "$prefix/share/man/man1/petrel.1" "$prefix/bin/petrel"; do
    [ -e "$f" ] || fail "not installed: ${f#"$prefix"/}"
done
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --exists petrel || fail "pkg-config does not find petrel"
[ "$(pkg-config --modversion petrel)" = "$("$prefix/bin/petrel" --version | sed -n '1s/^petrel //p')" ] ||
    fail "petrel.pc's version is not petrel --version's"
# the flags must point into the temporary prefix, not the build or source tree
case "$(pkg-config --cflags --libs petrel)" in
*"$build"* | *"$src/include"*) fail "pkg-config points outside the prefix: $(pkg-config --cflags --libs petrel)" ;;
esac

# the example, exactly as docs/api.md shows it
awk '/^<!-- example.c -->$/ {on = 1; next} on && /^```c$/ {inside = 1; next}
     inside && /^```$/ {exit} inside {print}' "$src/docs/api.md" >"$tmp/example.c"
[ "$(wc -l <"$tmp/example.c")" -gt 50 ] || fail "no example found in docs/api.md"

model=$src/models/stories260K.gguf
check_run() { # $1: binary, $2: label
    "$1" "$model" >"$tmp/out.$2" 2>"$tmp/err.$2"
    st=$?
    [ $st -eq 0 ] || fail "$2 example exited $st: $(cat "$tmp/err.$2")"
    grep -q "^greedy batched == alone: yes$" "$tmp/out.$2" || fail "$2 example: $(cat "$tmp/out.$2")"
    grep -Eq "^[0-9]+ tokens: 1 " "$tmp/out.$2" || fail "$2 example printed no token ids"
    [ "$(grep -c '^\[[0-3]\] ' "$tmp/out.$2")" -eq 4 ] || fail "$2 example: not four answers"
}
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Wextra -Werror $extra -o "$tmp/example" "$tmp/example.c" \
    $(pkg-config --cflags --libs petrel) -pthread -Wl,-rpath,"$libdir" 2>"$tmp/cc.log" ||
    fail "the example does not build: $(cat "$tmp/cc.log")"
if [ -x "$tmp/example" ]; then
    ldd "$tmp/example" | grep -q "$prefix.*libpetrel.so" || fail "the example did not link the installed libpetrel.so"
    check_run "$tmp/example" shared
fi
# shellcheck disable=SC2046
$cc -std=c11 -Wall $extra -o "$tmp/example-static" "$tmp/example.c" $(pkg-config --cflags petrel) \
    "$libdir/libpetrel.a" $(pkg-config --static --libs petrel | sed 's/-lpetrel\b//') -pthread \
    2>"$tmp/cc-static.log" || fail "the example does not link statically: $(cat "$tmp/cc-static.log")"
if [ -x "$tmp/example-static" ]; then
    ldd "$tmp/example-static" | grep -q libpetrel && fail "the static example still needs libpetrel.so"
    check_run "$tmp/example-static" static
    cmp -s "$tmp/out.shared" "$tmp/out.static" || fail "static and shared examples print differently"
fi

# visibility: the dynamic symbols are the header's functions, no more, no fewer
sed -n 's/^PETREL_API .*[ *]\(petrel_[a-z_]*\)(.*/\1/p' "$prefix/include/petrel/petrel.h" | sort >"$tmp/api"
nm -D --defined-only "$libdir/libpetrel.so" | awk '{print $3}' | grep -v '^_' | sort >"$tmp/exported"
[ "$(wc -l <"$tmp/api")" -ge 14 ] || fail "could not read the API from petrel.h"
cmp -s "$tmp/api" "$tmp/exported" || fail "exported symbols differ from the header: $(diff "$tmp/api" "$tmp/exported" | tr '\n' ' ')"

# the header on its own
printf '#include <petrel/petrel.h>\nint main(void) { return petrel_version() == 0; }\n' >"$tmp/h.c"
$cc -std=c99 -pedantic -Wall -Werror -fsyntax-only -I"$prefix/include" "$tmp/h.c" || fail "petrel.h is not C99"
if command -v c++ >/dev/null 2>&1; then
    c++ -x c++ -Wall -Werror -fsyntax-only -I"$prefix/include" "$tmp/h.c" || fail "petrel.h is not C++"
fi

[ $fails -eq 0 ] && echo "installed_example: all passed" && cat "$tmp/out.shared"
exit $((fails > 0))
