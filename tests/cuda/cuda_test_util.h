// Helpers for the CUDA differential tests: the GPU gate (skip without a device), temporary checkpoints in the
// official formats, fp16 rounding for the CPU twins, and a comparison that reports where the largest error is.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <numeric>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/api.h"
#include "formats/numeric.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace plumb::cuda::detail {}  // declared in full by cuda/fwd_kernels.h, which the kernel tests include

namespace plumb_cuda_test {


// The names the forward-kernel tests use (`using namespace plumb_cuda_test::kernels;`): device buffers and the
// kernels' namespace; the test fixture and helpers below join it at the end of this file.
namespace kernels {
namespace d = ::plumb::cuda::detail;
using plumb::cuda::DeviceBuffer;
using plumb::cuda::to_device;
using plumb::cuda::to_host;
}  // namespace kernels

// A deterministic prompt of n token ids below vocab (the forward tests' inputs).
inline std::vector<int32_t> test_prompt(int n, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 7919 + 13) % vocab);
  return t;
}

// Every GPU test derives from this: without a usable device it skips, saying why.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!plumb::cuda::available(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
};

// Whether the longest kernel tests take their sanitizer subset: under compute-sanitizer (bench/sanitize_each.py sets
// PLUMB_TEST_SANITIZER_SIZES=1 unless told --full-sizes) racecheck took more than 400-540 s over their whole shape
// lists (sessions 64-65). The subset keeps every kernel path and template of the list at smaller sizes (each test says
// which it leaves out); without the variable every test runs its whole list.
inline bool sanitizer_sizes() {
  static const bool on = [] {
    const char* v = std::getenv("PLUMB_TEST_SANITIZER_SIZES");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}
// Under the sanitizer subset, a line on stderr (unbuffered, so a test killed at its time limit still shows it) per
// case a long test starts, with the seconds since the first: which case a TIMEOUT stopped in and what each costs
// under the tool, to size the subsets. Silent otherwise.
inline void sanitizer_progress(const std::string& what) {
  if (!sanitizer_sizes()) return;
  static const auto t0 = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "[sanitizer subset] %7.1f s: %s\n", s, what.c_str());
}
// Timing tests measure the tool under compute-sanitizer, not the kernels: they skip themselves there.
#define PLUMB_SKIP_TIMING_UNDER_SANITIZER() \
  do {                                      \
    if (::plumb_cuda_test::sanitizer_sizes()) GTEST_SKIP() << "a timing test: under compute-sanitizer it would time the tool"; \
  } while (0)

// Temporary folders and checkpoints: the same helpers as the CPU model tests.
using plumb_test::TempDir;
using plumb_test::write_checkpoint;

// f(r0, r1) over [0, rows) split into contiguous ranges, one per host core: for the CPU twins' row-independent
// loops (each output row's fp64 sum is the same whichever thread computes it), which took about half of the CUDA
// tests' time single-threaded on the GPU machine.
template <class F>
void parallel_rows(int64_t rows, F f) {
  const int64_t parts = std::clamp<int64_t>(int64_t(std::thread::hardware_concurrency()), 1, std::max<int64_t>(rows, 1));
  if (parts <= 1) return f(int64_t(0), rows);
  std::vector<std::thread> threads;
  for (int64_t p = 0; p < parts; ++p) threads.emplace_back([&f, p, parts, rows] { f(rows * p / parts, rows * (p + 1) / parts); });
  for (auto& t : threads) t.join();
}

class Rng {
 public:
  explicit Rng(uint32_t seed) : g_(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g_); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_); }  // [lo, hi]
  std::vector<uint8_t> bytes(size_t n) {
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = uint8_t(g_());
    return v;
  }
  std::vector<uint8_t> e4m3(size_t n) {  // uniform codes without the NaN codes
    auto v = bytes(n);
    for (auto& b : v)
      if ((b & 0x7F) == 0x7F) b = uint8_t((b & 0x80) | 0x7E);
    return v;
  }
  std::vector<uint8_t> e8m0(size_t n, int lo, int hi) {
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = uint8_t(integer(lo, hi));
    return v;
  }
  std::vector<float> floats(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return v;
  }
  std::mt19937& gen() { return g_; }

 private:
  std::mt19937 g_;
};

