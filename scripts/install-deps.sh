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
SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: missing Debian packages: ${missing[*]}"
  echo "install-deps: fetching them now with apt-get (network: your Debian mirrors)${SUDO:+, through sudo}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Optional: headless Chromium for the report test (cli/bench_report_chromium,
# skipped without it).  A failed install only warns, so the build never
# depends on it.
if ! dpkg -s chromium >/dev/null 2>&1; then
  echo "install-deps: installing chromium (optional, for the bench report test)"
  { $SUDO apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; } ||
    echo "install-deps: warning: chromium did not install; cli/bench_report_chromium will be skipped"
fi
