// `plumb bench`'s latency-bound sections: a chain of dependent steps as launches or one persistent launch
// ("phases"), hc_pre at V4-Flash's size ("hc"), the sparse decode attention at a long context ("attention") and the
// lightning indexer at a long context ("indexer").
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

// What a layer's chain of dependent steps costs beyond its bytes (the persistent layer kernel's question, docs/cuda.md):
// four buffers of wq_b's size (33.5 MB) streamed one after another, as four launches or one persistent launch with
// grid barriers, without and with a 10 us latency-bound step before each of the last three (about an indexer's or an
// attention's step at batch 1), the persistent launch also staging the next buffer during those steps (into L2, all
// of it or half; or 200 KB per block into shared memory), the launches also under PDL (each read staging 200 KB per
// block into shared memory before its wait, or nothing); and one read of all the bytes. Two copies of the buffers
// alternate so that the graph's calls read cold bytes.
void bench_phases(Bench& B) {
  constexpr int P = 4;
  constexpr size_t kBytes = size_t(32768) * 1024;
  constexpr unsigned kGapNs = 10000;
  DeviceBuffer bufs(2 * P * kBytes), bar(64);
  d::fill(bufs.get(), bufs.bytes(), d::kFillBytes, 77, 0, 0);
  bar.fill_byte(0);
  auto at = [&](int i, int p) { return bufs.as<uint8_t>() + (size_t(i % 2) * P + size_t(p)) * kBytes; };
  const double total = double(P) * double(kBytes);
  const std::string name = fmt::format("phases: {} x {:.1f} MB", P, double(kBytes) / 1e6);
  for (const unsigned gap : {0u, kGapNs}) {
    const std::string note = gap ? fmt::format("{} steps of {} us included", P - 1, gap / 1000) : "";
    Timing t = B.time([&](int i) {
      for (int p = 0; p < P; ++p) {
        if (p > 0 && gap) d::spin(gap, B.s);
        d::read_stream(at(i, p), kBytes, B.sink.as<unsigned>(), B.s);
      }
    });
    B.add(B.rows, {name, "a launch per step", note, 1, 0, total}, t);
    // The same launches under PDL: each read launched while the step before it runs, its blocks first copying
    // 200 KB each (26 MB) of their share into shared memory, or nothing, before they wait.
    for (const size_t stage : {size_t(0), size_t(200) * 1024}) {
      t = B.time([&](int i) {
        for (int p = 0; p < P; ++p) {
          if (p > 0 && gap) d::spin_pdl(gap, B.s);
          d::staged_read(at(i, p), kBytes, stage, B.sink.as<unsigned>(), B.s);
        }
      });
      B.add(B.rows, {name, stage ? "a launch per step, PDL, 26 MB to smem before the wait" : "a launch per step, PDL", note, 1, 0, total}, t);
    }
    for (const int pf : {0, 1, 2, 3}) {
      if (pf && !gap) continue;
      d::PhaseArgs a;
      a.phases = P, a.gap_ns = gap, a.prefetch = pf, a.bar = bar.as<unsigned>(), a.sink = B.sink.as<unsigned>();
      try {
        t = B.time([&](int i) {
          d::PhaseArgs b = a;
          for (int p = 0; p < P; ++p) b.buf[p] = at(i, p), b.bytes[p] = kBytes;
          d::phase_stream(b, B.s);
        });
      } catch (const std::exception& ex) {
        fmt::print("skipped the persistent phase launch: {}\n", ex.what());
        d::dsync();
        continue;
      }
      static const char* const kVariant[4] = {"one launch, grid barriers", "one launch, next buffer to L2 in the steps",
                                              "one launch, half of it to L2 in the steps", "one launch, 26 MB of it to smem in the steps"};
      B.add(B.rows, {name, kVariant[pf], note, 1, 0, total}, t);
    }
  }
  const Timing t = B.time([&](int i) { d::read_stream(at(i, 0), P * kBytes, B.sink.as<unsigned>(), B.s); });
  B.add(B.rows, {name, "one read of all the bytes", "", 1, 0, total}, t);
}

