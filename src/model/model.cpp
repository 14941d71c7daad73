// Top-level forward (spec section 3): embed -> hc_mult streams -> layers (mHC + attention, mHC + MoE) -> hc head
// -> final norm -> LM head.
#include "model/model.h"

#include <filesystem>

#include "core/parallel.h"
#include "generate/token_bits.h"
#include "model/attention.h"
#include "model/hyper_connection.h"
#include "model/numerics.h"
#include "patches/registry.h"
#include "plumb/text.h"  // Sampler (forward_sample)

namespace plumb {

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelOptions& opt,
                                   const std::function<void(int64_t, int64_t)>& on_layer, const std::string& backend,
                                   const std::function<void(int64_t, int64_t)>& on_upload) {
  PLUMB_CHECK(backend == "cpu" || backend == "cuda", "unknown backend '{}' (available: {})", backend, kBackends);
  // A patch of one backend (Patch::backend) is refused on the others, by name: it is on in `opt` when enabling it
  // again changes nothing. (Covers every such patch the registry will hold, not a list kept here.)
  for (const Patch& p : patch_registry()) {
    if (p.backend.empty() || p.backend == backend) continue;
    ModelOptions again = opt;
    p.enable(again);
    PLUMB_CHECK(!(again == opt), "patch {} is a {} kernel: it needs --backend {} (in diff, kld and trace configurations "
                "the prefix {}:, as in {}:{})", p.name, p.backend == "cuda" ? "CUDA" : p.backend, p.backend, p.backend,
                p.backend, p.name);
  }
  auto m = std::make_unique<Model>();
  m->dir_ = dir;
  const auto cfg_path = (std::filesystem::path(dir) / "config.json").string();
  PLUMB_CHECK(!std::filesystem::exists(dir) || std::filesystem::is_directory(dir),
              "{} is a file: give its folder (a model folder holds config.json and model.safetensors)", dir);
  PLUMB_CHECK(std::filesystem::exists(cfg_path), "model folder {} has no config.json", dir);
  m->cfg_ = ModelConfig::load(cfg_path);
  if (opt.fault_v3_grouped_topk)
    PLUMB_CHECK(m->cfg_.set_v3_groups(), "fault.v3_grouped_topk: the {} experts (top-{}) of {} cannot be grouped so that the "
                "grouping limits the selection", m->cfg_.n_experts, m->cfg_.top_k, dir);
  m->ck_ = Checkpoint::open(dir);
  m->w_ = ModelWeights::bind(m->ck_, m->cfg_, on_layer);
  // The official code has no YaRN magnitude scaling (dsv4-spec.md 5.3): its cos and sin are never multiplied by an
  // attention factor, whatever config.json says; transformers multiplies them by rope_parameters' attention_factor
  // (by default 0.1 ln(factor) + 1 in the nested form, 1 in the legacy flat form). Nor does it have YaRN on the
  // sliding-window layers' table (dsv4-spec.md 5.3, P-A1: built with original_seq_len 0, its ModelArgs holds one
  // YaRN, the compressed layers'): a YaRN main rope in config.json (transformers applies it) is plain RoPE there.
  auto rope = [&](RopeConfig rc, bool main) {
    if (opt.official) {
      rc.attention_factor = 1.0;
      if (main) rc.yarn = false;
    }
    return ops::Rope(rc, m->cfg_.rope_dim);
  };
  m->rope_main_ = rope(m->cfg_.rope_main, true);
  m->rope_compress_ = rope(m->cfg_.rope_compress, false);
  m->opt_ = opt;
  m->backend_ = backend;
  if (backend == "cuda") m->device_ = make_cuda_forward(*m, on_upload);
  return m;
}

SessionState Model::new_state() const {
  SessionState s;
  if (device_) {
    s.dev = device_->new_state();
    return s;
  }
  s.layers.resize(size_t(cfg_.n_layers));
  return s;
}

void Model::check_tokens(const SessionState& st, std::span<const int32_t> tokens) const {
  PLUMB_CHECK(!tokens.empty(), "forward: no tokens");
  for (size_t i = 0; i < tokens.size(); ++i)
    PLUMB_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab, "token {} at position {} is outside the vocabulary [0, {})", tokens[i],
                st.pos + int64_t(i), cfg_.vocab);
}

