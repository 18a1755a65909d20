#!/bin/sh
# run.sh - the chat-template parity test: install the pinned reference
# (npm ci into WORK_DIR, once), render the corpus with it, then have our
# renderer (JINJA_PARITY, built from jinja_parity.c) compare byte for byte.
#
# usage: run.sh JINJA_PARITY WORK_DIR
# Exits 77 (CTest: skipped) when node or npm is not installed.
set -eu
bin=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "jinja parity: node/npm not installed; skipping"
    exit 77
fi
mkdir -p "$work"
if ! cmp -s "$here/package-lock.json" "$work/package-lock.json" || [ ! -d "$work/node_modules/@huggingface/jinja" ]; then
    cp "$here/package.json" "$here/package-lock.json" "$work/"
    (cd "$work" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi
(cd "$work" && node "$here/render.mjs" "$work/expected.json")
exec "$bin" "$work/expected.json"