// hc_pre at V4-Flash's size (hc_mult 4, hidden 4096, 20 Sinkhorn iterations): a latency-bound launch of the
// decode chain (two per layer). As the forward runs it (the previous sublayer's hc_post and the RMSNorm fused), and without each fused part; the
// one-iteration row is a diagnostic of the Sinkhorn's share of the launch (its comb differs), not a configuration;
// then the launch numerics.official makes (its mix mode, bf16 activations, the norm a launch of its own); the last
// two the forward's under cuda.streams (the gates and Sinkhorn apart: that launch is not timed), exact and with
// cuda.hc_norm_after_mix. Bytes: fn (24 x 16384 fp32) and the rows read and written.
void bench_hc(Bench& B, Synth& W) {
  const Stream S = B.s;
  const int64_t D = W.D;
  if (B.want("hc")) {
    const int H = 4, nm = (2 + H) * H, hn = 128;  // tokens at most
    const int64_t Dh = D;  // hidden
    DeviceBuffer X(size_t(hn) * H * size_t(Dh) * 4), Xp(size_t(hn) * H * size_t(Dh) * 4), fn(size_t(nm) * H * size_t(Dh) * 4),
        base(size_t(nm) * 4), scl(3 * 4), post(size_t(hn) * H * 4), comb(size_t(hn) * H * H * 4), postp(size_t(hn) * H * 4),
        combp(size_t(hn) * H * H * 4), col(size_t(hn) * size_t(Dh) * 4), col16(size_t(hn) * size_t(Dh) * 2),
        yv(size_t(hn) * size_t(Dh) * 4), nw(size_t(Dh) * 4), mix(d::fwd_hc_scratch_doubles(hn, H) * 8);
    for (DeviceBuffer* b : {&X, &Xp, &yv}) d::fill(b->get(), b->bytes() / 4, d::kFillF32, W.seed++, -1.0f, 1.0f, S);
    d::fill(fn.get(), fn.bytes() / 4, d::kFillF32, W.seed++, -0.01f, 0.01f, S);
    for (DeviceBuffer* b : {&base, &scl, &postp, &combp, &nw}) d::fill(b->get(), b->bytes() / 4, d::kFillF32, W.seed++, 0.1f, 1.0f, S);
    struct HcVar {
      const char* name;
      bool post, norm;
      int iters;
      bool official = false;  // numerics.official's launch: x . fn times r afterwards, bf16 activations, no fused norm
      bool apart = false;     // the gates left to fwd_hc_gates (cuda.streams runs them beside the sublayer; not timed)
      bool after = false;     // cuda.hc_norm_after_mix
    };
    const HcVar vars[] = {{"hc_pre + fused hc_post + norm (the forward's)", true, true, 20},
                          {"hc_pre + norm (X loaded)", false, true, 20},
                          {"hc_pre alone", false, false, 20},
                          {"hc_pre + fused hc_post + norm, 1 Sinkhorn iteration (diagnostic)", true, true, 1},
                          {"hc_pre + fused hc_post, numerics.official", true, false, 20, true},
                          {"hc_pre + fused hc_post + norm, gates apart", true, true, 20, false, true},
                          {"hc_pre + fused hc_post + norm, gates apart, cuda.hc_norm_after_mix", true, true, 20, false, true, true}};
    // 1 and 8 tokens: every variant at the launch's rule; 8-128 (batched decode): the forward's variant with the
    // rule and with each tokens-per-cluster choice.
    for (int n : {1, 8, 16, 32, 64, 128})
      for (int per_cluster : {0, 1, 2, 4})
        for (const HcVar& v : vars) {
          const bool every = n <= 8 && per_cluster == 0, sweep = n >= 8 && &v == &vars[0] && (n > 8 || per_cluster != 0);
          if (!every && !sweep) continue;
          d::HcArgs a;
          a.tokens_per_cluster = per_cluster;
          a.X = X.as<float>(), a.fn = fn.as<float>(), a.base = base.as<float>(), a.scale = scl.as<float>();
          a.n = n, a.H = H, a.iters = v.iters, a.D = Dh, a.hc_eps = 1e-6f, a.rms_eps = 1e-6;
          a.post = post.as<float>(), a.comb = comb.as<float>(), a.collapsed = col.as<float>();
          if (v.post)
            a.y = yv.as<float>(), a.X_prev = Xp.as<float>(), a.post_prev = postp.as<float>(), a.comb_prev = combp.as<float>(),
            a.X_out = X.as<float>();
          if (v.norm) a.norm_w = nw.as<float>(), a.norm_eps = 1e-6, a.collapsed16 = col16.as<uint16_t>();
          if (v.official) a.mix_mode = 2, a.act_bf16 = 1;
          a.gates_apart = v.apart, a.norm_after_mix = v.after;
          const double bytes = double(fn.bytes()) + double(n) * double(Dh) * 4 * (H + (v.post ? H + 1 + H : 0) + 1);
          const std::string how = per_cluster ? fmt::format("{} Sinkhorn iterations, {} tokens per cluster", v.iters, per_cluster)
                                              : fmt::format("{} Sinkhorn iterations", v.iters);
          B.add(B.rows, {v.name, "hc_mult 4, hidden 4096", how, n, 0, bytes},
                B.time([&](int) { d::fwd_hc_pre(a, mix.as<double>(), S); }));
        }
  }
}