int32_t Model::forward_sample(SessionState& st, std::span<const int32_t> tokens, Sampler& sampler,
                              std::span<const int32_t> history, const TokenFilter* allowed) const {
  check_tokens(st, tokens);
  PLUMB_CHECK(device_ && st.dev, "forward_sample: backend {} samples on the host (Session::forward_sample)", backend_);
  std::vector<float> row;
  bool filter_threw = false;  // (then the forward has run: the tokens are fed, nothing is drawn)
  TokenFilter watched;
  if (allowed && *allowed)
    watched = [&](std::span<uint32_t> bits) {
      try {
        (*allowed)(bits);
      } catch (...) {
        filter_threw = true;
        throw;
      }
    };
  int32_t id;
  try {
    id = device_->forward_sample(st, tokens, sampler, history, watched ? &watched : nullptr, row);
  } catch (...) {
    if (filter_threw) st.pos += int64_t(tokens.size());
    throw;
  }
  st.pos += int64_t(tokens.size());  // (fed, as on the host, even when the sampling fails below)
  if (id < 0) throw_no_finite_row(sampler, row, history, fmt::format("forward_sample: position {}", st.pos - 1));
  return id;
}

void Model::reserve(SessionState& st, int64_t positions) const {
  PLUMB_CHECK(positions >= 0, "reserve: {} positions (must be >= 0)", positions);
  if (cfg_.max_positions > 0) positions = std::min<int64_t>(positions, cfg_.max_positions);
  if (device_ && st.dev) device_->reserve(st, positions);
}

namespace {

// A compressor's state without its entries (StateMark::layers), and the restore of one, whose entries are cut back
// to the mark's count (rows appended since are dropped; the rows before are never rewritten).
CompressorState without_entries(const CompressorState& s) {
  CompressorState m;
  m.pend_kv = s.pend_kv, m.pend_gate = s.pend_gate, m.pending = s.pending;
  m.prev_kv = s.prev_kv, m.prev_gate = s.prev_gate, m.has_prev = s.has_prev;
  m.n_entries = s.n_entries;
  return m;
}
void restore(CompressorState& s, const CompressorState& m) {
  PLUMB_CHECK(m.n_entries <= s.n_entries, "rollback: the mark has {} compressed entries, the session {} (not this session's mark)",
              m.n_entries, s.n_entries);
  const size_t row = s.n_entries > 0 ? s.entries.size() / size_t(s.n_entries) : 0;
  std::vector<float> entries = std::move(s.entries);
  entries.resize(size_t(m.n_entries) * row);
  s = m;
  s.entries = std::move(entries);
}

}  // namespace

StateMark Model::mark(const SessionState& st) const {
  StateMark m;
  m.pos = st.pos;
  if (st.dev) {
    m.dev = device_->mark(st, m.bytes);
    return m;
  }
  m.layers.reserve(st.layers.size());
  for (const LayerState& l : st.layers) {
    LayerState c;
    c.win_kv = l.win_kv, c.win_pos = l.win_pos;
    c.comp = without_entries(l.comp), c.index_comp = without_entries(l.index_comp);
    for (const auto* v : {&c.win_kv, &c.comp.pend_kv, &c.comp.pend_gate, &c.comp.prev_kv, &c.comp.prev_gate,
                          &c.index_comp.pend_kv, &c.index_comp.pend_gate, &c.index_comp.prev_kv, &c.index_comp.prev_gate})
      m.bytes += int64_t(v->size() * sizeof(float));
    m.bytes += int64_t(c.win_pos.size() * sizeof(int64_t));
    m.layers.push_back(std::move(c));
  }
  return m;
}

void Model::rollback(SessionState& st, const StateMark& m) const {
  PLUMB_CHECK(m.pos <= st.pos && bool(m.dev) == bool(st.dev) && m.layers.size() == st.layers.size(),
              "rollback: a mark at position {} does not fit this session (at position {})", m.pos, st.pos);
  if (st.dev) {
    device_->rollback(st, m.dev.get());
  } else {
    for (size_t i = 0; i < st.layers.size(); ++i) {
      LayerState& l = st.layers[i];
      l.win_kv = m.layers[i].win_kv, l.win_pos = m.layers[i].win_pos;
      restore(l.comp, m.layers[i].comp);
      restore(l.index_comp, m.layers[i].index_comp);
    }
  }
  st.pos = m.pos;
}

