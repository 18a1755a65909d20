#!/bin/sh
# run_parity.sh WORK_DIR TOK_PARITY - the tokenizer parity test (CTest
# tokenizer/parity): pinned npm packages into WORK_DIR, the seeded corpus,
# reference ids from node, then the C comparison.  Exit 77 = skipped (no
# node, or the registry is unreachable); the reference ids are reused while
# the corpus, the scripts and the lock file are unchanged.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$1
bin=$2
mkdir -p "$work"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "tokenizer parity: node/npm not found; skipped"
    exit 77
fi

if ! cmp -s "$here/package-lock.json" "$work/installed.lock" ||
   [ ! -d "$work/node_modules/@lenml/tokenizers" ]; then
    cp "$here/package.json" "$here/package-lock.json" "$work/"
    if ! (cd "$work" && npm ci --no-audit --no-fund --loglevel=error); then
        echo "tokenizer parity: npm ci failed (registry unreachable?); skipped"
        exit 77
    fi
    cp "$here/package-lock.json" "$work/installed.lock"
fi

cp "$here/gen_corpus.mjs" "$here/reference.mjs" "$work/"
node "$work/gen_corpus.mjs" "$work/corpus.json"
stamp=$(cat "$work/corpus.json" "$here/reference.mjs" "$here/package-lock.json" | cksum)
if [ ! -f "$work/ref/stamp" ] || [ "$(cat "$work/ref/stamp")" != "$stamp" ]; then
    rm -rf "$work/ref"
    node "$work/reference.mjs" "$work/corpus.json" "$work/ref"
    echo "$stamp" > "$work/ref/stamp"
fi
exec "$bin" "$work/corpus.json" "$work/ref" llama3 qwen3 gemma3 llama2 llama3-gguf qwen3-gguf
