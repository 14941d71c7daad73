#!/usr/bin/env bash
# indexer-decode (branch of /work/wt-indexer): the CUDA tests, the layer bench and ncu of one decode step on the
# new binaries (bench/gpu_forward.sh), then the timing tests of the baseline binary (main + the IndexerTiming test).
set -u
# (lib-extra travels as a tar.xz: the tree plus the carry must stay under 64 MiB)
[ -d build-carry-indexer/lib-extra ] || python3 -c "import tarfile; tarfile.open('build-carry-indexer/lib-extra.tar.xz').extractall('build-carry-indexer')"
export CARRY=build-carry-indexer SKIP_CHECKS=1 NCU=1 LAYERS=2 LAYER_BATCHES=1 LAYER_PREFILL=0 T_LAYERS_REF=1
export GTEST_FILTER='GpuTest.*:Fixtures/*:Modes/*:AttentionSplitPlan.*:CudaNumerics.*:CudaBackend.*'
export NCU_PATCHES=cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,attn.splitk_decode
bash bench/gpu_forward.sh > "$OUT/summary.txt" 2>&1
C=/tmp/plumb-carry
CUB=$(python3 -c "import nvidia.cublas as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$C/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${CUB:+:$CUB}"
"$C/plumb" --version >/dev/null 2>&1 || export LD_LIBRARY_PATH="$C/lib-extra:$LD_LIBRARY_PATH"
timeout 120 "$C/plumb_cuda_tests_base" --gtest_color=no --gtest_filter='*IndexerTiming*:*IndexTopkTiming*' >"$OUT/base-timing.txt" 2>&1
echo "base timing rc=$?" >> "$OUT/base-timing.txt"
echo "==== new: tests"; grep -E "^\[  (PASSED|FAILED|SKIPPED)|^\[  FAILED|Failure|indexer|index-exact|tests ran" "$OUT/tests.txt" | head -30
echo "==== new: timing"; grep -A24 "^\[ RUN      \] GpuTest.Index.*Timing" "$OUT/tests.txt" | grep -vE "RUN|OK \]" | head -60
echo "==== base: timing"; grep -vE "RUN|OK \]|^Running|^Note|^\[----|^\[====" "$OUT/base-timing.txt" | head -60
echo "==== ncu (indexer)"; grep -iE "one forward|index|fused|select" "$OUT/ncu-step.txt" | head -20
echo "==== layers"; grep -E "batch 1:" "$OUT/layers-fast.txt" | head -3
gzip -f "$OUT/tests.txt"; rm -f "$OUT/layers-ref.txt" "$OUT/layers-fast.json"