Tensor Model::forward(SessionState& st, std::span<const int32_t> tokens, TapSink* taps, LogitRows rows,
                      const std::function<void(int)>& on_layer) const {
  const int64_t n = int64_t(tokens.size());
  check_tokens(st, tokens);
  if (device_) {
    PLUMB_CHECK(st.dev, "forward: this session's state was not made by the {} backend", backend_);
    Tensor logits = device_->forward(st, tokens, taps, taps ? LogitRows::All : rows);
    st.pos += n;
    return logits;
  }
  PLUMB_CHECK(!st.dev && int64_t(st.layers.size()) == cfg_.n_layers, "forward: this session's state was not made by the cpu backend");
  const RowRun run{&st, 0, n};
  return cpu_forward(std::span(&run, 1), tokens, taps, rows, on_layer);
}

std::vector<Model::RowRun> Model::check_batch(std::span<SessionState* const> states, std::span<const int32_t> tokens) const {
  const int64_t b = int64_t(states.size());
  PLUMB_CHECK(b > 0 && int64_t(tokens.size()) == b, "forward_batch: {} sessions and {} tokens (one token per session, at "
              "least one)", b, tokens.size());
  std::vector<RowRun> runs;
  for (int64_t i = 0; i < b; ++i) {
    SessionState* st = states[size_t(i)];
    PLUMB_CHECK(st, "forward_batch: session {} of {} is null", i, b);
    for (int64_t j = 0; j < i; ++j)  // (copies of a state share its device caches)
      PLUMB_CHECK(states[size_t(j)] != st && !(st->dev && states[size_t(j)]->dev == st->dev), "forward_batch: sessions {} and {} "
                  "are the same session (one token per session a step)", j, i);
    try {
      check_tokens(*st, tokens.subspan(size_t(i), 1));
    } catch (const Error& e) {
      fail("forward_batch: session {} of {}: {}", i, b, e.what());
    }
    PLUMB_CHECK(device_ ? bool(st->dev) : (!st->dev && int64_t(st->layers.size()) == cfg_.n_layers),
                "forward_batch: session {} of {} was not made by the {} backend", i, b, backend_);
    runs.push_back({st, i, 1});
  }
  return runs;
}

Tensor Model::forward_batch(std::span<SessionState* const> states, std::span<const int32_t> tokens) const {
  const std::vector<RowRun> runs = check_batch(states, tokens);
  if (device_) {
    Tensor logits = device_->forward_batch(states, tokens);
    for (SessionState* st : states) ++st->pos;
    return logits;
  }
  return cpu_forward(runs, tokens, nullptr, LogitRows::All, {});
}

void throw_no_finite_row(const Sampler& sampler, std::span<const float> row, std::span<const int32_t> history,
                         const std::string& where) {
  (void)sampler.distribution(row, history);  // throws: no finite logit (the message says what the row held)
  fail("{}: the device found no finite logit but the host sampler did", where);
}

std::vector<uint32_t> batch_masks(std::span<const BatchRow> rows, size_t words, std::vector<std::exception_ptr>& errors) {
  std::vector<uint32_t> bits(rows.size() * words, 0);
  errors.assign(rows.size(), nullptr);
  // (work: a mask reads about a byte string per token, ~32 x words steps; the pool takes it from a few rows at V4's
  // vocabulary, and leaves a small model's rows serial)
  parallel_for(int64_t(rows.size()), double(rows.size()) * double(words) * 32.0, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      if (const BatchRow& r = rows[size_t(b)]; r.sampler && r.allowed) try {
          r.allowed(std::span<uint32_t>(bits.data() + size_t(b) * words, words));
        } catch (...) {
          errors[size_t(b)] = std::current_exception();
        }
  });
  return bits;
}

void Model::forward_batch_sample(std::span<SessionState* const> states, std::span<BatchRow> rows) const {
  const std::vector<int32_t> tokens = batch_tokens(rows);
  const std::vector<RowRun> runs = check_batch(states, tokens);
  for (size_t i = 0; i < rows.size(); ++i) {
    BatchRow& r = rows[i];
    PLUMB_CHECK(!r.sampler || r.sampler->vocab() == cfg_.vocab, "forward_batch: session {} of {}: a sampler for a vocabulary "
                "of {}, the model's is {}", i, rows.size(), r.sampler ? r.sampler->vocab() : 0, cfg_.vocab);
    r.sampled = -1, r.logits.clear(), r.error = nullptr;
  }
  if (device_) {
    device_->forward_batch_sample(states, tokens, rows);
    for (SessionState* st : states) ++st->pos;
    return;
  }
  Tensor logits = cpu_forward(runs, tokens, nullptr, LogitRows::All, {});
  const size_t V = size_t(cfg_.vocab), words = gen::token_bits_words(cfg_.vocab);
  std::vector<std::exception_ptr> mask_errors;
  const std::vector<uint32_t> bits = batch_masks(rows, words, mask_errors);
  for (size_t i = 0; i < rows.size(); ++i) {
    BatchRow& r = rows[i];
    const std::span<float> row(logits.ptr() + i * V, V);  // (masked in place: each row is read once)
    if (!r.sampler) {
      r.logits.assign(row.begin(), row.end());
      continue;
    }
    if ((r.error = mask_errors[i])) continue;  // (nothing drawn, as forward_sample_masked leaves it)
    try {
      if (r.allowed) gen::mask_logits(row, std::span<const uint32_t>(bits.data() + i * words, words));
      r.sampled = r.sampler->sample(row, r.history);
    } catch (...) {
      r.error = std::current_exception();
    }
  }
}

