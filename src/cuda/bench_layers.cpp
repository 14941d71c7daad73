// `plumb bench --layers N`: the whole CUDA forward pass (Model::load(dir, options, {}, "cuda")) on the synthetic
// checkpoint of bench_layers_checkpoint.cpp (V4-Flash's or V4-Pro's dimensions in the official formats).
//
// Measures, in one process: the device's copy bandwidth; load time; decode steps of B tokens of one sequence
// (prefilled with `context` tokens first) for each batch B: median (and mean) wall time of a step as generation runs
// it (GPU: Model::forward_sample, the last row sampled on the device with the default sampling parameters, only the
// token coming back; CPU: Model::forward of the last row), the part outside the layers (the device time of the
// embedding, LM head and sampling op regions; without an op timer, the host clock at two taps), hence the time per
// layer (an upper bound: the step's host work counts as layer time), the bytes a layer must read at that batch, GB/s
// and % of the copy bandwidth, and the implied whole-model tokens/s (43 layers for Flash, 61 for Pro); prefill of N
// tokens on a fresh session in chunks of at most prefill_chunk. bench_layers_report.cpp prints and writes the results.
#ifdef PLUMB_WITH_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "core/error.h"
#include "cuda/api.h"
#include "cuda/bench_layers_internal.h"
#include "cuda/gpu_common.h"
#include "cuda/kernels.h"
#include "patches/registry.h"
#include "plumb/text.h"

