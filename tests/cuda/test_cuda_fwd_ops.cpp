// Forward-op kernels against their twins: hc_pre's warp-parallel Sinkhorn (H*H <= 32) bit for bit against one
// device thread running model/hc_math.h, and both against hc_math on the host from the same mixes (within a few
// ulps: CUDA's expf is not libm's).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda/fwd_kernels.h"
#include "cuda_test_util.h"
#include "model/hc_math.h"

namespace {

using plumb_cuda_test::GpuTest;
using plumb_cuda_test::Rng;
using namespace plumb_cuda_test::kernels;

// Mirrors fwd_hc.cu's scratch layout: n * 16 sum-of-squares partials, then mix partials [n, nmix, 16] summed in
// slice order into the fp32 mix (what hc_finish does).
constexpr int kSplit = 16;

struct HcOut {
  std::vector<float> post, comb;
  std::vector<double> partials;
};

HcOut run_hc(int H, int iters, float mix_scale, uint32_t seed, bool serial, std::vector<float>* scale_out,
             std::vector<float>* base_out) {
  const int n = 5, nmix = (2 + H) * H;
  const int64_t D = 256, hd = H * D;
  Rng rng(seed);
  const auto X = rng.floats(size_t(n * hd), -2.0f, 2.0f);
  const auto fn = rng.floats(size_t(nmix * hd), -mix_scale, mix_scale);
  *base_out = rng.floats(size_t(nmix), -1.0f, 1.0f);
  *scale_out = rng.floats(3, 0.5f, 2.0f);
  DeviceBuffer dX = to_device(X), dfn = to_device(fn), dbase = to_device(*base_out), dscale = to_device(*scale_out);
  DeviceBuffer post(size_t(n * H) * 4), comb(size_t(n * H * H) * 4), col(size_t(n * D) * 4);
  DeviceBuffer scratch(d::fwd_hc_scratch_doubles(n, H) * 8);
  d::HcArgs a;
  a.X = dX.as<float>(), a.fn = dfn.as<float>(), a.base = dbase.as<float>(), a.scale = dscale.as<float>();
  a.n = n, a.H = H, a.iters = iters, a.D = D, a.hc_eps = 1e-6f, a.rms_eps = 1e-6;
  a.post = post.as<float>(), a.comb = comb.as<float>(), a.collapsed = col.as<float>();
  a.serial_sinkhorn = serial ? 1 : 0;
  d::fwd_hc_pre(a, scratch.as<double>(), nullptr);
  return {to_host<float>(post, size_t(n * H)), to_host<float>(comb, size_t(n * H * H)),
          to_host<double>(scratch, d::fwd_hc_scratch_doubles(n, H))};
}

void check_hc(int H, int iters, float mix_scale, uint32_t seed) {
  const int n = 5, nmix = (2 + H) * H;
  std::vector<float> scale, base;
  const HcOut warp = run_hc(H, iters, mix_scale, seed, false, &scale, &base);
  const HcOut serial = run_hc(H, iters, mix_scale, seed, true, &scale, &base);
  ASSERT_EQ(std::memcmp(warp.post.data(), serial.post.data(), warp.post.size() * 4), 0) << "H " << H << ": post differs";
  for (size_t i = 0; i < warp.comb.size(); ++i)
    ASSERT_EQ(std::memcmp(&warp.comb[i], &serial.comb[i], 4), 0)
        << "H " << H << " iters " << iters << " comb element " << i << ": warp " << warp.comb[i] << " one thread " << serial.comb[i];
  for (int t = 0; t < n; ++t) {
    std::vector<float> mix(static_cast<size_t>(nmix));
    for (int o = 0; o < nmix; ++o) {
      double acc = 0;
      for (int i = 0; i < kSplit; ++i) acc += warp.partials[size_t(n * kSplit + (t * nmix + o) * kSplit + i)];
      mix[size_t(o)] = float(acc);
    }
    float pre[8], p[8], C[64];
    plumb::hc_math::weights(mix.data(), scale.data(), base.data(), H, 1e-6f, iters, pre, p, C);
    for (int j = 0; j < H; ++j)
      EXPECT_NEAR(p[j], warp.post[size_t(t * H + j)], 1e-6 * std::max(1.0f, std::fabs(p[j]))) << "H " << H << " token " << t << " post " << j;
    for (int i = 0; i < H * H; ++i)
      EXPECT_NEAR(C[i], warp.comb[size_t(t * H * H + i)], 1e-5 * std::max(1.0f, std::fabs(C[i])))
          << "H " << H << " token " << t << " comb[" << i / H << "][" << i % H << "]";
  }
}

TEST_F(GpuTest, HcPreWarpSinkhornMatchesSerial) {
  for (int H : {1, 2, 4, 5, 6})  // H = 6: both runs take the one-thread path (36 > 32 lanes)
    for (int iters : {1, 20}) {
      check_hc(H, iters, 0.05f, 100u + unsigned(H * 31 + iters));
      check_hc(H, iters, 2.0f, 200u + unsigned(H * 31 + iters));  // large mixes: saturated softmax rows
    }
}

}  // namespace
