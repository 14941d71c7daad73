#!/usr/bin/env bash
# The CLI depends only on the public API (include/plumb/*) and its own files (src/cli/*): no quoted include of an
# internal header (src/model, src/toolkit, src/cuda, ...).
cd "$(dirname "$0")/../.."
bad=$(grep -n '#include "' src/cli/*.cpp src/cli/*.h | grep -v '#include "cli/\|#include "plumb/')
if [ -n "$bad" ]; then
  echo "src/cli includes internal headers:"
  echo "$bad"
  exit 1
fi
echo "public_api_only: src/cli includes only plumb/ and cli/ headers"
