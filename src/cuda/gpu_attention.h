// The attention sublayer of the CUDA forward pass (see gpu_attention.cpp).
#pragma once
#include <span>

#include "cuda/gpu_common.h"
#include "cuda/gpu_numerics.h"

namespace plumb::cuda {

// One session's rows of the chunk: rows row0 .. row0 + n - 1 are consecutive positions of that session (its step),
// whose caches of this layer are *st.
struct AttnRun {
  int64_t row0 = 0, n = 0;
  Step step;
  GpuLayerState* st = nullptr;
};

// cuda.batch_rows: one layer's per-session tables for forward_batch's rows (row r: session r's), on the device
// (GpuForward::run_batch uploads them with each step's positions): the window rings and the compressors' state.
struct LayerRows {
  float* const* rings = nullptr;      // [n]
  // [n] CSA layers: 2 where the row's session takes every visible entry (takes_all_entries), else 1 (its indexer's
  // selection): the split-K attention's per-row type where a batch has rows on both sides of the indexer's limit
  const int8_t* csa_types = nullptr;
  const float* const* entries = nullptr;  // [n] the compressor's entries (comp's, as the attention reads them)
  const detail::CompCaches* comp = nullptr;   // [n] (null: no compressor)
  const detail::CompCaches* icomp = nullptr;  // [n] (CSA's indexer compressor)
  const float* const* ikeys = nullptr;  // [n] the indexer compressor's entries (CSA: the indexer's keys)
};

// indexer.skip_short: whether a CSA layer's step ending before pos_end takes every visible entry of its compressor in
// entry order instead of its indexer's top-k (which would select them all); false for the other layers.
bool takes_all_entries(const GpuAttn& w, const ModelConfig& c, int64_t pos_end);

// x: [n, D] device (attn_norm-ed collapsed streams); x16: the same as f16 or null (then the FP8 GEMVs convert
// x themselves); out: [n, D] device. runs: the chunk's rows by session, in order, n in all (one run: a session's own
// chunk; forward_batch: a run of one row per session). The projections read their weights once for all the rows;
// what reads or writes the caches (RoPE at the positions, the window ring, the compressors' steps, the indexer's top-k,
// the attention) runs per session. Several runs need no side streams in sc (they reuse one scratch serially). Taps
// attn.q, attn.kv, attn.indexer.*, attn.out (substitutable). Updates the layers' window rings and compressor caches.
// nm: the numerics policy. fold (cuda.hc_fold, or null): the FFN hc_pre's start, which wo_b's launch runs on its rows
// where it can (one token, wo_b on the FP8 GEMV with an f16 input); returns whether it did (else the caller runs
// hc_post as usual). rows (cuda.batch_rows, or null): with runs of one token each, one session per row in order and
// their positions consecutive in memory, what runs per session runs as one launch per kind over the rows (the
// reference's numerics and no tap; the attention with the split-K kernel, on CSA layers where no session runs its
// indexer, with cuda.batch_rows_indexer where every session runs it over index_topk entries or more, and with
// cuda.batch_rows_mixed where each does or takes every entry: see `batched` in gpu_attention.cpp; else the CSA layer's
// indexer and attention stay per session).
bool gpu_attention(const GpuAttn& w, const ModelConfig& c, AttnType type, const GpuRope& rope, const float* x, const uint16_t* x16,
                   std::span<const AttnRun> runs, Scratch& sc, const GpuNumerics& nm, const Tap& tap, float* out,
                   const detail::HcPartArgs* fold = nullptr, const LayerRows* rows = nullptr);

// The layers whose compressors can defer (cuda.comp_deferred): one rate for both (CSA's indexer compressor shares the
// kept x rows).
bool comp_deferrable(const GpuAttn& w);
// cuda.comp_deferred: what a one-token step does with this layer's compressor rows. A window whose tokens all came
// in one-token steps keeps their x rows (GpuLayerState::xring) and projects them as one chunk of `rate` rows at its
// last token, so the compressors' weights (V4-Flash CSA: 21 MB of bf16, HCA: 8 MB) are read once per window
// instead of once per token; the chunk runs on the fp32 twin (project_kept: up to 4 rows each with its one-token
// bits). Modes: kCompNormal (projected now), kCompStore (kept), kCompProject (the window's last token: its rows
// projected and pooled). *pending: rows kept from earlier steps of this window, which a step that does not defer
// projects first.
enum CompDeferMode { kCompNormal = 0, kCompStore = 1, kCompProject = 2 };
CompDeferMode comp_defer_mode(const GpuAttn& w, const Step& step, int n, int64_t* pending = nullptr);

// A fresh session's caches for this layer: the window ring and the compressors' fixed buffers.
void init_attention_state(const GpuAttn& w, const ModelConfig& c, GpuLayerState& st);
// Grows the compressors' entry buffers to hold every entry up to position pos_end (doubling, contents kept);
// bumps `generation` (the session's: DeviceSessionState::generation) when one moves. Called before every step (a
// graph's replay included), by the forward (GpuForward::reserve_caches).
void reserve_attention_state(const GpuAttn& w, int64_t pos_end, GpuLayerState& st, uint64_t& generation);

}  // namespace plumb::cuda
