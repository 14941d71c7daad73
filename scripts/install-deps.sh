#!/usr/bin/env bash
# Installs plumb's dependencies from Debian packages (run as root or with sudo on a fresh Debian 12 machine).
#   scripts/install-deps.sh          what the build and `plumb` need
#   scripts/install-deps.sh --test   also what the test suite drives (headless Chromium, tmux)
set -euo pipefail
pkgs=(
  build-essential cmake pkg-config # C++20 compiler and the build
  googletest libgtest-dev libgmock-dev  # unit tests
  nlohmann-json3-dev               # config.json, safetensors headers, golden.json, tokenizer.json
  libcli11-dev                     # the command line
  libfmt-dev                       # formatting of messages and tables
  libpcre2-dev                     # Unicode regex for the tokenizer's pre-tokenizer
  libcpp-httplib-dev               # plumb serve's HTTP server (OpenAI-compatible API)
  python3                          # test scripts that edit fixture copies (tests/cli, tests/toolkit)
)
if [ "${1:-}" = "--test" ]; then
  pkgs+=(
    chromium                       # renders plumb diff --html in a headless screenshot test
    tmux                           # drives plumb chat through a pseudo-terminal
  )
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
