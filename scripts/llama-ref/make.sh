#!/usr/bin/env bash
# make.sh - llama.cpp as a reference for GGUF model families.
#
#   scripts/llama-ref/make.sh env     unpack the anchor llama.cpp (prebuilt CPU
#                                     tools, headers, gguf-py) into build-llama/
#                                     and build build-llama/llama-ref-logits;
#                                     prints the PYTHONPATH and python to use
#   scripts/llama-ref/make.sh gguf-py  only unpack gguf-py (what dummy_gguf.py
#                                     needs; tests/model's dummy cases run it)
#   scripts/llama-ref/make.sh logits MODEL.gguf N_GREEDY IDS [IDS...]
#                                     llama.cpp's logits for those token ids
#                                     (llama_ref_logits.c says what is printed)
#
# The fixture generators (scripts/llama-ref/*.py: numpy and llama.cpp's
# gguf-py, from Debian's python3-numpy) write small random-weight GGUF files
# in llama.cpp's layout and record this tool's output as the reference the
# tests compare Petrel against.  Needs the anchors (../shared/anchors, or
# $ANCHORS); CI does not run it: the fixtures are committed.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=build-llama
lcpp=$dir/llama.cpp-cpu
src=$dir/llama.cpp

find_anchors() {
  for a in "${ANCHORS:-}" ../shared/anchors ../../shared/anchors /work/shared/anchors; do
    [ -n "$a" ] && [ -f "$a/llama.cpp-34af94cd-cpu-debian12.tar.xz" ] && { echo "$a"; return; }
  done
  echo "make.sh: no anchors folder (set ANCHORS=path/to/shared/anchors)" >&2
  exit 1
}

prepare() {
  local anchors
  mkdir -p $dir
  if [ ! -x $lcpp/llama-bench ]; then
    anchors=$(find_anchors)
    tar -C $dir -xJf "$anchors/llama.cpp-34af94cd-cpu-debian12.tar.xz"
  fi
  if [ ! -f $src/include/llama.h ] || [ ! -d $src/gguf-py ]; then
    anchors=$(find_anchors)
    tar -C $dir -xJf "$anchors/llama.cpp-34af94cd-src.tar.xz" --wildcards \
      '*/include/*' '*/gguf-py/*'
  fi
  if [ ! -x $dir/llama-ref-logits ] || [ scripts/llama-ref/llama_ref_logits.c -nt $dir/llama-ref-logits ]; then
    cc -O2 -std=c11 -Wall -o $dir/llama-ref-logits scripts/llama-ref/llama_ref_logits.c \
      -I$src/include -I$src/ggml/include -L$lcpp -lllama -lggml -lggml-base \
      -Wl,-rpath,"$(cd $lcpp && pwd)"
  fi
  /usr/bin/python3 -c 'import numpy' 2>/dev/null ||
    { echo "make.sh: needs numpy for /usr/bin/python3: apt-get install python3-numpy" >&2; exit 1; }
}

case "${1:-}" in
  gguf-py)
    if [ ! -d $src/gguf-py ]; then
      mkdir -p $dir
      tar -C $dir -xJf "$(find_anchors)/llama.cpp-34af94cd-src.tar.xz" --wildcards '*/gguf-py/*'
    fi
    ;;
  env)
    prepare
    echo "PYTHONPATH=$(cd $src/gguf-py && pwd) /usr/bin/python3"
    echo "LLAMA_CPP_DIR=$(cd $lcpp && pwd) $(cd $dir && pwd)/llama-ref-logits MODEL.gguf N_GREEDY IDS..."
    ;;
  logits)
    shift
    prepare
    LLAMA_CPP_DIR=$lcpp $dir/llama-ref-logits "$@" 2> >(grep -v '^llama_\|^load\|^print_info\|^\.\|^graph\|^sched\|^set_abort' >&2)
    ;;
  *)
    sed -n '2,19p' "$0"
    exit 2
    ;;
esac
