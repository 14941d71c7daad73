// The CUDA backend's host side (cuda/api.h): buffers, weight upload into the device layouts, launch parameters.
// Compiled into plumb_core only when the build has CUDA (PLUMB_WITH_CUDA, set by cmake/PlumbCuda.cmake).
#ifdef PLUMB_WITH_CUDA
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "cuda/api.h"
#include "cuda/fp4_layout.h"
#include "cuda/fwd_kernels.h"
#include "cuda/kernels.h"
#include "formats/numeric.h"

namespace plumb::cuda {

namespace d = detail;

bool available(std::string* why) { return d::probe(why); }

DeviceInfo device_info() {
  const d::Info i = d::info();
  DeviceInfo r;
  r.name = i.name;
  r.cc_major = i.cc_major, r.cc_minor = i.cc_minor, r.sm_count = i.sm_count;
  r.l2_bytes = i.l2_bytes, r.mem_bytes = i.mem_bytes, r.driver = i.driver, r.runtime = i.runtime;
  r.check_only = i.check_only;
  return r;
}

void memory_info(size_t& free_bytes, size_t& total_bytes) { d::mem_info(&free_bytes, &total_bytes); }

void synchronize() { d::dsync(); }

DeviceBuffer::DeviceBuffer(size_t bytes, Place place)
    : p_(place == Place::HostMapped ? d::hmalloc_mapped(bytes) : d::dmalloc(bytes)), n_(bytes), host_(place == Place::HostMapped) {}
DeviceBuffer::~DeviceBuffer() { release(); }
void DeviceBuffer::release() noexcept {
  if (host_) d::hfree_pinned(p_);
  else d::dfree(p_);
}

HostStage::~HostStage() {
  for (Slot& sl : slots_) {
    if (sl.done) {
      try {
        d::event_sync(sl.done);  // (its copy reads the pinned bytes freed below)
      } catch (...) {
      }
      d::event_destroy(sl.done);
    }
    d::hfree_pinned(sl.host);
  }
}
void HostStage::upload(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  Slot& sl = slots_[next_];
  next_ ^= 1;
  if (sl.done) d::event_sync(sl.done);  // the slot's last copy has run: its bytes may be overwritten
  else sl.done = d::event_create_sync();
  if (sl.cap < bytes) {
    d::hfree_pinned(sl.host);
    sl.host = nullptr, sl.cap = 0;  // (empty until the allocation succeeds: a throw leaves no slot claiming bytes)
    const size_t cap = std::max<size_t>(bytes, 4096);
    sl.host = d::hmalloc_pinned(cap);
    sl.cap = cap;
  }
  std::memcpy(sl.host, src, bytes);
  d::h2d_async(dst, sl.host, bytes, nullptr);
  d::event_record(sl.done, d::stream_of(nullptr));
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    p_ = o.p_, n_ = o.n_, host_ = o.host_;
    o.p_ = nullptr, o.n_ = 0, o.host_ = false;
  }
  return *this;
}
void DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  PLUMB_CHECK(offset + bytes <= n_, "device upload of {} bytes at {} overflows a buffer of {}", bytes, offset, n_);
  if (host_) d::dsync(), std::memcpy(static_cast<char*>(p_) + offset, src, bytes);  // (after the kernels queued before it, as cudaMemcpy)
  else d::h2d(static_cast<char*>(p_) + offset, src, bytes);
}
void DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  PLUMB_CHECK(offset + bytes <= n_, "device download of {} bytes at {} overflows a buffer of {}", bytes, offset, n_);
  if (host_) d::dsync(), std::memcpy(dst, static_cast<const char*>(p_) + offset, bytes);  // (after the kernels that write it)
  else d::d2h(dst, static_cast<const char*>(p_) + offset, bytes);
}
void DeviceBuffer::fill_byte(int value) {
  if (host_) d::dsync(), std::memset(p_, value, n_);
  else d::dmemset(p_, value, n_);
}

size_t act_size(Act a) { return a == Act::F32 ? 4 : 2; }

float* Workspace::partial(size_t floats) {
  if (partial_.bytes() < floats * sizeof(float)) {
    d::dsync();
    partial_ = DeviceBuffer(std::max<size_t>(floats, 1 << 16) * sizeof(float));
  }
  return partial_.as<float>();
}

uint16_t* Workspace::half(size_t count) {
  if (half_.bytes() < count * 2) {
    d::dsync();
    half_ = DeviceBuffer(std::max<size_t>(count, 1 << 16) * 2);
  }
  return half_.as<uint16_t>();
}

unsigned* Workspace::counters(size_t count) {
  if (counters_.bytes() < count * sizeof(unsigned)) {
    d::dsync();
    counters_ = DeviceBuffer(std::max<size_t>(count, 4096) * sizeof(unsigned));
    counters_.fill_byte(0);
  }
  return counters_.as<unsigned>();
}

