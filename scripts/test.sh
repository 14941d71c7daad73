#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds (Release, and ASan+UBSan), runs every test with CTest.
# README's second quick-start command and .ci/run both run exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
jobs=$(nproc)

# With nvcc present (CI has it, without a GPU) the CUDA backend is compiled too and its GPU tests skip cleanly.
cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPLUMB_CUDA=$cuda >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer (the loader must survive corrupt files).
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPLUMB_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
