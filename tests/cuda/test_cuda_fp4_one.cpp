// The one-token MXFP4 decode kernel (gemv_fp4one.cuh, GemvArgs::fp4_kernel 3; the default at one token) against the
// per-tile kernel (fp4_kernel 1) with the same warps: the same work split and arithmetic, so the same bits (fp32 and
// f16 outputs), for gate/up (with and without the weight before down) and down, on routings of one token with
// distinct experts and with an expert chosen several times (hash routing's repeats), at V4-Flash-like and small K.
#include <cstring>
#include <numeric>

#include "cuda/kernels.h"
#include "cuda_test_util.h"

using namespace plumb;
using namespace plumb_cuda_test;

namespace {
namespace d = cuda::detail;
class CudaFp4One : public GpuTest {};
}  // namespace

TEST_F(CudaFp4One, MatchesPerTileBitForBit) {
  Rng rng(31);
  struct Shape {
    int64_t E, D, I;
  };
  for (const Shape& sh : {Shape{8, 2048, 1024}, Shape{5, 256, 384}}) {
    auto f = make_moe(rng, sh.E, sh.D, sh.I);
    const cuda::MoeExperts m = cuda::upload_experts(f->w);
    for (const std::vector<int32_t>& idx : {std::vector<int32_t>{3, 0, 7 % int(sh.E), 1, 4, 2}, std::vector<int32_t>{2, 2, 1, 2, 4, 1}}) {
      const int K = int(idx.size());
      const Acts x = make_acts(cuda::Act::F16, rng.floats(size_t(sh.D), -2.0f, 2.0f));
      const Acts h = make_acts(cuda::Act::F16, rng.floats(size_t(K) * size_t(sh.I), -2.0f, 2.0f));
      cuda::DeviceBuffer di = cuda::to_device(idx), pw = cuda::to_device(rng.floats(size_t(K), 0.1f, 1.0f));
      // which: 0 gate/up f32 out, 1 gate/up f16 out, 2 down; kernel 1 per-tile, 3 one-token.
      auto run = [&](int which, int kernel, bool pre) {
        const cuda::Fp4Matrices& w = which == 2 ? m.w2 : m.w1;
        const size_t count = size_t(K) * size_t(w.rows);
        cuda::DeviceBuffer out(count * 4);
        out.fill_byte(0xFF);
        d::GemvArgs a;
        a.fmt = d::kFp4, a.mode = d::kMoe, a.act = d::kF16, a.idx = di.as<int32_t>(), a.n = 1, a.topk = K, a.problems = int(sh.E);
        a.w[0] = w.codes.as<uint8_t>(), a.s[0] = w.scales.get();
        a.w_prob_stride = int64_t(w.code_bytes()), a.s_prob_stride = int64_t(w.scale_bytes());
        a.rows = w.rows, a.cols = w.cols, a.s_ld = w.cols / 32;
        a.fp4_kernel = kernel, a.warps = which == 2 ? 1 : 2, a.minblocks = 1, a.pdl = 1;
        if (which < 2) {
          a.nmat = 2, a.epi = d::kSwiglu, a.limit = 7.0f, a.pre_weight = pre ? pw.as<float>() : nullptr, a.out_half = which;
          a.w[1] = m.w3.codes.as<uint8_t>(), a.s[1] = m.w3.scales.get();
          a.x = x.dev.get(), a.x_tok_stride = sh.D, a.x_by_token = 1, a.o_tok_stride = sh.I;
        } else {
          a.x = h.dev.get(), a.x_tok_stride = sh.I, a.o_tok_stride = sh.D;
        }
        a.out = out.get();
        d::launch_gemv(a, nullptr);
        cuda::synchronize();
        return cuda::to_host<uint8_t>(out, count * (which == 1 ? 2 : 4));
      };
      for (int which : {0, 1, 2})
        for (bool pre : {false, true}) {
          if (which == 2 && pre) continue;
          const auto a = run(which, 1, pre), b = run(which, 3, pre);
          size_t first = 0;
          while (first < a.size() && a[first] == b[first]) ++first;
          EXPECT_EQ(first, a.size()) << (which == 2 ? "down" : which == 1 ? "gate/up f16" : "gate/up f32") << (pre ? " (weight before down)" : "")
                                     << " E" << sh.E << " D" << sh.D << " I" << sh.I << " routing " << idx[0] << "," << idx[1]
                                     << ",...: first differing byte " << first << " of " << a.size();
        }
    }
  }
  // Refused where it does not apply: more than one token.
  auto f = make_moe(rng, 2, 256, 128);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  d::GemvArgs a;
  cuda::DeviceBuffer di = cuda::to_device(std::vector<int32_t>{0, 1}), x(256 * 2 * 2), out(2 * 128 * 4);
  a.fmt = d::kFp4, a.mode = d::kMoe, a.act = d::kF16, a.idx = di.as<int32_t>(), a.n = 2, a.topk = 1, a.problems = 2;
  a.w[0] = m.w2.codes.as<uint8_t>(), a.s[0] = m.w2.scales.get(), a.rows = m.w2.rows, a.cols = m.w2.cols, a.s_ld = m.w2.cols / 32;
  a.x = x.get(), a.x_tok_stride = m.w2.cols, a.out = out.get(), a.o_tok_stride = m.w2.rows, a.fp4_kernel = 3, a.warps = 1;
  EXPECT_THROW(d::launch_gemv(a, nullptr), std::exception);
}
