// plumb::forward_batch on the GPU: a step of several sessions (the rows share every launch but the attention, which
// runs per session on its own caches) against each session's own steps, in the launch modes a session runs.
#include <gtest/gtest.h>

#include <string>

#include "cuda_test_util.h"
#include "plumb/engine.h"
#include "session_test_util.h"

namespace {

using plumb_cuda_test::GpuTest;

// Without patches every kernel is an fp32 twin whose rows do not depend on the chunk: the same bits. Under
// cuda.fast the batch's rows take the batched GEMV / MXFP4 kernels and the single steps the one-token paths (fused
// projections, the hc fold, the deferred compressors), whose fp32 sums run in other orders: within 2e-3 of logits of
// magnitude ~1-10 (measured on an H100: see the test's printed figure; the patch registry allows cuda.fast 5e-2 against
// the CPU reference).
TEST_F(GpuTest, ForwardBatchRowsAreEachSessionsOwnStep) {
  plumb_test::check_forward_batch(*plumb_test::csa_long_engine("cuda", ""), 0.0f, "cuda []");
  plumb_test::check_forward_batch(*plumb_test::csa_long_engine("cuda", "cuda.graph"), 0.0f, "cuda [cuda.graph]");
  plumb_test::check_forward_batch(*plumb_test::csa_long_engine("cuda", "cuda.fast"), 2e-3f, "cuda [cuda.fast]");
}

}  // namespace