// The sparse attention at a long context: the unsplit twin vs attn.splitk_decode (fp64, and attn.splitk_f16).
// An HCA layer at 1M tokens (8192 compressed entries + the 128-key window, 64 heads x 512): the bytes are the keys
// (read once by an ideal kernel), the queries and the outputs.
void bench_attention(Bench& B, Synth& W) {
  const Stream S = B.s;
  const int maxn = W.maxn;
  if (B.want("attention")) {
    const int Hq = 64;
    const int64_t Dh = 512, win = 128, rate = 128, ne = 8192, maxk = win + ne;
    DeviceBuffer q(size_t(maxn) * Hq * Dh * 4), kv(size_t(maxn) * Dh * 4), ring(size_t(win * Dh) * 4), ent(size_t(ne * Dh) * 4);
    DeviceBuffer sink(size_t(Hq) * 4), pos = to_device(std::vector<int64_t>{ne * rate - maxn});
    for (DeviceBuffer* b : {&q, &kv, &ring, &ent, &sink}) d::fill(b->get(), b->bytes() / 4, d::kFillF32, W.seed++, -1.0f, 1.0f);
    DeviceBuffer logits(size_t(maxn) * Hq * maxk * 4), out(size_t(maxn) * Hq * Dh * 4);
    for (int n : {1, 8}) {
      d::AttendArgs a;
      a.q = q.as<float>(), a.chunk_kv = kv.as<float>(), a.ring = ring.as<float>(), a.entries = ent.as<float>();
      a.sink = sink.as<float>(), a.pos = pos.as<int64_t>(), a.out = out.as<float>();
      a.n = n, a.Hq = Hq, a.type = 2, a.Dh = Dh, a.window = win, a.ne = ne, a.rate = rate, a.scale = 1.0f / std::sqrt(float(Dh));
      const double bytes = double(maxk * Dh * 4) + 2.0 * double(n * Hq * Dh * 4);
      const std::string shape = fmt::format("HCA {} keys, {} heads x {}", maxk, Hq, Dh);
      d::AttendArgs tw = a;
      tw.logits = logits.as<float>(), tw.ld_logits = maxk;
      B.add(B.rows, {"attention (unsplit twin)", shape, "logits, then softmax + P.V", n, 0, bytes},
            B.time([&](int) { d::fwd_attend(tw, S); }));
      const d::SplitPlan plan = d::fwd_attend_splitk_plan(n, Hq, Dh, maxk, B.dev.sm_count);
      DeviceBuffer part(std::max<size_t>(plan.scratch_bytes, 8));
      B.add(B.rows, {"attention (attn.splitk_decode)", shape, fmt::format("{} splits of {} keys", plan.splits, plan.keys_per_split(maxk)), n, 0, bytes},
            B.time([&](int) { d::fwd_attend_splitk(a, plan, part.get(), S); }));
      d::AttendArgs ah = a;
      ah.f16 = 1;
      B.add(B.rows, {"attention (attn.splitk_f16)", shape, fmt::format("{} splits of {} keys, f16 products", plan.splits, plan.keys_per_split(maxk)), n, 0, bytes},
            B.time([&](int) { d::fwd_attend_splitk(ah, plan, part.get(), S); }));
    }
  }
}

