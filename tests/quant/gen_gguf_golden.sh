#!/usr/bin/env bash
# gen_gguf_golden.sh - regenerates tests/quant/data/gguf_golden.json from
# llama.cpp's reference quantizers (libggml-base.so in the npm package
# @node-llama-cpp/linux-x64).  Needs npm and a C compiler; run by hand when
# the cases change, and commit the JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
pkg="@node-llama-cpp/linux-x64@${NLC_VERSION:-3.22.1}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$pkg" >/dev/null && tar xzf ./*.tgz)
lib="$tmp/package/bins/linux-x64/libggml-base.so"
cc -O2 -o "$tmp/gen" tests/quant/gen_gguf_golden.c -ldl -lm
mkdir -p tests/quant/data
"$tmp/gen" "$lib" > tests/quant/data/gguf_golden.json
echo "wrote tests/quant/data/gguf_golden.json from $pkg ($(sed 's/.*"release":"\([^"]*\)".*/llama.cpp \1/' "$tmp/package/bins/linux-x64/_nlcBuildMetadata.json"))"
