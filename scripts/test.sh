#!/usr/bin/env bash
# test.sh - the whole test suite, as CI runs it:
#   1. Release build, every CTest test (unit, parity against npm reference
#      implementations, end-to-end);
#   2. the same suite under AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. a short libFuzzer run of every parser.
# Set PETREL_QUICK=1 to skip 2 and 3.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)

echo "== release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")

if [ "${PETREL_QUICK:-0}" != 1 ]; then
  echo "== ASan + UBSan build and tests"
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPETREL_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$jobs"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j"$jobs" -E "${PETREL_ASAN_EXCLUDE:-^$}")

  echo "== fuzz smoke"
  FUZZ_SECONDS="${FUZZ_SECONDS:-15}" scripts/fuzz-smoke.sh
fi
echo "test.sh: all passed"
