// cuBLASLt bf16 GEMM (src/cuda/blas.cpp) against a CPU fp64 product of the same bf16 values. Skips without a GPU
// or in a build without cuBLASLt.
#include <cmath>

#include "cuda/blas.h"
#include "cuda_test_util.h"
#include "formats/numeric.h"

using namespace plumb;
using namespace plumb_cuda_test;

namespace {

class CudaBlas : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    if (!cuda::have_cublaslt()) GTEST_SKIP() << "built without cuBLASLt";
  }
};

std::vector<uint16_t> bf16_values(Rng& rng, size_t count, std::vector<float>& value) {
  std::vector<uint16_t> b(count);
  value.resize(count);
  for (size_t i = 0; i < count; ++i) b[i] = fmt8::f32_to_bf16(rng.uniform(-1.0f, 1.0f)), value[i] = fmt8::bf16_to_f32(b[i]);
  return b;
}

}  // namespace

// D = A . B^T, fp32 and bf16 outputs, shapes not multiples of the tiles.
TEST_F(CudaBlas, Bf16GemmMatchesCpu) {
  Rng rng(5);
  for (auto [m, n, k] : {std::tuple{64, 64, 64}, std::tuple{200, 136, 520}, std::tuple{1, 4096, 1024}, std::tuple{33, 7, 256}}) {
    std::vector<float> av, bv;
    const auto ab = bf16_values(rng, size_t(m) * size_t(k), av), bb = bf16_values(rng, size_t(n) * size_t(k), bv);
    std::vector<float> ref(size_t(m) * size_t(n));
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int q = 0; q < k; ++q) s += double(av[size_t(i) * size_t(k) + size_t(q)]) * double(bv[size_t(j) * size_t(k) + size_t(q)]);
        ref[size_t(i) * size_t(n) + size_t(j)] = float(s);
      }
    cuda::DeviceBuffer da = cuda::to_device(ab), db = cuda::to_device(bb), d32(size_t(m) * size_t(n) * 4), d16(size_t(m) * size_t(n) * 2);
    d32.fill_byte(0xFF), d16.fill_byte(0xFF);
    cuda::gemm_bf16(da.as<uint16_t>(), db.as<uint16_t>(), d32.get(), true, m, n, k);
    cuda::gemm_bf16(da.as<uint16_t>(), db.as<uint16_t>(), d16.get(), false, m, n, k);
    cuda::synchronize();
    const std::string tag = "bf16 gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    // fp32 accumulation of exact products: ~k * 2^-24 relative at worst, far less on random signs.
    expect_close(tag + " (fp32 out)", cuda::to_host<float>(d32, ref.size()), ref, n, 1e-5);
    const auto h16 = cuda::to_host<uint16_t>(d16, ref.size());
    std::vector<float> g16(h16.size());
    for (size_t i = 0; i < h16.size(); ++i) g16[i] = fmt8::bf16_to_f32(h16[i]);
    expect_close(tag + " (bf16 out)", g16, ref, n, 8e-3);  // one bf16 rounding: 2^-9 relative
  }
}

TEST_F(CudaBlas, MeasuresRate) {
  const cuda::GemmRate r = cuda::measure_bf16_gemm(1024, 1024, 1024, 1, 3);
  ASSERT_TRUE(r.measured) << r.why;
  // A plausible measurement, not a speed target (those are plumb bench's): finite, positive and below any GPU's
  // dense bf16 rate. Under compute-sanitizer the same call runs at ~0.4 TFLOP/s and must still pass.
  EXPECT_TRUE(std::isfinite(r.tflops));
  EXPECT_GT(r.tflops, 0.0);
  EXPECT_LT(r.tflops, 1.0e4);
  std::printf("  bf16 gemm 1024^3: %.1f TFLOP/s (median of 3)\n", r.tflops);
}