// The lightning indexer at a long context: the exact scores vs indexer.dmma_scores and indexer.tc_scores.
// A CSA layer at 256K tokens (65536 compressed entries, 64 heads x 128 dims, top-512), scores and top-k per call:
// the bytes are the keys (read once by an ideal kernel), the queries and the scores.
void bench_indexer(Bench& B, Synth& W) {
  const Stream S = B.s;
  if (B.want("indexer")) {
    const int nh = 64, topk = 512;
    const int64_t dh = 128, rate = 4, ne = 65536;
    DeviceBuffer iq(size_t(8) * nh * dh * 4), keys(size_t(ne * dh) * 4), hw(size_t(8) * nh * 4);
    for (DeviceBuffer* b : {&iq, &keys, &hw}) d::fill(b->get(), b->bytes() / 4, d::kFillF32, W.seed++, -1.0f, 1.0f);
    for (int n : {1, 8}) {
      DeviceBuffer pos = to_device(std::vector<int64_t>{ne * rate - n}), scores(size_t(n) * size_t(ne) * 4),
                   sel(size_t(n) * topk * 8);
      d::IndexArgs a;
      a.q = iq.as<float>(), a.keys = keys.as<float>(), a.hw = hw.as<float>(), a.pos = pos.as<int64_t>();
      a.n = n, a.nh = nh, a.topk = topk, a.k_cap = topk, a.dh = dh, a.ne_cap = ne, a.rate = rate;
      a.qscale = 1.0f / std::sqrt(float(dh)), a.wscale = 1.0f / std::sqrt(float(nh));
      a.scores = scores.as<float>(), a.sel = sel.as<int64_t>();
      a.topk_scratch_bytes = d::fwd_index_topk_scratch_bytes(n, ne, topk, d::fwd_index_topk_path(n, ne, topk));
      DeviceBuffer scratch(std::max<size_t>(a.topk_scratch_bytes, 8));
      a.topk_scratch = scratch.get();
      const double bytes = double(ne * dh * 4) + double(n * nh * dh * 4) + double(n * ne * 4);
      const std::string shape = fmt::format("{} entries, {} heads x {}, top-{}", ne, nh, dh, topk);
      const struct {
        const char* name;
        int path;
        const char* note;
      } paths[] = {{"indexer (exact scores)", d::fwd_indexer_path(a), "fp64 dots in dim order, then the top-k"},
                   {"indexer (indexer.dmma_scores)", d::kIndexerDmma, "the dots on the fp64 tensor cores (exact)"},
                   {"indexer (indexer.tc_scores)", d::kIndexerTc, "f16 tensor cores (tolerance 1e-2)"}};
      for (const auto& pth : paths)
        B.add(B.rows, {pth.name, shape, pth.note, n, 0, bytes}, B.time([&](int) { d::fwd_indexer(a, S, pth.path); }));
    }
  }
}

}  // namespace plumb::cuda::kbench
#endif  // PLUMB_WITH_CUDA
