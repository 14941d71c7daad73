#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds (Release, and ASan+UBSan), runs every test with CTest.
# README's second quick-start command and .ci/run both run exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
jobs=$(nproc)
# Each phase's time on stderr at its end (CI's log then shows where its minutes went).
phase() { echo "test.sh: $1 took $((SECONDS - t0)) s" >&2; t0=$SECONDS; }
t0=$SECONDS

# With nvcc present (CI has it, without a GPU) the CUDA backend is compiled too and its GPU tests skip cleanly.
# Without a visible GPU no kernel can run, so the kernels are compiled for checking only (PLUMB_CUDA_CHECK_ONLY:
# every compiler stage, the device optimizers low: they build in ~60 % of the time); with a GPU they are built
# optimized and their tests run.
cuda=OFF check_only=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; fi
if [ $cuda = ON ] && ! { nvidia-smi -L >/dev/null 2>&1 || [ -e /dev/nvidia0 ]; }; then check_only=ON; fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPLUMB_CUDA=$cuda -DPLUMB_CUDA_CHECK_ONLY=$check_only >/dev/null
cmake --build build -j "$jobs"
phase "the Release build"
ctest --test-dir build --output-on-failure -j "$jobs"
phase "the Release tests"

# The unit tests (loader, formats, sublayers, tokenizer, toolkit) and the fuzz corpora's replays (tests/fuzz) again
# under AddressSanitizer + UndefinedBehaviorSanitizer: corrupt and truncated files must never reach undefined
# behaviour; the public-API example (api.embed_example) and the server's tests (threads and lifetimes:
# plumb_server_tests) run there too. -O1 without debug info keeps this build short
# on 2 cores; the CLI-level tests above already ran the same code optimized.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O1 -DPLUMB_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs" --target sanitized_suite  # (plumb_tests, plumb_server_tests, fuzz_replays, embed_example)
phase "the ASan/UBSan build"
# (the CLI-driven tests need the plumb binary, which this build skips)
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -E '^(golden|fault|cli|toolkit)\.'
phase "the ASan/UBSan tests"