namespace plumb::cuda {

namespace bench_layers {

void out(const std::string& s) {
  std::fputs(s.c_str(), stdout);
  std::fflush(stdout);
}
std::string fmt_num(double v, int prec) { return std::isfinite(v) ? fmt::format("{:.{}f}", v, prec) : "-"; }

namespace {

namespace d = detail;

// Bytes a layer must read per decode step (weights, in the checkpoint formats): everything but the routed experts,
// plus the bytes of one routed expert (w1, w2, w3 codes and scales). no_index_q: the CSA layer's indexer query
// (its wq_b) is not run (indexer.skip_short at a context whose entries the top-k would all select).
struct LayerBytes {
  double fixed = 0, per_expert = 0;
};
LayerBytes layer_bytes(const LayerBenchDims& d, AttnType type, bool no_index_q) {
  auto fp8 = [](int64_t r, int64_t c) { return double(r * c + ((r + 127) / 128) * ((c + 127) / 128)); };
  auto fp4 = [](int64_t r, int64_t c) { return double(r * c / 2 + r * c / 32); };
  const int64_t D = d.hidden, H = d.hc_mult, mix = (2 + H) * H, Dh = d.head_dim, QL = d.q_lora, I = d.moe_inter;
  LayerBytes b;
  b.fixed += 2.0 * double(mix * H * D + mix + 3) * 4 + 2.0 * double(D) * 2;  // hc_attn, hc_ffn (f32), two norms (bf16)
  b.fixed += fp8(QL, D) + double(QL) * 2 + fp8(int64_t(d.heads) * Dh, QL) + fp8(Dh, D) + double(Dh) * 2 +
             fp8(int64_t(d.o_groups) * d.o_lora, int64_t(d.heads) * Dh / d.o_groups) + fp8(D, int64_t(d.o_groups) * d.o_lora) +
             double(d.heads) * 4;
  auto comp = [&](int rate, int64_t dim, bool overlap) {
    const int64_t w = overlap ? 2 * dim : dim;
    return 2.0 * double(w * D) * 2 + double(rate * w) * 4 + double(dim) * 2;
  };
  if (type != AttnType::Sliding) b.fixed += comp(type == AttnType::CSA ? d.csa_rate : d.hca_rate, Dh, type == AttnType::CSA);
  if (type == AttnType::CSA)
    b.fixed += (no_index_q ? 0.0 : fp8(int64_t(d.index_heads) * d.index_head_dim, QL)) + double(d.index_heads * D) * 2 +
               comp(d.csa_rate, d.index_head_dim, true);
  b.fixed += double(int64_t(d.experts) * D) * 2 + double(d.experts) * 4 + 2 * fp8(I, D) + fp8(D, I);  // router, shared expert
  b.per_expert = 2 * fp4(I, D) + fp4(D, I);
  return b;
}
// Distinct experts B tokens touch when each token picks each expert with probability K/E (uniform routing).
double expected_experts(const LayerBenchDims& d, int B) {
  return d.experts * (1.0 - std::pow(1.0 - double(d.top_k) / d.experts, B));
}

double measure_copy_gbps() {
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer src(bytes), dst(bytes);
  src.fill_byte(0x5A);
  dst.fill_byte(0);
  struct Ev {
    void *a = d::event_create(), *b = d::event_create();
    ~Ev() { d::event_destroy(a), d::event_destroy(b); }
  } ev;
  std::vector<double> ms;
  for (int i = 0; i < 3 + 15; ++i) {
    d::event_record(ev.a, nullptr);
    d::copy_d2d(dst.get(), src.get(), bytes, nullptr);
    d::event_record(ev.b, nullptr);
    const double t = d::event_elapsed_ms(ev.a, ev.b);
    if (i >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * double(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int32_t> random_tokens(std::mt19937& g, int n, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(g() % uint32_t(vocab));
  return t;
}

struct LogitStats {
  bool finite = true;
  double max_abs = 0, rms = 0;
};
LogitStats logit_stats(const Tensor& l) {
  LogitStats s;
  double ss = 0;
  for (float v : l.data) {
    if (!std::isfinite(v)) {
      s.finite = false;
      continue;
    }
    s.max_abs = std::max(s.max_abs, double(std::fabs(v)));
    ss += double(v) * v;
  }
  s.rms = l.data.empty() ? 0 : std::sqrt(ss / double(l.data.size()));
  return s;
}

// Times the part of a forward call outside the layers: "L0.hc_attn.post" is the first tap inside layer 0 and
// "hc_head.out" the first after the last layer; the GPU forward downloads a tapped tensor before the sink sees it,
// so the host clock at those calls marks how far the device got. Also counts the distinct routed experts of each
// layer ("L<i>.ffn.gate.indices").
class SplitSink : public TapSink {
 public:
  explicit SplitSink(int layers) {
    for (int i = 0; i < layers; ++i) idx_.insert(fmt::format("L{}.ffn.gate.indices", i));
  }
  bool wants(const std::string& n) const override { return n == kFirst || n == kLast || idx_.count(n); }
  void put(const std::string& n, const Tensor&) override {
    if (n == kFirst && !first) t_first = Clock::now(), first = true;
    if (n == kLast) t_last = Clock::now(), last = true;
  }
  void put_index(const std::string& n, const IndexTensor& t) override {
    if (!idx_.count(n)) return;
    std::set<int64_t> s(t.data.begin(), t.data.end());
    distinct.push_back(double(s.size()));
  }
  void reset() { first = last = false; }

  static constexpr const char* kFirst = "L0.hc_attn.post";
  static constexpr const char* kLast = "hc_head.out";
  Clock::time_point t_first, t_last;
  bool first = false, last = false;
  std::vector<double> distinct;

 private:
  std::set<std::string> idx_;
};

PairedStats paired_stats(const std::vector<double>& a, const std::vector<double>& b) {
  PairedStats s;
  s.pairs = int(std::min(a.size(), b.size()));
  if (s.pairs == 0) return s;
  std::vector<double> d(static_cast<size_t>(s.pairs));
  for (int i = 0; i < s.pairs; ++i) d[size_t(i)] = b[size_t(i)] - a[size_t(i)];
  s.a = median(a), s.b = median(b), s.diff = median(d);
  s.mean_diff = std::accumulate(d.begin(), d.end(), 0.0) / double(s.pairs);
  std::sort(d.begin(), d.end());
  const int n = s.pairs;
  double p = std::pow(0.5, n), cum = 0;  // P(X = j), P(X <= j) for X ~ Binomial(n, 1/2)
  int k = 0;
  for (int j = 0; j < n; ++j) {
    cum += p;
    if (cum > 0.025) break;
    k = j + 1;
    p = p * double(n - j) / double(j + 1);
  }
  if (k >= 1) s.lo = d[size_t(k - 1)], s.hi = d[size_t(n - k)];
  return s;
}


// One decode step as generation runs it, the form every timed step (and --ab's pairs) takes: on the GPU the last
// row sampled on the device, only the token downloaded (B-sequence decode would sample its B rows there too).
// Downloading the row's logits instead (517 KB at V4-Flash's vocabulary, from pageable memory) put ~100 us of PCIe
// copy per step in the layers' share.
void generation_step(bool gpu, const Model& m, SessionState& s, const std::vector<int32_t>& toks, Sampler& sampler) {
  if (gpu) m.forward_sample(s, toks, sampler, {});
  else m.forward(s, toks, nullptr, LogitRows::Last);
}

// Under cuda.graph, at most this many steps beyond o.warmup warm the graph until a step replays it.
constexpr int kGraphWarmups = 6;

// One run's options, models and state, shared by its phases.
struct Run {
  const LayerBenchOptions& o;
  const Clock::time_point start = Clock::now();
  const bool gpu;
  const DeviceInfo dev;
  const std::vector<AttnType> types;
  PatchSet patches, patches_b;
  std::unique_ptr<Model> model, model_b;  // model_b: --ab's, the same checkpoint with other patches
  std::mt19937 rng{1234};
  bool failed = false, sane_checked = false;
  LayerBenchResult res;

  explicit Run(const LayerBenchOptions& opt)
      : o(opt), gpu(opt.backend == "cuda"), dev(gpu ? device_info() : DeviceInfo{"cpu (reference backend)"}),
        types(stack_types(opt.layers)) {}
  int layers() const { return o.layers; }
  double left() const { return o.max_seconds - secs(start, Clock::now()); }

  void check_logits(const Tensor& l, const std::string& where) {
    const auto s = logit_stats(l);
    res.sanity.push_back({{"where", where}, {"finite", s.finite}, {"max_abs_logit", s.max_abs}, {"rms_logit", s.rms}});
    out(fmt::format("  sanity ({}): logits {}, max |logit| {:.3g}, rms {:.3g}\n", where, s.finite ? "finite" : "NOT FINITE",
                    s.max_abs, s.rms));
    if (!s.finite) out("  WARNING: non-finite logits: the timings below are of a broken computation\n");
  }
  // Feeds n random tokens to model m in calls of at most prefill_chunk; returns the total seconds (each call's in
  // chunk_s).
  double feed(const Model& m, SessionState& st, int n, std::vector<double>* chunk_s, Tensor* last_logits) {
    double total = 0;
    for (int done = 0; done < n;) {
      const int c = std::min(o.prefill_chunk, n - done);
      const auto toks = random_tokens(rng, c, o.dims.vocab);
      const auto t0 = Clock::now();
      // As a Session prefills for generation: logits of the last token of the last call only.
      Tensor lg = m.forward(st, toks, nullptr, done + c == n ? LogitRows::Last : LogitRows::None);
      const double s = secs(t0, Clock::now());
      total += s;
      if (chunk_s) chunk_s->push_back(s);
      if (last_logits && done + c == n) *last_logits = std::move(lg);
      done += c;
    }
    return total;
  }
};

std::string shown(const PatchSet& p) { return p.names().empty() ? std::string("none") : p.names(); }

void print_header(const Run& R) {
  const auto& o = R.o;
  const auto& dm = o.dims;
  const auto& dev = R.dev;
  if (R.gpu)
    out(fmt::format("device: {} (sm_{}{}, {} SMs, L2 {} MB, {:.1f} GB)\n", dev.name, dev.cc_major, dev.cc_minor, dev.sm_count,
                    dev.l2_bytes >> 20, double(dev.mem_bytes) / 1e9));
  else
    out("backend cpu: the reference backend (no bandwidth measurement)\n");
  if (R.gpu && dev.check_only) fmt::print(stderr, "{}", kCheckOnlyWarning), out(kCheckOnlyWarning);
  out(fmt::format("model: {} dimensions ({} layers in the whole model)\n", dm.model, dm.model_layers));
  out(fmt::format("layer stack: {} layer{} [{}]; learned routing (sqrtsoftplus + bias, top-{} of {}) on every layer; "
                  "patches: {}\n",
                  o.layers, o.layers == 1 ? "" : "s", fmt::join(R.res.type_names, ", "), dm.top_k, dm.experts,
                  R.patches.names().empty() && R.gpu ? "none (the generic GPU kernels)" : shown(R.patches)));
  out(fmt::format("dims: hidden {}, {} heads x {} (rope {}), q_lora {}, o {} x {}, window {}, {} experts top-{} + 1 shared, "
                  "moe_inter {}, hc_mult {}, index {} x {} top-{}, compress {}/{}, vocab {}\n",
                  dm.hidden, dm.heads, dm.head_dim, dm.rope_dim, dm.q_lora, dm.o_groups, dm.o_lora, dm.window, dm.experts, dm.top_k,
                  dm.moe_inter, dm.hc_mult, dm.index_heads, dm.index_head_dim, dm.index_topk, dm.csa_rate, dm.hca_rate, dm.vocab));
  out(fmt::format("time limits: {:.0f} s for the whole run (phases that would not fit are skipped), {:.0f} s per decode batch, "
                  "larger prefills skipped after one slower than {:.0f} s\n",
                  o.max_seconds, o.batch_budget_s, o.prefill_skip_after_s));
}

// Loads model A (and with --ab model B) from the checkpoint folder; false after a message on stderr.
bool load_models(Run& R, const std::string& dir) {
  out(fmt::format("loading with backend {}{}...\n", R.o.backend, R.gpu ? " (bind + upload)" : ""));
  const auto tl = Clock::now();
  try {
    R.model = Model::load(dir, R.patches.options, {}, R.o.backend);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: plumb bench --layers: loading failed: %s\n", e.what());
    return false;
  }
  R.res.load_s = secs(tl, Clock::now());
  out(fmt::format("loaded in {:.1f} s: {}\n", R.res.load_s, R.model->config().summary()));
  // cuda.host_experts: those bytes cross PCIe, not HBM, though the table's % copy counts every byte at the copy rate.
  if (const int64_t host = R.model->device_memory().host)
    out(fmt::format("cuda.host_experts: {:.2f} GB of routed-expert codes in pinned host memory: their layers' active experts "
                    "cross PCIe at each step, and the table's GB/s and % copy count them as HBM bytes\n",
                    double(host) / 1e9));
  if (!R.o.ab) return true;
  try {
    const auto tb = Clock::now();
    R.model_b = Model::load(dir, R.patches_b.options, {}, R.o.backend);
    out(fmt::format("loaded model B (patches: {}) in {:.1f} s\n", shown(R.patches_b), secs(tb, Clock::now())));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: plumb bench --layers: loading model B (--ab) failed: %s\n", e.what());
    return false;
  }
  return true;
}

// The bytes a layer reads at batch B, averaged over the stack's types (indexer.skip_short: the CSA layers do not
// read the indexer's wq_b when every measured step, at most warm-up + iters steps of B tokens after the context, ends
// where the top-k would select all entries: the engine's rule), with the note that says which case holds.
void plan_bytes(const Run& R, DecodeRow& r) {
  const auto& o = R.o;
  const int B = r.batch;
  r.experts_expected = expected_experts(o.dims, B);
  const bool skip = R.patches.options.indexer_skip_short && std::count(R.types.begin(), R.types.end(), AttnType::CSA) > 0;
  const int64_t first_end = o.context + B, last_end = o.context + int64_t(o.warmup + kGraphWarmups + o.iters) * B;
  const bool no_index_q = skip && indexer_skippable(R.model->config(), o.dims.csa_rate, last_end);
  if (no_index_q)
    r.note = "indexer.skip_short: the CSA layers skip their indexer in every step (bytes without its wq_b)";
  else if (skip && indexer_skippable(R.model->config(), o.dims.csa_rate, first_end))  // some steps skip it: bytes overstate reads
    r.note = "indexer.skip_short: the CSA layers skip their indexer in the first steps only (bytes with its wq_b: GB/s an upper bound)";
  double fixed = 0, per_e = 0;
  for (auto t : R.types) {
    const LayerBytes b = layer_bytes(o.dims, t, no_index_q);
    fixed += b.fixed / o.layers, per_e += b.per_expert / o.layers;
  }
  r.layer_bytes = fixed + per_e * r.experts_expected;
}

void add_note(DecodeRow& r, const std::string& s) { r.note += (r.note.empty() ? "" : "; ") + s; }

// Under cuda.graph: whether run_step's step replayed the graph it captured in dev (not eager, not a new capture);
// true without a device.
template <class F>
bool replayed_graph(const DeviceSessionState* dev, F&& run_step) {
  const int64_t launches = dev ? dev->graph_launches : 0, captures = dev ? dev->graph_captures : 0;
  run_step();
  return !dev || (dev->graph_launches != launches && dev->graph_captures == captures);
}

// One decode batch's session on model A and its forms of a step.
struct Batch {
  Run& R;
  const int B;
  SessionState st;
  Sampler sampler;  // plumb run's defaults (temperature 0.8, top-k 40, top-p, min-p)
  std::optional<DeviceBuffer> l2_flush;  // --cold-l2
  int64_t reach = 0;
  int min_steps = 3, tapped = 3;

  Batch(Run& run, int batch)
      : R(run), B(batch), st(run.model->new_state()), sampler(SamplingParams{}, run.o.dims.vocab) {
    // Every position this batch's steps reach (warm-up, timed, tapped, --skeleton's and --ab's), reserved as
    // generation reserves its prompt and --max-tokens: otherwise the caches' doubling (at 256 + 4 tokens on the CSA
    // layers) re-captured the decode graph during the timed steps, one eager step and one capture among them.
    reach = R.o.context + int64_t(B) * (R.o.warmup + 4 * R.o.iters + 16);
    R.model->reserve(st, reach);
    if (R.o.cold_l2 && R.gpu) l2_flush.emplace(2 * R.dev.l2_bytes);
  }
  // One step of B random tokens, timed on the host clock. The sanity check's step (keep) and tapped steps (every
  // row computed) download the logits; the timeline's (sample false) runs the forward alone.
  double step(TapSink* taps, Tensor* keep, bool sample = true) {
    const auto toks = random_tokens(R.rng, B, R.o.dims.vocab);
    if (l2_flush) l2_flush->fill_byte(0), d::dsync();  // --cold-l2 (not timed; a memset writes every byte each time)
    const auto t0 = Clock::now();
    Tensor lg;
    if (sample && !keep && !taps) generation_step(R.gpu, *R.model, st, toks, sampler);
    else lg = R.model->forward(st, toks, taps, LogitRows::Last);
    const double s = secs(t0, Clock::now());
    if (keep) *keep = std::move(lg);
    return s;
  }
  // Under cuda.graph: whether run_step's step replayed the captured graph (not eager, not a new capture).
  template <class F>
  bool replayed(F&& run_step) {
    return replayed_graph(st.dev.get(), run_step);
  }
  // --timeline: one step as the forward runs it (graph replay, side streams), each region's start and end. The first
  // step here is eager (a graph apart from the timed one: its events are nodes), the second captures it, the third
  // replays it; without cuda.graph each step is eager and the last one's regions count.
  std::vector<OpTimer::Span> timeline(const char* what) {
    auto& timer = st.dev->scratch.timer;
    // (The forward alone: the sampling after it is eager, so its region would be the replayed step's only new one.)
    timer.on = timer.timeline = true;
    step(nullptr, nullptr, false);
    timer.clear();
    step(nullptr, nullptr, false);
    const size_t k = timer.count();
    step(nullptr, nullptr, false);
    auto spans = timer.collect_timeline(timer.count() > k ? k : 0);
    timer.on = timer.timeline = false;
    out(fmt::format("  batch {} timeline{} (us from the first region's start; region: start - end):\n", B, what));
    for (const auto& s : spans)  // (steps inside an op region, "op/step", indented)
      out(fmt::format("    {:>8.1f} - {:>8.1f}  {:>7.1f}  {}{}\n", s.start_us, s.end_us, s.end_us - s.start_us,
                      s.name.find('/') != std::string::npos ? "  " : "", s.name));
    return spans;
  }
};

// Warm-up (a step so slow that the usual 2 + 3 + 3 steps would not fit the batch budget times fewer steps), then the
// timed steps: their median, minimum and mean.
void time_steps(Batch& b, DecodeRow& r) {
  Run& R = b.R;
  const auto& o = R.o;
  const double budget = std::min(o.batch_budget_s, R.left() - 10);
  for (int w = 0; w < o.warmup; ++w) {
    Tensor lg;
    const double s = b.step(nullptr, R.sane_checked ? nullptr : &lg);
    if (!R.sane_checked) R.check_logits(lg, fmt::format("decode batch {}, first step", b.B)), R.sane_checked = true;
    if (w == 0 && s * (o.warmup - 1 + 6) > budget) {
      b.min_steps = b.tapped = 1;
      r.note = fmt::format("slow ({:.1f} s per step): 1 warm-up step, at least 1 timed and 1 tapped step", s);
      break;
    }
  }
  // Under cuda.graph, warm up until a step replays the captured graph (a first step runs eagerly, the next
  // captures; an allocation between them starts over), so that the timed steps are the steady state.
  if (R.patches.options.cuda_graph && b.st.dev && b.min_steps > 1)
    for (int extra = 0; extra < kGraphWarmups && !b.replayed([&] { b.step(nullptr, nullptr); }); ++extra) {
    }
  std::vector<double>& us = r.steps_us;  // every timed step, in order
  double spent = 0, last = 0;
  int not_replayed = 0;  // timed steps that ran eagerly or captured the graph (memory moved): not steady state
  for (int i = 0; i < o.iters; ++i) {
    if (i >= b.min_steps && spent + last > budget) {
      add_note(r, fmt::format("stopped after {} of {} steps (batch budget {:.0f} s)", i, o.iters, budget));
      break;
    }
    if (!b.replayed([&] { last = b.step(nullptr, nullptr); })) ++not_replayed;
    spent += last;
    us.push_back(last * 1e6);
  }
  r.steps = int(us.size());
  if (not_replayed > 0 && R.patches.options.cuda_graph)
    add_note(r, fmt::format("{} of the timed steps ran eagerly or captured the graph", not_replayed));
  if (b.st.dev && b.st.dev->graph_launches > 0)
    add_note(r, fmt::format("cuda.graph: {} steps replayed, {} captured in this session", b.st.dev->graph_launches,
                            b.st.dev->graph_captures));
  r.us_step = median(us);
  r.us_step_min = *std::min_element(us.begin(), us.end());
  // The mean too: a generation's tokens/s follows it, and steps that complete a compression window (every 4th on CSA
  // layers, every 128th on HCA ones) may run longer than the median step (JSON: every step's time).
  r.us_step_mean = std::accumulate(us.begin(), us.end(), 0.0) / double(us.size());
}

// Tapped steps: the distinct experts each layer routes to; returns each step's host time outside the layers (the
// split without an op timer).
std::vector<double> tapped_steps(Batch& b, DecodeRow& r) {
  SplitSink sink(b.R.layers());
  std::vector<double> nl;
  for (int i = 0; i < b.tapped; ++i) {
    sink.reset();
    const auto toks = random_tokens(b.R.rng, b.B, b.R.o.dims.vocab);
    const auto t0 = Clock::now();
    b.R.model->forward(b.st, toks, &sink);
    const auto t1 = Clock::now();
    if (sink.first && sink.last) nl.push_back((secs(t0, sink.t_first) + secs(sink.t_last, t1)) * 1e6);
  }
  r.pos_last = b.st.pos - 1;
  if (!sink.distinct.empty())
    r.experts_measured = std::accumulate(sink.distinct.begin(), sink.distinct.end(), 0.0) / double(sink.distinct.size());
  return nl;
}

// Where a step's time goes: one more untapped step (run by `step`) with CUDA events around each op region of
// `timer` (the events add a little time; the regions' sum is below the step time by the launch gaps and host work
// between them). Prints "<what> per-op us per step" and returns the regions' us.
std::vector<std::pair<std::string, double>> op_breakdown(OpTimer& timer, const std::function<void()>& step, const std::string& what) {
  timer.on = true;
  step();
  timer.on = false;
  std::vector<std::pair<std::string, double>> regions;
  std::string line;
  double sum = 0;
  for (const auto& [name, ms] : timer.collect()) {
    line += fmt::format("{}{} {}", line.empty() ? "" : ", ", name, fmt_num(ms * 1e3));
    regions.push_back({name, ms * 1e3});
    sum += ms * 1e3;
  }
  out(fmt::format("  {} per-op us per step (all layers): {}; sum {}\n", what, line, fmt_num(sum)));
  return regions;
}

// The part outside the layers. On the GPU: the device time of the "embed", "head" and "sample" op regions (CUDA events
// on an untapped step; the LM head dominates). The step's uploads, the token's download and the host work between
// launches stay in the layers' share, so the per-layer time is an upper bound. (Timing the outside part on tapped
// steps, as the bench did before, counted the taps' downloads and the eager launch gaps outside the layers: 464-546 us
// at batch 1 against ~320 us of embed + head, a per-layer time up to 40 % too low.)
void split_layers(const Run& R, DecodeRow& r, const std::vector<double>& outside_tapped, int tapped) {
  const int L = R.layers();
  double regions = 0;
  int seen = 0;
  for (const auto& [name, us_op] : r.breakdown)
    if (name == "embed" || name == "head" || name == "sample") regions += us_op, ++seen;
  if (seen > 0) {
    r.split_measured = true;
    r.us_non_layer = std::min(regions, r.us_step);
  } else if (!outside_tapped.empty() && int(outside_tapped.size()) == tapped) {
    // No op timer (CPU backend): the tapped steps' host clock, the least of their (up to 3) outside parts. A host
    // clock only gains time from other work on the machine, and their median of 3 once exceeded the step's median on
    // a loaded 2-core machine (session 66: a fuzzer beside CI), which left the layers 0 us.
    r.split_measured = true;
    r.us_non_layer = std::min(*std::min_element(outside_tapped.begin(), outside_tapped.end()), r.us_step);
  } else {
    r.us_non_layer = 0;
    add_note(r, "non-layer part not measured (taps not seen): per layer = step / layers");
  }
  r.us_layer = (r.us_step - r.us_non_layer) / L;
  r.tok_s = r.batch / (r.us_step * 1e-6);
  r.gbps = r.layer_bytes / (r.us_layer * 1e-6) / 1e9;
  r.pct = 100.0 * r.gbps / R.res.copy_gbps;
  r.implied = r.batch / ((double(R.o.dims.model_layers) * r.us_layer + r.us_non_layer) * 1e-6);
}

// --skeleton: the same steps with every weight-streaming launch skipped (a graph of their own), against the time the
// batch's weight bytes take at the copy rate and the 80 % target's budget (1.25x that).
void skeleton(Batch& b, DecodeRow& r) {
  detail::SkipWeightsScope skip(true);
  for (int w = 0; w < b.R.o.warmup + 1; ++w) b.step(nullptr, nullptr);  // (the eager step, then the capture)
  std::vector<double> sk;
  for (int i = 0; i < std::max(3, r.steps); ++i) sk.push_back(b.step(nullptr, nullptr) * 1e6);
  r.us_step_skeleton = median(sk);
  r.us_layer_skeleton = (r.us_step_skeleton - r.us_non_layer) / b.R.layers();
  const double bytes_us = r.layer_bytes / (b.R.res.copy_gbps * 1e3);
  out(fmt::format("  batch {} without weight bytes (--skeleton: the GEMVs and one-token linears skipped, {} steps): {} us/step, "
                  "{} us/layer; the layer's weight bytes take {} us at the copy rate, the 80 % target allows {} us per layer\n",
                  b.B, sk.size(), fmt_num(r.us_step_skeleton), fmt_num(r.us_layer_skeleton), fmt_num(bytes_us),
                  fmt_num(1.25 * bytes_us)));
  if (b.R.o.timeline) b.timeline(" without weight bytes");
}

// --ab: fresh sessions of both models with the same context and tokens; each pair times one step of each, the order
// alternating, so drifts of the machine (clocks, other work) fall on both sides of the difference.
void ab_pairs(Batch& b, DecodeRow& r) {
  Run& R = b.R;
  const auto& o = R.o;
  const int B = b.B, L = R.layers();
  SessionState sa = R.model->new_state(), sb = R.model_b->new_state();
  R.model->reserve(sa, b.reach), R.model_b->reserve(sb, b.reach);
  const std::mt19937 saved = R.rng;
  R.feed(*R.model, sa, o.context, nullptr, nullptr);
  R.rng = saved;  // the same context tokens for B
  R.feed(*R.model_b, sb, o.context, nullptr, nullptr);
  auto timed = [&](const Model& m, SessionState& st, const std::vector<int32_t>& toks) {
    const auto t0 = Clock::now();
    generation_step(R.gpu, m, st, toks, b.sampler);
    return secs(t0, Clock::now()) * 1e6;
  };
  for (int w = 0; w < o.warmup; ++w) {
    const auto toks = random_tokens(R.rng, B, o.dims.vocab);
    timed(*R.model, sa, toks), timed(*R.model_b, sb, toks);
  }
  std::vector<double> ua, ub;
  double spent = 0;
  const double budget = std::min(o.batch_budget_s, R.left() - 10);
  for (int i = 0; i < o.iters && (i < 3 || spent < budget * 1e6); ++i) {
    const auto toks = random_tokens(R.rng, B, o.dims.vocab);
    double ta, tb;
    if (i % 2 == 0) ta = timed(*R.model, sa, toks), tb = timed(*R.model_b, sb, toks);
    else tb = timed(*R.model_b, sb, toks), ta = timed(*R.model, sa, toks);
    ua.push_back(ta), ub.push_back(tb);
    spent += ta + tb;
  }
  r.ab = paired_stats(ua, ub);
  out(fmt::format("  A/B batch {} ({} pairs of steps, alternating order): A {} us/step, B {}; B - A {} us/step (95 % interval "
                  "{} .. {}), {} us per layer; mean B - A {} us/step, {} per layer\n",
                  B, r.ab.pairs, fmt_num(r.ab.a), fmt_num(r.ab.b), fmt_num(r.ab.diff), fmt_num(r.ab.lo), fmt_num(r.ab.hi),
                  fmt_num(r.ab.diff / L), fmt_num(r.ab.mean_diff), fmt_num(r.ab.mean_diff / L)));
  std::string ds;
  for (size_t i = 0; i < ua.size() && i < ub.size(); ++i) ds += fmt::format(" {:.0f}", ub[i] - ua[i]);
  out(fmt::format("  A/B batch {}: B - A per pair in step order (us):{}\n", B, ds));
}

// A session checkpoint where the batch's steps left the session (its window rows and pending compressor rows: what
// Session::checkpoint holds and a stopped prefill puts back): its size and the median time to take and to restore it,
// over 5 rounds; each restore puts the session back where it is, so the steps after are unchanged.
void checkpoint_cost(Batch& b, DecodeRow& r) {
  std::vector<double> mark_s, back_s;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    const StateMark m = b.R.model->mark(b.st);
    mark_s.push_back(secs(t0, Clock::now()));
    t0 = Clock::now();
    b.R.model->rollback(b.st, m);
    back_s.push_back(secs(t0, Clock::now()));
    r.checkpoint_mb = double(m.bytes) / 1e6;
  }
  r.mark_ms = median(mark_s) * 1e3, r.rollback_ms = median(back_s) * 1e3;
  out(fmt::format("  batch {}: a session checkpoint at position {} holds {:.1f} MB ({:.2f} MB per layer); taking it {:.2f} ms, "
                  "restoring it {:.2f} ms (median of 5)\n", b.B, b.st.pos, r.checkpoint_mb,
                  r.checkpoint_mb / double(b.R.o.layers), r.mark_ms, r.rollback_ms));
}

// One decode batch: B consecutive new tokens of one sequence per step, after a `context`-token prefill.
DecodeRow decode_batch(Run& R, int B) {
  DecodeRow r;
  r.batch = B;
  plan_bytes(R, r);
  if (R.left() < 15) {
    r.note = fmt::format("skipped: {:.0f} s of the {:.0f} s run budget left", std::max(0.0, R.left()), R.o.max_seconds);
    out(fmt::format("  batch {}: {}\n", B, r.note));
    return r;
  }
  try {
    Batch b(R, B);
    if (R.o.context > 0) r.context_s = R.feed(*R.model, b.st, R.o.context, nullptr, nullptr);
    r.pos_first = b.st.pos;
    time_steps(b, r);
    const std::vector<double> outside = tapped_steps(b, r);
    if (b.st.dev) r.breakdown = op_breakdown(b.st.dev->scratch.timer, [&] { b.step(nullptr, nullptr); }, fmt::format("batch {}", B));
    if (b.st.dev && R.o.timeline) r.timeline = b.timeline("");
    split_layers(R, r, outside, b.tapped);
    out(fmt::format("  batch {}: {} us/step ({} us outside the layers, {} us/layer), {} tokens/s; mean {} us/step over {} steps; "
                    "context {} s\n", B, fmt_num(r.us_step), fmt_num(r.us_non_layer), fmt_num(r.us_layer), fmt_num(r.tok_s, 2),
                    fmt_num(r.us_step_mean), r.steps, fmt_num(r.context_s, 2)));
    if (B == R.o.decode_batches.front()) checkpoint_cost(b, r);
    if (R.o.skeleton && b.st.dev) skeleton(b, r);
    if (R.model_b) {
      try {
        ab_pairs(b, r);
      } catch (const std::exception& e) {
        r.ab_error = e.what();
        R.failed = true;
        out(fmt::format("  A/B batch {}: FAILED: {}\n", B, r.ab_error));
      }
    }
  } catch (const std::exception& e) {
    r.error = e.what();
    R.failed = true;
    out(fmt::format("  batch {}: FAILED: {}\n", B, r.error));
  }
  return r;
}

// --sequences B: B sessions, each prefilled with `context` random tokens, then timed: steps of one
// Model::forward_batch of all B (one token each; every row's logits come back, as plumb::forward_batch returns
// them), and the same B sessions stepped one after another as generation steps one (forward_sample: graph replay under
// cuda.graph, the token sampled on the device). Median us of each over the rounds.
SequencesRow sequences_row(Run& R, int B) {
  SequencesRow r;
  r.sessions = B;
  const auto& o = R.o;
  if (R.left() < 15) {
    r.note = fmt::format("skipped: {:.0f} s of the {:.0f} s run budget left", std::max(0.0, R.left()), o.max_seconds);
    out(fmt::format("  {} sequences: {}\n", B, r.note));
    return r;
  }
  try {
    std::vector<SessionState> st;
    std::vector<SessionState*> ptrs;
    st.reserve(size_t(B));
    for (int b = 0; b < B; ++b) {
      const int64_t context = b % 2 && o.context_alt ? o.context_alt : o.context;  // (--context-alt: every other)
      st.push_back(R.model->new_state());
      R.model->reserve(st.back(), context + 2 * int64_t(o.warmup + kGraphWarmups + o.iters) + 2);
      if (context > 0) R.feed(*R.model, st.back(), context, nullptr, nullptr);
    }
    for (auto& s : st) ptrs.push_back(&s);
    Sampler sampler(SamplingParams{}, o.dims.vocab);
    Tensor lg;
    auto together = [&] {
      const auto toks = random_tokens(R.rng, B, o.dims.vocab);
      const auto t0 = Clock::now();
      lg = R.model->forward_batch(ptrs, toks);
      return secs(t0, Clock::now());
    };
    // Every row drawn on the device with plumb run's default sampler (its own seed per session), only the tokens back.
    std::vector<Sampler> samplers;
    for (int b = 0; b < B; ++b) {
      SamplingParams p;
      p.seed = uint64_t(b) + 1;
      samplers.emplace_back(p, o.dims.vocab);
    }
    auto together_sampled = [&] {
      const auto toks = random_tokens(R.rng, B, o.dims.vocab);
      std::vector<BatchRow> rows(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) rows[size_t(b)].token = toks[size_t(b)], rows[size_t(b)].sampler = &samplers[size_t(b)];
      const auto t0 = Clock::now();
      R.model->forward_batch_sample(ptrs, rows);
      const double s = secs(t0, Clock::now());
      for (const BatchRow& r : rows)
        if (r.error) std::rethrow_exception(r.error);
      return s;
    };
    auto alone = [&] {
      const auto toks = random_tokens(R.rng, B, o.dims.vocab);
      const auto t0 = Clock::now();
      for (int b = 0; b < B; ++b) generation_step(R.gpu, *R.model, st[size_t(b)], {toks[size_t(b)]}, sampler);
      return secs(t0, Clock::now());
    };
    together();
    R.check_logits(lg, fmt::format("{} sequences, first step", B));
    // (the sessions' own decode graphs: a first step eager, the next captures, then replays)
    for (int w = 0; w < std::max(o.warmup, 1) + 2; ++w) together(), alone();
    // Timed as a server runs them: steps together one after another, then the sessions' own steps one after another.
    // (Each session's own step keeps its compressor rows under cuda.comp_deferred; the first step together after it
    // projects them first, eagerly: untimed here, as it comes once when a batch forms.)
    together();
    std::vector<double> a, b1;
    const double budget = std::min(o.batch_budget_s, R.left() - 10) / 2;
    double spent = 0;
    DeviceSessionState* first = st[0].dev.get();  // (null on the CPU backend) its batch graphs hold the step together's
    for (int i = 0; i < o.iters && (i < 3 || spent < budget); ++i) {
      double x = 0;
      if (replayed_graph(first, [&] { x = together(); }) && first) ++r.replayed;
      a.push_back(x * 1e6), spent += x;
    }
    // (the first two allocate the sampler's buffers, which moves the model's scratch: an eager step, a capture)
    std::vector<double> sampled;
    together_sampled(), together_sampled();
    alone(), alone();  // (the sessions' own graphs re-captured after the sampler's buffers moved the model's scratch)
    for (size_t i = 0; i < a.size(); ++i) sampled.push_back(together_sampled() * 1e6);
    spent = 0;
    for (size_t i = 0; i < a.size() && (i < 3 || spent < budget); ++i) {
      const double y = alone();
      b1.push_back(y * 1e6), spent += y;
    }
    r.steps = int(a.size());
    r.us_step = median(a), r.us_alone = median(b1), r.us_sampled = median(sampled);
    r.tok_s = B / (r.us_step * 1e-6), r.tok_s_alone = B / (r.us_alone * 1e-6), r.tok_s_sampled = B / (r.us_sampled * 1e-6);
    out(fmt::format("  {} sequences: {} us per step of all together ({} tokens/s), {} us one after another ({} tokens/s): {}x; "
                    "{} rounds\n", B, fmt_num(r.us_step), fmt_num(r.tok_s, 2), fmt_num(r.us_alone), fmt_num(r.tok_s_alone, 2),
                    fmt_num(r.us_alone / r.us_step, 2), r.steps));
    out(fmt::format("  {} sequences: {} us per step together with every row sampled where its logits are ({} tokens/s): {}x over one after "
                    "another\n", B, fmt_num(r.us_sampled), fmt_num(r.tok_s_sampled, 2), fmt_num(r.us_alone / r.us_sampled, 2)));
    if (R.patches.options.cuda_graph) out(fmt::format("  {} sequences: {} of the {} timed steps together replayed their graph\n", B, r.replayed, r.steps));
    if (first) {
      r.scratch_mb = double(first->scratch.bytes()) / 1e6, r.cache_mb = double(first->cache_bytes()) / 1e6;
      out(fmt::format("  {} sequences: device memory: the model's scratch {} MB (shared by its sessions), caches {} MB per session\n", B,
                      fmt_num(r.scratch_mb, 1), fmt_num(r.cache_mb, 2)));
    }
    if (first) r.breakdown = op_breakdown(first->scratch.timer, [&] { together(); }, fmt::format("{} sequences together", B));
  } catch (const std::exception& e) {
    r.error = e.what();
    R.failed = true;
    out(fmt::format("  {} sequences: FAILED: {}\n", B, r.error));
  }
  return r;
}

// Prefill of each size on a fresh session, smallest first; a size is skipped once one took longer than
// prefill_skip_after_s, or when its predicted time (from the largest so far, or the decode context) does not fit.
std::vector<PrefillRow> prefills(Run& R) {
  const auto& o = R.o;
  std::vector<PrefillRow> pre;
  out(fmt::format("prefill: N random tokens on a fresh session, fed in forward calls of at most {} tokens, one run without "
                  "warm-up (as a Session prefills for generation: the LM head runs on the last token of the last call only)\n",
                  o.prefill_chunk));
  double est_per_tok = NAN;  // seconds per token of the largest prefill so far (or of the decode context)
  int est_n = 0;
  double last_s = 0;
  int last_n = 0;
  for (const auto& r : R.res.decode)
    if (std::isfinite(r.context_s) && o.context > 0) est_per_tok = r.context_s / o.context, est_n = o.context;
  std::vector<int> sizes = o.prefill;
  std::sort(sizes.begin(), sizes.end());
  for (int N : sizes) {
    PrefillRow p;
    p.tokens = N;
    p.chunks = (N + o.prefill_chunk - 1) / o.prefill_chunk;
    // Attention and the indexer grow faster than linearly with the context: scale the estimate by 1.5.
    const double predicted = std::isfinite(est_per_tok) ? est_per_tok * N * (N > est_n ? 1.5 : 1.0) : 0;
    if (last_s > o.prefill_skip_after_s)
      p.skipped = fmt::format("the {}-token prefill took {:.1f} s (> {:.0f} s)", last_n, last_s, o.prefill_skip_after_s);
    else if (predicted > R.left() - 5)
      p.skipped = fmt::format("predicted {:.0f} s, {:.0f} s of the run budget left", predicted, std::max(0.0, R.left()));
    if (!p.skipped.empty()) {
      out(fmt::format("  {} tokens: skipped ({})\n", N, p.skipped));
      pre.push_back(p);
      continue;
    }
    try {
      SessionState st = R.model->new_state();
      Tensor lg;
      p.seconds = R.feed(*R.model, st, N, &p.chunk_s, &lg);
      p.tok_s = N / p.seconds;
      last_s = p.seconds, last_n = N;
      est_per_tok = p.seconds / N, est_n = N;
      out(fmt::format("  {} tokens: {:.2f} s, {:.0f} tokens/s ({} call{})\n", N, p.seconds, p.tok_s, p.chunks, p.chunks == 1 ? "" : "s"));
      R.check_logits(lg, fmt::format("prefill {}, last chunk", N));
    } catch (const std::exception& e) {
      p.error = e.what();
      R.failed = true;
      out(fmt::format("  {} tokens: FAILED: {}\n", N, p.error));
    }
    pre.push_back(p);
  }
  return pre;
}

int run(const LayerBenchOptions& o) {
  Run R(o);
  auto& res = R.res;
  for (auto t : R.types) res.type_names.push_back(attn_type_name(t));
  res.device = R.dev.name;
  R.patches = parse_patches(o.patches);
  if (o.ab) R.patches_b = parse_patches(o.ab_patches);  // before the checkpoint is written: a typo costs no minutes
  print_header(R);

  // ---- checkpoint ----
  const int models = o.ab ? 2 : 1;  // --ab: model B holds its own copy
  const double bytes = double(checkpoint_size(o).first), need_dev = bytes * 1.05 * models + 4e9 * models;
  PLUMB_CHECK(!R.gpu || need_dev < double(R.dev.mem_bytes), "{} layers need about {:.1f} GB of device memory ({} x weights {:.1f} GB + "
              "scratch); this GPU has {:.1f} GB: use fewer layers{}", o.layers, need_dev / 1e9, models, bytes / 1e9,
              double(R.dev.mem_bytes) / 1e9, o.ab ? " or drop --ab" : "");
  WorkDir wd;
  res.checkpoint = prepare_checkpoint(o, wd);
  res.checkpoint_dir = wd.path.string();
  res.checkpoint_removed = wd.remove;

  // ---- copy bandwidth, load ----
  res.copy_gbps = R.gpu ? measure_copy_gbps() : NAN;
  if (R.gpu) out(fmt::format("measured bandwidth: D2D copy {:.0f} GB/s (read + write, 1 GiB, median of 15)\n", res.copy_gbps));
  if (!load_models(R, wd.path.string())) return 2;
  res.patches = R.patches.names();
  if (R.model_b) res.ab = true, res.ab_patches = R.patches_b.names();

  // ---- decode ----
  out(fmt::format("decode: \"batch B\" = B consecutive new tokens of one sequence per forward step (after a {}-token prefill), "
                  "which reads the weights once per step as B-sequence decode would; {}; median (and mean) of up to {} steps after {} "
                  "warm-up steps{}\n",
                  o.context,
                  R.gpu ? "each step as generation runs it: the last row sampled on the device (plumb run's default sampling), "
                          "only the token coming back (a server samples its B rows there too)"
                        : "the last row's logits come back",
                  o.iters, o.warmup,
                  o.cold_l2 && R.gpu ? fmt::format("; --cold-l2: {} MB overwritten before each timed step", (2 * R.dev.l2_bytes) >> 20)
                                     : ""));
  for (int B : o.decode_batches) res.decode.push_back(decode_batch(R, B));
  if (!o.sequences.empty())
    out(fmt::format("sequences: B sessions, each after a {}-token prefill{}, one token each per step: all B in one forward "
                    "(plumb::forward_batch: eager, or its graph under cuda.graph; every row's logits downloaded) against the B stepped one after another "
                    "(each as generation steps one), each timed in a run of its own (the first step together after the sessions' own steps untimed); "
                    "median of up to {} steps of each\n", o.context,
                    o.context_alt ? fmt::format(" (every other one {} tokens: --context-alt)", o.context_alt) : std::string(), o.iters));
  for (int B : o.sequences) res.sequences.push_back(sequences_row(R, B));

  // ---- prefill, report ----
  res.prefill = prefills(R);
  print_tables(o, res);
  res.total_s = secs(R.start, Clock::now());
  if (!write_json(o, res) || !write_csv(o, res)) return 2;
  if (!wd.remove && o.dir.empty()) out(fmt::format("checkpoint kept in {}\n", wd.path.string()));
  out(fmt::format("total {:.1f} s\n", secs(R.start, Clock::now())));
  return R.failed ? 1 : 0;
}

}  // namespace

}  // namespace bench_layers

int run_layer_bench(const LayerBenchOptions& o) {
  std::string why;
  if (o.backend == "cuda" && !available(&why)) {
    std::fprintf(stderr, "error: plumb bench --layers: no usable GPU: %s\n", why.c_str());
    return 3;
  }
  try {
    PLUMB_CHECK(o.backend == "cuda" || o.backend == "cpu", "unknown backend '{}' (cuda, cpu)", o.backend);
    PLUMB_CHECK(o.layers >= 1, "--layers must be at least 1, got {}", o.layers);
    PLUMB_CHECK(o.iters >= 1 && o.warmup >= 0 && o.context >= 0 && o.prefill_chunk >= 1, "bad iteration/context/chunk options");
    for (int b : o.decode_batches) PLUMB_CHECK(b >= 1, "decode batch sizes must be positive, got {}", b);
    for (int b : o.sequences) PLUMB_CHECK(b >= 1, "--sequences: a step has at least one sequence, got {}", b);
    for (int n : o.prefill) PLUMB_CHECK(n >= 1, "prefill sizes must be positive, got {}", n);
    return bench_layers::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: plumb bench --layers: %s\n", e.what());
    return 2;
  }
}

}  // namespace plumb::cuda
#endif  // PLUMB_WITH_CUDA
