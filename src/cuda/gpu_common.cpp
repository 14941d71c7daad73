// Host helpers of the CUDA forward pass: weight upload (as stored), scratch, taps across the device boundary.
#ifdef PLUMB_WITH_CUDA
#include "cuda/gpu_common.h"

#include <algorithm>
#include <atomic>

#include <fmt/format.h>

#include "cuda/blas.h"
#include "cuda/kernels.h"

namespace plumb::cuda {

namespace {
DeviceBuffer upload_bytes(const void* p, size_t n) {
  DeviceBuffer b(n ? n : 4);
  if (n) b.upload(p, n);
  return b;
}
}  // namespace

std::string weights_fit_problem(uint64_t weight_bytes, size_t free_bytes, size_t total_bytes, const std::string& gpu,
                                bool suggest_host_experts) {
  if (weight_bytes <= free_bytes) return {};
  return fmt::format("the model's weights take {:.2f} GB in their checkpoint formats, more than the {:.2f} GB free of the "
                     "{:.2f} GB of this GPU ({}): the model does not fit one GPU ({}--backend cpu runs it from the mapped "
                     "files)", double(weight_bytes) / 1e9, double(free_bytes) / 1e9, double(total_bytes) / 1e9, gpu,
                     suggest_host_experts ? "the patch cuda.host_experts, with cuda.moe_mxfp4, keeps the last layers' "
                                            "routed-expert weights in host memory; "
                                          : "");
}

uint64_t host_experts_reserve(size_t total_bytes) { return uint64_t(4'000'000'000ull) + uint64_t(total_bytes / 50); }

HostExpertPlan plan_host_experts(uint64_t weight_bytes, const std::vector<uint64_t>& expert_bytes, size_t free_bytes,
                                 size_t total_bytes, int requested, const std::string& gpu) {
  HostExpertPlan p;
  p.host.assign(expert_bytes.size(), 0);
  const uint64_t reserve = host_experts_reserve(total_bytes);
  const uint64_t need = weight_bytes + reserve > free_bytes ? weight_bytes + reserve - free_bytes : 0;
  // From the last layer back: which layers go is a choice without effect on the results; the last ones keep the
  // first layers' steps (a prefill's progress) as fast as without the patch.
  for (size_t i = expert_bytes.size(); i-- > 0;) {
    const bool more = requested > 0 ? p.layers < requested : (p.layers == 0 || p.host_bytes < need);
    if (!more) break;
    if (!expert_bytes[i]) continue;
    p.host[i] = 1, ++p.layers, p.host_bytes += expert_bytes[i];
  }
  if (!p.layers) {  // nothing to place (the patch does not apply): the plain check
    p.problem = weights_fit_problem(weight_bytes, free_bytes, total_bytes, gpu, false);
    return p;
  }
  const uint64_t rest = weight_bytes > p.host_bytes ? weight_bytes - p.host_bytes : 0;
  if (rest > free_bytes)
    p.problem = fmt::format("with the routed experts of {} layers in host memory ({:.2f} GB{}), the rest of the weights take "
                            "{:.2f} GB, more than the {:.2f} GB free of the {:.2f} GB of this GPU ({})", p.layers,
                            double(p.host_bytes) / 1e9, requested > 0 ? "" : ", every layer that can", double(rest) / 1e9,
                            double(free_bytes) / 1e9, double(total_bytes) / 1e9, gpu);
  return p;
}

void rethrow_for(const std::string& what) {
  try {
    throw;
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  } catch (const std::exception& e) {
    throw std::runtime_error(what + ": " + e.what());
  }
}

bool fp8_fast_fits(const Matrix& m) {
  return m.layout() == Matrix::Layout::FP8Block && m.rows() % 16 == 0 && m.cols() % 128 == 0;
}

DeviceBuffer bf16_copy_if_exact(const Matrix& m) {
  if (!fp8_fast_fits(m)) return {};
  const Fp8Matrix f = upload_fp8(m);
  if (!fp8_gemm_exact(f)) return {};
  DeviceBuffer out(size_t(f.rows * f.cols) * 2);
  fp8_dequant_bf16(f, out.as<uint16_t>());
  synchronize();  // (f's buffers go when this returns)
  return out;
}

GMat upload_matrix(const Matrix& m, bool fp8_fast) {
  GMat g;
  const TensorView& v = m.values();
  if (fp8_fast && fp8_fast_fits(m)) {
    g.fp8 = std::make_shared<Fp8Matrix>(upload_fp8(m));
    g.d.w = g.fp8->codes.get();
    g.d.s = g.fp8->scales.get();
    g.d.rows = m.rows(), g.d.cols = m.cols(), g.d.s_cols = g.fp8->scale_cols();
    g.d.layout = 1, g.d.s_f32 = g.fp8->scale_f32;
    return g;
  }
  g.w = upload_bytes(v.data, v.nbytes);
  g.d.w = g.w.get();
  g.d.rows = m.rows();
  g.d.cols = m.cols();
  switch (m.layout()) {
    case Matrix::Layout::Plain:
      g.d.layout = 0;
      g.d.dtype = v.dtype == DType::F32 ? 0 : v.dtype == DType::BF16 ? 1 : 2;
      break;
    case Matrix::Layout::FP8Block:
    case Matrix::Layout::FP4Group: {
      const TensorView* s = m.scales();
      g.s = upload_bytes(s->data, s->nbytes);
      g.d.s = g.s.get();
      g.d.s_cols = m.scale_cols();
      g.d.s_f32 = s->dtype == DType::F32;
      g.d.layout = m.layout() == Matrix::Layout::FP8Block ? 1 : 2;
      break;
    }
  }
  return g;
}

DeviceBuffer upload_tensor(const Tensor& t) { return upload_bytes(t.ptr(), size_t(t.numel()) * 4); }

GpuRope upload_rope(const ops::Rope& r) {
  GpuRope g;
  g.dim = r.dim();
  g.attention_factor = r.attention_factor();
  g.inv_freq = upload_bytes(r.inv_freq().data(), r.inv_freq().size() * 4);
  return g;
}

void GpuRope::apply(float* x, int64_t rows, int64_t ld, int64_t off, const int64_t* dpos, int64_t per_pos, bool inverse,
                    bool round_bf16) const {
  detail::fwd_rope(x, rows, ld, off, dim / 2, f32(inv_freq), attention_factor, dpos, 0, per_pos, 1, inverse ? 1 : 0, nullptr,
                   round_bf16 ? 1 : 0);
}

Fp8GemmBuffers gemm_buffers(Scratch& sc, size_t x_elems, size_t w_elems, size_t gu_elems, size_t h_elems, bool cublas) {
  Fp8GemmBuffers b;
  b.w_elems = std::max(w_elems, sc.gemm_w_elems), b.x_elems = x_elems, b.gu_elems = gu_elems, b.h_elems = h_elems;
  ++sc.gemm_calls;
  b.w = static_cast<uint16_t*>(sc.get("fp8gemm.w", b.w_elems * 2));
  b.x = static_cast<uint16_t*>(sc.get("fp8gemm.x", x_elems * 2));
  if (gu_elems) b.gu = sc.f("fp8gemm.gu", int64_t(gu_elems));
  if (h_elems) b.h = static_cast<uint16_t*>(sc.get("fp8gemm.h", h_elems * 2));
  if (cublas) b.lt = gemm_workspace(sc);
  return b;
}

bool bf16_gemm_applies(const GMat& w, int n) {
  return plain_bf16(w) && w.gemm_min && n >= w.gemm_min;
}

bool bf16_gemv_applies(const GMat& w, int n) { return !w.fp8 && n >= 2 && n <= w.gemv16_max; }

void* gemm_workspace(Scratch& sc) { return sc.get("cublaslt", kGemmWorkspaceBytes); }

Fp8GemmBuffers gemv16_buffers(Scratch& sc, size_t x_elems) {
  ++sc.gemv16_calls;
  Fp8GemmBuffers b;
  b.x = static_cast<uint16_t*>(sc.get("fp8gemm.x", x_elems * 2)), b.x_elems = x_elems;  // (the GEMMs' bf16 x scratch)
  return b;
}

void linear(const GMat& w, const float* x, int n, int64_t ldx, float* y, int64_t ldy, Scratch& sc, const uint16_t* x16) {
  // cuda.prefill_gemm: from the fp32 x (one bf16 rounding, not f16 then bf16).
  if (w.fp8 && w.gemm_min && n >= w.gemm_min)
    return fp8_linear_gemm(*w.fp8, x, Act::F32, ldx, n, y, ldy,
                           gemm_buffers(sc, size_t(n) * size_t(w.fp8->cols), size_t(w.fp8->rows * w.fp8->cols)));
  // cuda.bf16_gemv, then cuda.prefill_gemm on a plain bf16 matrix (the compressors' projections): the weight as stored.
  if (bf16_gemv_applies(w, n)) {
    const Bf16Proj p{static_cast<const uint16_t*>(w.d.w), w.d.rows, y, ldy};
    return bf16_linear_gemv_multi(&p, 1, w.d.cols, x, Act::F32, ldx, n, gemv16_buffers(sc, size_t(n) * size_t(w.d.cols)));
  }
  if (bf16_gemm_applies(w, n))
    return bf16_linear_gemm(static_cast<const uint16_t*>(w.d.w), w.d.rows, w.d.cols, x, Act::F32, ldx, n, y, ldy,
                            gemm_buffers(sc, size_t(n) * size_t(w.d.cols), 0));
  if (w.fp8) return x16 ? fp8_linear(*w.fp8, x16, Act::F16, ldx, n, y, ldy, sc.work())
                 : fp8_linear(*w.fp8, x, Act::F32, ldx, n, y, ldy, sc.work());
  detail::fwd_linear(w.d, x, n, ldx, 0, w.d.rows, y, ldy, nullptr);
}

OpTimer::~OpTimer() {
  for (void* e : pool_) detail::event_destroy(e);
}

void* OpTimer::event() {
  if (used_ == pool_.size()) pool_.push_back(detail::event_create());
  return pool_[used_++];
}

size_t OpTimer::begin(const char* name) {
  void* e = event();
  Mark m{name, e, nullptr, nullptr};
  if (timeline) m.stream = detail::stream_of(nullptr), detail::event_record_node(e, m.stream);
  else detail::event_record(e, nullptr);
  marks_.push_back(std::move(m));
  return marks_.size() - 1;
}

void OpTimer::end(size_t i) {
  if (i >= marks_.size() || marks_[i].end) return;
  void* e = event();
  if (timeline) detail::event_record_node(e, marks_[i].stream);
  else detail::event_record(e, nullptr);
  marks_[i].end = e;
}

void OpTimer::clear() {
  detail::dsync();
  marks_.clear();
  used_ = 0;
}

std::vector<std::pair<std::string, double>> OpTimer::collect() {
  std::vector<std::pair<std::string, double>> out;
  for (const Mark& m : marks_) {
    if (!m.end) continue;
    const double ms = detail::event_elapsed_ms(m.begin, m.end);
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == m.name; });
    if (it == out.end()) out.push_back({m.name, ms});
    else it->second += ms;
  }
  marks_.clear();
  used_ = 0;
  return out;
}

std::vector<OpTimer::Span> OpTimer::collect_timeline(size_t from) {
  std::vector<Span> out;
  detail::dsync();
  for (size_t i = from; i < marks_.size(); ++i) {
    const Mark& m = marks_[i];
    if (!m.end) continue;
    out.push_back({m.name, 1e3 * detail::event_elapsed_ms(marks_[from].begin, m.begin),
                   1e3 * detail::event_elapsed_ms(marks_[from].begin, m.end)});
  }
  marks_.clear();
  used_ = 0;
  return out;
}

Scratch::~Scratch() {
  detail::event_destroy(ev_fork);
  detail::event_destroy(ev_join);
  detail::event_destroy(ev_entries);
  detail::event_destroy(ev_gates_fork);
  detail::event_destroy(ev_gates_join);
  detail::event_destroy(ev_pf_fork);
  detail::event_destroy(ev_pf_join);
  detail::stream_destroy(side);
  detail::stream_destroy(side2);
  detail::stream_destroy(side3);
  detail::stream_destroy(pf);
}

void Scratch::enable_side() {
  if (side) return;
  side = detail::stream_create();
  side2 = detail::stream_create();
  side3 = detail::stream_create();
  ev_gates_fork = detail::event_create_sync();
  ev_gates_join = detail::event_create_sync();
  ev_fork = detail::event_create_sync();
  ev_join = detail::event_create_sync();
  ev_entries = detail::event_create_sync();
  sync_words = DeviceBuffer(size_t(kSyncSlots) * sizeof(unsigned));
  sync_words.fill_byte(0);
}

namespace {
// s's entry in a list of streams, else the first free one (null: the list is full).
Stream* stream_entry(Stream (&list)[4], Stream s) {
  Stream* entry = nullptr;
  for (Stream& x : list) {
    if (x == s) return &x;
    if (!x && !entry) entry = &x;
  }
  return entry;
}
}  // namespace

void Scratch::wait_or_join(detail::BranchWait& w, bool in_kernel, Stream side, void* ev) {
  if (!side) return;
  Stream* entry = stream_entry(signalled_, side);
  if (flags && in_kernel && entry && sync_used + 1 < kSyncSlots) {
    const int slot = sync_used + 1;
    if (w.add(sync(), slot)) {
      *entry = side, sync_used = slot;
      detail::branch_signal(side, sync(), slot);
      ++branch_signals;
      return;
    }
  }
  detail::branch_join(side, ev);
}

void Scratch::join_later(Stream side, void* ev) {
  if (!side) return;
  Stream* entry = flags || early_joins ? stream_entry(signalled_, side) : nullptr;
  if (entry) *entry = side;
  else detail::branch_join(side, ev);
}

void Scratch::join_deferred_gates() {
  if (gates_to_join) detail::branch_join(gates_to_join, ev_gates_join), gates_to_join = nullptr;
}

void Scratch::start_signals(bool on) {
  flags = on && sync_words.get();
  sync_used = 0;
  for (Stream& x : signalled_) x = nullptr;
}

void Scratch::join_signalled() {
  for (Stream& x : signalled_)
    if (x) detail::branch_join(x, ev_join), x = nullptr;
}

void Scratch::enable_prefetch() {
  if (pf) return;
  pf = detail::stream_create();
  ev_pf_fork = detail::event_create_sync();
  ev_pf_join = detail::event_create_sync();
}

void Scratch::prefetch_l2(std::initializer_list<ByteRange> ranges) {
  if (!prefetch) return;
  detail::PrefetchRanges r;
  for (const ByteRange& b : ranges) r.add(b.p, b.bytes, kPrefetchBudget);
  if (r.count == 0) return;
  detail::branch_fork(prefetch, ev_pf_fork);
  pf_forked = true;
  detail::fwd_prefetch_l2(r, prefetch);
}

void* Scratch::get(const std::string& name, size_t bytes) {
  // Inside a side-stream scope (cuda.streams) each name is its own buffer: the two streams' temporaries never alias.
  // (Results that cross between them are passed as pointers, looked up once.)
  const int lane = detail::stream_lane();
  auto& b = bufs_[lane == 2 ? name + "@side2" : lane == 1 ? name + "@side" : name];
  if (b.bytes() < bytes || !b.get()) {
    ++generation;        // (first: a graph must not replay with the old buffer even if the new one fails)
    b = DeviceBuffer();  // (the old buffer goes first: the new one may need its memory)
    try {
      b = DeviceBuffer(std::max<size_t>(bytes, 4));
    } catch (...) {
      rethrow_for(fmt::format("the forward's scratch buffer '{}' ({} bytes)", name, bytes));
    }
  }
  return b.get();
}

size_t Scratch::bytes() const {
  size_t sum = 0;
  for (const auto& [name, b] : bufs_) sum += b.bytes();
  return sum;
}

DeviceBuffer zeroed(size_t bytes) {
  DeviceBuffer b(bytes);
  b.fill_byte(0);
  return b;
}

bool grow_keep(DeviceBuffer& b, size_t bytes, size_t keep) {
  if (b.get() && b.bytes() >= bytes) return false;
  // Zeros first: the caches' rows past those written are read and not used (the indexer stages every row below
  // the capacity), and they are copied on the next growth; zeros keep them defined (compute-sanitizer's initcheck).
  DeviceBuffer nb = zeroed(std::max<size_t>({bytes, 2 * b.bytes(), 256}));
  if (keep) detail::copy_d2d(nb.get(), b.get(), keep);
  b = std::move(nb);
  return true;
}

Tensor download(const float* d, const Shape& shape) {
  Tensor t(shape);
  if (t.numel()) detail::d2h(t.ptr(), d, size_t(t.numel()) * 4);
  return t;
}

void tap_put(const Tap& tap, const char* name, const float* d, const Shape& shape) {
  if (tap.on(name)) tap(name, download(d, shape));
}

void tap_io(const Tap& tap, const char* name, float* d, const Shape& shape) {
  if (!tap.on(name)) return;
  Tensor t = download(d, shape);
  tap.io(name, t);  // the sink may replace t (same shape)
  if (t.numel()) detail::h2d(d, t.ptr(), size_t(t.numel()) * 4);
}

}  // namespace plumb::cuda

plumb::GpuGraph::~GpuGraph() { plumb::cuda::detail::graph_destroy(exec); }

int64_t plumb::DeviceSessionState::cache_bytes() const {
  size_t sum = 0;
  auto comp = [&](const GpuCompState& c) { sum += c.pend_kv.bytes() + c.pend_gate.bytes() + c.prev_kv.bytes() + c.prev_gate.bytes() + c.entries.bytes(); };
  for (const GpuLayerState& l : layers) {
    sum += l.ring.bytes() + l.xring.bytes() + l.xpos.bytes();
    comp(l.comp), comp(l.icomp);
  }
  return int64_t(sum);
}

uint64_t plumb::DeviceSessionState::next_id() {
  static std::atomic<uint64_t> ids{0};
  return ++ids;
}

#endif  // PLUMB_WITH_CUDA
