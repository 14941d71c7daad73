// Attention sublayer on the GPU (twin of src/model/attention.cpp, compressor.cpp, indexer.cpp): query and KV
// paths, the CSA/HCA compressors with their device caches, the lightning indexer, sparse attention with the
// sink, the grouped output projection. Shapes: x [n, D] (attn_norm-ed), out [n, D].
#ifdef PLUMB_WITH_CUDA
#include "cuda/gpu_attention.h"

#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

namespace plumb::cuda {

using namespace detail;

namespace {

int64_t comp_width(const GpuComp& w) { return w.overlap ? 2 * w.dim : w.dim; }

// A compressor's rows of this chunk, [n, width] each: x through wkv and wgate.
struct CompRows {
  float* kv;
  float* gate;
};

CompRows comp_rows(const GpuComp& w, const char* name, int n, Scratch& sc) {
  const int64_t width = comp_width(w);
  return {sc.f(std::string(name) + ".kv", n * width), sc.f(std::string(name) + ".gate", n * width)};
}

void project_comp(const GpuComp& w, const float* x, int n, const CompRows& r, Scratch& sc) {
  const int64_t width = comp_width(w), D = w.wkv.d.cols;
  linear(w.wkv, x, n, D, r.kv, width, sc);
  linear(w.wgate, x, n, D, r.gate, width, sc);
}

// Several tokens: the compressors' projections (the indexer's with ir), each as linear() computes it. Where all of
// them run on the bf16 GEMV (cuda.bf16_gemv) or as bf16 GEMMs (cuda.prefill_gemm), x is rounded to bf16 once for
// the four (the same bits: one conversion launch instead of four, on the compressors' stream, which at 8 tokens is
// as long as the query path), and the GEMV takes the four in one launch.
void project_comps(const GpuAttn& w, const float* x, int n, const CompRows& cr, const CompRows* ir, Scratch& sc) {
  const int64_t D = w.comp->wkv.d.cols;
  Bf16Proj p[4];
  int count = 0;
  bool gemv = true, gemm = true;
  auto add = [&](const GpuComp& c, const CompRows& r) {
    for (const auto& [m, y] : {std::pair{&c.wkv, r.kv}, std::pair{&c.wgate, r.gate}}) {
      gemv = gemv && bf16_gemv_applies(*m, n) && m->d.cols == D;
      gemm = gemm && bf16_gemm_applies(*m, n) && m->d.cols == D;
      p[count++] = Bf16Proj{static_cast<const uint16_t*>(m->d.w), m->d.rows, y, comp_width(c)};
    }
  };
  add(*w.comp, cr);
  if (ir) add(*w.icomp, *ir);
  if (gemv) return bf16_linear_gemv_multi(p, count, D, x, cuda::Act::F32, D, n, gemv16_buffers(sc, size_t(n) * size_t(D)));
  if (gemm) return bf16_linear_gemm_multi(p, count, D, x, cuda::Act::F32, D, n, gemm_buffers(sc, size_t(n) * size_t(D), 0));
  project_comp(*w.comp, x, n, cr, sc);
  if (ir) project_comp(*w.icomp, x, n, *ir, sc);
}

// Decode (one token): the compressors' projections of x, and the indexer's head weights (hw, CSA) unless the
// official numerics round them differently, in one launch (the same bits as one launch each). False (nothing
// launched) when a compressor matrix does not fit the one-token kernel (FP8 on the tensor-core path): the caller
// projects them one by one. hw_done says whether hw was computed here.
bool project_fused(const GpuAttn& w, const float* x, const CompRows& cr, const CompRows* ir, float* hw, const GpuNumerics& nm,
                   bool& hw_done) {
  LinearSegs g;
  auto add = [&](const GMat& m, float* y) {
    if (m.fp8 || !fwd_linear_one_fits(m.d) || m.d.cols != w.comp->wkv.d.cols) return false;
    g.add(m.d, y);
    return true;
  };
  if (!(add(w.comp->wkv, cr.kv) && add(w.comp->wgate, cr.gate))) return false;
  if (ir && !(add(w.icomp->wkv, ir->kv) && add(w.icomp->wgate, ir->gate))) return false;
  hw_done = hw && !nm.official() && add(w.iweights, hw);
  fwd_linear_one_multi(g, x, nullptr);
  return true;
}

// The compressor step's arguments for n projected rows at positions from dpos (without the state to step).
CompressArgs comp_args(const GpuComp& w, const GpuRope& rope, double eps, const CompRows& r, int n, const int64_t* dpos,
                       const GpuNumerics& nm, bool rotate) {
  CompressArgs a;
  a.rows_kv = r.kv, a.rows_gate = r.gate;
  a.ape = f32(w.ape), a.norm = f32(w.norm), a.inv_freq = f32(rope.inv_freq);
  a.pos = dpos;
  a.n = n, a.overlap = w.overlap, a.m = int(w.rate), a.c = w.dim;
  a.rope_half = rope.dim / 2, a.attention_factor = rope.attention_factor, a.eps = eps;
  // Official: the entries' bf16 storage, then the indexer's rotation (its keys) or the FP8 KV simulation.
  a.official = nm.official(), a.rotate = rotate, a.kv_fp8 = nm.official() && !nm.official_initial();
  return a;
}

// Runs the compressor step on the device (CompressArgs) on this chunk's projected rows: completed windows become
// entries (pooled, RMS-normed, rotated at position entry * m), the rest stay pending.
void compressor_step(const GpuComp& w, const GpuRope& rope, double eps, const CompRows& r, int n, const Step& step, GpuCompState& st,
                     const GpuNumerics& nm, bool rotate, bool whole_window = false) {
  const int64_t m = w.rate;
  CompressArgs a = comp_args(w, rope, eps, r, n, step.dpos, nm, rotate);
  a.pend_kv = st.pend_kv.as<float>(), a.pend_gate = st.pend_gate.as<float>();
  a.prev_kv = st.prev_kv.as<float>(), a.prev_gate = st.prev_gate.as<float>();
  a.nw_max = int(step.bounds ? (n + m - 1) / m : (step.pos0 + n) / m - step.pos0 / m);
  a.entries = st.entries.as<float>();
  a.whole_window = whole_window;
  fwd_compress(a, nullptr);
}

// The state buffers start as zeros, like the caches (grow_keep): defined bytes wherever a kernel reads ahead of
// what was written.
void init_comp(const GpuComp& w, GpuCompState& st) {
  const size_t m = size_t(w.rate), row = size_t(comp_width(w)) * 4;
  st.pend_kv = zeroed(m * row);
  st.pend_gate = zeroed(m * row);
  if (w.overlap) {
    st.prev_kv = zeroed(m * size_t(w.dim) * 4);
    st.prev_gate = zeroed(m * size_t(w.dim) * 4);
  }
}

void reserve_comp(const GpuComp& w, int64_t pos_end, GpuCompState& st, uint64_t& generation) {
  // At least 64 entries, so that short sessions never regrow (each growth re-captures the decode graph).
  const int64_t need = std::max<int64_t>(pos_end / w.rate, 64), row = w.dim * 4;
  if (st.capacity >= need) return;
  if (grow_keep(st.entries, size_t(need * row), size_t(st.capacity * row))) ++generation;
  st.capacity = int64_t(st.entries.bytes()) / row;
}

// cuda.comp_deferred's chunk of k rows kept in st.xring (positions *xpos .. *xpos + k - 1, slots 0 .. k - 1 of the
// window), projected as one chunk and stepped through the main compressor; returns the indexer compressor's step
// (CSA), which the caller runs after marking the main one's entries. The indexer's head weights are not in it. The
// projection is the fp32 twin's whatever the patches, so that keeping the rows changes when the weights are read,
// not the numbers (cuda.bf16_gemv's bf16 activations here moved kernel-dims' logits by up to 0.2 where the indexer's
// top-k flipped): up to kOneMaxTokens rows (CSA's windows of 4) in one launch of fwd_linear_one_multi (its
// multi-token kernel), each row's sums in the one-token kernel's order (the bits of projecting each token when it
// came); more (HCA's 128) the twin's chunk linear (fp64 sums in another order).
std::function<void()> project_kept(const GpuAttn& w, const GpuRope& rope, double eps, int64_t k, int64_t pos0, bool bounds,
                                   GpuLayerState& st, Scratch& sc, const GpuNumerics& nm) {
  const int kn = int(k);
  const CompRows cr = comp_rows(*w.comp, "comp.kept", kn, sc);
  std::optional<CompRows> ir;
  if (w.icomp) ir = comp_rows(*w.icomp, "icomp.kept", kn, sc);
  const float* x = st.xring.as<float>();
  const int64_t D = w.comp->wkv.d.cols;
  LinearSegs g;
  g.ntok = kn, g.ldx = D;
  bool one = kn <= kOneMaxTokens && D % 4 == 0;
  auto add = [&](const GpuComp& c, const CompRows& r) {
    for (const auto& [m, y] : {std::pair{&c.wkv, r.kv}, std::pair{&c.wgate, r.gate}}) {
      one = one && !m->fp8 && fwd_linear_multi_fits(m->d, w.comp->wkv.d);  // (else fwd_linear_one_multi would refuse them)
      if (one) g.add(m->d, y), g.seg[g.count - 1].ldy = comp_width(c);
    }
  };
  add(*w.comp, cr);
  if (ir) add(*w.icomp, *ir);
  if (one) {
    fwd_linear_one_multi(g, x, nullptr);
  } else {
    auto project = [&](const GpuComp& c, const CompRows& r) {
      const int64_t width = comp_width(c);
      fwd_linear(c.wkv.d, x, kn, D, 0, width, r.kv, width, nullptr);
      fwd_linear(c.wgate.d, x, kn, D, 0, width, r.gate, width, nullptr);
    };
    project(*w.comp, cr);
    if (ir) project(*w.icomp, *ir);
  }
  const Step chunk{st.xpos.as<int64_t>(), pos0, bounds};
  // The kept rows start at their window's first position (xpos), so m of them are the whole window: pooled in one launch.
  const bool whole = k == w.comp->rate;
  compressor_step(*w.comp, rope, eps, cr, kn, chunk, st.comp, nm, /*rotate=*/false, whole);
  if (!ir) return {};
  return [&w, &rope, eps, rows = *ir, kn, chunk, &st, &nm, whole] {
    compressor_step(*w.icomp, rope, eps, rows, kn, chunk, st.icomp, nm, /*rotate=*/true, whole);
  };
}

}  // namespace

bool comp_deferrable(const GpuAttn& w) { return w.comp_deferred && w.comp && (!w.icomp || w.icomp->rate == w.comp->rate); }

CompDeferMode comp_defer_mode(const GpuAttn& w, const Step& step, int n, int64_t* pending) {
  if (pending) *pending = 0;
  if (!comp_deferrable(w)) return kCompNormal;
  // The window of the step's first token starts at s; its rows before pos0 were kept iff every step from s on
  // deferred (s >= defer_from).
  const int64_t m = w.comp->rate, s = step.pos0 - step.pos0 % m, kept = s >= step.defer_from ? step.pos0 - s : 0;
  if (pending) *pending = kept;
  if (!step.defer || n != 1 || s < step.defer_from) return kCompNormal;
  return (step.pos0 + 1) % m == 0 ? kCompProject : kCompStore;
}

void init_attention_state(const GpuAttn& w, const ModelConfig& c, GpuLayerState& st) {
  st.ring = zeroed(size_t(c.window) * size_t(c.head_dim) * 4);
  if (w.comp) init_comp(*w.comp, st.comp);
  if (w.icomp) init_comp(*w.icomp, st.icomp);
  if (comp_deferrable(w)) st.xring = zeroed(size_t(w.comp->rate) * size_t(c.hidden) * 4), st.xpos = zeroed(8);
}

void reserve_attention_state(const GpuAttn& w, int64_t pos_end, GpuLayerState& st, uint64_t& generation) {
  if (w.comp) reserve_comp(*w.comp, pos_end, st.comp, generation);
  if (w.icomp) reserve_comp(*w.icomp, pos_end, st.icomp, generation);
}

bool takes_all_entries(const GpuAttn& w, const ModelConfig& c, int64_t pos_end) {
  return w.icomp && w.skip_short && indexer_skippable(c, w.icomp->rate, pos_end);
}

bool gpu_attention(const GpuAttn& w, const ModelConfig& c, AttnType type, const GpuRope& rope, const float* x, const uint16_t* x16,
                   std::span<const AttnRun> runs, Scratch& sc, const GpuNumerics& nm, const Tap& tap, float* out,
                   const detail::HcPartArgs* fold, const LayerRows* rows) {
  const int64_t D = c.hidden, H = c.n_heads, Dh = c.head_dim, rd = rope.dim, W = c.window, QL = c.q_lora;
  const int n = int(runs.back().row0 + runs.back().n);
  const bool one = runs.size() == 1;  // a session's own chunk (else forward_batch's rows, one run per session)
  // (every run's caches were reserved for its step by the caller: GpuForward's reserve_caches)

  OpTimer& tm = sc.timer;
  std::optional<OpRegion> region;
  // cuda.streams: the KV row on the side stream (sc.branch) and the compressors (projections and cache steps) on the
  // second (sc.branch2) while the query path runs here: at decode each chain is about as long as the query path, and
  // one stream for both made the indexer wait for them. The query path's first projection is launched before the
  // branches' work (they fork from the same point): its blocks take the SMs first. The compressors join before the
  // indexer (CSA) or the attention, the KV row before the attention. Null branches: the same launches, serially (as
  // for several sessions, whose runs reuse one scratch: the caller gives them no branches).
  const Stream side = sc.branch, side2 = type != AttnType::Sliding ? sc.branch2 : nullptr;
  // indexer.skip_short: while the top-k would select every visible entry, the CSA queries take them in entry order
  // (HCA's key list) and the indexer does not run, unless a tap asks for its scores (model/attention.h). The
  // choice depends on the step's end position (each session's own): run_graph keys its captured steps by it
  // (indexer_skips). The attention then waits for the compressor's entries only (ev_entries); the indexer's keys,
  // compressed after them on the same stream for later steps, join at the sublayer's end.
  auto all_entries = [&](const AttnRun& r) { return type == AttnType::CSA && takes_all_entries(w, c, r.step.pos0 + r.n); };
  auto run_indexer = [&](const AttnRun& r) { return type == AttnType::CSA && (!all_entries(r) || tap.on("attn.indexer.scores")); };
  // rows_sides: every session either runs its indexer over at least index_topk entries, so that its row's selection
  // has index_topk slots and no holes (as a batch's rows must, to split their keys as their sessions' own steps do:
  // see `batched`), or (indexer.skip_short, short of its limit) takes every visible entry without it.
  bool any_indexer = false, any_all_entries = false, rows_sides = true;
  for (const AttnRun& r : runs) {
    const bool ri = run_indexer(r), all = all_entries(r);
    any_indexer = any_indexer || ri, any_all_entries = any_all_entries || all;
    rows_sides = rows_sides && (ri ? !all && (r.step.pos0 + r.n) / w.icomp->rate >= c.index_topk : all);
  }
  const bool keys_later = type == AttnType::CSA && !any_indexer;
  // cuda.batch_rows: forward_batch's rows as one launch per kind (row r: runs[r]'s one token, at dpos[r]): the cache
  // steps (the KV row's norm and RoPE, its ring slot, the compressors' steps) always; the split-K attention too
  // (`batched`) where no session runs its indexer, and (cuda.batch_rows_indexer) with the indexer's top-k and the
  // queries' RoPE beside it where every session runs its indexer over at least index_topk entries (each row on its own
  // keys: IndexArgs::keys_rows), and (cuda.batch_rows_mixed) where each session does or takes every entry: rows on both
  // sides of the limit attend each by its own type (LayerRows::csa_types; the indexer ranks every row, the
  // entry-taking rows' selections unread). Otherwise (sessions on both sides without cuda.batch_rows_mixed; without
  // indexer.skip_short, a session with fewer entries: its selection's trailing holes would widen its key count, and
  // so its split, past its own step's) they run per session.
  const bool batched_caches = [&] {
    if (!rows || one || nm.official() || tap.sink) return false;
    for (size_t k = 0; k < runs.size(); ++k)
      if (runs[k].n != 1 || runs[k].row0 != int64_t(k) || runs[k].step.dpos != runs[0].step.dpos + k) return false;
    return true;
  }();
  const bool batched = batched_caches && w.splitk &&
                       (!any_indexer || (rows_sides && w.rows_indexer && (!any_all_entries || w.rows_mixed)));
  const bool mixed = batched && any_indexer && any_all_entries;  // (CSA rows of both kinds: per-row types)
  // (An entry-taking row's keys fit the selection's slots because its entries, counted at the compressor's rate, are at
  // most index_topk by the indexer's rate: one rate for both, as the weights' loader makes them.)
  PLUMB_CHECK(!mixed || w.comp->rate == w.icomp->rate, "cuda.batch_rows_mixed: a CSA layer's compressor (rate {}) and its "
              "indexer's (rate {}) differ: rows of both kinds cannot share one attention launch", w.comp->rate, w.icomp->rate);
  const int64_t* row_pos = runs[0].step.dpos;  // (batched_caches: every row's position, in row order)
  if (batched) ++sc.batch_rows[size_t(type)], sc.batch_rows_indexed += any_indexer, sc.batch_rows_mixed += mixed;
  branch_mark(side, sc.ev_fork);
  region.emplace(tm, "attn.q_kv");
  float* qr = sc.f("attn.qr", n * QL);
  {
    const OpRegion d(tm, "q/wq_a", true);
    nm.proj(w.wq_a, x, n, D, qr, QL, sc, x16);
  }
  branch_wait(side, sc.ev_fork);
  branch_wait(side2, sc.ev_fork);

  // Shared key/value row: kv_norm(wkv x), RoPE on the last rd dims (official: FP8 simulation of the nope dims).
  float* kv = sc.f("attn.kv", n * Dh);
  float* hw = nullptr;
  bool hw_done = false;
  {
    const StreamScope on_side(side);
    region.emplace(tm, "attn.q_kv");  // (the KV row's: a region of its own on its stream)
    {
      const OpRegion d(tm, "kv/wkv", true);
      nm.proj(w.wkv, x, n, D, kv, Dh, sc, x16);
    }
    if (batched_caches) {  // kv_norm, then RoPE (at each session's positions)
      nm.norm_rope(rope, kv, n, Dh, f32(w.kv_norm), c.rms_eps, row_pos, -1);
    } else {
      for (const AttnRun& r : runs) nm.norm_rope(rope, kv + r.row0 * Dh, int(r.n), Dh, f32(w.kv_norm), c.rms_eps, r.step.dpos, 1);
    }
    nm.kv_fp8_sim(kv, n, Dh, Dh - rd);
    tap_put(tap, "attn.kv", kv, {n, Dh});
    // One token: its ring slot (pos % W) holds position pos - W, outside its window, so the row can be stored now,
    // beside the query path. (With more tokens a later row's store would overwrite a key an earlier row reads.)
    if (batched_caches) {
      fwd_ring_store_rows(kv, n, Dh, row_pos, W, rows->rings, nullptr);
    } else {
      for (const AttnRun& r : runs)
        if (r.n == 1) fwd_ring_store(kv + r.row0 * Dh, 1, Dh, r.step.dpos, W, r.st->ring.as<float>(), nullptr);
    }
  }
  // cuda.comp_deferred defers a session's own one-token steps only (Step::defer is never set for several sessions).
  const CompDeferMode defer = one ? comp_defer_mode(w, runs[0].step, n) : kCompNormal;
  if (type == AttnType::CSA) hw = sc.f("attn.index.w", n * c.index_heads);
  std::optional<CompRows> crows, irows;
  if (defer != kCompNormal) {  // cuda.comp_deferred: x kept; at the window's last token its rows projected and pooled
    const StreamScope on_side2(side2, 2);
    region.emplace(tm, "attn.compressor");
    const AttnRun& r = runs[0];
    const int64_t m = w.comp->rate;
    {
      const OpRegion d(tm, "comp/keep", true);
      fwd_comp_defer(x, D, r.step.dpos, int(m), r.st->xring.as<float>(), m - 1, r.st->xpos.as<int64_t>(), nullptr);
    }
    std::function<void()> index_step;
    if (defer == kCompProject) {
      const OpRegion d(tm, "comp/step", true);
      index_step = project_kept(w, rope, c.rms_eps, m, r.step.pos0 - (m - 1), r.step.bounds, *r.st, sc, nm);
    }
    if (keys_later) branch_mark(side2, sc.ev_entries);
    if (index_step) index_step();
    // The indexer's head weights, which the fused projection would have computed (the same one-token kernel).
    if (type == AttnType::CSA && any_indexer && !nm.official() && !w.iweights.fp8 && fwd_linear_one_fits(w.iweights.d)) {
      fwd_linear(w.iweights.d, x, n, D, 0, c.index_heads, hw, c.index_heads, nullptr);
      hw_done = true;
    }
  } else {
    const StreamScope on_side2(side2, 2);
    region.emplace(tm, "attn.compressor");
    for (const AttnRun& r : runs) {
      int64_t kept = 0;
      comp_defer_mode(w, r.step, int(r.n), &kept);
      if (kept == 0) continue;
      // cuda.comp_deferred: a step that does not defer after steps that did: their rows first
      const OpRegion d(tm, "comp/kept", true);
      fwd_comp_defer(nullptr, D, r.step.dpos, int(w.comp->rate), nullptr, kept, r.st->xpos.as<int64_t>(), nullptr);
      const auto index_step = project_kept(w, rope, c.rms_eps, kept, r.step.pos0 - kept, r.step.bounds, *r.st, sc, nm);
      if (index_step) index_step();
    }
    // The compressors' projections (and the indexer's head weights): one launch at decode (timed as attn.compressor).
    if (type != AttnType::Sliding) crows = comp_rows(*w.comp, "comp", n, sc);
    if (type == AttnType::CSA) irows = comp_rows(*w.icomp, "icomp", n, sc);
    if (crows) {
      const OpRegion d(tm, "comp/proj", true);
      if (!(n == 1 && project_fused(w, x, *crows, irows ? &*irows : nullptr, hw, nm, hw_done)))
        project_comps(w, x, n, *crows, irows ? &*irows : nullptr, sc);
    }
    // Each session's rows through its compressors (a chunk's rows are consecutive positions of one session).
    auto rows_of = [](const GpuComp& g, const CompRows& all, const AttnRun& r) {
      const int64_t off = r.row0 * comp_width(g);
      return CompRows{all.kv + off, all.gate + off};
    };
    // (batched_caches: a block per row, each on its session's state)
    auto step_rows = [&](const GpuComp& g, const CompRows& all, const CompCaches* tab, bool rotate) {
      CompressArgs a = comp_args(g, rope, c.rms_eps, all, n, row_pos, nm, rotate);
      a.rows = tab, a.nw_max = 1;
      fwd_compress(a, nullptr);
    };
    if (type != AttnType::Sliding) {
      const OpRegion d(tm, "comp/step", true);
      if (batched_caches) step_rows(*w.comp, *crows, rows->comp, /*rotate=*/false);
      else
        for (const AttnRun& r : runs)
          compressor_step(*w.comp, rope, c.rms_eps, rows_of(*w.comp, *crows, r), int(r.n), r.step, r.st->comp, nm, /*rotate=*/false);
    }
    if (keys_later) branch_mark(side2, sc.ev_entries);  // (recorded on side2: the current stream here)
    if (type == AttnType::CSA && batched_caches) step_rows(*w.icomp, *irows, rows->icomp, /*rotate=*/true);
    else if (type == AttnType::CSA)
      for (const AttnRun& r : runs)
        compressor_step(*w.icomp, rope, c.rms_eps, rows_of(*w.icomp, *irows, r), int(r.n), r.step, r.st->icomp, nm, /*rotate=*/true);
  }

  // Query: q_norm(wq_a x) (wq_a above) -> wq_b -> per-head unweighted RMS -> RoPE on the last rd dims.
  // With x16 (the FP8 GEMVs' f16 input, made by the norms), qr is normalized into an f16 copy too: wq_b and the
  // indexer's wq_b read it without a conversion launch each.
  region.emplace(tm, "attn.q_kv");
  auto* qr16 = x16 ? static_cast<uint16_t*>(sc.get("attn.qr16", size_t(n) * size_t(QL) * 2)) : nullptr;
  {
    const OpRegion d(tm, "q/norm", true);
    if (!nm.rms_norm(qr, n, QL, f32(w.q_norm), c.rms_eps, qr16)) qr16 = nullptr;
  }
  float* q = sc.f("attn.q", n * H * Dh);
  {
    const OpRegion d(tm, "q/wq_b", true);
    nm.proj(w.wq_b, qr, n, QL, q, H * Dh, sc, qr16);
  }
  // head_rms, then RoPE; on CSA layers after the indexer's projection below, in one call with the indexer query's
  // RoPE (one launch with the reference numerics: the bits of the two launches). With the split-K attention and no
  // indexer query, inside the attention's launch instead (AttendArgs::q_inv_freq: the same bits, one launch fewer),
  // unless a tap reads q.
  const bool q_in_attn = w.splitk && !any_indexer && !nm.official() && !tap.on("attn.q");
  // (a batch normalizes its rows' queries in the attention or, where an indexer runs, beside the indexer's below: the
  // loop just after this skips it)
  PLUMB_CHECK(!batched || any_indexer || q_in_attn, "gpu_attention: a batch's queries would not be normalized");
  if (!q_in_attn) {  // (per session: a batched attention's rows take q_in_attn's path, or the indexer's batched RoPE below,
                     // every row's, the entry-taking ones' too)
    for (const AttnRun& r : runs)
      if (!batched && !run_indexer(r)) nm.norm_rope(rope, q + r.row0 * H * Dh, int(r.n * H), Dh, nullptr, c.rms_eps, r.step.dpos, H);
    if (!any_indexer) tap_put(tap, "attn.q", q, {n, H, Dh});
  }
  if (sc.pf_weights) sc.prefetch_l2({weight_bytes(w.wo_a), weight_bytes(w.wo_b)});  // cuda.l2_prefetch: beside the indexer and attention

  // The indexer's query and head weights, for every row (the sessions that skip it leave theirs unread).
  const int64_t nh = c.index_heads, dh = c.index_head_dim;
  float* iq = nullptr;
  if (any_indexer) {
    region.emplace(tm, "attn.indexer");
    iq = sc.f("attn.index.q", n * nh * dh);
    {
      const OpRegion d(tm, "index/wq_b", true);
      nm.proj(w.iwq_b, qr, n, QL, iq, nh * dh, sc, qr16);
    }
    {
      const OpRegion d(tm, "index/norm_rope", true);
      if (batched) {  // every row at its own position: groups of H query rows and nh indexer rows
        RopeRows ir;
        ir.x = iq, ir.rows = n * nh, ir.ld = dh, ir.off = dh - rd, ir.per_pos = -nh;
        nm.norm_rope(rope, q, int(n * H), Dh, nullptr, c.rms_eps, row_pos, -H, &ir);
      } else {
        for (const AttnRun& r : runs) {
          if (!run_indexer(r)) continue;  // (its q was normed and rotated above)
          RopeRows ir;
          ir.x = iq + r.row0 * nh * dh, ir.rows = r.n * nh, ir.ld = dh, ir.off = dh - rd, ir.per_pos = nh;
          nm.norm_rope(rope, q + r.row0 * H * Dh, int(r.n * H), Dh, nullptr, c.rms_eps, r.step.dpos, H, &ir);
        }
      }
    }
    tap_put(tap, "attn.q", q, {n, H, Dh});
    nm.indexer_rotate(iq, n * nh, dh);  // the keys are rotated the same way: q.k is preserved up to FP4 rounding
    branch_join(side2, sc.ev_join);  // the indexer's keys and head weights come from the compressors' stream
    if (!hw_done && w.iweights_gemv) {  // cuda.bf16_gemv under the official numerics: x is bf16 there (exact operands)
      const Bf16Proj p{static_cast<const uint16_t*>(w.iweights.d.w), nh, hw, nh};
      bf16_linear_gemv_multi(&p, 1, D, x, cuda::Act::F32, D, n, gemv16_buffers(sc, size_t(n) * size_t(D)));
      // (its bf16 rounding, as the official linear's output is stored, in the scale's launch below)
    } else if (!hw_done) {
      nm.proj_bf16(w.iweights, x, n, D, 0, nh, hw, nh);
    }
    if (nm.official()) {  // official: bf16(weights_proj(x)) * (dh^-1/2 * nh^-1/2), one bf16 tensor
      const int round_in = !hw_done && w.iweights_gemv ? 1 : 0;
      fwd_scale(hw, float(1.0 / std::sqrt(double(dh) * double(nh))), hw, n * nh, nullptr, round_in, 1);
    }
  }

  // The compressor's entries (the indexer's keys: below) and the KV row (and its ring slot). cuda.branch_flags: the
  // split launch waits for them in-kernel where its grid leaves room to their kernels (the entries of HCA; CSA's
  // indexer keys follow them on their stream, so they stay an await), else they join here.
  float* o = sc.f("attn.o", n * H * Dh);
  // K = V, so each output carries the keys' rotation on its rope dims: undo it at the query's position. The FP8
  // output projection reads o as f16: written by the same launch (the split-K attention's own stores where it runs,
  // else fwd_rope_f16 below).
  const int64_t G = c.o_groups, R = c.o_lora, gw = H * Dh / G;
  // (The official numerics take wo_a in bf16, as DeepSeek's convert.py dequantizes it: proj_bf16 below.)
  const bool wo_fp8 = w.wo_a.fp8 && R % 128 == 0 && !nm.official();
  // cuda.prefill_gemm: the grouped GEMM reads o in fp32 (rotated in place below) and rounds it to bf16 once.
  const bool wo_gemm = wo_fp8 && w.wo_a.gemm_min && n >= w.wo_a.gemm_min;
  uint16_t* o16 = wo_fp8 && !wo_gemm && !nm.official() ? static_cast<uint16_t*>(sc.get("attn.o16", size_t(n) * size_t(H * Dh) * 2))
                                                       : nullptr;
  bool joined = false;
  // A compressor's entries as this run's launches read them: its own (exact, or the capacity in graph mode), or batched
  // the largest session's (each row's visible ones, (p + 1) / rate, stay within its own).
  auto entry_count = [&](const AttnRun& r, GpuCompState GpuLayerState::*comp, int64_t rate) {
    auto own = [&](const AttnRun& b) { return b.step.bounds ? (b.st->*comp).capacity : (b.step.pos0 + b.n) / rate; };
    if (!batched) return own(r);
    int64_t ne = 0;
    for (const AttnRun& b : runs) ne = std::max(ne, own(b));
    return ne;
  };
  // Per session: its indexer's top-k over its keys, then its attention (window + selected or all entries, the sink).
  // Batched: the first iteration takes every row, each on its session's caches (LayerRows), in one launch.
  for (const AttnRun& r : runs) {
    if (batched && &r != &runs.front()) break;
    const int rn = batched ? n : int(r.n);
    const int64_t pos0 = r.step.pos0, row0 = r.row0;
    const int64_t* dpos = r.step.dpos;
    GpuLayerState& st = *r.st;
    AttendArgs a;
    a.type = type == AttnType::Sliding ? 0 : type == AttnType::CSA ? 1 : 2;
    // Sizes: exact for this step, or (graph mode) the largest any step of these caches can need.
    int64_t max_keys = W;  // keys of one query: window + (HCA entries | CSA selection slots)
    if (type != AttnType::Sliding) {  // the compressor's entries, as the attention reads them
      a.entries = batched ? nullptr : st.comp.entries.as<float>();
      if (batched) a.entries_rows = rows->entries;
      a.ne = entry_count(r, &GpuLayerState::comp, w.comp->rate);
      a.rate = w.comp->rate;
      if (type == AttnType::HCA) max_keys += a.ne;
    }
    // (batched: the launch's kind, from every row's: its indexer where any row's runs, every entry where none does)
    const bool skip = batched ? type == AttnType::CSA && !any_indexer : all_entries(r);
    if (batched ? any_indexer : run_indexer(r)) {
      if (&r != &runs.front()) region.emplace(tm, "attn.indexer");  // (the first session's continues the region above)
      const int64_t ne = entry_count(r, &GpuLayerState::icomp, w.icomp->rate);  // (batched: each row ranks its own visible ones)
      IndexArgs ia;
      ia.q = iq + row0 * nh * dh;
      ia.keys = batched ? nullptr : st.icomp.entries.as<float>();
      if (batched) ia.keys_rows = rows->ikeys;
      ia.hw = hw + row0 * nh;
      ia.n = rn;
      ia.nh = int(nh);
      ia.topk = c.index_topk;
      ia.k_cap = int(std::min<int64_t>(c.index_topk, ne));
      ia.dh = dh;
      ia.ne_cap = ne;
      ia.pos = dpos;
      ia.rate = w.icomp->rate;
      ia.qscale = 1.0f / std::sqrt(float(dh));
      ia.wscale = 1.0f / std::sqrt(float(nh));
      ia.official = nm.official();
      ia.scores = sc.f("attn.index.scores", rn * ne);
      ia.sel = static_cast<int64_t*>(sc.get("attn.index.topk", size_t(rn) * size_t(std::max(ia.k_cap, 1)) * 8));
      ia.topk_scratch_bytes = fwd_index_topk_scratch_bytes(rn, ne, ia.k_cap, fwd_index_topk_path(rn, ne, ia.k_cap));
      if (ia.topk_scratch_bytes) ia.topk_scratch = sc.get("attn.index.select", ia.topk_scratch_bytes);
      // indexer.tc_scores where it fits, else indexer.dmma_scores where it fits, else the exact paths. (Each patch
      // applies at every size, so a graph, sized by the cache capacity, takes the eager step's path.)
      const OpRegion d(tm, "index/topk", true);  // (after the join: the compressors' end shows as a gap before it)
      fwd_indexer(ia, nullptr,
                  w.index_tc && fwd_indexer_tc_fits(ia)       ? kIndexerTc
                  : w.index_dmma && fwd_indexer_dmma_fits(ia) ? kIndexerDmma
                                                              : fwd_indexer_path(ia));
      // Taps run eagerly with exact sizes: ne and k_cap are this step's counts, the layouts [n, ne] and [n, k].
      tap_put(tap, "attn.indexer.scores", ia.scores, {rn, ne});
      if (tap.on("attn.indexer.topk") && !skip) {
        IndexTensor sel({rn, int64_t(ia.k_cap)});
        if (sel.numel()) d2h(sel.ptr(), ia.sel, size_t(sel.numel()) * 8);
        tap.index("attn.indexer.topk", sel);
      }
      if (!skip) a.sel = ia.sel, a.ksel = ia.k_cap, max_keys += ia.k_cap;
      if (mixed) a.type_rows = rows->csa_types;  // (an entry-taking row's <= index_topk entries fit the k_cap slots)
    }
    if (skip) {
      a.type = 2;  // every visible entry of the CSA compressor, in entry order
      max_keys += a.ne;
      if (tap.on("attn.indexer.topk"))
        tap.index("attn.indexer.topk", all_entries_selection(c, rn, pos0, w.icomp->rate, (pos0 + rn) / w.icomp->rate));
    }

    std::optional<SplitPlan> plan;
    if (batched) plan = fwd_attend_splitk_plan_rows(rn, int(H), Dh, max_keys, sm_count());
    else if (w.splitk) plan = fwd_attend_splitk_plan(rn, int(H), Dh, max_keys, sm_count());
    if (!joined) {  // (the branches run once for all the sessions: joined before the first attention)
      const bool in_kernel = sc.flags && plan && !nm.official() && branch_wait_fits(plan->blocks);
      if (keys_later) branch_await(side2, sc.ev_entries);
      else if (!any_indexer) sc.wait_or_join(a.wait, in_kernel, side2, sc.ev_join);
      sc.wait_or_join(a.wait, in_kernel, side, sc.ev_join);
      if (side) sc.join_deferred_gates();  // cuda.early_joins: this launch joins anyway (early_joins excludes the flags)
      joined = true;
    }
    region.emplace(tm, "attn.core");
    a.q = q + row0 * H * Dh;
    a.chunk_kv = kv + row0 * Dh;
    a.ring = batched ? nullptr : st.ring.as<float>();
    if (batched) a.ring_rows = rows->rings;
    a.sink = f32(w.sink);
    a.n = rn;
    a.Hq = int(H);
    a.Dh = Dh;
    a.pos = dpos;
    a.window = W;
    a.scale = 1.0f / std::sqrt(float(Dh));
    a.out = o + row0 * H * Dh;
    a.official = nm.official();
    a.f16 = w.splitk_f16;
    uint16_t* ro16 = o16 ? o16 + row0 * H * Dh : nullptr;
    if (w.splitk && ro16) {
      a.out_inv_freq = f32(rope.inv_freq), a.out_rope_off = Dh - rd, a.out_af = rope.attention_factor, a.out16 = ro16;
    }
    if (q_in_attn) {
      a.q_inv_freq = f32(rope.inv_freq), a.q_rope_off = Dh - rd, a.q_rope_half = int(rd / 2), a.q_af = rope.attention_factor;
      a.q_eps = c.rms_eps;
    }
    if (w.splitk) {  // attn.splitk_decode (refused with the official numerics): no logits scratch; partials only
                     // when a query's keys span splits
      fwd_attend_splitk(a, *plan, plan->scratch_bytes ? sc.get("attn.split", plan->scratch_bytes) : nullptr, nullptr);
    } else {
      a.ld_logits = max_keys;
      a.logits = sc.f("attn.logits", rn * H * max_keys);
      fwd_attend(a, nullptr);
    }
    if (!a.out_inv_freq) {
      const int64_t per_pos = batched ? -H : H;  // (batched: each row's H heads at its own position)
      if (ro16) fwd_rope_f16(a.out, rn * H, Dh, Dh - rd, f32(rope.inv_freq), rope.attention_factor, dpos, per_pos, 1, ro16, nullptr);
      else nm.rope(rope, a.out, rn * H, Dh, Dh - rd, dpos, per_pos, true);
    }
    if (rn != 1 && !batched) fwd_ring_store(kv + row0 * Dh, rn, Dh, dpos, W, st.ring.as<float>(), nullptr);
  }

  region.emplace(tm, "attn.out_proj");
  // Grouped output projection: heads of group g -> wo_a rows [g*R, (g+1)*R); then wo_b.
  float* mid = sc.f("attn.mid", n * G * R);
  // When wo_b runs as an FP8 GEMV (f16 input), the wo_a GEMV writes mid as f16 for it directly: the bits of an fp32
  // mid converted by wo_b's own conversion launch, one launch fewer (mid itself is then not written).
  const bool wo_b_gemv = w.wo_b.fp8 && !(w.wo_b.gemm_min && n >= w.wo_b.gemm_min);
  uint16_t* mid16 = wo_fp8 && !wo_gemm && wo_b_gemv && !nm.official()
                        ? static_cast<uint16_t*>(sc.get("attn.mid16", size_t(n) * size_t(G * R) * 2))
                        : nullptr;
  std::optional<OpRegion> d(std::in_place, tm, "out/wo_a", true);
  if (wo_gemm)
    fp8_linear_grouped_gemm(*w.wo_a.fp8, int(G), o, cuda::Act::F32, n, mid,
                            gemm_buffers(sc, size_t(n) * size_t(H * Dh), size_t(w.wo_a.fp8->rows * w.wo_a.fp8->cols)));
  else if (wo_fp8)
    fp8_linear_grouped(*w.wo_a.fp8, int(G), o16 ? static_cast<const void*>(o16) : o, o16 ? cuda::Act::F16 : cuda::Act::F32, n, mid,
                       sc.ws, nullptr, mid16);
  else if (nm.official() && w.wo_a.w16.get()) {  // cuda.fp8_gemv: the official bf16 wo_a on the bf16 tensor cores
    ++sc.official_tc_calls;
    bf16_linear_grouped_official(w.wo_a.w16.as<uint16_t>(), int(G), R, gw, o, n, mid,
                                 gemm_buffers(sc, size_t(n) * size_t(H * Dh), 0, 0, 0, /*cublas=*/false));
  } else {
    for (int64_t g = 0; g < G; ++g) nm.proj_bf16(w.wo_a, o + g * gw, n, H * Dh, g * R, R, mid + g * R, G * R);
  }
  d.emplace(tm, "out/wo_b", true);
  // cuda.hc_fold: the FFN hc_pre's hc_post and sums in this launch (mid16: wo_b on the FP8 GEMV, not the official numerics).
  const bool folded = fold && n == 1 && mid16;
  if (folded) {
    fp8_linear_hc_part(*w.wo_b.fp8, mid16, out, *fold, sc.work());
    ++sc.hc_folds;
  } else {
    nm.proj(w.wo_b, mid, n, G * R, out, D, sc, mid16);
  }
  // The indexer's keys (beside the attention and its projections); cuda.branch_flags: at the forward's end instead
  // (nothing reads them before the next step).
  if (keys_later) sc.join_later(side2, sc.ev_join);
  d.reset();
  region.reset();
  tap_io(tap, "attn.out", out, {n, D});
  return folded;
}

}  // namespace plumb::cuda
#endif  // PLUMB_WITH_CUDA
