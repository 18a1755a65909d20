#!/usr/bin/env bash
# install-deps.sh - the Debian packages Petrel builds and tests with.
# Safe to run again; uses sudo when not root.
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang libclang-rt-14-dev
      libjansson-dev libevent-dev libpcre2-dev libutf8proc-dev libcmocka-dev
      libxxhash-dev libzstd-dev nodejs npm curl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# node/npm may come from outside Debian (a newer Node.js): accept what works.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -ra missing <<<"${missing[*]}"
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "install-deps: missing Debian packages: ${missing[*]}"
echo "install-deps: fetching them now with apt-get (network: your Debian mirrors)${SUDO:+, through sudo}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