// ---- FP4 decode layout ----
// Tile-major: the 16 rows of a tile are contiguous (rows * cols / 2 bytes in all, a permutation of the checkpoint's
// bytes), [tile = r / 16][chunk c = 128 columns][row half h = (r % 16) / 8][lane 4g + t, g = r % 8][16 bytes], so
// that a warp's fragments of one chunk and row half are 512 contiguous bytes and a tile streams as one run.
// The 16 bytes of (row, chunk c, lane t) are the lane's tensor-core fragment: word j of them holds the 8 elements
// e0..e7 = [32(4c+j) + 8t, +8) of scale group 4c+j. Byte b of the word holds L = (e0, e1, e4, e5)[b] and
// H = (e2, e3, e6, e7)[b], each a 4-bit E2M1 code s.m2.m1.m0, at
//   bit 7 = s(L), bits 3..1 = m2 m1 m0 of L, bit 0 = s(H), bits 4, 5, 6 = m2, m1, m0 of H (mirrored),
// so that the kernel gets the bytes s.000.m2.m1.m0.0 (the high byte of an f16 that is the code's value times
// 2^-14) of the L codes with one AND and of the H codes with a bit reversal of the word and one AND, then places
// byte pairs with one permute per f16x2 (fp4_layout.h, which defines these bytes). Every code keeps its 4 bits: the
// layout is a permutation.
// The A8 layout (Fp4Layout::A8, the official numerics' FP8 tensor-core kernels) has the same fragments and words;
// byte b of a word holds L = e_b at bit 7 (s) and bits 4..2 (e1.e0.m) and H = e_{4+b} at bit 5 (s), bit 6 (e1),
// bit 1 (e0) and bit 0 (m), so that L is an E4M3 byte (value * 2^-6) after one AND and H after two shifts, an AND
// and an OR (common.cuh, fp4x8_to_e4m3x4), and the bytes come in element order.

namespace {
using fp4::pack_lh, fp4::unpack_l, fp4::unpack_h;  // the F16 layout's bytes (fp4_layout.h)
inline uint8_t pack_lh_a8(uint8_t L, uint8_t H) {
  return uint8_t(((L & 8) << 4) | ((L & 7) << 2) | ((H & 8) << 2) | ((H & 4) << 4) | (H & 3));
}
inline uint8_t unpack_l_a8(uint8_t b) { return uint8_t(((b >> 7) << 3) | ((b >> 2) & 7)); }
inline uint8_t unpack_h_a8(uint8_t b) { return uint8_t((((b >> 5) & 1) << 3) | (((b >> 6) & 1) << 2) | (b & 3)); }
// The elements (of a word's 8) that byte b holds as L and as H, per layout.
constexpr int kL[2][4] = {{0, 1, 4, 5}, {0, 1, 2, 3}}, kH[2][4] = {{2, 3, 6, 7}, {4, 5, 6, 7}};
// Byte offset of the 16-byte fragment (row r, chunk c, lane part t) in the decode layout.
inline int64_t frag_offset(int64_t r, int64_t c, int t, int64_t cols) {
  return (r / 16) * 8 * cols + c * 1024 + ((r % 16) / 8) * 512 + (4 * (r % 8) + t) * 16;
}
// Two bytes of a layout word from the two checkpoint bytes x, y that hold their codes: the low nibbles make the
// first byte (L from x, H from y), the high nibbles the second. With the word's source bytes s0..s3 (its 8 elements,
// two per byte, low nibble first), F16 pairs (s0, s1) -> bytes 0, 1 (L = e0, e1; H = e2, e3) and (s2, s3) -> 2, 3;
// A8 pairs (s0, s2) -> bytes 0, 1 (L = e0, e1; H = e4, e5) and (s1, s3) -> 2, 3. A lookup per byte pair instead of
// eight nibble extractions: loading V4-Flash repacks ~130 GB of expert codes (43 layers x 256 experts x 3 x 4 MB).
struct Fp4PairTables {
  uint16_t t[2][65536];  // [layout: 0 F16, 1 A8][x | y << 8]
  Fp4PairTables() {
    for (int v = 0; v < 65536; ++v) {
      const uint8_t x = uint8_t(v), y = uint8_t(v >> 8);
      t[0][v] = uint16_t(pack_lh(x & 15, y & 15) | (pack_lh(x >> 4, y >> 4) << 8));
      t[1][v] = uint16_t(pack_lh_a8(x & 15, y & 15) | (pack_lh_a8(x >> 4, y >> 4) << 8));
    }
  }
};
const Fp4PairTables& fp4_pair_tables() {
  static const Fp4PairTables tables;
  return tables;
}

// Rows [r0, r1) of repack_fp4_decode into `out` (the whole matrix's rows * cols / 2 bytes): each row's fragments are
// its own bytes of the layout.
void repack_fp4_rows(const uint8_t* packed, int64_t r0, int64_t r1, int64_t cols, Fp4Layout layout, uint8_t* out) {
  static_assert(std::endian::native == std::endian::little, "the layout's words are assembled little-endian");
  const bool a8 = layout == Fp4Layout::A8;
  const uint16_t* T = fp4_pair_tables().t[a8];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = packed + r * cols / 2;
    for (int64_t c = 0; c < cols / 128; ++c)
      for (int t = 0; t < 4; ++t) {
        uint8_t* frag = out + frag_offset(r, c, t, cols);
        for (int j = 0; j < 4; ++j) {
          const uint8_t* s = src + ((4 * c + j) * 32 + 8 * t) / 2;  // the word's 8 elements, 4 bytes
          const uint32_t lo = a8 ? T[s[0] | (s[2] << 8)] : T[s[0] | (s[1] << 8)];
          const uint32_t hi = a8 ? T[s[1] | (s[3] << 8)] : T[s[2] | (s[3] << 8)];
          const uint32_t w = lo | (hi << 16);
          std::memcpy(frag + 4 * j, &w, 4);
        }
      }
  }
}
void check_fp4_shape(int64_t rows, int64_t cols) {
  PLUMB_CHECK(cols % 128 == 0 && rows % 16 == 0,
              "FP4 decode layout: rows ({}) must be a multiple of 16 and columns ({}) of 128", rows, cols);
}
}  // namespace

std::vector<uint8_t> repack_fp4_decode(const uint8_t* packed, int64_t rows, int64_t cols, Fp4Layout layout) {
  check_fp4_shape(rows, cols);
  std::vector<uint8_t> out(size_t(rows * cols / 2));
  // The pool takes ranges of rows (disjoint outputs: the same bytes for any thread count).
  parallel_for(rows, double(rows) * double(cols), [&](int64_t a, int64_t b) { repack_fp4_rows(packed, a, b, cols, layout, out.data()); });
  return out;
}

