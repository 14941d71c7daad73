#!/usr/bin/env bash
# One run on the GPU machine (the device tool): the CUDA tests, `plumb bench`, an ncu profile of the main kernels
# and compute-sanitizer on a subset of the tests, with the binaries built on the development machine and carried
# in build-carry/ (bin + the two shared libraries the image may lack). Everything is logged under $OUT (7 files:
# the device tool returns at most 8); the last
# lines printed are the summaries. Each step has its own time limit, and a failing step does not stop the next.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
C=$PWD/build-carry
export LD_LIBRARY_PATH="$C/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T_TESTS=${T_TESTS:-110} T_BENCH=${T_BENCH:-100} T_NCU=${T_NCU:-45} T_SAN=${T_SAN:-30}
note() { echo "== $*" | tee -a "$OUT/run.log"; }

{ date; uname -a; head -2 /etc/os-release; ldd --version | head -1; nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE | head -60; } \
  >"$OUT/env.txt" 2>&1
if ! "$C/plumb" --version >>"$OUT/run.log" 2>&1; then
  note "carried plumb does not start; retrying with the carried libstdc++"
  export LD_LIBRARY_PATH="$C/lib-extra:$LD_LIBRARY_PATH"
  "$C/plumb" --version >>"$OUT/run.log" 2>&1 || note "carried plumb still does not start"
fi

note "tests"
timeout "$T_TESTS" "$C/plumb_cuda_tests" --gtest_color=no >"$OUT/tests.txt" 2>&1
note "tests rc=$?"

note "bench"
timeout "$T_BENCH" "$C/plumb" bench --json "$OUT/bench.json" >"$OUT/bench.txt" 2>&1
note "bench rc=$?"

note "ncu"
timeout "$T_NCU" ncu --clock-control none -k 'regex:gemv_kernel|router_kernel' --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy \
  --section LaunchStats "$C/plumb" bench --profile >"$OUT/ncu.txt" 2>&1
note "ncu rc=$?"

note "compute-sanitizer"
{
  timeout "$T_SAN" compute-sanitizer --tool memcheck --error-exitcode 9 "$C/plumb_cuda_tests" --gtest_color=no \
    --gtest_filter='CudaMoe.RoutedMoe*:CudaFp8.Grouped*:CudaRouter.*'
  echo "memcheck rc=$?"
  timeout "$T_SAN" compute-sanitizer --tool racecheck --error-exitcode 9 "$C/plumb_cuda_tests" --gtest_color=no \
    --gtest_filter='CudaMoe.RoutedMoe*'
  echo "racecheck rc=$?"
} >"$OUT/sanitizer.txt" 2>&1
note "$(grep -E 'rc=|ERROR SUMMARY' "$OUT/sanitizer.txt" | tr '\n' ' ')"

echo; echo "==== test summary"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |normalized|Failure|error' "$OUT/tests.txt" | grep -vE 'tol [0-9.e-]+\]$' | tail -25
grep -cE 'normalized' "$OUT/tests.txt" | sed 's/^/comparisons printed: /'
echo "==== bench"
tail -n 60 "$OUT/bench.txt"