// The reference pass over a chunk's rows, which belong to one session or several (runs: consecutive rows of one
// session each). Every op but the attention sublayer works row by row, so rows of different sessions share its
// weights; the attention runs per run, on that session's caches at its position.
Tensor Model::cpu_forward(std::span<const RowRun> runs, std::span<const int32_t> tokens, TapSink* taps, LogitRows rows,
                          const std::function<void(int)>& on_layer) const {
  const auto& c = cfg_;
  const int64_t n = int64_t(tokens.size()), D = c.hidden, H = c.hc_mult;
  const Numerics nm(opt_);

  // Embedding, copied into every residual stream: X [n, H, D].
  Tensor X({n, H, D});
  std::vector<float> e(static_cast<size_t>(D));
  for (int64_t t = 0; t < n; ++t) {
    w_.embed.row(tokens[size_t(t)], e.data());
    nm.act(e.data(), D);
    for (int64_t j = 0; j < H; ++j) std::copy(e.begin(), e.end(), X.ptr() + (t * H + j) * D);
  }

  for (int i = 0; i < c.n_layers; ++i) {
    const auto& L = w_.layers[size_t(i)];
    const Tap tap{taps, taps ? fmt::format("L{}.", i) : std::string()};
    const auto type = c.attn[size_t(i)];
    const ops::Rope& rope = type == AttnType::Sliding ? rope_main_ : rope_compress_;

    HcPre a = hc_pre(L.hc_attn, c, opt_, X, tap, "hc_attn");
    nm.rms_norm(a.collapsed.ptr(), n, L.attn_norm, c.rms_eps);
    Tensor att;
    if (runs.size() == 1) {
      att = attention_forward(L.attn, c, type, rope, a.collapsed, runs[0].st->pos, runs[0].st->layers[size_t(i)], opt_, nm, tap);
    } else {
      att = Tensor({n, D});
      for (const RowRun& r : runs) {
        const float* x0 = a.collapsed.ptr() + r.row0 * D;
        const Tensor x({r.n, D}, std::vector<float>(x0, x0 + r.n * D));
        const Tensor y = attention_forward(L.attn, c, type, rope, x, r.st->pos, r.st->layers[size_t(i)], opt_, nm, tap);
        std::copy(y.data.begin(), y.data.end(), att.ptr() + r.row0 * D);
      }
    }
    X = hc_post(att, X, a, opt_);

    HcPre f = hc_pre(L.hc_ffn, c, opt_, X, tap, "hc_ffn");
    nm.rms_norm(f.collapsed.ptr(), n, L.ffn_norm, c.rms_eps);
    const Tensor moe = moe_forward(L.moe, c, c.mlp[size_t(i)], f.collapsed, tokens, opt_, nm, tap);
    X = hc_post(moe, X, f, opt_);
    tap.io("out", X);
    if (on_layer) on_layer(i + 1);
  }

  for (const RowRun& r : runs) r.st->pos += r.n;
  if (taps) rows = LogitRows::All;
  if (rows == LogitRows::None) return Tensor();
  const Tap top{taps, ""};
  Tensor y = hc_head(w_.hc_head, c, opt_, X);  // per row: the last row's alone is the same numbers
  top.io("hc_head.out", y);
  if (rows == LogitRows::Last) y = Tensor({1, D}, std::vector<float>(y.ptr() + (n - 1) * D, y.ptr() + n * D));
  nm.rms_norm(y.ptr(), y.dim(0), w_.norm, c.rms_eps);
  return ops::linear(y, w_.head);
}

}  // namespace plumb