std::vector<uint8_t> unpack_fp4_decode(const uint8_t* repacked, int64_t rows, int64_t cols, Fp4Layout layout) {
  check_fp4_shape(rows, cols);
  const bool a8 = layout == Fp4Layout::A8;
  std::vector<uint8_t> out(size_t(rows * cols / 2), 0);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = out.data() + r * cols / 2;
    auto put = [&](int64_t k, uint8_t v) { dst[k >> 1] = uint8_t(dst[k >> 1] | (v << (4 * (k & 1)))); };
    for (int64_t c = 0; c < cols / 128; ++c)
      for (int t = 0; t < 4; ++t)
        for (int j = 0; j < 4; ++j) {
          const int64_t e0 = (4 * c + j) * 32 + 8 * t;
          const uint8_t* w = repacked + frag_offset(r, c, t, cols) + 4 * j;
          for (int b = 0; b < 4; ++b) {
            put(e0 + kL[a8][b], a8 ? unpack_l_a8(w[b]) : unpack_l(w[b]));
            put(e0 + kH[a8][b], a8 ? unpack_h_a8(w[b]) : unpack_h(w[b]));
          }
        }
  }
  return out;
}

Fp4Matrices alloc_fp4(int64_t count, int64_t rows, int64_t cols, DeviceBuffer::Place codes_at) {
  PLUMB_CHECK(rows % 16 == 0 && cols % 128 == 0, "FP4 matrices [{}, {}]: rows must be a multiple of 16, columns of 128", rows,
              cols);
  Fp4Matrices m;
  m.count = count, m.rows = rows, m.cols = cols;
  m.codes = DeviceBuffer(size_t(count) * m.code_bytes(), codes_at);
  m.scales = DeviceBuffer(size_t(count) * m.scale_bytes());
  return m;
}

Fp4Matrices upload_fp4(const std::vector<const uint8_t*>& codes, const std::vector<const uint8_t*>& scales, int64_t rows,
                       int64_t cols, Fp4Layout layout, DeviceBuffer::Place codes_at) {
  PLUMB_CHECK(codes.size() == scales.size() && !codes.empty(), "upload_fp4: {} code and {} scale tensors", codes.size(),
              scales.size());
  Fp4Matrices m = alloc_fp4(int64_t(codes.size()), rows, cols, codes_at);
  m.layout = layout;
  int lo = 255, hi = 0;
  for (size_t i = 0; i < codes.size(); ++i) {
    for (size_t b = 0; b < m.scale_bytes(); ++b) {
      PLUMB_CHECK(scales[i][b] != 0xFF, "upload_fp4: matrix {} has a NaN (0xFF) E8M0 scale at {}", i, b);
      lo = std::min(lo, int(scales[i][b])), hi = std::max(hi, int(scales[i][b]));
    }
    const auto rp = repack_fp4_decode(codes[i], rows, cols, layout);
    m.codes.upload(rp.data(), rp.size(), i * m.code_bytes());
    m.scales.upload(scales[i], m.scale_bytes(), i * m.scale_bytes());
  }
  m.scale_lo = lo, m.scale_hi = hi;
  return m;
}

namespace {

// The E8M0 byte of a power-of-two scale (2^-127 .. 2^127); -1 if `s` is not one.
int e8m0_code(float s) {
  if (std::isnan(s)) return 255;
  if (!(s > 0) || std::isinf(s)) return -1;
  uint32_t bits;
  std::memcpy(&bits, &s, 4);
  if (bits == 0x00400000u) return 0;  // 2^-127
  if (bits & 0x7FFFFFu) return -1;
  return int(bits >> 23);
}

}  // namespace

// A packed FP4 Matrix holds exactly the checkpoint's E2M1 bytes and E8M0 scales: upload them as stored (the
// raw overload checks the scales and applies the decode-layout permutation).
Fp4Matrices upload_fp4(const std::vector<const Matrix*>& mats, Fp4Layout layout, DeviceBuffer::Place codes_at) {
  PLUMB_CHECK(!mats.empty(), "upload_fp4: no matrices");
  const int64_t rows = mats[0]->rows(), cols = mats[0]->cols();
  std::vector<const uint8_t*> codes, scales;
  for (const Matrix* w : mats) {
    PLUMB_CHECK(w->layout() == Matrix::Layout::FP4Group && w->rows() == rows && w->cols() == cols,
                "upload_fp4: {} is not a packed FP4 [{}, {}] matrix", w->name(), rows, cols);
    codes.push_back(w->values().data);
    scales.push_back(w->scales()->data);
  }
  return upload_fp4(codes, scales, rows, cols, layout, codes_at);
}

Fp8Matrix alloc_fp8(int64_t rows, int64_t cols, bool scale_f32) {
  PLUMB_CHECK(rows % 16 == 0 && cols % 128 == 0, "FP8 matrix [{}, {}]: rows must be a multiple of 16, columns of 128", rows,
              cols);
  Fp8Matrix m;
  m.rows = rows, m.cols = cols, m.scale_f32 = scale_f32;
  m.codes = DeviceBuffer(size_t(rows * cols));
  m.scales = DeviceBuffer(m.scale_bytes());
  return m;
}

Fp8Matrix upload_fp8(const uint8_t* codes, const void* scales, bool scale_f32, int64_t rows, int64_t cols) {
  Fp8Matrix m = alloc_fp8(rows, cols, scale_f32);
  m.codes.upload(codes, size_t(rows * cols));
  m.scales.upload(scales, m.scale_bytes());
  return m;
}

