#!/usr/bin/env bash
# test.sh - the whole test suite, as CI runs it:
#   1. Release build, every CTest test (unit, parity against npm reference
#      implementations, end-to-end);
#   2. the same suite under AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. a short libFuzzer run of every parser.
# Set PETREL_QUICK=1 to skip 2 and 3.
#
# It says before it touches the network: install-deps.sh names the Debian
# packages it would fetch with apt-get, and the npm packages the parity and
# end-to-end tests install are listed before the first ctest run.  After
# each ctest run it lists the tests that did not run and the reason each
# gave (CUDA tests exit 77 without a GPU, npm tests without node or the
# registry), so "100% tests passed" never hides a skipped test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)

# The npm packages each suite installs (npm ci from its package-lock.json)
# unless its work directory already has them.
announce_npm() {
  command -v node >/dev/null || return 0
  echo "test.sh: the parity and end-to-end tests run 'npm ci' (network: the npm registry) the first"
  echo "  time, or when a package-lock.json changed, to install into the build tree:"
  local f
  for f in tests/server/e2e/package.json tests/parity/tokenizer/package.json tests/parity/jinja/package.json; do
    [ -f "$f" ] || continue
    echo "    ${f%/package.json}: $(node -e '
      const p = require(process.argv[1]);
      const d = Object.assign({}, p.dependencies, p.devDependencies);
      console.log(Object.entries(d).map(([k, v]) => k + "@" + v).join(" "));' "$PWD/$f")"
  done
}

# Lists the tests of the last ctest run in build dir $1 that did not run,
# with the reason each printed (its last line that says "skip", else its
# last line), from the JUnit report ctest wrote.
report_skipped() {
  local xml=$1/ctest-junit.xml
  [ -f "$xml" ] || return 0
  awk '
    function unxml(s) {
      gsub(/&lt;/, "<", s); gsub(/&gt;/, ">", s); gsub(/&quot;/, "\"", s);
      gsub(/&apos;/, "\047", s); gsub(/&amp;/, "\\&", s); return s
    }
    /<testcase / {
      name = $0; sub(/.*<testcase name="/, "", name); sub(/".*/, "", name)
      notrun = ($0 ~ /status="(notrun|disabled)"/); why = ""; last = ""; said = ""; inout = 0
    }
    notrun && /<skipped message="/ { why = $0; sub(/.*<skipped message="/, "", why); sub(/".*/, "", why) }
    notrun && /<system-out>/ { inout = 1; sub(/.*<system-out>/, "") }
    notrun && inout {
      line = $0; end = sub(/<\/system-out>.*/, "", line)
      if (line ~ /[^ \t]/) { last = line; if (tolower(line) ~ /skip/) said = line }
      if (end) inout = 0
    }
    /<\/testcase>/ && notrun {
      reason = said != "" ? said : last != "" ? last : why
      printf "    %-28s %s\n", name, unxml(reason); notrun = 0
    }
  ' "$xml" | {
    out=$(cat)
    [ -z "$out" ] && return 0
    echo "test.sh: $(printf '%s\n' "$out" | wc -l) test(s) did not run in $1; each one's reason:"
    printf '%s\n' "$out"
  }
}

run_ctest() {
  local dir=$1; shift
  local rc=0
  (cd "$dir" && "$@" --output-junit ctest-junit.xml) || rc=$?
  report_skipped "$dir"
  return $rc
}

echo "== release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
announce_npm
run_ctest build ctest --output-on-failure -j"$jobs"

if [ "${PETREL_QUICK:-0}" != 1 ]; then
  echo "== ASan + UBSan build and tests"
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPETREL_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    run_ctest build-asan ctest --output-on-failure -j"$jobs" -E "${PETREL_ASAN_EXCLUDE:-^$}"

  echo "== fuzz smoke"
  FUZZ_SECONDS="${FUZZ_SECONDS:-15}" scripts/fuzz-smoke.sh
fi
echo "test.sh: all passed"