inline plumb::OwnedTensor raw(const std::string& name, plumb::DType dt, plumb::Shape shape, std::vector<uint8_t> bytes) {
  return plumb::OwnedTensor{name, dt, std::move(shape), std::move(bytes)};
}
inline plumb::OwnedTensor bf16_tensor(const std::string& name, plumb::Shape shape, const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = plumb::fmt8::f32_to_bf16(v[i]);
    b[2 * i] = uint8_t(h), b[2 * i + 1] = uint8_t(h >> 8);
  }
  return raw(name, plumb::DType::BF16, std::move(shape), std::move(b));
}

// An FP4 expert matrix [rows, cols] in the checkpoint format: I8 codes [rows, cols/2] + E8M0 [rows, cols/32].
inline void add_fp4(std::vector<plumb::OwnedTensor>& ts, Rng& rng, const std::string& name, int64_t rows, int64_t cols,
                    int slo = 118, int shi = 124) {
  ts.push_back(raw(name + ".weight", plumb::DType::I8, {rows, cols / 2}, rng.bytes(size_t(rows * cols / 2))));
  ts.push_back(raw(name + ".scale", plumb::DType::F8_E8M0, {rows, cols / 32}, rng.e8m0(size_t(rows * cols / 32), slo, shi)));
}
// An FP8 matrix [rows, cols]: E4M3 codes + [ceil(rows/128), ceil(cols/128)] scales, E8M0 or F32.
inline void add_fp8(std::vector<plumb::OwnedTensor>& ts, Rng& rng, const std::string& name, int64_t rows, int64_t cols,
                    bool f32_scales = false, int slo = 116, int shi = 120) {
  const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
  ts.push_back(raw(name + ".weight", plumb::DType::F8_E4M3, {rows, cols}, rng.e4m3(size_t(rows * cols))));
  if (f32_scales) {
    std::vector<float> s = rng.floats(size_t(sr * sc), 0.001f, 0.01f);
    ts.push_back(plumb::owned_f32(name + ".scale", plumb::Tensor({sr, sc}, s)));
  } else {
    ts.push_back(raw(name + ".scale", plumb::DType::F8_E8M0, {sr, sc}, rng.e8m0(size_t(sr * sc), slo, shi)));
  }
}

struct MoeFixture {
  TempDir dir;
  plumb::Checkpoint ck;
  plumb::MoeWeights w;
  int64_t E, D, I;
};

// E random FP4 routed experts (w1, w3 [I, D], w2 [D, I]) in a temporary checkpoint, bound as MoeWeights (and a
// bf16 router gate [E, D] when `router`). Scales E8M0 bytes in [slo, shi]; `ranges` (if given) sets them per expert
// instead.
inline std::unique_ptr<MoeFixture> make_moe(Rng& rng, int64_t E, int64_t D, int64_t I, bool router = false, int slo = 118,
                                     int shi = 124, const std::vector<std::pair<int, int>>& ranges = {}) {
  auto f = std::make_unique<MoeFixture>();
  f->E = E, f->D = D, f->I = I;
  std::vector<plumb::OwnedTensor> ts;
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "experts." + std::to_string(e);
    const int lo = ranges.empty() ? slo : ranges[size_t(e)].first, hi = ranges.empty() ? shi : ranges[size_t(e)].second;
    add_fp4(ts, rng, p + ".w1", I, D, lo, hi);
    add_fp4(ts, rng, p + ".w2", D, I, lo, hi);
    add_fp4(ts, rng, p + ".w3", I, D, lo, hi);
  }
  if (router) ts.push_back(bf16_tensor("gate.weight", {E, D}, rng.floats(size_t(E * D), -0.1f, 0.1f)));
  f->ck = write_checkpoint(f->dir, ts);
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "experts." + std::to_string(e);
    f->w.experts.push_back({plumb::Matrix::bind(f->ck, p + ".w1.weight", I, D), plumb::Matrix::bind(f->ck, p + ".w2.weight", D, I),
                            plumb::Matrix::bind(f->ck, p + ".w3.weight", I, D)});
  }
  if (router) f->w.gate = plumb::Matrix::bind(f->ck, "gate.weight", E, D);
  return f;
}