Fp8Matrix upload_fp8(const Matrix& w) {
  PLUMB_CHECK(w.layout() == Matrix::Layout::FP8Block, "upload_fp8: {} is not an FP8 block-scaled matrix", w.name());
  const int64_t rows = w.rows(), cols = w.cols(), nscale = ((rows + 127) / 128) * ((cols + 127) / 128);
  // The stored E4M3 bytes; the two NaN codes become +NaN (0x7F), as decoding and re-encoding them did.
  std::vector<uint8_t> codes(w.values().data, w.values().data + rows * cols);
  for (auto& c : codes)
    if ((c & 0x7F) == 0x7F) c = 0x7F;
  const TensorView& sv = *w.scales();
  std::vector<float> sf(static_cast<size_t>(nscale));
  for (int64_t i = 0; i < nscale; ++i) {
    if (sv.dtype == DType::F8_E8M0) sf[size_t(i)] = fmt8::e8m0_to_f32(sv.data[i]);
    else std::memcpy(&sf[size_t(i)], sv.data + i * 4, 4);
  }
  bool pow2 = true;
  for (float s : sf) {
    PLUMB_CHECK(std::isfinite(s), "upload_fp8: {} has a non-finite block scale", w.name());
    pow2 = pow2 && e8m0_code(s) >= 0;
  }
  if (!pow2) return upload_fp8(codes.data(), sf.data(), true, rows, cols);
  std::vector<uint8_t> s8(sf.size());
  for (size_t i = 0; i < sf.size(); ++i) s8[i] = uint8_t(e8m0_code(sf[i]));
  return upload_fp8(codes.data(), s8.data(), false, rows, cols);
}

size_t expert_code_bytes(const MoeWeights& w) {
  size_t b = 0;
  for (const auto& e : w.experts)
    for (const Matrix* m : {&e.w1, &e.w3, &e.w2}) b += size_t(m->rows() * m->cols() / 2);
  return b;
}

MoeExperts upload_experts(const MoeWeights& w, Fp4Layout layout, DeviceBuffer::Place codes_at) {
  MoeExperts m;
  PLUMB_CHECK(!w.experts.empty(), "upload_experts: no routed experts");
  std::vector<const Matrix*> w1, w2, w3;
  for (const auto& e : w.experts) w1.push_back(&e.w1), w2.push_back(&e.w2), w3.push_back(&e.w3);
  m.w1 = upload_fp4(w1, layout, codes_at), m.w3 = upload_fp4(w3, layout, codes_at), m.w2 = upload_fp4(w2, layout, codes_at);
  m.E = int64_t(w.experts.size()), m.I = m.w1.rows, m.D = m.w1.cols;
  PLUMB_CHECK(m.w2.rows == m.D && m.w2.cols == m.I, "upload_experts: w2 is [{}, {}], expected [{}, {}]", m.w2.rows, m.w2.cols, m.D,
              m.I);
  return m;
}

Fp8Expert upload_expert_fp8(const ExpertWeights& e) {
  Fp8Expert r;
  r.w1 = upload_fp8(e.w1), r.w3 = upload_fp8(e.w3), r.w2 = upload_fp8(e.w2);
  return r;
}

RouterWeights upload_router(const MoeWeights& w, int64_t E, int64_t D) {
  PLUMB_CHECK(w.gate.rows() == E && w.gate.cols() == D, "upload_router: gate is [{}, {}], expected [{}, {}]", w.gate.rows(),
              w.gate.cols(), E, D);
  RouterWeights r;
  r.E = E, r.D = D;
  std::vector<uint16_t> g(size_t(E * D));
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t e = 0; e < E; ++e) {
    w.gate.row(e, row.data());
    for (int64_t k = 0; k < D; ++k) g[size_t(e * D + k)] = fmt8::f32_to_bf16(row[size_t(k)]);
  }
  r.gate = to_device(g);
  if (w.bias.numel()) r.bias = to_device(w.bias.data);
  if (w.tid2eid.numel()) {
    std::vector<int32_t> t(size_t(w.tid2eid.numel()));
    for (int64_t i = 0; i < w.tid2eid.numel(); ++i) {
      PLUMB_CHECK(w.tid2eid[i] >= 0 && w.tid2eid[i] < E, "upload_router: tid2eid entry {} is {}, outside [0, {})", i,
                  w.tid2eid[i], E);
      t[size_t(i)] = int32_t(w.tid2eid[i]);
    }
    r.tid2eid = to_device(t);
    r.vocab = w.tid2eid.dim(0);
  }
  return r;
}

// ---- launches ----

