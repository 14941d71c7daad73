// forward_batch_sample's masks on the CPU reference: spread over the CPU threads, each row drawn from its own mask
// (batch_masks_util.h; the GPU's twin test is in tests/cuda/test_cuda_forward_batch.cpp).
#include <gtest/gtest.h>

#include "batch_masks_util.h"

namespace {

TEST(ForwardBatch, RowMasksRunOnTheCpuThreadsEachRowItsOwn) {
  plumb_test::check_parallel_masks(*plumb_test::csa_long_engine("cpu"), "cpu");
}

}  // namespace