struct Fp8ExpertFixture {
  TempDir dir;
  plumb::Checkpoint ck;
  plumb::ExpertWeights e;
};

// A random FP8 expert (the shared expert's form: w1, w3 [I, D], w2 [D, I], E8M0 128x128 scales) in a temporary
// checkpoint, bound as ExpertWeights. Scale bytes in [lo13, hi13] for w1 and w3, [lo2, hi2] for w2.
inline std::unique_ptr<Fp8ExpertFixture> make_fp8_expert(Rng& rng, int64_t D, int64_t I, int lo13, int hi13, int lo2, int hi2) {
  auto f = std::make_unique<Fp8ExpertFixture>();
  std::vector<plumb::OwnedTensor> ts;
  add_fp8(ts, rng, "se.w1", I, D, false, lo13, hi13);
  add_fp8(ts, rng, "se.w2", D, I, false, lo2, hi2);
  add_fp8(ts, rng, "se.w3", I, D, false, lo13, hi13);
  f->ck = write_checkpoint(f->dir, ts);
  f->e = {plumb::Matrix::bind(f->ck, "se.w1.weight", I, D), plumb::Matrix::bind(f->ck, "se.w2.weight", D, I),
          plumb::Matrix::bind(f->ck, "se.w3.weight", I, D)};
  return f;
}

// Every 32-bit word of an FP4 matrix [rows, cols] in the decode layout (repack_fp4_decode: tile-major, [tile][chunk]
// [row half][lane 4g + t][16 B]): f(r, c, t, j, w) for row r, 128-column chunk c, lane part t and group word j, the
// word holding the elements [32 (4c + j) + 8t, +8) of row r.
template <class F>
void for_each_fp4_word(const std::vector<uint8_t>& rp, int64_t rows, int64_t cols, F f) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols / 128; ++c)
      for (int t = 0; t < 4; ++t)
        for (int j = 0; j < 4; ++j) {
          const int64_t at = (r / 16) * 16 * cols / 2 + c * 1024 + ((r % 16) / 8) * 512 + (4 * (r % 8) + t) * 16 + 4 * j;
          uint32_t w = 0;
          std::memcpy(&w, rp.data() + at, 4);
          f(r, c, t, j, w);
        }
}

// n tokens each choosing K distinct experts of E at random: [n, K] routing, token-major.
inline std::vector<int32_t> random_distinct_routing(Rng& rng, int n, int K, int64_t E) {
  std::vector<int32_t> idx;
  for (int t = 0; t < n; ++t) {
    std::vector<int32_t> p(static_cast<size_t>(E));
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng.gen());
    idx.insert(idx.end(), p.begin(), p.begin() + K);
  }
  return idx;
}

// Round to the nearest fp16 (ties to even), as the kernels' activation conversion does.
inline float round_f16(float v) {
  if (!std::isfinite(v)) return v;
  const float a = std::fabs(v);
  if (a >= 65520.0f) return std::copysign(INFINITY, v);
  if (a == 0.0f) return v;
  int e;
  std::frexp(a, &e);
  const int q = std::max(e - 11, -24);
  return std::copysign(std::ldexp(std::nearbyint(std::ldexp(a, -q)), q), v);
}
inline uint16_t f16_bits(float v) {  // v must be exactly representable in fp16
  const uint16_t s = std::signbit(v) ? 0x8000 : 0;
  const float a = std::fabs(v);
  if (a == 0.0f) return s;
  int e;
  std::frexp(a, &e);
  const int E = e - 1 + 15;
  uint16_t bits;
  if (E >= 1) bits = uint16_t(s | (E << 10) | int(std::ldexp(a, -(e - 1)) * 1024.0f - 1024.0f));
  else bits = uint16_t(s | int(std::ldexp(a, 24)));
  if (plumb::fmt8::f16_to_f32(bits) != v) ADD_FAILURE() << "f16_bits: " << v << " is not an fp16 value";
  return bits;
}