namespace {

d::GemvArgs base_args(d::Fmt fmt) {
  d::GemvArgs a;
  a.fmt = fmt;
  a.act = d::kF16;
  return a;
}

// Warps per block, register budget and blocks along K for a dense decode GEMV (defaults; `plumb bench` sweeps the
// alternatives). The fewest warps in {1, 2, 4, 8} that put >= 2048 warps on the GPU (tiles = 16-row tiles over all
// problems), at most one per 128-column chunk; no split of K across blocks; single matrices too small for that even
// with 8 warps (< 256 tiles) issue 4 chunks' loads per warp at once (fp8_unroll 4, full register budget). Read off
// the H200 sweeps (bench/results/h200-bench.txt, later runs, batch 1 and 8): this picks the best configuration of
// every V4-Flash shape within noise (wq_b [32768, 1024]: 1 warp, whole K per warp and no block reduction, 70.2 %
// of copy in graph replay against 67.2 with 2 and 37.6 with 8 (session 11, h200-session11/bench-fp8-warps.txt);
// wo_a grouped: 4; wo_b: 8; indexer wq_b: 4); the cross-block split the old rule used for wq_a / wkv lost to 8 warps without it at
// both batches (10.0% vs 12.8% of copy on wq_a). Small ones, graph replay, batch 1 / 8 (h200-session7-runs): wq_a
// 5.16 / 6.10 us with 4 chunks in flight against 5.35 / 6.20 with 2 and registers capped at 85 (the rule before),
// wkv 4.83 / 5.65 against 5.09 / 5.90; 4 chunks lose on the large ones (wq_b 18.4 against 12.1 us).
void dense_split(d::GemvArgs& a, int n) {
  const int64_t tiles = a.rows / 16 * a.problems, chunks = a.cols / 128;
  a.minblocks = 1;
  a.kblocks = 1;
  if (a.fmt == d::kFp8 && a.nmat == 1 && n > 8) {
    // W8A16 above 8 tokens on matrices with enough 16-row tiles: the shared-activation kernel (gemv_xs.cuh). Its
    // blocks of 8 (or 4) warps, a tile each, read one staging of their K range's activations from shared memory,
    // where the register path's warps each read their tokens' activations from L2 (at 32 tokens ~4x the weight
    // bytes). One pass of token groups up to 64 tokens; at most 8 chunks of K per block (blocks along K beyond
    // that: 64 KB of staged activations at 32 tokens, 128 KB at 64); 8 warps per block where that leaves >= 128
    // blocks, else 4; 8 chunks' loads in flight per block (16 at 64 tokens), at most 2 per warp (4 spill at 64
    // tokens; 4-warp blocks at 16 / 32 tokens within 0.6 us either way). H200, `plumb bench --only fp8xs` (graph replay, us at 16 / 32 / 64 tokens; this rule's pick
    // against the register path's best at 16 / 32): wq_b [32768, 1024] 13.6 / 16.1 / 26.9 against 16.7 / 31.4;
    // wo_a (8 x [1024, 4096]) 17.5 / 22.7 / 40.0 against 19.8 / 28.3; wo_b [4096, 8192] 17.7 / 23.5 / 41.8 against
    // 17.0 / 27.2; the indexer's wq_b [8192, 1024] 7.5 / 9.0 / 12.3 against 7.7 / 10.9. Whole layers (paired A/B
    // against the register path, 2 rounds): batch 16 -6.1 / -11.5, batch 32 -26.5 / -26.8, batch 64 (with
    // cuda.prefill_gemm's GEMM for these from 80 tokens instead of 64) -34.6 / -37.5 us per layer. A token's last
    // bits can differ between steps of <= 8 tokens and larger ones where K splits differently (as on the register
    // path above 8 tokens); a step's bits depend on nothing else.
    const int np = d::gemv_xs_token_groups(n);
    int z = 1;
    while (chunks > 8 * z && 2 * z <= chunks) z *= 2;
    const int64_t per_prob = a.rows / 16;
    auto blocks = [&](int w) { return (per_prob + w - 1) / w * a.problems * z; };
    const int w = blocks(8) >= 128 ? 8 : blocks(4) >= 128 ? 4 : 0;
    if (w) {
      a.shared_x = 1, a.warps = w, a.kblocks = z, a.token_groups = np;
      a.fp8_unroll = std::min((np == 8 ? 16 : 8) / w, 2);
      return;
    }
  }
  if (a.fmt == d::kFp8 && n > 8) {
    // W8A16 above 8 tokens on the rest (wq_a, wkv: too few tiles; the shared expert's gate/up: 48.3 against 30.1 us
    // for the whole expert at 32 tokens on the shared-activation kernel): one pass of token groups (up to 32
    // tokens), ~150-240 registers per thread, so about 8 resident warps per SM: the most warps per block in {1, 2,
    // 4, 8} that keep the grid within ~1024 warps (one wave), 2 chunks in flight for 1-warp blocks, else 1. Each
    // V4-Flash shape's best of the sweep at 32 tokens (H200, `plumb bench --only fp8`, graph replay, us, session 23):
    // wq_b 31.4 (1 warp), wo_a 28.9 (2; 4 warps 35.8), wo_b 27.4 (4; 8 warps 35.5), indexer wq_b 10.8 (2; 4 warps
    // 15.0), wq_a 11.7 / wkv 11.4 (8). Where this picks fewer warps than the rule below, K splits over fewer warps:
    // a token's outputs can differ in the last place between a step of <= 8 tokens and a larger one (within
    // cuda.fp8_gemv's tolerance; as cuda.prefill_gemm's GEMM from 32 tokens already did).
    int warps = 1;
    while (warps < 8 && tiles * warps * 2 <= 1024) warps *= 2;
    a.warps = int(std::min<int64_t>(warps, chunks));
    a.fp8_unroll = a.warps == 1 ? 2 : 1;
    return;
  }
  a.warps = d::gemv_dense_warps(tiles, chunks);
  a.fp8_unroll = a.nmat == 1 && tiles * 8 < 2048 ? 4 : 2;
}

void fill_fp8(d::GemvArgs& a, int q, const Fp8Matrix& w) {
  a.w[q] = w.codes.as<uint8_t>();
  a.s[q] = w.scales.get();
  a.rows = w.rows, a.cols = w.cols, a.s_ld = w.scale_cols(), a.s_f32 = w.scale_f32 ? 1 : 0;
}

void attach_workspace(d::GemvArgs& a, Workspace& ws) {
  if (a.kblocks <= 1) return;
  const d::GemvWorkspace need = d::gemv_workspace(a);
  a.partial = ws.partial(need.floats);
  a.counters = ws.counters(need.counters);
}

// x as f16 rows of `cols` (ld `ldx` elements); converts into the workspace unless it already is f16.
const void* as_f16(const void* x, Act xt, int n, int64_t cols, int64_t& ldx, Workspace& ws, Stream s) {
  if (xt == Act::F16) return x;
  uint16_t* h = ws.half(size_t(n) * size_t(cols));
  d::launch_to_f16(x, int(xt), n, cols, ldx, h, s);
  ldx = cols;
  return h;
}

}  // namespace

