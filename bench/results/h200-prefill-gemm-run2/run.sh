#!/usr/bin/env bash
# pgemm helper's device run: cuda.prefill_gemm tests, the prefill FP8 bench section, the layer bench A/B.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
C=/tmp/plumb-carry; rm -rf "$C" && cp -r "$PWD/build-carry-pgemm" "$C"
for f in "$C"/*.xz; do python3 -c "import lzma, sys; open(sys.argv[1][:-3], 'wb').write(lzma.open(sys.argv[1]).read())" "$f" && rm -f "$f"; done
chmod +x "$C"/plumb*
CUB=$(python3 -c "import nvidia.cublas as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$C/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${CUB:+:$CUB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$C/plumb" --version >/dev/null 2>&1 || export LD_LIBRARY_PATH="$C/lib-extra:$LD_LIBRARY_PATH"
built=$(grep -aoE -m1 '/[[:alnum:]_./-]*/tests/data' "$C/plumb_cuda_tests" | head -n 1 | sed 's#/tests/data$##')
if [ -n "$built" ] && [ ! -e "$built" ]; then mkdir -p "$(dirname "$built")" && ln -s "$PWD" "$built"; fi
FAST=cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,cuda.graph,attn.splitk_decode
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/run.log"; }
el "tests"
timeout ${T_TESTS:-150} "$C/plumb_cuda_tests" --gtest_color=no --gtest_filter="${GF:-CudaFp8Gemm.*:GpuTest.PrefillGemm*:Fixtures/GpuGolden.*_4:CudaBlas.*:GpuTest.GraphStepsMatchEager*}" >"$OUT/tests.txt" 2>&1
el "tests rc=$?"
for p in "$FAST" "$FAST,cuda.prefill_gemm"; do
  timeout 60 "$C/plumb" verify-golden -q --backend cuda --patches "$p" tests/data/golden/kernel-dims >>"$OUT/golden.txt" 2>&1
  el "verify-golden kernel-dims [$p] rc=$?"
done
el "bench fp8prefill"
timeout ${T_BENCH:-120} "$C/plumb" bench --only fp8prefill --json "$OUT/bench.json" >"$OUT/bench.txt" 2>&1
el "bench rc=$?"
if [ -z "${NO_LAYERS:-}" ]; then
for alt in ",cuda.prefill_gemm" ""; do
  el "layer bench [FAST$alt]"
  timeout ${T_LAYERS:-110} "$C/plumb" bench --layers 2 --dir /tmp/plumb-layers --patches "$FAST$alt" --batches 1,8 --prefill 1024,8192 \
    >>"$OUT/layers.txt" 2>&1
  el "layer bench rc=$?"
done
fi
echo "==== summaries"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure|GEMM projections|free running|teacher forced|differs on|select differently' "$OUT/tests.txt" | head -80
grep -E "verify-golden:|prefill_gemm" "$OUT/golden.txt"
grep -E "bf16 GEMM rate|measured bandwidth" "$OUT/bench.txt"; sed -n '/prefill FP8 projections/,$p' "$OUT/bench.txt" | head -90; grep "^check" "$OUT/bench.txt"
grep -E "prefill|tok/s|backend cuda|^\| 1 " "$OUT/layers.txt" | head -40
cat "$OUT/run.log"
