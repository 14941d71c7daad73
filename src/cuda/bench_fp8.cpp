// `plumb bench`'s FP8 and bf16 projection sections at decode sizes: each V4-Flash attention projection (and the
// indexer's wq_b) on the default path with the GEMV's tuning sweeps and, above 8 tokens, the shared-activation kernel;
// the FP8 shared expert; the compressors' bf16 projections, cuBLASLt against the GEMV.
#ifdef PLUMB_WITH_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>

#include "cuda/bench_harness.h"
#include "cuda/fwd_kernels.h"
#include "formats/numeric.h"

namespace plumb::cuda::kbench {

// The FP8 block-scaled projections (attention wq_a, wkv, wq_b, wo_a in 8 groups, wo_b; the indexer's wq_b) at 1-32
// tokens on the default path with the GEMV's sweeps (warps, blocks along K, register budget, chunks in flight; under
// PDL the first weights into registers or L2), at 16-128 tokens the shared-activation kernel (`fp8xs`); a spot
// check of wq_a against the CPU.
void bench_fp8_projections(Bench& B, Synth& W) {
  const Stream S = B.s;
  struct Proj {
    const char* name;
    int64_t rows, cols;
    int groups;
  };
  const Proj projs[] = {{"attn wq_a", 1024, 4096, 1},  {"attn wkv", 512, 4096, 1},   {"attn wq_b", 32768, 1024, 1},
                        {"attn wo_a (8 groups)", 8192, 4096, 8}, {"attn wo_b", 4096, 8192, 1}, {"indexer wq_b", 8192, 1024, 1}};
  for (const auto& p : projs) {
    if (!B.want("fp8") && !B.want("fp8xs")) break;
    const int nc = B.copies_for(double(p.rows * p.cols));
    std::vector<Fp8Matrix> ws8;
    for (int c = 0; c < nc; ++c) {
      ws8.push_back(alloc_fp8(p.rows, p.cols));
      d::fill(ws8.back().codes.get(), ws8.back().codes.bytes(), d::kFillE4M3, W.seed++, 0, 0);
      d::fill(ws8.back().scales.get(), ws8.back().scales.bytes(), d::kFillE8M0, W.seed++, 112, 118);
    }
    const Fp8Matrix& w = ws8[0];
    const int64_t gr = p.rows / p.groups, in_w = p.cols * p.groups;
    // A direct launch of either kernel on this projection (the sweeps' configurations), with its workspace.
    auto direct = [&](int n, int warps, int kb, int unroll) {
      d::GemvArgs a;
      a.fmt = d::kFp8, a.act = d::kF16, a.rows = gr, a.cols = p.cols, a.problems = p.groups;
      a.w_prob_stride = gr * p.cols, a.s_prob_stride = (gr / 128) * w.scale_cols();
      a.s_ld = w.scale_cols(), a.x = W.x16.get(), a.x_tok_stride = in_w, a.x_prob_stride = p.groups > 1 ? p.cols : 0;
      a.out = W.y.get(), a.o_tok_stride = p.rows, a.o_prob_stride = gr, a.n = n, a.warps = warps, a.kblocks = kb;
      a.fp8_unroll = unroll;
      return a;
    };
    auto time_direct = [&](const d::GemvArgs& a0) {
      d::GemvArgs a = a0;
      if (a.kblocks > 1) {
        const d::GemvWorkspace need = d::gemv_workspace(a);
        a.partial = W.ws.partial(need.floats), a.counters = W.ws.counters(need.counters);
      }
      return B.time([&](int i) {
        d::GemvArgs b = a;
        b.w[0] = ws8[size_t(i % nc)].codes.as<uint8_t>(), b.s[0] = ws8[size_t(i % nc)].scales.get();
        d::launch_gemv(b, S);
      });
    };
    for (int n : {1, 8, 16, 32, 64, 128}) {
      if (n > 32 && !B.want("fp8xs")) break;
      const double bytes = double(p.rows * p.cols) + double(w.scale_bytes()) + double(n * in_w * 2) + double(n * p.rows * 4);
      if (n <= 32) {  // the default path's row and the register-path kernel's sweep
        Timing t;
        if (p.groups > 1)
          t = B.time([&](int i) { fp8_linear_grouped(ws8[size_t(i % nc)], p.groups, W.x16.get(), Act::F16, n, W.y.as<float>(), W.ws, S); });
        else
          t = B.time([&](int i) { fp8_linear(ws8[size_t(i % nc)], W.x16.get(), Act::F16, p.cols, n, W.y.as<float>(), p.rows, W.ws, S); });
        B.add(B.rows, {fmt::format("FP8 {}", p.name), fmt::format("[{}, {}] E4M3, x f16", p.rows, p.cols), "", n, 0, bytes}, t);
        // Sweep: warps per block x blocks along K x register budget x chunks in flight per warp (above 8 tokens, one
        // pass of token groups: the full register budget, no split of K, 1 or 2 chunks in flight).
        for (int warps : {1, 2, 4, 8})
          for (int kb : {1, 2, 4, 8})
            for (int minb : {1, 3})
            if (B.want("fp8") || n > 8)
            for (int unroll : {1, 2, 4}) {
            if (p.cols / 128 < int64_t(warps) * kb || (unroll == 4 && kb > 1)) continue;
            if (n <= 8 ? unroll == 1 : (kb > 1 || minb > 1 || unroll == 4)) continue;
            d::GemvArgs a = direct(n, warps, kb, unroll);
            a.minblocks = minb;
            const Timing tt = time_direct(a);
            B.add(B.tuning, {fmt::format("FP8 {}", p.name), fmt::format("warps {}, kblocks {}, minb {}, unroll {}", warps, kb, minb, unroll), "", n, 0, bytes}, tt);
          }
        // Under PDL (as cuda.pdl launches them at <= 8 tokens), each launch's first weights requested before its
        // wait into registers (pdl_early, the default) or into L2.
        if (n <= 8 && B.want("fp8") && p.groups == 1)
          for (int early : {0, 1}) {
            const int64_t chunks = p.cols / 128;
            d::GemvArgs a = direct(n, d::gemv_dense_warps(gr / 16, chunks), 1, 2);
            a.pdl = 1, a.pdl_early = early;
            B.add(B.tuning, {fmt::format("FP8 {}", p.name), fmt::format("pdl, first weights into {}", early ? "registers" : "L2"), "", n, 0, bytes},
                  time_direct(a));
          }
      }
      // The shared-activation kernel above 8 tokens (gemv_xs.cuh, `--only fp8xs`): tiles per block x blocks along K x
      // chunks in flight, one pass of token groups (passes of 64 above).
      if (n > 8 && B.want("fp8xs")) {
        for (int warps : {2, 4, 8})
          for (int kb : {1, 2, 4, 8, 16, 32})
            for (int unroll : {1, 2}) {
              const int64_t blocks = (gr / 16 + warps - 1) / warps * p.groups * kb;
              if (p.cols / 128 < kb || blocks < 32 || blocks > 4096) continue;
              d::GemvArgs a = direct(n, warps, kb, unroll);
              a.shared_x = 1;  // (token groups 0: gemv_xs_token_groups)
              if (d::gemv_xs_smem(a) > d::kGemvXsMaxSmem) continue;
              B.add(B.tuning, {fmt::format("FP8 {}", p.name), fmt::format("xs warps {}, kblocks {}, unroll {}", warps, kb, unroll), "", n, 0, bytes},
                    time_direct(a));
            }
      }
    }
    if (std::string(p.name) == "attn wq_a") {  // spot check at the real size
      const int n = 8;
      fp8_linear(w, W.x32.get(), Act::F32, p.cols, n, W.y.as<float>(), p.rows, W.ws, S);
      d::dsync();
      const auto yg = to_host<float>(W.y, size_t(n * p.rows));
      const auto xs = to_host<float>(W.x32, size_t(n * p.cols));
      std::vector<uint8_t> codes(size_t(p.rows * p.cols)), sc(w.scales.bytes());
      w.codes.download(codes.data(), codes.size());
      w.scales.download(sc.data(), sc.size());
      double max_err = 0, max_ref = 0;
      for (int t2 = 0; t2 < n; ++t2)
        for (int64_t r = 0; r < p.rows; r += 13) {
          double acc = 0;
          for (int64_t k = 0; k < p.cols; ++k)
            acc += double(fmt8::e4m3_to_f32(codes[size_t(r * p.cols + k)])) * fmt8::e8m0_to_f32(sc[size_t((r / 128) * (p.cols / 128) + k / 128)]) *
                   round_f16(xs[size_t(t2 * p.cols + k)]);
          max_ref = std::max(max_ref, std::fabs(acc));
          max_err = std::max(max_err, std::fabs(acc - double(yg[size_t(t2 * p.rows + r)])));
        }
      const double rel = max_err / std::max(max_ref, 1e-30);
      fmt::print("spot check FP8 wq_a n=8: max |gpu - cpu| = {:.3e} (max |ref| {:.3e}, normalized {:.2e})\n", max_err, max_ref, rel);
      B.checks.push_back({{"kernel", "fp8 wq_a"}, {"batch", n}, {"max_abs_err", max_err}, {"max_ref", max_ref}, {"normalized", rel}});
    }
  }
}

// The FP8 shared expert (gate+up+SwiGLU, down) at 1-32 tokens.
void bench_shared_expert(Bench& B, Synth& W) {
  const Stream S = B.s;
  const int64_t D = W.D;
  const int64_t I = W.I;
  const int nc = B.copies_for(3.0 * double(I * D));
  std::vector<Fp8Expert> ses(static_cast<size_t>(nc));
  for (auto& se : ses) {
    se.w1 = alloc_fp8(I, D), se.w3 = alloc_fp8(I, D), se.w2 = alloc_fp8(D, I);
    for (Fp8Matrix* m : {&se.w1, &se.w3, &se.w2}) {
      d::fill(m->codes.get(), m->codes.bytes(), d::kFillE4M3, W.seed++, 0, 0);
      d::fill(m->scales.get(), m->scales.bytes(), d::kFillE8M0, W.seed++, 112, 118);
    }
  }
  for (int n : {1, 8, 16, 32}) {
    const Timing t = B.time([&](int i) {
      fp8_expert_ffn(ses[size_t(i % nc)], W.x16.get(), Act::F16, n, 10.0, W.scratch.h.as<uint16_t>(), W.y.as<float>(), W.ws, S);
    });
    const double bytes = 3.0 * double(I * D) + 3.0 * double(ses[0].w1.scale_bytes()) + double(n * D * 2) +
                         2.0 * double(n * I * 2) + double(n * D * 4);
    B.add(B.rows, {"FP8 shared expert (gate+up+SwiGLU, down)", "[2048, 4096] x2 + [4096, 2048]", "2 launches", n, 0, bytes}, t);
  }
}

// The compressors' bf16 projections at a few tokens: cuBLASLt GEMMs (cuda.prefill_gemm) vs the GEMV's bf16
// table launch (cuda.bf16_gemv). A CSA layer's four (wkv and wgate [1024, 4096], the indexer compressor's [256, 4096]) from one bf16 conversion
// of x, both paths; bytes: the weights, x (fp32 in, bf16 out and in again), y.
void bench_bf16_compressors(Bench& B, Synth& W) {
  const Stream S = B.s;
  const int64_t D = W.D;
  if (B.want("bf16")) {
    const int64_t cols = D, prow[4] = {1024, 1024, 256, 256};
    double wbytes = 0;
    for (int64_t r : prow) wbytes += double(r * cols * 2);
    const int nc = B.copies_for(wbytes);
    std::vector<DeviceBuffer> wsets;
    for (int c = 0; c < nc; ++c)
      for (int64_t r : prow) {
        wsets.emplace_back(size_t(r * cols) * 2);
        d::fill(wsets.back().get(), size_t(r * cols), d::kFillBF16, W.seed++, -0.05f, 0.05f);
      }
    const int most = 32;
    DeviceBuffer bx(size_t(most * cols) * 2), yb(size_t(most) * 2560 * 4);
    Fp8GemmBuffers fb;
    fb.x = bx.as<uint16_t>(), fb.x_elems = size_t(most * cols);
    auto projs = [&](int i) {
      std::array<Bf16Proj, 4> p;
      int64_t off = 0;
      for (int j = 0; j < 4; ++j) {
        p[size_t(j)] = Bf16Proj{wsets[size_t((i % nc) * 4 + j)].as<uint16_t>(), prow[j], yb.as<float>() + off, prow[j]};
        off += int64_t(most) * prow[j];
      }
      return p;
    };
    for (int n : {2, 4, 8, 16, 32}) {
      const double bytes = wbytes + double(n * cols) * (4 + 2 + 2) + double(n) * 2560 * 4;
      const std::string shape = "CSA: [1024, 4096] x2 + [256, 4096] x2";
      if (have_cublaslt()) {
        const Timing t = B.time([&](int i) {
          const auto p = projs(i);
          bf16_linear_gemm_multi(p.data(), 4, cols, W.x32.get(), Act::F32, cols, n, fb, S);
        });
        B.add(B.rows, {"bf16 compressor projections, cuBLASLt", shape, "cuda.prefill_gemm: 1 + 4 launches", n, 0, bytes}, t);
      }
      const Timing t = B.time([&](int i) {
        const auto p = projs(i);
        bf16_linear_gemv_multi(p.data(), 4, cols, W.x32.get(), Act::F32, cols, n, fb, S);
      });
      B.add(B.rows, {"bf16 compressor projections, GEMV", shape, "cuda.bf16_gemv: 1 + 1 launches", n, 0, bytes}, t);
    }
  }
}

}  // namespace plumb::cuda::kbench
#endif  // PLUMB_WITH_CUDA