void fp8_linear(const Fp8Matrix& w, const void* x, Act xt, int64_t ldx, int n, float* y, int64_t ldy, Workspace& ws, Stream s) {
  d::GemvArgs a = base_args(d::kFp8);
  fill_fp8(a, 0, w);
  a.x = as_f16(x, xt, n, w.cols, ldx, ws, s);
  a.x_tok_stride = ldx, a.out = y, a.o_tok_stride = ldy, a.n = n;
  dense_split(a, n);
  attach_workspace(a, ws);
  d::launch_gemv(a, s);
}

void fp8_linear_hc_part(const Fp8Matrix& w, const uint16_t* x16, float* y, const d::HcPartArgs& hc, Workspace& ws, Stream s) {
  d::GemvArgs a = base_args(d::kFp8);
  fill_fp8(a, 0, w);
  a.x = x16, a.act = d::kF16, a.x_tok_stride = w.cols, a.out = y, a.o_tok_stride = w.rows, a.n = 1;
  dense_split(a, 1);  // (one token: no split of K across blocks)
  attach_workspace(a, ws);
  a.epi = d::kHcPart, a.hc = hc;
  d::launch_gemv(a, s);
}

void fp8_linear_a8(const Fp8Matrix& w, const uint8_t* x8, const float* xs, int n, float* y, int64_t ldy, Workspace& ws, Stream s) {
  d::GemvArgs a = base_args(d::kFp8A8);
  fill_fp8(a, 0, w);
  a.act = d::kE4M3, a.x = x8, a.x_tok_stride = w.cols, a.x_scale = xs, a.xs_ld = w.cols / 128, a.round_bf16 = 1;
  a.out = y, a.o_tok_stride = ldy, a.n = n;
  dense_split(a, n);
  attach_workspace(a, ws);
  d::launch_gemv(a, s);
}

void fp8_linear_grouped(const Fp8Matrix& w, int groups, const void* x, Act xt, int n, float* y, Workspace& ws, Stream s,
                        uint16_t* y16) {
  PLUMB_CHECK(groups >= 1 && w.rows % (int64_t(groups) * 128) == 0,
              "grouped projection: {} rows do not split into {} groups of whole 128-row blocks", w.rows, groups);
  d::GemvArgs a = base_args(d::kFp8);
  fill_fp8(a, 0, w);
  const int64_t gr = w.rows / groups;
  int64_t ldx = int64_t(groups) * w.cols;
  a.x = as_f16(x, xt, n, ldx, ldx, ws, s);
  a.rows = gr, a.problems = groups;
  a.w_prob_stride = gr * w.cols;
  a.s_prob_stride = (gr / 128) * w.scale_cols() * (w.scale_f32 ? 4 : 1);
  a.x_tok_stride = ldx, a.x_prob_stride = w.cols;
  a.out = y16 ? static_cast<void*>(y16) : y, a.out_half = y16 ? 1 : 0;
  a.o_tok_stride = w.rows, a.o_prob_stride = gr, a.n = n;
  dense_split(a, n);
  attach_workspace(a, ws);
  d::launch_gemv(a, s);
}

void fp8_expert_ffn(const Fp8Expert& e, const void* x, Act xt, int n, double limit, uint16_t* h, float* y, Workspace& ws,
                    Stream s) {
  const int64_t I = e.w1.rows, D = e.w1.cols;
  PLUMB_CHECK(e.w3.rows == I && e.w3.cols == D && e.w2.rows == D && e.w2.cols == I && e.w1.scale_f32 == e.w3.scale_f32,
              "fp8_expert_ffn: inconsistent expert shapes w1 [{}, {}], w3 [{}, {}], w2 [{}, {}]", I, D, e.w3.rows, e.w3.cols,
              e.w2.rows, e.w2.cols);
  d::GemvArgs a = base_args(d::kFp8);
  fill_fp8(a, 0, e.w1);
  a.w[1] = e.w3.codes.as<uint8_t>(), a.s[1] = e.w3.scales.get();
  a.nmat = 2, a.epi = d::kSwiglu, a.out_half = 1, a.limit = float(limit);
  int64_t ldx = D;
  a.x = as_f16(x, xt, n, D, ldx, ws, s);
  a.x_tok_stride = ldx, a.out = h, a.o_tok_stride = I, a.n = n;
  dense_split(a, n);
  attach_workspace(a, ws);
  d::launch_gemv(a, s);
  fp8_linear(e.w2, h, Act::F16, I, n, y, D, ws, s);
}

RouterConfig router_config(const ModelConfig& c, MlpType type) {
  RouterConfig r;
  r.E = c.n_experts, r.K = c.top_k, r.D = c.hidden, r.score = c.score, r.routed_scaling = c.routed_scaling;
  r.hash = type == MlpType::Hash;
  r.renorm = true;
  return r;
}

template <Rsf P>
void route(const RouterWeights& w, const RouterConfig& c, const void* x, Act xt, int n, const int32_t* tokens,
           const DeviceRouting<P>& out, Workspace& ws, Stream s, uint16_t* x16) {
  PLUMB_CHECK(w.E == c.E && w.D == c.D, "route: router weights [{}, {}] do not match the config [{}, {}]", w.E, w.D, c.E, c.D);
  PLUMB_CHECK(out.n == n && out.K == c.K, "route: output holds {} x {}, expected {} x {}", out.n, out.K, n, c.K);
  d::RouterArgs a;
  a.gate = w.gate.as<uint16_t>(), a.bias = w.bias.as<float>(), a.tid2eid = w.tid2eid.as<int32_t>(), a.tokens = tokens;
  a.x = x, a.act = int(xt), a.n = n, a.E = c.E, a.K = c.K, a.D = c.D, a.score = int(c.score);
  a.hash = c.hash ? 1 : 0, a.renorm = c.renorm ? 1 : 0;
  a.fold = P == Rsf::Folded ? float(c.routed_scaling) : 1.0f;
  a.idx = out.idx, a.weight = out.weight, a.logits = out.logits, a.select = out.select, a.x16 = x16;
  const size_t doubles = size_t(d::router_ksplit(c.D)) * size_t(n) * size_t(c.E);
  a.partial = reinterpret_cast<double*>(ws.partial(2 * doubles));
  a.counter = ws.counters(size_t(d::router_counters(n)));
  d::launch_router(a, s);
}

