// MoE sublayer on the GPU (twin of src/model/router.cpp + experts.cpp) under the same routed-scaling contract:
// the routing's placement is part of its type (GpuRouted<P>), a runner consumes exactly one placement
// (RunnerAccepts from model/experts.h), so routed_scaling_factor is applied once, for hash and learned layers
// alike, and never to the shared expert. As on the CPU, only the fault branch below may relabel a placement.
#ifdef PLUMB_WITH_CUDA
#include "cuda/gpu_moe.h"

#include "cuda/gpu_numerics.h"
#include "model/experts.h"

#include <optional>

namespace plumb::cuda {

using namespace detail;

namespace {

template <Rsf P>
struct GpuRouted {
  int32_t* idx = nullptr;   // [n, K]
  float* weight = nullptr;  // [n, K]; contains routed_scaling_factor iff P == Folded
  float* logits = nullptr;  // [n, E]
  float* select = nullptr;  // [n, E] learned layers, else null
  int n = 0, K = 0, E = 0;
  // cuda.topk_in_experts: the top-k left to the routed experts' launches (fwd_route's arguments, never launched);
  // idx, weight and select hold the routing once gate/up has run.
  detail::RouteArgs ranked;
  bool in_experts = false;
};

struct MoeCtx {
  const GpuMoe& w;
  const ModelConfig& c;
  MlpType type;
  const ModelOptions& opt;
  const float* x;
  const uint16_t* x16;  // x as f16 (the tensor-core kernels' input) or null
  int n;
  const int32_t* tokens;
  Scratch& sc;
  const Tap& tap;
  GpuNumerics nm;
  Stream shared_side = nullptr;  // cuda.streams: the shared expert already runs on this stream (joined in combine)
  GpuCombine* defer = nullptr;   // gpu_moe's: the combine may be left to the output's reader
};

// The official order (and moe.weight_before_down): each routing weight applied before W2, inside gate/up.
bool weight_before_w2(const MoeCtx& m) { return m.opt.weight_before_down || m.nm.official(); }

template <Rsf P>
GpuRouted<P> route(const MoeCtx& m) {
  OpRegion region(m.sc.timer, "moe.router");
  const auto& c = m.c;
  GpuRouted<P> r;
  r.n = m.n, r.K = c.top_k, r.E = c.n_experts;
  r.logits = m.sc.f("moe.logits", int64_t(m.n) * r.E);
  r.weight = m.sc.f("moe.weight", int64_t(m.n) * r.K);
  r.idx = static_cast<int32_t*>(m.sc.get("moe.idx", size_t(m.n) * size_t(r.K) * 4));
  if (m.type == MlpType::Learned) r.select = m.sc.f("moe.select", int64_t(m.n) * r.E);
  // fp32 logits; x . bf16(gate) under numerics.official (DeepSeek's Gate), bf16 operands and logits for router.bf16
  std::optional<OpRegion> d(std::in_place, m.sc.timer, "router/gate", true);
  if (m.nm.official() && !m.opt.router_bf16 && m.opt.cuda_bf16_gemv && plain_bf16(m.w.gate) && r.E % 16 == 0 && c.hidden % 128 == 0) {
    // cuda.bf16_gemv under the official numerics: x is stored as bf16 there, so the GEMV's bf16 rounding of it is
    // exact and every product exact in fp32; fp32 accumulation and logits, as DeepSeek's Gate (the twin sums in fp64).
    const Bf16Proj p{static_cast<const uint16_t*>(m.w.gate.d.w), r.E, r.logits, r.E};
    bf16_linear_gemv_multi(&p, 1, c.hidden, m.x, cuda::Act::F32, c.hidden, m.n, gemv16_buffers(m.sc, size_t(m.n) * size_t(c.hidden)));
  } else if (m.nm.official() || m.opt.router_bf16) {
    linear_bf16_weight(m.w.gate, m.x, m.n, c.hidden, r.logits, r.E, m.opt.router_bf16);
  } else {
    fwd_linear(m.w.gate.d, m.x, m.n, c.hidden, 0, r.E, r.logits, r.E, nullptr);
  }
  d.reset();
  RouteArgs a;
  a.logits = r.logits;
  a.bias = m.type == MlpType::Learned ? f32(m.w.bias) : nullptr;
  a.tid2eid = m.type == MlpType::Hash ? m.w.tid2eid.as<int32_t>() : nullptr;
  a.tokens = m.tokens;
  a.n = m.n, a.E = r.E, a.K = r.K;
  a.score = c.score == ScoreFunc::SqrtSoftplus ? 0 : c.score == ScoreFunc::Sigmoid ? 1 : 2;
  a.hash = m.type == MlpType::Hash;
  a.n_group = c.n_group, a.topk_group = c.topk_group;
  a.unfloored = m.opt.fault_renorm_unfloored;
  a.renorm = !(m.nm.official() && c.score == ScoreFunc::Softmax);  // DeepSeek's Gate skips it for softmax
  a.softplus_naive = m.opt.fault_softplus_naive;
  a.fold = P == Rsf::Folded ? float(c.routed_scaling) : 1.0f;
  a.idx = r.idx, a.weight = r.weight, a.select = r.select;
  // cuda.topk_in_experts: at one token the routed experts' launches rank the logits themselves (combine), one
  // dependent launch fewer on the chain; the routing is the same bits (the same device code).
  if (m.opt.cuda_topk_in_experts && m.w.fp4 && !weight_before_w2(m) && moe_ranks_in_experts(a, *m.w.fp4)) {
    r.ranked = a, r.in_experts = true;
    return r;
  }
  const OpRegion topk(m.sc.timer, "router/topk", true);
  fwd_route(a, nullptr);
  return r;
}

// Reinterprets a placement without changing the numbers: the mechanism of every "missing" bug (fault only).
template <Rsf To, Rsf From>
GpuRouted<To> fault_relabel(const GpuRouted<From>& r) {
  return GpuRouted<To>{r.idx, r.weight, r.logits, r.select, r.n, r.K, r.E, r.ranked, r.in_experts};
}
// A runner that consumes Folded weights but scales its output anyway: the double application (fault only).
struct FaultRunnerScalesFoldedAgain {
  static constexpr Rsf consumes = Rsf::Folded;
  static float output_scale(const ModelConfig& c) { return float(c.routed_scaling); }
};

// The golden routing taps, through the reference's own tap_routing (indices sorted, factor applied).
template <Rsf P>
void tap_routes(const MoeCtx& m, const GpuRouted<P>& r) {
  const Tap& t = m.tap;
  if (!t.on("ffn.gate.logits") && !t.on("ffn.gate.scores") && !t.on("ffn.gate.indices") && !t.on("ffn.gate.weights")) return;
  std::vector<int32_t> idx(size_t(r.n) * size_t(r.K));
  d2h(idx.data(), r.idx, idx.size() * 4);
  RoutedWeights<P> h{IndexTensor({r.n, r.K}), download(r.weight, {r.n, r.K}), download(r.logits, {r.n, r.E}),
                     r.select ? download(r.select, {r.n, r.E}) : Tensor()};
  for (size_t i = 0; i < idx.size(); ++i) h.idx[int64_t(i)] = idx[i];
  tap_routing(t, h, m.c.routed_scaling);
}

// SwiGLU expert FFN for `slots` rows: W1/W3 from mats1/mats3 (indexed by idx, or the single matrix when idx is
// null), input row slot / x_div, optional per-slot weight before W2; ys [slots, D]. The activation is the config's
// (expert_activation); `bias` (the shared MLP under mlp_bias): b1, b2, b3 as F.linear adds them, b1 / b3 before the
// clamps, b2 after W2.
void expert_ffn(const MoeCtx& m, const DMat* d1, const DMat* d2, const DMat* d3, const int32_t* idx, int slots, int x_div, int64_t I,
                double limit, const float* pre, float* ys, const GpuMoe* bias = nullptr) {
  static_assert(int(ExpertAct::Silu) == 0 && int(ExpertAct::Gelu) == 1 && int(ExpertAct::GeluTanh) == 2 && int(ExpertAct::Relu) == 3,
                "swiglu_kernel's activation codes are ExpertAct's values");
  const int64_t D = m.c.hidden;
  float* g = m.sc.f("moe.g", slots * I);
  float* u = m.sc.f("moe.u", slots * I);
  float* h = m.sc.f("moe.h", slots * I);
  const bool b = bias && bias->sb1.get();
  m.nm.proj_slots(d1, idx, slots, x_div, m.x, D, I, D, g, I, m.sc);
  m.nm.proj_slots(d3, idx, slots, x_div, m.x, D, I, D, u, I, m.sc);
  fwd_swiglu(g, u, I, slots, I, float(limit), pre, h, nullptr, m.nm.official() ? 1 : 0,  // (official: act in the launch)
             int(expert_activation(m.c, m.nm.official())), b ? bias->sb1.as<float>() : nullptr, b ? bias->sb3.as<float>() : nullptr);
  m.nm.proj_slots(d2, idx, slots, 1, h, I, D, I, ys, D, m.sc);
  if (b) fwd_add_row(ys, slots, D, bias->sb2.as<float>(), nullptr);
}

// The shared expert into `shared` [n, D]: weight 1, never scaled by routed_scaling_factor. It reads only x.
void shared_expert(const MoeCtx& m, float* shared) {
  const double limit = m.opt.fault_swiglu_unclamped ? kSwigluNoClamp : swiglu_clamp_limit(m.c, m.nm.official());
  const OpRegion region(m.sc.timer, "moe.shared");
  if (m.w.sfp8 && m.w.shared_gemm_min && m.n >= m.w.shared_gemm_min) {  // cuda.prefill_gemm: bf16 GEMMs from the fp32 x
    const size_t I = size_t(m.w.sfp8->w1.rows), n = size_t(m.n), D = size_t(m.c.hidden);
    fp8_expert_ffn_gemm(*m.w.sfp8, m.x, cuda::Act::F32, m.n, limit, shared, gemm_buffers(m.sc, n * D, 2 * I * D, n * 2 * I, n * I));
  } else if (m.w.sfp8 && m.nm.official()) {
    // cuda.fp8_gemv under the official numerics: expert_ffn's steps with each projection on the E4M3 tensor cores.
    const double shared_limit = m.nm.official_initial() ? kSwigluNoClamp : limit;
    const int64_t I = m.w.sfp8->w1.rows, D = m.c.hidden;
    float* g = m.sc.f("moe.g", m.n * I);
    float* u = m.sc.f("moe.u", m.n * I);
    float* h = m.sc.f("moe.h", m.n * I);
    const OfficialCodes xq = official_quant(m.x, m.n, D, D, m.sc);  // one quantization of x for w1 and w3
    official_fp8_linear(m.w.sfp8->w1, xq, m.n, g, I, m.sc);
    official_fp8_linear(m.w.sfp8->w3, xq, m.n, u, I, m.sc);
    fwd_swiglu(g, u, I, m.n, I, float(shared_limit), nullptr, h, nullptr, 1);  // (act in the launch)
    official_fp8_linear(m.w.sfp8->w2, h, m.n, I, shared, D, m.sc);
  } else if (m.w.sfp8) {  // cuda.fp8_gemv: gate/up + SwiGLU fused, then down
    auto* h16 = static_cast<uint16_t*>(m.sc.get("moe.shared.h16", size_t(m.n) * size_t(m.w.sfp8->w1.rows) * 2));
    fp8_expert_ffn(*m.w.sfp8, m.x16 ? static_cast<const void*>(m.x16) : m.x, m.x16 ? cuda::Act::F16 : cuda::Act::F32, m.n, limit,
                   h16, shared, m.sc.work());
  } else {
    // The release-day official code's shared expert had no SwiGLU clamp.
    const double shared_limit = m.nm.official_initial() ? kSwigluNoClamp : limit;
    expert_ffn(m, m.w.shared_desc.as<DMat>(), m.w.shared_desc.as<DMat>() + 1, m.w.shared_desc.as<DMat>() + 2, nullptr, m.n, 1,
               m.w.s1->d.rows, shared_limit, nullptr, shared, &m.w);
  }
}

// Tokens per chunk from which the routed experts run as grouped GEMMs (moe_gate_up_grouped) instead of the decode
// kernels (8 tokens per expert per pass, every active expert read once per 1024 slots). Above 256 slots the decode
// kernels go by a group table (moe_group, two small launches) instead of a block per slot scanning every slot for
// its expert's others (a cost that grows with the square of the slots; gate/up: the same bits; down: the streaming
// kernel, which groups at most 256 slots itself, reads the grouping from the table). `plumb bench` crossover
// lines, H200 (bench/results/h200-session9/moe-crossover.txt), gate+up + down, graph-replayed, decode with the
// table / with the scan / grouped: 32 tokens 596 / 594 / 911 us, 64 tokens 820 / 1220 / 1217, 128 tokens 1008 /
// 2131 / 1463, 256 tokens 1990 / 4389 / 1561; at 16 tokens the table's launches cost more than the scan (360 /
// 343 us).
constexpr int kGroupedMinTokens = 192;
constexpr int kDecodeTableMinSlots = 257;

// routed + shared; `total_scale` != 1 only for fault.shared_scaled.
template <class Runner, Rsf P>
  requires RunnerAccepts<Runner, P>
void combine(const Runner&, const MoeCtx& m, const GpuRouted<P>& r, float* out, float total_scale = 1.0f) {
  const auto& c = m.c;
  const int64_t D = c.hidden, I = c.moe_inter;
  if (!r.in_experts) tap_routes(m, r);  // (else after gate/up, which stores the routing)
  const double limit = m.opt.fault_swiglu_unclamped ? kSwigluNoClamp : swiglu_clamp_limit(c, m.nm.official());
  const bool before = weight_before_w2(m);
  const int slots = r.n * r.K;
  float* ys = m.sc.f("moe.ys", slots * D);
  // The shared expert (shared_expert): on the side stream with cuda.streams (route_and_shared; joined here),
  // else run here, after the routed experts.
  const bool has_shared = m.w.s1 || m.w.sfp8;
  float* shared = has_shared ? m.sc.f("moe.shared", r.n * D) : nullptr;
  // With the shared expert already on the side stream, the combine adds it (join first): one launch fewer, the
  // same bits as combine then fwd_add (launch_combine rounds the add separately). The fp32 twin's combine adds below.
  const bool official = m.nm.official();  // (its W4A8 path adds the shared expert after the combine, as the twin)
  const float* add = has_shared && m.shared_side && m.w.fp4 && !official ? shared : nullptr;
  bool joined = false;
  auto join_for_add = [&] {  // right before the first combine: the routed GEMVs still overlap the shared expert
    if (add && !joined) branch_join(m.shared_side, m.sc.ev_join), joined = true;
  };
  std::optional<OpRegion> region(std::in_place, m.sc.timer, "moe.routed");
  // The decode kernels (below) take at most 1024 slots per launch; above kDecodeTableMinSlots they go by moe_group's
  // table (the same bits, fewer scans).
  const int chunk = std::max(1, 1024 / r.K);
  auto decode_groups = [&](const int32_t* idx, int nc) -> void* {
    if (nc * r.K < kDecodeTableMinSlots || r.E > 1024) return nullptr;
    void* g = m.sc.get("moe.groups", moe_group_bytes(nc, r.K, r.E));
    moe_group(idx, nc, r.K, r.E, g);
    return g;
  };
  const bool grouped = m.w.fp4 && !official && r.n >= kGroupedMinTokens && r.E <= 1024 && I % 128 == 0 && D % 256 == 0;
  if (grouped) {  // cuda.moe_mxfp4 at prefill: grouped GEMMs, each expert's weights read once per 64 of its tokens
    void* groups = m.sc.get("moe.groups", moe_group_bytes(r.n, r.K, r.E));
    auto* h16 = static_cast<uint16_t*>(m.sc.get("moe.h16.grouped", size_t(slots) * size_t(I) * 2));
    moe_group(r.idx, r.n, r.K, r.E, groups);
    moe_gate_up_grouped(*m.w.fp4, groups, r.n, r.K, m.x16 ? static_cast<const void*>(m.x16) : m.x,
                        m.x16 ? cuda::Act::F16 : cuda::Act::F32, limit, before ? r.weight : nullptr, h16, m.sc.ws);
    moe_down_grouped(*m.w.fp4, groups, r.n, r.K, h16, ys);
    join_for_add();
    moe_combine(ys, before ? nullptr : r.weight, r.n, r.K, D, Runner::output_scale(c), add, out);
  } else if (m.w.fp4 && official) {
    // cuda.moe_mxfp4 under the official numerics: the W4A8 kernels (DeepSeek's fp4_gemm: x and h quantized to E4M3
    // per 128 as its act_quant does, bf16 outputs), then the twin's combine.
    const size_t cs = size_t(std::min(r.n, chunk)) * size_t(r.K);
    auto* x8 = static_cast<uint8_t*>(m.sc.get("moe.x8", size_t(std::min(r.n, chunk)) * size_t(D)));
    float* xs = m.sc.f("moe.xs", int64_t(std::min(r.n, chunk)) * (D / 128));
    float* h = m.sc.f("moe.h", int64_t(cs) * I);
    auto* h8 = static_cast<uint8_t*>(m.sc.get("moe.h8", cs * size_t(I)));
    float* hs = m.sc.f("moe.hs", int64_t(cs) * (I / 128));
    for (int t0 = 0; t0 < r.n; t0 += chunk) {
      const int nc = std::min(chunk, r.n - t0);
      const int32_t* idx = r.idx + int64_t(t0) * r.K;
      const float* wt = r.weight + int64_t(t0) * r.K;
      void* g = decode_groups(idx, nc);
      act_quant_e4m3(m.x + int64_t(t0) * D, nc, D, D, x8, xs);
      {
        const OpRegion d(m.sc.timer, "routed/gate_up", true);
        moe_gate_up_a8(*m.w.fp4, idx, nc, r.K, x8, xs, limit, before ? wt : nullptr, h, nullptr, g);
      }
      act_quant_e4m3(h, int64_t(nc) * r.K, I, I, h8, hs);
      {
        const OpRegion d(m.sc.timer, "routed/down", true);
        moe_down_a8(*m.w.fp4, idx, nc, r.K, h8, hs, ys, nullptr, g);
      }
      ++m.sc.official_tc_calls;
      fwd_moe_combine(ys, before ? nullptr : wt, nc, r.K, D, Runner::output_scale(c), out + int64_t(t0) * D, nullptr, idx);
    }
  } else if (m.w.fp4) {  // cuda.moe_mxfp4: W4A16 tensor-core kernels, f16 hidden state
    auto* h16 = static_cast<uint16_t*>(m.sc.get("moe.h16", size_t(std::min(r.n, chunk)) * size_t(r.K) * size_t(I) * 2));
    for (int t0 = 0; t0 < r.n; t0 += chunk) {
      const int nc = std::min(chunk, r.n - t0);
      const int32_t* idx = r.idx + int64_t(t0) * r.K;
      const float* wt = r.weight + int64_t(t0) * r.K;
      const void* xc = m.x16 ? static_cast<const void*>(m.x16 + int64_t(t0) * D) : m.x + int64_t(t0) * D;
      void* g = decode_groups(idx, nc);
      const cuda::Act xt = m.x16 ? cuda::Act::F16 : cuda::Act::F32;
      if (r.in_experts) {  // cuda.topk_in_experts (one token, one chunk, no weight before W2: route)
        {
          const OpRegion d(m.sc.timer, "routed/gate_up", true);
          moe_gate_up_ranked(*m.w.fp4, r.ranked, xc, xt, limit, h16, m.sc.ws);
        }
        tap_routes(m, r);
        const OpRegion d(m.sc.timer, "routed/down", true);
        moe_down(*m.w.fp4, r.idx, 1, r.K, h16, nullptr, ys, m.sc.ws);
      } else {
        {
          const OpRegion d(m.sc.timer, "routed/gate_up", true);
          moe_gate_up(*m.w.fp4, idx, nc, r.K, xc, xt, limit, before ? wt : nullptr, h16, nullptr, m.sc.ws, nullptr, g);
        }
        const OpRegion d(m.sc.timer, "routed/down", true);
        moe_down(*m.w.fp4, idx, nc, r.K, h16, nullptr, ys, m.sc.ws, nullptr, g);
      }
      // One chunk, nothing after the combine (no shared expert to add separately, no fault scale, no bf16 rounding of
      // the output): the combine is left to the reader of `out` (gpu_moe's defer), one launch fewer at decode. With
      // cuda.branch_flags the shared expert's branch is left to that reader too, which waits for it in-kernel or joins.
      const bool defer = m.defer && nc == r.n && (!has_shared || add) && total_scale == 1.0f;  // (never official: above)
      const Stream leave = defer && add && !joined && m.sc.flags ? m.shared_side : nullptr;
      if (!leave) join_for_add();
      if (defer) {
        *m.defer = GpuCombine{ys, before ? nullptr : wt, add, r.K, Runner::output_scale(c), leave};
        return;
      }
      moe_combine(ys, before ? nullptr : wt, nc, r.K, D, Runner::output_scale(c), add ? add + int64_t(t0) * D : nullptr,
                  out + int64_t(t0) * D);
    }
  } else {
    expert_ffn(m, m.w.routed.d1.as<DMat>(), m.w.routed.d2.as<DMat>(), m.w.routed.d3.as<DMat>(), r.idx, slots, r.K, I, limit,
               before ? r.weight : nullptr, ys);
    fwd_moe_combine(ys, before ? nullptr : r.weight, r.n, r.K, D, Runner::output_scale(c), out, nullptr, official ? r.idx : nullptr);
  }
  region.reset();
  tap_io(m.tap, "ffn.routed", out, {r.n, D});
  const bool add_shared = has_shared && !add;  // (else there is none, or the combine added it)
  if (add_shared) {
    if (m.shared_side) branch_join(m.shared_side, m.sc.ev_join);
    else shared_expert(m, shared);
    tap_io(m.tap, "ffn.shared", shared, {r.n, D});
  }
  // fp32 accumulation of routed + shared, stored as an activation (official: rounded to bf16 by the last of the add,
  // the scale or act). (The CPU sums a token's routed experts in expert-id order, as the official code does; the
  // official numerics' combine above too, the others in top-k order: fp32 reassociation, within their tolerance.)
  const int round = m.nm.official() ? 1 : 0;
  const bool scaled = total_scale != 1.0f;
  if (add_shared) fwd_add(out, shared, r.n * D, nullptr, scaled ? 0 : round);
  if (scaled) fwd_scale(out, total_scale, out, r.n * D, nullptr, 0, round);
  if (!add_shared && !scaled) m.nm.act(out, int64_t(r.n) * D);
  tap_io(m.tap, "ffn.out", out, {r.n, D});
}

// The shared expert on the side stream, after everything the thread's stream has enqueued so far.
void fork_shared(const MoeCtx& m) {
  float* shared = m.sc.f("moe.shared", m.n * m.c.hidden);
  branch_fork(m.shared_side, m.sc.ev_fork);
  const StreamScope on_side(m.shared_side);
  shared_expert(m, shared);
}

// (cuda.streams) The shared expert on the side stream, forked after the routing at one token and from 9 tokens on,
// before it at 2-8 tokens; it has until the combine to finish. Paired A/B on the H200 (plumb bench --layers --ab,
// V4-Flash, us per layer, forked before against after; bench/results/h200-session22/): batch 1 +5.2 / +5.9 (the
// router's gate GEMV shares the SMs and the bandwidth with the shared expert's GEMVs: session 13's timeline put the
// router at 20-28 us of the critical path instead of 13-14), batch 2 -2.6 / -1.4, 4 -0.9 / -0.5, 8 -4.6 / -4.5 /
// -6.5 / -2.7, 32 +1.4 / +2.4, 128 +25.0 / +28.8. Either order gives the same bits. cuda.shared_first forks before
// the router at one token too: on session 48's kernels (the router's gate on the one-token linear) that order is
// 1.2-2.1 us per layer faster at batch 1 (paired A/B, 6 rounds in two runs, one beside a FAST-vs-FAST control of 0.0
// to -0.6); at 9-32 tokens it was much slower (+9.5 to +10.2 at 16, +17.8 at 32: bench/results/h200-session48/).
constexpr int kSharedBeforeRouterMin = 2, kSharedBeforeRouterMax = 8;
template <Rsf P>
GpuRouted<P> route_and_shared(const MoeCtx& m) {
  // (cuda.shared_first: one token too)
  const bool before = m.n <= kSharedBeforeRouterMax && (m.n >= kSharedBeforeRouterMin || m.opt.cuda_shared_first);
  if (m.shared_side && before) fork_shared(m);
  GpuRouted<P> r = route<P>(m);
  if (m.shared_side && !before) fork_shared(m);
  return r;
}

template <class Runner>
void moe_with(const Runner& runner, const MoeCtx& m, float* out) {
  combine(runner, m, route_and_shared<Runner::consumes>(m), out);
}

}  // namespace

void gpu_moe(const GpuMoe& w, const ModelConfig& c, MlpType type, const ModelOptions& opt, const float* x, const uint16_t* x16,
             int n, const int32_t* tokens, Scratch& sc, const Tap& tap, float* out, GpuCombine* defer) {
  MoeCtx m{w, c, type, opt, x, x16, n, tokens, sc, tap, GpuNumerics(opt)};
  if (defer) *defer = GpuCombine{};
  if (defer && !tap.on("ffn.routed") && !tap.on("ffn.out")) m.defer = defer;  // taps read out
  // cuda.streams: the shared expert on the side stream, beside the routed experts (route_and_shared).
  if ((w.s1 || w.sfp8) && sc.branch) m.shared_side = sc.branch;
  if (opt.fault_rsf_twice) return moe_with(FaultRunnerScalesFoldedAgain{}, m, out);
  if (opt.fault_rsf_missing || (opt.fault_rsf_missing_hash_layers && type == MlpType::Hash))
    return combine(RunnerFoldedWeights{}, m, fault_relabel<Rsf::Folded>(route_and_shared<Rsf::Unfolded>(m)), out);
  if (opt.fault_shared_scaled)
    return combine(RunnerFoldedWeights{}, m, fault_relabel<Rsf::Folded>(route_and_shared<Rsf::Unfolded>(m)), out,
                   float(c.routed_scaling));
  return opt.rsf_on_output ? moe_with(RunnerScalesOutput{}, m, out) : moe_with(RunnerFoldedWeights{}, m, out);
}

}  // namespace plumb::cuda
#endif  // PLUMB_WITH_CUDA
