#!/usr/bin/env bash
# The CLI and the server depend only on the public API (include/plumb/*) and their own files: src/cli/* may include
# plumb/, cli/ and server/ headers, src/server/* plumb/ and server/ ones; no include of an internal header (src/model,
# src/toolkit, src/cuda, ...), quoted or angled (both have src/ on their include path for their own headers, so
# <model/model.h> would compile too). Angled includes of the libraries (<fmt/...>, <CLI/...>, <httplib.h>) are fine.
cd "$(dirname "$0")/../.."
internal=$(cd src && find . -mindepth 1 -maxdepth 1 -type d ! -name cli ! -name server -printf '%f\n' | paste -sd'|')
bad=$({
  grep -n '#include "' src/cli/*.cpp src/cli/*.h | grep -v '#include "cli/\|#include "plumb/\|#include "server/'
  grep -n '#include "' src/server/*.cpp src/server/*.h | grep -v '#include "plumb/\|#include "server/'
  grep -nE "#include <($internal)/" src/cli/*.cpp src/cli/*.h src/server/*.cpp src/server/*.h
})
if [ -n "$bad" ]; then
  echo "src/cli or src/server includes internal headers:"
  echo "$bad"
  exit 1
fi
echo "public_api_only: src/cli and src/server include only plumb/, cli/ and server/ headers"