// Activations in one of the storage types, and the values the kernels see after their f16 conversion.
struct Acts {
  plumb::cuda::Act type;
  std::vector<float> value;  // the stored value (f32, or the bf16/f16 value)
  std::vector<float> f16;    // what enters the tensor cores
  plumb::cuda::DeviceBuffer dev;
};
inline Acts make_acts(plumb::cuda::Act type, const std::vector<float>& v) {
  Acts a{type, v, v, {}};
  if (type == plumb::cuda::Act::BF16) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = plumb::fmt8::f32_to_bf16(v[i]), a.value[i] = plumb::fmt8::bf16_to_f32(b[i]);
    a.dev = plumb::cuda::to_device(b);
  } else if (type == plumb::cuda::Act::F16) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) a.value[i] = round_f16(v[i]), b[i] = f16_bits(a.value[i]);
    a.dev = plumb::cuda::to_device(b);
  } else {
    a.dev = plumb::cuda::to_device(v);
  }
  for (size_t i = 0; i < v.size(); ++i) a.f16[i] = round_f16(a.value[i]);
  return a;
}
inline const char* act_name(plumb::cuda::Act a) {
  return a == plumb::cuda::Act::F32 ? "f32" : a == plumb::cuda::Act::BF16 ? "bf16" : "f16";
}

// Largest error and where it is. The normalized error is max|gpu - ref| / max|ref|.
struct Cmp {
  double max_abs = 0, max_ref = 0, norm = 0, gpu = 0, ref = 0;
  int64_t at = -1, nonfinite = 0;
};
inline Cmp compare(const float* gpu, const float* ref, int64_t n) {
  Cmp c;
  for (int64_t i = 0; i < n; ++i) {
    c.max_ref = std::max(c.max_ref, std::fabs(double(ref[i])));
    if (!std::isfinite(gpu[i]) && std::isfinite(ref[i])) {
      if (c.nonfinite++ == 0) c.at = i, c.gpu = gpu[i], c.ref = ref[i], c.max_abs = INFINITY;
      continue;
    }
    const double e = std::fabs(double(gpu[i]) - double(ref[i]));
    if (c.nonfinite == 0 && e > c.max_abs) c.max_abs = e, c.at = i, c.gpu = gpu[i], c.ref = ref[i];
  }
  c.norm = c.max_abs / std::max(c.max_ref, 1e-30);
  return c;
}
inline std::string describe(const std::string& what, const Cmp& c, int64_t cols) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s: max |gpu - ref| = %.3e at [%lld, %lld] (gpu %.9g, ref %.9g); max |ref| %.3e; normalized %.3e%s", what.c_str(),
                c.max_abs, (long long)(c.at < 0 ? -1 : c.at / cols), (long long)(c.at < 0 ? -1 : c.at % cols), c.gpu, c.ref,
                c.max_ref, c.norm, c.nonfinite ? " (non-finite outputs!)" : "");
  return buf;
}
// Checks gpu against ref at a normalized tolerance and prints the comparison either way.
inline void expect_close(const std::string& what, const std::vector<float>& gpu, const std::vector<float>& ref, int64_t cols,
                         double tol) {
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  const Cmp c = compare(gpu.data(), ref.data(), int64_t(gpu.size()));
  const std::string d = describe(what, c, cols);
  std::printf("  %s [tol %.1e]\n", d.c_str(), tol);
  EXPECT_EQ(c.nonfinite, 0) << d;
  EXPECT_LE(c.norm, tol) << d;
}

// Device buffers a and b hold the same first n bytes; on failure the message names the first differing byte.
inline void expect_same_bytes(const plumb::cuda::DeviceBuffer& a, const plumb::cuda::DeviceBuffer& b, size_t n, const std::string& what) {
  const auto u = plumb::cuda::to_host<uint8_t>(a, n), v = plumb::cuda::to_host<uint8_t>(b, n);
  size_t first = 0;
  while (first < n && u[first] == v[first]) ++first;
  EXPECT_EQ(first, n) << what << ": first differing byte " << first << " of " << n;
}

namespace kernels {
using plumb_cuda_test::expect_close;
using plumb_cuda_test::expect_same_bytes;
using plumb_cuda_test::GpuTest;
using plumb_cuda_test::Rng;
using plumb_cuda_test::sanitizer_progress;
using plumb_cuda_test::sanitizer_sizes;
}  // namespace kernels

}  // namespace plumb_cuda_test