template void route<Rsf::Folded>(const RouterWeights&, const RouterConfig&, const void*, Act, int, const int32_t*,
                                 const DeviceRouting<Rsf::Folded>&, Workspace&, Stream, uint16_t*);
template void route<Rsf::Unfolded>(const RouterWeights&, const RouterConfig&, const void*, Act, int, const int32_t*,
                                   const DeviceRouting<Rsf::Unfolded>&, Workspace&, Stream, uint16_t*);

namespace {

d::GemvArgs moe_args(const Fp4Matrices& w, const int32_t* idx, int n, int K, int64_t E, Fp4Layout layout = Fp4Layout::F16) {
  PLUMB_CHECK(w.layout == layout, "routed experts: the {} kernels need the {} layout of the FP4 weights (upload_experts' layout)",
              layout == Fp4Layout::A8 ? "W4A8 (official numerics)" : "W4A16", layout == Fp4Layout::A8 ? "A8" : "F16");
  d::GemvArgs a = base_args(layout == Fp4Layout::A8 ? d::kFp4A8 : d::kFp4);
  a.mode = d::kMoe;
  a.w[0] = w.codes.as<uint8_t>(), a.s[0] = w.scales.get();
  a.w_prob_stride = int64_t(w.code_bytes()), a.s_prob_stride = int64_t(w.scale_bytes());
  a.rows = w.rows, a.cols = w.cols, a.s_ld = w.cols / 32;
  a.idx = idx, a.n = n, a.topk = K, a.problems = int(E);
  a.warps = int(std::min<int64_t>(4, w.cols / 128));  // run 1 on an H200: 4 warps (K/4 each) beat 8 and 16
  return a;
}

void set_groups(d::GemvArgs& a, const void* groups) {
  if (!groups) return;
  const d::GroupLayout L = d::group_layout(int64_t(a.n) * a.topk, a.problems);
  a.groups = static_cast<const int32_t*>(groups);
  a.g_offs = L.offs, a.g_list = L.list, a.g_tiles = L.tiles, a.g_max_tiles = int(L.max_tiles);
}

d::GroupedArgs grouped_args(const Fp4Matrices& w, const void* groups, int n, int K, int64_t E, int variant) {
  PLUMB_CHECK(w.layout == Fp4Layout::F16, "routed experts: the grouped prefill kernels need the F16 layout of the FP4 weights");
  d::GroupedArgs a;
  a.variant = variant;
  a.w[0] = w.codes.as<uint8_t>(), a.s[0] = w.scales.get();
  a.w_prob_stride = int64_t(w.code_bytes()), a.s_prob_stride = int64_t(w.scale_bytes());
  a.rows = w.rows, a.cols = w.cols;
  a.groups = static_cast<const int32_t*>(groups), a.slots = n * K, a.E = int(E);
  a.fold_ok = d::fold_scales(w.scale_lo, w.scale_hi, a.fold_add[0], a.fold_unscale[0]);
  return a;
}

}  // namespace

void moe_gate_up(const MoeExperts& m, const int32_t* idx, int n, int K, const void* x, Act xt, double limit,
                 const float* pre_weight, uint16_t* h16, float* h32, Workspace& ws, Stream s, const void* groups) {
  PLUMB_CHECK((h16 == nullptr) != (h32 == nullptr), "moe_gate_up: exactly one of h16 and h32");
  d::GemvArgs a = moe_args(m.w1, idx, n, K, m.E);
  set_groups(a, groups);
  a.nmat = 2, a.epi = d::kSwiglu, a.limit = float(limit), a.pre_weight = pre_weight;
  a.w[1] = m.w3.codes.as<uint8_t>(), a.s[1] = m.w3.scales.get();
  int64_t ldx = m.D;
  a.x = as_f16(x, xt, n, m.D, ldx, ws, s);
  a.x_tok_stride = ldx, a.x_by_token = 1;
  a.out = h16 ? static_cast<void*>(h16) : static_cast<void*>(h32), a.out_half = h16 ? 1 : 0, a.o_tok_stride = m.I;
  d::launch_gemv(a, s);
}

void moe_down(const MoeExperts& m, const int32_t* idx, int n, int K, const uint16_t* h16, const float* h32, float* ys,
              Workspace& ws, Stream s, const void* groups) {
  PLUMB_CHECK((h16 == nullptr) != (h32 == nullptr), "moe_down: exactly one of h16 and h32");
  d::GemvArgs a = moe_args(m.w2, idx, n, K, m.E);
  set_groups(a, groups);
  int64_t ldx = m.I;
  a.x = h16 ? static_cast<const void*>(h16) : as_f16(h32, Act::F32, n * K, m.I, ldx, ws, s);
  a.x_tok_stride = ldx, a.x_by_token = 0;
  a.out = ys, a.o_tok_stride = m.D;
  a.pdl_early = 1;  // (idx is gate/up's routing, written before that launch: down reads it before its PDL wait)
  d::launch_gemv(a, s);
}

bool moe_ranks_in_experts(const d::RouteArgs& r, const MoeExperts& m) {
  const int v = d::route_warp_variant(r);
  return r.n == 1 && r.K <= 8 && r.E == m.E && v >= 1 && v <= 5 && m.w1.layout == Fp4Layout::F16;
}

