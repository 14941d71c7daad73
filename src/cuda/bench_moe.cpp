// `plumb bench`'s router and routed-expert sections at decode sizes: the router; the MXFP4 gate/up + SwiGLU, down
// and combine kernels alone and together (also under PDL), against a plain read of the same weight bytes, the W4A8
// kernels of the official numerics, the FP4 kernels' tuning sweep and a spot check against the CPU; the MoE layer
// with the router choosing.
#ifdef PLUMB_WITH_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>

#include "cuda/bench_harness.h"
#include "cuda/fwd_kernels.h"
#include "formats/numeric.h"

namespace plumb::cuda::kbench {

// The router (sqrtsoftplus, top-6, the routed scaling factor folded in) at 1 and 8 tokens.
void bench_router(Bench& B, Synth& W) {
  const int E = W.E, K = W.K;
  const int64_t D = W.D;
  for (int n : {1, 8}) {
    if (!B.want("router")) break;
    const DeviceRouting<Rsf::Folded> r = W.routing(n);
    const Timing t = B.time([&](int i) { W.route_with(i, n, true, r, B.s); });
    const double bytes = double(E * D * 2 + E * 4 + n * D * 2 + n * D * 2 + n * E * 8 + n * K * 8);
    B.add(B.rows, {"router (sqrtsoftplus, top-6, fold 1.5)", "gate [256, 4096] bf16, x bf16", "also writes x f16", n, 0, bytes}, t);
  }
}

// The routed experts (MXFP4) at 1, 8 and 32 tokens of random top-6 routing (rotated per call: cold weights)
// (32 tokens: 192 slots, the streaming kernel's range, where the default still picks the per-tile gate/up)
void bench_moe_decode(Bench& B, Synth& W) {
  const Stream S = B.s;
  const int E = W.E;
  const int K = W.K;
  const int64_t D = W.D;
  const int64_t I = W.I;
  const double fp4_w13 = W.fp4_w13();
  const double fp4_w2 = W.fp4_w2();
  const int runs = B.o.warmup + B.o.iters + Bench::kGraph;
  for (int n : {1, 8, 32}) {
    if (!B.want("moe")) break;
    const Routings R = make_routings(runs, n, K, E, 1234u + unsigned(n));
    DeviceBuffer idx_all = to_device(R.idx), w_all = to_device(R.w);
    auto idx_at = [&](int i) { return idx_all.as<int32_t>() + size_t(i % runs) * size_t(n * K); };
    auto w_at = [&](int i) { return w_all.as<float>() + size_t(i % runs) * size_t(n * K); };
    double uavg = 0;
    for (int u : R.distinct) uavg += u;
    uavg /= double(R.distinct.size());
    const int ue = int(std::lround(uavg));
    const double xin = double(n) * double(D) * 2, hbytes = double(n * K) * double(I) * 2, ysb = double(n * K) * double(D) * 4;
    const std::string note = fmt::format("{:.1f} active experts (mean)", uavg);
    auto h16 = W.scratch.h.as<uint16_t>();
    auto ys = W.scratch.ys.as<float>();
    Timing t = B.time([&](int i) { moe_gate_up(W.moe, idx_at(i), n, K, W.x16.get(), Act::F16, 10.0, nullptr, h16, nullptr, W.ws, S); });
    B.add(B.rows, {"moe gate+up (w1,w3 FP4) + SwiGLU", "E256 [2048, 4096] x2, x f16", note, n, ue, uavg * fp4_w13 + xin + hbytes}, t);
    t = B.time([&](int i) { moe_gate_up(W.moe, idx_at(i), n, K, W.xb16.get(), Act::BF16, 10.0, nullptr, h16, nullptr, W.ws, S); });
    B.add(B.rows, {"moe gate+up, x bf16 (+ f16 conversion launch)", "E256 [2048, 4096] x2", note, n, ue, uavg * fp4_w13 + 3 * xin + hbytes}, t);
    t = B.time([&](int i) { moe_down(W.moe, idx_at(i), n, K, h16, nullptr, ys, W.ws, S); });
    B.add(B.rows, {"moe down (w2 FP4)", "E256 [4096, 2048], h f16", note, n, ue, uavg * fp4_w2 + hbytes + ysb}, t);
    t = B.time([&](int i) { moe_combine(ys, w_at(i), n, K, D, 1.0f, nullptr, W.y.as<float>(), S); });
    B.add(B.rows, {"moe combine (weights, sum over k)", "[n*6, 4096] f32", "", n, 0, ysb + double(n) * double(D) * 4}, t);
    auto routed = [&](int i) {
      moe_gate_up(W.moe, idx_at(i), n, K, W.x16.get(), Act::F16, 10.0, nullptr, h16, nullptr, W.ws, S);
      moe_down(W.moe, idx_at(i), n, K, h16, nullptr, ys, W.ws, S);
      moe_combine(ys, w_at(i), n, K, D, 1.0f, nullptr, W.y.as<float>(), S);
    };
    const double routed_bytes = uavg * (fp4_w13 + fp4_w2) + xin + 2 * hbytes + 2 * ysb + double(n) * double(D) * 4;
    t = B.time(routed);
    B.add(B.rows, {"moe routed total (gate+up, down, combine)", "3 launches", note, n, ue, routed_bytes}, t);
    if (n <= 8) {  // as the forward runs them under cuda.pdl (steps of <= 8 tokens): every launch with PDL
      const d::PdlScope pdl(true);
      t = B.time(routed);
      B.add(B.rows, {"moe routed total (gate+up, down, combine)", "3 launches, cuda.pdl", note, n, ue, routed_bytes}, t);
    }

    // What a plain read of the experts' weight bytes reaches in the same harness (read_stream over the expert
    // weights, a different region per call where they fit): the ceiling for kernels of this size, launch, ramp and
    // tail included. (H200: 19.2 us for the 80 MB of batch 1, 100 % of copy: the MXFP4 kernels' gap to it is their
    // own, not the launch's.)
    // Also each kernel's own bytes alone (gate+up, down): the ceiling of a launch of that size, against which the
    // kernels' target (75 % of copy) is set. (Only where those bytes fit in w1's allocation: not at 32 tokens.)
    const std::pair<double, const char*> refs[3] = {{uavg * (fp4_w13 + fp4_w2), "reference: gate+up + down's bytes"},
                                                    {uavg * fp4_w13, "reference: gate+up's bytes"},
                                                    {uavg * fp4_w2, "reference: down's bytes"}};
    for (const auto& [bytes, what] : refs) {
      if (size_t(bytes) > W.moe.w1.codes.bytes()) continue;
      const size_t rb = size_t(bytes) / 256 * 256;
      const size_t slots = std::max<size_t>(1, W.moe.w1.codes.bytes() / rb);
      t = B.time([&](int i) { d::read_stream(W.moe.w1.codes.as<uint8_t>() + size_t(i) % slots * rb, rb, B.sink.as<unsigned>(), S); });
      B.add(B.rows, {"read-only stream of the same weight bytes", what, "", n, 0, double(rb)}, t);
    }

    // The official numerics' W4A8 kernels (cuda.moe_mxfp4 under numerics.official: x and h quantized to E4M3 per 128,
    // FP8 tensor cores, bf16 outputs) on the same weights read as the A8 layout (random codes are random in either):
    // gate+up from x's codes, down from h's, and the whole routed path with both quantizations and the combine.
    {
      W.moe.w1.layout = W.moe.w3.layout = W.moe.w2.layout = Fp4Layout::A8;
      const int64_t S8 = int64_t(n) * K;
      DeviceBuffer x8(size_t(n * D)), xsc(size_t(n * D / 128) * 4), h32(size_t(S8 * I) * 4), h8(size_t(S8 * I)),
          hsc(size_t(S8 * I / 128) * 4);
      act_quant_e4m3(W.x32.as<float>(), n, D, D, x8.as<uint8_t>(), xsc.as<float>(), S);
      moe_gate_up_a8(W.moe, idx_at(0), n, K, x8.as<uint8_t>(), xsc.as<float>(), 10.0, nullptr, h32.as<float>(), S);
      act_quant_e4m3(h32.as<float>(), S8, I, I, h8.as<uint8_t>(), hsc.as<float>(), S);
      const double x8b = double(n * D) * (1.0 + 4.0 / 128), h8b = double(S8 * I) * (1.0 + 4.0 / 128), h32b = double(S8 * I) * 4;
      t = B.time([&](int i) { moe_gate_up_a8(W.moe, idx_at(i), n, K, x8.as<uint8_t>(), xsc.as<float>(), 10.0, nullptr, h32.as<float>(), S); });
      B.add(B.rows, {"moe gate+up W4A8 (official numerics)", "E256 [2048, 4096] x2, x E4M3", note, n, ue, uavg * fp4_w13 + x8b + h32b}, t);
      t = B.time([&](int i) { moe_down_a8(W.moe, idx_at(i), n, K, h8.as<uint8_t>(), hsc.as<float>(), ys, S); });
      B.add(B.rows, {"moe down W4A8 (official numerics)", "E256 [4096, 2048], h E4M3", note, n, ue, uavg * fp4_w2 + h8b + ysb}, t);
      t = B.time([&](int i) {
        act_quant_e4m3(W.x32.as<float>(), n, D, D, x8.as<uint8_t>(), xsc.as<float>(), S);
        moe_gate_up_a8(W.moe, idx_at(i), n, K, x8.as<uint8_t>(), xsc.as<float>(), 10.0, nullptr, h32.as<float>(), S);
        act_quant_e4m3(h32.as<float>(), S8, I, I, h8.as<uint8_t>(), hsc.as<float>(), S);
        moe_down_a8(W.moe, idx_at(i), n, K, h8.as<uint8_t>(), hsc.as<float>(), ys, S);
        moe_combine(ys, nullptr, n, K, D, 1.0f, nullptr, W.y.as<float>(), S);
      });
      B.add(B.rows,
            {"moe routed total W4A8 (official numerics)", "5 launches: 2 quantizations", note, n, ue,
             uavg * (fp4_w13 + fp4_w2) + double(n * D) * 4 + x8b + 2 * h32b + h8b + 2 * ysb + double(n * D) * 4},
            t);
      W.moe.w1.layout = W.moe.w3.layout = W.moe.w2.layout = Fp4Layout::F16;
    }

    // Tuning sweep of the two FP4 kernels: the per-tile kernel (warps per block) and the streaming kernel (warps
    // per CTA, stages in flight, warps splitting one tile's K, programmatic dependent launch).
    struct Fp4Cfg {
      int kernel, warps, depth, ks, pdl, minb, early = 0;
    };
    std::vector<Fp4Cfg> fcfgs;
    // Per-tile: warps per block, register budget (minblocks), PDL.
    for (int warps : {1, 2, 3, 4})
      for (int minb : {1, 2, 3})
        for (int pdl : {0, 1})
          fcfgs.push_back({1, warps, 0, 0, pdl, minb});
    // Down's routing read and first weights requested before its PDL wait (pdl_early, as moe_down launches it).
    for (int warps : {1, 2, 4})
      for (int minb : {1, 2, 3}) fcfgs.push_back({1, warps, 0, 0, 1, minb, 1});
    // Streaming: warps per CTA, stages in flight, warps splitting one tile's K, PDL.
    for (int pdl : {0, 1})
      for (int warps : {2, 4, 8})
        for (int depth : {2, 3})
          for (int ks : {1, 2, 4})
            if (ks <= warps && (ks == 1 || depth == 2)) fcfgs.push_back({2, warps, depth, ks, pdl, 1});
    // The launch arguments of gate/up + SwiGLU (which 0: x by token, f16 h) or down (which 1: h by slot, fp32 ys),
    // the configuration fields at their defaults (fp4_kernel 0: the automatic choice, as moe_gate_up / moe_down).
    auto fp4_base = [&](int which) {
      d::GemvArgs a;
      a.fmt = d::kFp4, a.mode = d::kMoe, a.n = n, a.topk = K, a.problems = E, a.act = d::kF16;
      const Fp4Matrices& w = which == 0 ? W.moe.w1 : W.moe.w2;
      a.w[0] = w.codes.as<uint8_t>(), a.s[0] = w.scales.get();
      a.w_prob_stride = int64_t(w.code_bytes()), a.s_prob_stride = int64_t(w.scale_bytes());
      a.rows = w.rows, a.cols = w.cols, a.s_ld = w.cols / 32;
      if (which == 0) {
        a.nmat = 2, a.epi = d::kSwiglu, a.limit = 10.0f, a.w[1] = W.moe.w3.codes.as<uint8_t>(), a.s[1] = W.moe.w3.scales.get();
        a.x = W.x16.get(), a.x_tok_stride = D, a.x_by_token = 1, a.out = h16, a.out_half = 1, a.o_tok_stride = I;
      } else {
        a.x = h16, a.x_tok_stride = I, a.out = ys, a.o_tok_stride = D;
      }
      return a;
    };
    for (int which = 0; which < 2; ++which)
      for (const Fp4Cfg& fc : fcfgs) {
          if (fc.early && which == 0) continue;  // (gate/up's routing is its predecessor's output)
          d::GemvArgs a = fp4_base(which);
          a.warps = fc.kernel == 1 ? fc.warps : 4;
          a.minblocks = fc.minb;
          a.fp4_kernel = fc.kernel, a.fp4_warps = fc.kernel == 2 ? fc.warps : 0, a.fp4_depth = fc.depth;
          a.fp4_ksplit = fc.ks, a.pdl = fc.pdl, a.pdl_early = fc.early;
          try {
            t = B.time([&](int i) {
              d::GemvArgs b = a;
              b.idx = idx_at(i);
              d::launch_gemv(b, S);
            });
          } catch (const std::exception& ex) {  // a configuration that does not fit (shared memory)
            fmt::print("skipped FP4 config: {}\n", ex.what());
            d::dsync();
            continue;
          }
          const std::string var = fc.kernel == 1 ? fmt::format("per-tile w{} minb {}{}{}", fc.warps, fc.minb, fc.pdl ? " pdl" : "",
                                                               fc.early ? " early" : "")
                                                  : fmt::format("stream w{} d{} ks{}{}", fc.warps, fc.depth, fc.ks,
                                                                fc.pdl ? " pdl" : "");
          B.add(B.tuning,
                {which == 0 ? "moe gate+up (w1,w3 FP4) + SwiGLU" : "moe down (w2 FP4)", var, note, n, ue,
                 which == 0 ? uavg * fp4_w13 + xin + hbytes : uavg * fp4_w2 + hbytes + ysb},
                t);
          // At <= 8 tokens the per-tile configurations under PDL again in their place in the forward: gate/up
          // (this configuration or the automatic one), down (likewise), the combine, as moe_gate_up / moe_down
          // launch them. A kernel replayed after itself overlaps its own tail under PDL in ways it cannot after
          // its real neighbour (session 29: a down kernel 1 us faster alone was 6-12 us slower here).
          if (n <= 8 && fc.kernel == 1 && fc.pdl && (which == 0 || fc.early)) {
            const d::GemvArgs gu = which == 0 ? a : fp4_base(0);  // (the automatic gate/up after a down configuration)
            t = B.time([&](int i) {
              d::GemvArgs g2 = gu, d2 = a;
              g2.idx = d2.idx = idx_at(i);
              d::launch_gemv(g2, S);
              if (which == 0) moe_down(W.moe, idx_at(i), n, K, h16, nullptr, ys, W.ws, S);
              else d::launch_gemv(d2, S);
              moe_combine(ys, w_at(i), n, K, D, 1.0f, nullptr, W.y.as<float>(), S);
            });
            B.add(B.tuning,
                  {which == 0 ? "moe routed total, gate+up as" : "moe routed total, down as", var, note, n, ue, routed_bytes}, t);
          }
      }

    // Spot check at the real size: sampled gate/up outputs for every token, against the CPU.
    {
      DeviceBuffer h32(size_t(n * K) * size_t(I) * 4);
      moe_gate_up(W.moe, idx_at(0), n, K, W.x32.get(), Act::F32, std::numeric_limits<double>::infinity(), nullptr, nullptr,
                  h32.as<float>(), W.ws, S);  // (no clamp: the check below has none)
      d::dsync();
      const auto hg = to_host<float>(h32, size_t(n * K) * size_t(I));
      const auto xs = to_host<float>(W.x32, size_t(n) * size_t(D));
      double max_err = 0, max_ref = 0;
      for (int slot = 0; slot < n * K; slot += std::max(1, n * K / 4)) {
        const int e = R.idx[size_t(slot)], tok = slot / K;
        std::vector<float> xr(static_cast<size_t>(D));
        for (int64_t k = 0; k < D; ++k) xr[size_t(k)] = round_f16(xs[size_t(tok * D + k)]);
        for (int64_t r = 0; r < I; r += 97) {
          // The decode layout keeps a 16-row tile together: download the row's tile and unpack it.
          const int64_t t0 = r / 16 * 16;
          std::vector<uint8_t> rp(size_t(8 * D)), sc1(size_t(D / 32)), sc3(size_t(D / 32)), rp3(size_t(8 * D));
          W.moe.w1.codes.download(rp.data(), rp.size(), size_t(e) * W.moe.w1.code_bytes() + size_t(t0 * D / 2));
          W.moe.w3.codes.download(rp3.data(), rp3.size(), size_t(e) * W.moe.w3.code_bytes() + size_t(t0 * D / 2));
          W.moe.w1.scales.download(sc1.data(), sc1.size(), size_t(e) * W.moe.w1.scale_bytes() + size_t(r * D / 32));
          W.moe.w3.scales.download(sc3.data(), sc3.size(), size_t(e) * W.moe.w3.scale_bytes() + size_t(r * D / 32));
          const auto c1 = unpack_fp4_decode(rp.data(), 16, D), c3 = unpack_fp4_decode(rp3.data(), 16, D);
          const double g = fp4_row_dot(c1.data() + (r - t0) * D / 2, sc1.data(), xr, D);
          const double u = fp4_row_dot(c3.data() + (r - t0) * D / 2, sc3.data(), xr, D);
          const double ref = g / (1.0 + std::exp(-g)) * u;
          max_ref = std::max(max_ref, std::fabs(ref));
          max_err = std::max(max_err, std::fabs(ref - double(hg[size_t(slot) * size_t(I) + size_t(r)])));
        }
      }
      const double rel = max_err / std::max(max_ref, 1e-30);
      fmt::print("spot check moe gate+up n={}: max |gpu - cpu| = {:.3e} (max |ref| {:.3e}, normalized {:.2e})\n", n, max_err,
                 max_ref, rel);
      B.checks.push_back({{"kernel", "moe gate+up"}, {"batch", n}, {"max_abs_err", max_err}, {"max_ref", max_ref}, {"normalized", rel}});
    }
  }
}

// The MoE layer with the router choosing (router + gate/up + down + combine): 4 launches.
void bench_moe_layer(Bench& B, Synth& W) {
  const Stream S = B.s;
  const int E = W.E, K = W.K;
  const int64_t D = W.D, I = W.I;
  for (int n : {1, 8}) {
    if (!B.want("moe")) break;
    const DeviceRouting<Rsf::Folded> r = W.routing(n);
    ModelConfig mc;
    mc.n_experts = E, mc.top_k = K, mc.hidden = int(D), mc.moe_inter = int(I), mc.routed_scaling = W.rsf, mc.swiglu_limit = 10.0;
    const Timing t = B.time([&](int i) {  // a different router copy each time: different experts, cold weights
      W.route_with(i, n, true, r, S);
      moe_routed(GpuRunnerFolded{}, mc, W.moe, r, W.scratch.x16.as<uint16_t>(), W.scratch, W.ws, nullptr, W.y.as<float>(), S);
    });
    d::dsync();
    const auto idx = to_host<int32_t>(W.ridx, size_t(n * K));
    const int ue = int(std::set<int32_t>(idx.begin(), idx.end()).size());
    const double bytes = double(E * D * 2) + ue * (W.fp4_w13() + W.fp4_w2()) + double(n * K) * double(I + D) * 8;
    B.add(B.rows, {"moe layer: router + routed experts", "4 launches, x bf16", fmt::format("{} active experts (last run)", ue), n, ue, bytes}, t);
  }
}

}  // namespace plumb::cuda::kbench
#endif  // PLUMB_WITH_CUDA
