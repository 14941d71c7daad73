// mHC reference: fp32 mixes of the RMS-normalized flattened streams, Sinkhorn-Knopp in fp32 (spec section 4).
#include "model/hyper_connection.h"

#include <string>

#include "formats/numeric.h"
#include "model/hc_math.h"
#include "model/numerics.h"
#include "model/ops.h"

namespace plumb {

namespace {

// mix[t][o] = (x_t * rsqrt(mean(x_t^2) + eps)) . fn[o] over the flattened H*D streams of token t.
// mhc.bf16_mix rounds both GEMM operands to bf16 (fp32 accumulation).
std::vector<float> mixes(const Tensor& fn, const ModelConfig& c, const ModelOptions& opt, const float* xt, int64_t hd) {
  const bool bf16 = opt.mhc_bf16_mix;
  double ss = 0;
  for (int64_t i = 0; i < hd; ++i) ss += double(xt[i]) * xt[i];
  const double r = 1.0 / std::sqrt(ss / double(hd) + c.rms_eps);
  const int64_t nmix = fn.dim(0);
  std::vector<float> m(static_cast<size_t>(nmix));
  for (int64_t o = 0; o < nmix; ++o) {
    const float* f = fn.row(o);
    double acc = 0;
    if (opt.official) {  // official: (x . fn) * rsqrt, the norm applied after the GEMM
      for (int64_t i = 0; i < hd; ++i) acc += double(xt[i]) * f[i];
      m[size_t(o)] = float(acc) * float(r);
      continue;
    }
    if (bf16)
      for (int64_t i = 0; i < hd; ++i) acc += double(fmt8::round_bf16(float(xt[i] * r))) * fmt8::round_bf16(f[i]);
    else
      for (int64_t i = 0; i < hd; ++i) acc += double(float(xt[i] * r)) * f[i];
    m[size_t(o)] = float(acc);
  }
  return m;
}

}  // namespace

HcPre hc_pre(const HyperConnWeights& w, const ModelConfig& c, const ModelOptions& o, const Tensor& X, const Tap& tap,
             const char* site) {
  const int64_t n = X.dim(0), H = c.hc_mult, D = c.hidden;
  const float eps = float(c.hc_eps);
  const Numerics nm(o);
  HcPre p{Tensor({n, H}), Tensor({n, H, H}), Tensor({n, D})};
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = X.ptr() + t * H * D;
    const auto m = mixes(w.fn, c, o, xt, H * D);
    std::vector<float> pre(static_cast<size_t>(H));
    hc_math::weights(m.data(), w.scale.ptr(), w.base.ptr(), int(H), eps, c.hc_sinkhorn_iters, pre.data(), p.post.ptr() + t * H,
                     p.comb.ptr() + t * H * H);
    float* y = p.collapsed.ptr() + t * D;
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0;
      for (int64_t j = 0; j < H; ++j) acc += pre[size_t(j)] * xt[j * D + d];
      y[d] = nm.act(acc);
    }
  }
  const std::string s = site;
  tap.io((s + ".post").c_str(), p.post);
  tap.io((s + ".comb").c_str(), p.comb);
  tap.io((s + ".collapsed").c_str(), p.collapsed);
  return p;
}

Tensor hc_post(const Tensor& y, const Tensor& X, const HcPre& p, const ModelOptions& o) {
  const int64_t n = X.dim(0), H = X.dim(1), D = X.dim(2);
  const Numerics nm(o);
  Tensor out({n, H, D});
  // Column k of C gathers every stream j into stream k; fault.comb_untransposed reads row k instead.
  auto cidx = [&](int64_t j, int64_t k) { return o.fault_comb_untransposed ? k * H + j : j * H + k; };
  for (int64_t t = 0; t < n; ++t) {
    const float* C = p.comb.ptr() + t * H * H;
    for (int64_t k = 0; k < H; ++k) {
      float* o = out.ptr() + (t * H + k) * D;
      const float post = p.post[t * H + k];
      for (int64_t d = 0; d < D; ++d) {
        // This summation order reproduced the official golden's bf16 rounding bit for bit (tiny-official-ref).
        float acc = post * y[t * D + d];
        for (int64_t j = 0; j < H; ++j) acc += C[cidx(j, k)] * X[(t * H + j) * D + d];
        o[d] = nm.act(acc);
      }
    }
  }
  return out;
}

Tensor hc_head(const HyperConnWeights& w, const ModelConfig& c, const ModelOptions& o, const Tensor& X) {
  const int64_t n = X.dim(0), H = c.hc_mult, D = c.hidden;
  const Numerics nm(o);
  Tensor y({n, D});
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = X.ptr() + t * H * D;
    const auto m = mixes(w.fn, c, o, xt, H * D);
    std::vector<float> pre(static_cast<size_t>(H));
    hc_math::weights(m.data(), w.scale.ptr(), w.base.ptr(), int(H), float(c.hc_eps), 0, pre.data(), nullptr, nullptr);
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0;
      for (int64_t j = 0; j < H; ++j) acc += pre[size_t(j)] * xt[j * D + d];
      y[t * D + d] = nm.act(acc);
    }
  }
  return y;
}

}  // namespace plumb