static d::GemvArgs ranked_args(const Fp4Matrices& w, const d::RouteArgs& r, const MoeExperts& m, const char* what) {
  PLUMB_CHECK(moe_ranks_in_experts(r, m), "{}: the routed experts rank the gate's logits for one token, K <= 8 of <= 256 experts ({} "
              "tokens, K {} of {})", what, r.n, r.K, r.E);
  d::GemvArgs a = moe_args(w, nullptr, 1, r.K, m.E);
  a.route = r, a.route_variant = d::route_warp_variant(r);
  return a;
}

void moe_gate_up_ranked(const MoeExperts& m, const d::RouteArgs& r, const void* x, Act xt, double limit, uint16_t* h16, Workspace& ws,
                        Stream s) {
  d::GemvArgs a = ranked_args(m.w1, r, m, "moe_gate_up_ranked");
  a.nmat = 2, a.epi = d::kSwiglu, a.limit = float(limit);
  a.w[1] = m.w3.codes.as<uint8_t>(), a.s[1] = m.w3.scales.get();
  int64_t ldx = m.D;
  a.x = as_f16(x, xt, 1, m.D, ldx, ws, s);
  a.x_tok_stride = ldx, a.x_by_token = 1;
  a.out = h16, a.out_half = 1, a.o_tok_stride = m.I;
  d::launch_gemv(a, s);
}

void act_quant_e4m3(const float* x, int64_t rows, int64_t K, int64_t ldx, uint8_t* codes, float* scales, Stream s) {
  d::fwd_act_quant_e4m3(x, rows, K, ldx, codes, scales, s);
}

void moe_gate_up_a8(const MoeExperts& m, const int32_t* idx, int n, int K, const uint8_t* x8, const float* xs, double limit,
                    const float* pre_weight, float* h32, Stream s, const void* groups) {
  d::GemvArgs a = moe_args(m.w1, idx, n, K, m.E, Fp4Layout::A8);
  set_groups(a, groups);
  a.nmat = 2, a.epi = d::kSwiglu, a.limit = float(limit), a.pre_weight = pre_weight, a.round_bf16 = 1;
  a.w[1] = m.w3.codes.as<uint8_t>(), a.s[1] = m.w3.scales.get();
  a.act = d::kE4M3, a.x = x8, a.x_tok_stride = m.D, a.x_by_token = 1, a.x_scale = xs, a.xs_ld = m.D / 128;
  a.out = h32, a.o_tok_stride = m.I;
  d::launch_gemv(a, s);
}

void moe_down_a8(const MoeExperts& m, const int32_t* idx, int n, int K, const uint8_t* h8, const float* hs, float* ys, Stream s,
                 const void* groups) {
  d::GemvArgs a = moe_args(m.w2, idx, n, K, m.E, Fp4Layout::A8);
  set_groups(a, groups);
  a.round_bf16 = 1;
  a.act = d::kE4M3, a.x = h8, a.x_tok_stride = m.I, a.x_by_token = 0, a.x_scale = hs, a.xs_ld = m.I / 128;
  a.out = ys, a.o_tok_stride = m.D;
  d::launch_gemv(a, s);
}

size_t moe_group_bytes(int n, int K, int64_t E) { return size_t(d::group_layout(int64_t(n) * K, E).ints) * 4; }

void moe_group(const int32_t* idx, int n, int K, int64_t E, void* groups, Stream s) {
  PLUMB_CHECK(E >= 1 && E <= 1024, "moe_group: {} experts (1..1024 supported)", E);
  d::launch_moe_group(idx, n * K, int(E), static_cast<int32_t*>(groups), s);
}

void moe_gate_up_grouped(const MoeExperts& m, const void* groups, int n, int K, const void* x, Act xt, double limit,
                         const float* pre_weight, uint16_t* h16, Workspace& ws, Stream s, int variant) {
  d::GroupedArgs a = grouped_args(m.w1, groups, n, K, m.E, variant);
  a.nmat = 2, a.w[1] = m.w3.codes.as<uint8_t>(), a.s[1] = m.w3.scales.get();
  a.fold_ok = d::fold_scales(m.w3.scale_lo, m.w3.scale_hi, a.fold_add[1], a.fold_unscale[1]) && a.fold_ok;
  int64_t ldx = m.D;
  a.x = as_f16(x, xt, n, m.D, ldx, ws, s);
  a.x_ld = ldx, a.x_div = K;
  a.out = h16, a.o_ld = m.I, a.pre_weight = pre_weight, a.limit = float(limit);
  d::launch_moe_grouped(a, s);
}

void moe_down_grouped(const MoeExperts& m, const void* groups, int n, int K, const uint16_t* h16, float* ys, Stream s,
                      int variant) {
  d::GroupedArgs a = grouped_args(m.w2, groups, n, K, m.E, variant);
  a.nmat = 1, a.x = h16, a.x_ld = m.I, a.x_div = 1, a.out = ys, a.o_ld = m.D;
  d::launch_moe_grouped(a, s);
}

void moe_combine(const float* ys, const float* weight, int n, int K, int64_t D, float out_scale, const float* add, float* y,
                 Stream s) {
  d::launch_combine(ys, weight, n, K, D, out_scale, add, y, s);
}

void MoeScratch::reserve(int n, int K, int64_t D, int64_t I) {
  const size_t hb = size_t(n) * size_t(K) * size_t(I) * 2, yb = size_t(n) * size_t(K) * size_t(D) * 4, xb = size_t(n) * size_t(D) * 2;
  if (h.bytes() < hb) h = DeviceBuffer(hb);
  if (ys.bytes() < yb) ys = DeviceBuffer(yb);
  if (x16.bytes() < xb) x16 = DeviceBuffer(xb);
}

}  // namespace plumb::cuda
#endif  // PLUMB_WITH_CUDA
