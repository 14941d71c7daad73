#!/usr/bin/env bash
# The CLI depends only on the public API (include/plumb/*) and its own files (src/cli/*): no include of an internal
# header (src/model, src/toolkit, src/cuda, ...), quoted or angled (the CLI has src/ on its include path for its own
# cli/ headers, so <model/model.h> would compile too). Angled includes of the libraries (<fmt/...>, <CLI/...>, <vector>) are fine.
cd "$(dirname "$0")/../.."
internal=$(cd src && find . -mindepth 1 -maxdepth 1 -type d ! -name cli -printf '%f\n' | paste -sd'|')
bad=$({
  grep -n '#include "' src/cli/*.cpp src/cli/*.h | grep -v '#include "cli/\|#include "plumb/'
  grep -nE "#include <($internal)/" src/cli/*.cpp src/cli/*.h
})
if [ -n "$bad" ]; then
  echo "src/cli includes internal headers:"
  echo "$bad"
  exit 1
fi
echo "public_api_only: src/cli includes only plumb/ and cli/ headers"
