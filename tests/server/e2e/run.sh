#!/bin/sh
# run.sh WORK_DIR PETREL_BIN [CLIENTS] [SCRIPT [ARGS...]] - the end-to-end
# suite of `petrel serve` (CTest server/e2e): installs the pinned npm
# packages (package-lock.json) into WORK_DIR, then runs e2e.test.mjs with
# node:test against PETREL_BIN; CLIENTS is the load test's concurrency
# (default 64).  With SCRIPT (e.g. load.mjs) runs that script instead.
# Exit 77 = skipped: node, npm or curl missing, or the registry unreachable.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
work=$(cd "$1" && pwd)
bin=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
clients=${3:-64}
shift 2
[ $# -gt 0 ] && shift

for tool in node npm curl; do
    if ! command -v $tool >/dev/null 2>&1; then
        echo "server e2e: $tool not found; skipped"
        exit 77
    fi
done
if ! cmp -s "$here/package-lock.json" "$work/installed.lock" || [ ! -d "$work/node_modules/openai" ]; then
    cp "$here/package.json" "$here/package-lock.json" "$work/"
    if ! (cd "$work" && npm ci --no-audit --no-fund --loglevel=error); then
        echo "server e2e: npm ci failed (registry unreachable?); skipped"
        exit 77
    fi
    cp "$here/package-lock.json" "$work/installed.lock"
fi
cp "$here"/*.mjs "$work/"

export PETREL_BIN="$bin" PETREL_SOURCE_DIR="$here/../../.." E2E_CLIENTS="$clients" E2E_OUT="$work/load.json"
cd "$work"
if [ $# -gt 0 ]; then
    script=$1
    shift
    exec node "$script" "$@"
fi
exec node --test --test-concurrency=1 --test-reporter=spec ./*.test.mjs
