// FP4 MoE decode lab: checks the FP4 MoE kernels (per-tile and streaming, every variant) against a CPU reference
// that reads the decode layout directly, then times them at V4-Flash sizes the way `plumb bench` does (random
// routings rotating over the calls, L2 flush, 16 calls in one CUDA graph, median of 5 replays), next to the device
// copy bandwidth measured in the same run. Standalone: links gemv.cu and runtime.cu only.
//   build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc bench/fp4_lab/lab.cu src/cuda/gemv.cu src/cuda/runtime.cu
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda/kernels.h"

using namespace plumb::cuda::detail;

#define CK(x)                                                                             \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::printf("CUDA %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

static float e2m1(int c) {
  static const float lut[8] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (c & 8 ? -1.f : 1.f) * lut[c & 7];
}
// Element k of row r in the decode layout (repack_fp4_decode: tile-major, [tile][chunk][row half][lane][16 B]).
static int code_at(const uint8_t* mat, int64_t cols, int64_t r, int64_t k) {
  static const int posL[8] = {0, 1, -1, -1, 2, 3, -1, -1}, posH[8] = {-1, -1, 0, 1, -1, -1, 2, 3};
  const int64_t c = k / 128, j = (k % 128) / 32, t = (k % 32) / 8, e = k % 8;
  const int b = posL[e] >= 0 ? posL[e] : posH[e];
  const int64_t frag = (r / 16) * 8 * cols + c * 1024 + ((r % 16) / 8) * 512 + (4 * (r % 8) + t) * 16;
  const uint8_t v = mat[frag + 4 * j + b];
  if (posL[e] >= 0) return ((v >> 7) << 3) | ((v >> 1) & 7);
  return ((v & 1) << 3) | (((v >> 4) & 1) << 2) | (((v >> 5) & 1) << 1) | ((v >> 6) & 1);  // H mirrored (fp4_layout.h)
}
static double e8m0(uint8_t b) { return b == 0 ? 0.0 : std::ldexp(1.0, int(b) - 127); }

struct Mat {  // E experts of [rows, cols] FP4 in the decode layout + E8M0 scales
  int64_t E, rows, cols;
  uint8_t *codes, *scales;
  std::vector<uint8_t> hc, hs;
  size_t cb() const { return size_t(rows * cols / 2); }
  size_t sb() const { return size_t(rows * cols / 32); }
};
static Mat make_mat(int64_t E, int64_t rows, int64_t cols, uint64_t seed, bool host) {
  Mat m{E, rows, cols, nullptr, nullptr, {}, {}};
  CK(cudaMalloc(&m.codes, E * m.cb()));
  CK(cudaMalloc(&m.scales, E * m.sb()));
  fill(m.codes, E * m.cb(), kFillBytes, seed, 0, 0);
  fill(m.scales, E * m.sb(), kFillE8M0, seed + 1, 116, 122);
  CK(cudaDeviceSynchronize());
  if (host) {
    m.hc.resize(E * m.cb()), m.hs.resize(E * m.sb());
    CK(cudaMemcpy(m.hc.data(), m.codes, m.hc.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(m.hs.data(), m.scales, m.hs.size(), cudaMemcpyDeviceToHost));
  }
  return m;
}
static double row_dot(const Mat& m, int e, int64_t r, const std::vector<float>& x) {
  const uint8_t* mat = m.hc.data() + e * m.cb();
  const uint8_t* sc = m.hs.data() + e * m.sb() + r * m.cols / 32;
  double acc = 0;
  for (int64_t k = 0; k < m.cols; ++k) acc += double(e2m1(code_at(mat, m.cols, r, k))) * e8m0(sc[k / 32]) * x[k];
  return acc;
}

struct Variant {
  std::string name;
  int kernel, warps, depth, ctas, pdl;
  int ks = 0;  // warps splitting one tile's K (streaming)
};
static GemvArgs args_for(const Variant& v, const Mat& w, const Mat* w3) {
  GemvArgs a;
  a.fmt = kFp4, a.mode = kMoe, a.act = kF16;
  a.w[0] = w.codes, a.s[0] = w.scales;
  a.w_prob_stride = int64_t(w.cb()), a.s_prob_stride = int64_t(w.sb());
  a.rows = w.rows, a.cols = w.cols, a.s_ld = w.cols / 32, a.problems = int(w.E);
  if (w3) a.nmat = 2, a.epi = kSwiglu, a.w[1] = w3->codes, a.s[1] = w3->scales;
  a.fp4_kernel = v.kernel, a.warps = v.kernel == 1 ? v.warps : 4, a.minblocks = 1;
  if (v.kernel != 1) a.fp4_warps = v.warps, a.fp4_depth = v.depth, a.fp4_ctas = v.ctas, a.pdl = v.pdl, a.fp4_ksplit = v.ks;
  return a;
}

// One check case: a routing, inputs, and the CPU reference on a set of (slot, row) outputs, computed once.
struct Case {
  int n, K;
  std::vector<int32_t> idx;
  bool pre;
  float limit;
  std::vector<uint16_t> xh, hh;
  std::vector<float> pw;
  struct Ref {
    size_t at;
    double v;
  };
  std::vector<Ref> rh, ry;
  double mh = 0, my = 0;
};
static Case make_case(const Mat& w1, const Mat& w3, const Mat& w2, int n, int K, std::vector<int32_t> idx, bool pre, float limit,
                      bool full, uint32_t seed) {
  Case c{n, K, std::move(idx), pre, limit, {}, {}, {}, {}, {}};
  const int S = n * K;
  const int64_t D = w1.cols, I = w1.rows;
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> U(-2.f, 2.f);
  auto f16 = [&](std::vector<uint16_t>& h, std::vector<float>& f, size_t cnt) {
    h.resize(cnt), f.resize(cnt);
    for (size_t i = 0; i < cnt; ++i) {
      __half v = __float2half(U(g));
      std::memcpy(&h[i], &v, 2);
      f[i] = __half2float(v);
    }
  };
  std::vector<float> xf, hf;
  f16(c.xh, xf, size_t(n * D));
  f16(c.hh, hf, size_t(S * I));
  c.pw.resize(size_t(S));
  for (auto& p : c.pw) p = 0.05f + 0.9f * float(g() % 1000) / 1000.f;
  const int64_t step_i = full ? 1 : 61, step_d = full ? 1 : 67;
  for (int s = 0; s < S; ++s) {
    const int e = c.idx[size_t(s)], tok = s / K;
    if (e < 0 || e >= w1.E) continue;
    std::vector<float> xr(xf.begin() + tok * D, xf.begin() + (tok + 1) * D), hr(hf.begin() + s * I, hf.begin() + (s + 1) * I);
    for (int64_t r = (s * 7) % step_i; r < I; r += step_i) {
      double gg = row_dot(w1, e, r, xr), u = row_dot(w3, e, r, xr);
      if (limit > 0) gg = std::min(gg, double(limit)), u = std::max(-double(limit), std::min(u, double(limit)));
      double ref = gg / (1.0 + std::exp(-gg)) * u;
      if (pre) ref *= c.pw[size_t(s)];
      c.rh.push_back({size_t(s * I + r), ref});
      c.mh = std::max(c.mh, std::fabs(ref));
    }
    for (int64_t r = (s * 5) % step_d; r < D; r += step_d) {
      const double ref = row_dot(w2, e, r, hr);
      c.ry.push_back({size_t(s * D + r), ref});
      c.my = std::max(c.my, std::fabs(ref));
    }
  }
  return c;
}

// Runs gate+up (f32 out) and down (f32 out, from the case's own f16 h) and compares with the reference.
static bool check(const Variant& v, const Mat& w1, const Mat& w3, const Mat& w2, const Case& c, double* worst) {
  const int n = c.n, K = c.K, S = n * K;
  const int64_t D = w1.cols, I = w1.rows;
  void *dx, *dh, *dh16, *dys, *didx, *dpw;
  CK(cudaMalloc(&dx, c.xh.size() * 2));
  CK(cudaMalloc(&dh, size_t(S * I) * 4));
  CK(cudaMalloc(&dh16, size_t(S * I) * 2));
  CK(cudaMalloc(&dys, size_t(S * D) * 4));
  CK(cudaMalloc(&didx, size_t(S) * 4));
  CK(cudaMalloc(&dpw, size_t(S) * 4));
  CK(cudaMemcpy(dx, c.xh.data(), c.xh.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dh16, c.hh.data(), c.hh.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(didx, c.idx.data(), size_t(S) * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dpw, c.pw.data(), size_t(S) * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dh, 0xFF, size_t(S * I) * 4));
  CK(cudaMemset(dys, 0xFF, size_t(S * D) * 4));
  GemvArgs a = args_for(v, w1, &w3);
  a.x = dx, a.x_tok_stride = D, a.x_by_token = 1, a.out = dh, a.out_half = 0, a.o_tok_stride = I, a.limit = c.limit;
  a.idx = static_cast<int32_t*>(didx), a.n = n, a.topk = K, a.pre_weight = c.pre ? static_cast<float*>(dpw) : nullptr;
  launch_gemv(a, nullptr);
  GemvArgs b = args_for(v, w2, nullptr);
  b.x = dh16, b.x_tok_stride = I, b.x_by_token = 0, b.out = dys, b.o_tok_stride = D, b.out_scale = 1.0f;
  b.idx = static_cast<int32_t*>(didx), b.n = n, b.topk = K;
  launch_gemv(b, nullptr);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> h(size_t(S * I)), ys(size_t(S * D));
  CK(cudaMemcpy(h.data(), dh, h.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ys.data(), dys, ys.size() * 4, cudaMemcpyDeviceToHost));
  cudaFree(dx), cudaFree(dh), cudaFree(dh16), cudaFree(dys), cudaFree(didx), cudaFree(dpw);
  double e1 = 0, e2 = 0;
  bool bad = false;
  for (const auto& r : c.rh) {
    if (!std::isfinite(h[r.at])) bad = true;
    e1 = std::max(e1, std::fabs(r.v - h[r.at]));
  }
  for (const auto& r : c.ry) {
    if (!std::isfinite(ys[r.at])) bad = true;
    e2 = std::max(e2, std::fabs(r.v - ys[r.at]));
  }
  const double n1 = e1 / std::max(c.mh, 1e-30), n2 = e2 / std::max(c.my, 1e-30);
  *worst = std::max({*worst, n1, n2});
  return !bad && n1 < 1e-4 && n2 < 1e-4;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const bool quick = argc > 1 && std::string(argv[1]) == "quick";
  const bool profile = argc > 1 && std::string(argv[1]) == "profile";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  cudaStream_t S;
  CK(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
  cudaEvent_t ea, eb;
  CK(cudaEventCreate(&ea));
  CK(cudaEventCreate(&eb));
  auto ms_between = [&]() {
    float ms;
    CK(cudaEventSynchronize(eb));
    CK(cudaEventElapsedTime(&ms, ea, eb));
    return double(ms);
  };
  unsigned* sink;
  CK(cudaMalloc(&sink, 64));
  double copy_gbps, read_gbps;
  {
    const size_t bytes = size_t(1) << 30;
    void *src, *dst;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMalloc(&dst, bytes));
    fill(src, bytes, kFillBytes, 1, 0, 0, S);
    std::vector<double> c, r;
    for (int i = 0; i < 18; ++i) {
      CK(cudaEventRecord(ea, S));
      CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S));
      CK(cudaEventRecord(eb, S));
      if (i >= 3) c.push_back(ms_between());
      CK(cudaEventRecord(ea, S));
      read_stream(src, bytes, sink, S);
      CK(cudaEventRecord(eb, S));
      if (i >= 3) r.push_back(ms_between());
    }
    std::sort(c.begin(), c.end()), std::sort(r.begin(), r.end());
    copy_gbps = 2.0 * double(bytes) / (c[c.size() / 2] * 1e-3) / 1e9;
    read_gbps = double(bytes) / (r[r.size() / 2] * 1e-3) / 1e9;
    std::printf("copy D2D %.0f GB/s (read+write, 1 GiB, median of 15), read-only stream %.0f GB/s\n", copy_gbps, read_gbps);
    cudaFree(src), cudaFree(dst);
  }

  std::vector<Variant> vars;
  vars.push_back({"tile w2", 1, 2, 0, 0, 0});
  vars.push_back({"tile w4", 1, 4, 0, 0, 0});
  struct Cfg {
    int depth, warps, ctas;
  };
  const Cfg cfgs[] = {{2, 2, 0}, {3, 2, 0}, {4, 2, 0}, {6, 2, 0}, {2, 4, 0}, {3, 4, 0}, {4, 4, 0}, {6, 4, 0},
                      {2, 8, 0}, {3, 8, 0}, {4, 2, 3}, {3, 4, 2}, {4, 4, 2}, {2, 4, 2}, {3, 2, 3}, {3, 2, 4}};
  for (int pdl : {0, 1})
    for (const Cfg& c : cfgs) {
      char nm[64];
      std::snprintf(nm, sizeof nm, "stream d%d w%d c%d%s", c.depth, c.warps, c.ctas, pdl ? " pdl" : "");
      vars.push_back({nm, 2, c.warps, c.depth, c.ctas, pdl});
    }
  for (int ks : {2, 4})
    for (const Cfg& c : {Cfg{2, 4, 0}, Cfg{3, 4, 0}, Cfg{2, 8, 0}})
      if (ks <= c.warps) {
        char nm[64];
        std::snprintf(nm, sizeof nm, "stream d%d w%d ks%d", c.depth, c.warps, ks);
        vars.push_back({nm, 2, c.warps, c.depth, c.ctas, 0, ks});
      }
  vars.push_back({"auto (library default)", 0, 0, 0, 0, -1});

  if (profile) {  // one launch per kernel and batch, for ncu: per-tile (w2) and streaming (defaults)
    const int E = 256, K = 6;
    const int64_t D = 4096, I = 2048;
    Mat w1 = make_mat(E, I, D, 10, false), w3 = make_mat(E, I, D, 12, false), w2 = make_mat(E, D, I, 14, false);
    void *x16, *h16, *ys, *didx;
    CK(cudaMalloc(&x16, 8 * D * 2));
    CK(cudaMalloc(&h16, 48 * I * 2));
    CK(cudaMalloc(&ys, 48 * D * 4));
    CK(cudaMalloc(&didx, 48 * 4));
    fill(x16, 8 * D, kFillF16, 3, -1.f, 1.f, S);
    fill(h16, 48 * I, kFillF16, 4, -1.f, 1.f, S);
    std::vector<int32_t> idx;
    std::mt19937 g(9);
    for (int i = 0; i < 48; ++i) idx.push_back(int(g() % E));
    CK(cudaMemcpy(didx, idx.data(), 48 * 4, cudaMemcpyHostToDevice));
    for (const Variant& v : {Variant{"tile", 1, 2, 0, 0, 0}, Variant{"auto", 0, 0, 0, 0, -1}})
      for (int n : {1, 8}) {
        GemvArgs a = args_for(v, w1, &w3);
        a.x = x16, a.x_tok_stride = D, a.x_by_token = 1, a.out = h16, a.out_half = 1, a.o_tok_stride = I, a.limit = 10.f;
        a.n = n, a.topk = K, a.idx = static_cast<int32_t*>(didx);
        launch_gemv(a, S);
        GemvArgs b = args_for(v, w2, nullptr);
        b.x = h16, b.x_tok_stride = I, b.out = ys, b.o_tok_stride = D, b.n = n, b.topk = K, b.idx = static_cast<int32_t*>(didx);
        launch_gemv(b, S);
      }
    CK(cudaStreamSynchronize(S));
    std::printf("profile launches done\n");
    return 0;
  }

  // ---- correctness: small shapes (every output) and the real shapes (sampled rows) ----
  bool all_ok = true;
  {
    const int64_t E = 12, D = 1024, I = 512;
    Mat w1 = make_mat(E, I, D, 100, true), w3 = make_mat(E, I, D, 110, true), w2 = make_mat(E, D, I, 120, true);
    struct R {
      const char* name;
      int n, K;
      std::vector<int32_t> idx;
    };
    std::vector<R> rs = {{"one token", 1, 4, {3, 0, 11, 7}},
                         {"repeats", 3, 4, {2, 2, 5, 9, 9, 9, 1, 2, 4, 4, 4, 4}},
                         {"passes of 8", 5, 4, std::vector<int32_t>(20, 6)},
                         {"invalid ids", 2, 4, {1, -1, 12, 3, 3, 40, 0, 1}}};
    {
      R r{"random 8x4", 8, 4, {}};
      std::mt19937 g(3);
      for (int t = 0; t < 8; ++t) {
        std::vector<int32_t> p(E);
        for (int i = 0; i < E; ++i) p[i] = i;
        std::shuffle(p.begin(), p.end(), g);
        r.idx.insert(r.idx.end(), p.begin(), p.begin() + 4);
      }
      rs.push_back(r);
    }
    std::vector<Case> cases;
    for (const auto& r : rs)
      for (int pre : {0, 1}) cases.push_back(make_case(w1, w3, w2, r.n, r.K, r.idx, pre, pre ? 7.0f : 0.0f, true, 50 + pre));
    for (const auto& v : vars) {
      double worst = 0;
      bool ok = true;
      try {
        for (const auto& c : cases) ok &= check(v, w1, w3, w2, c, &worst);
      } catch (const std::exception& ex) {
        cudaGetLastError();
        std::printf("check        %-24s skipped: %s\n", v.name.c_str(), ex.what());
        continue;
      }
      std::printf("check small  %-24s %s (worst normalized %.2e)\n", v.name.c_str(), ok ? "ok" : "FAIL", worst);
      all_ok &= ok;
    }
  }

  const int E = 256, K = 6;
  const int64_t D = 4096, I = 2048;
  Mat w1 = make_mat(E, I, D, 10, true), w3 = make_mat(E, I, D, 12, true), w2 = make_mat(E, D, I, 14, true);
  {
    std::mt19937 g(5);
    std::vector<Case> cases;
    for (int n : {1, 8}) {
      std::vector<int32_t> idx;
      for (int t = 0; t < n; ++t) {
        std::vector<int32_t> p(E);
        for (int i = 0; i < E; ++i) p[i] = i;
        std::shuffle(p.begin(), p.end(), g);
        idx.insert(idx.end(), p.begin(), p.begin() + K);
      }
      cases.push_back(make_case(w1, w3, w2, n, K, idx, n == 8, 10.0f, false, 60 + n));
    }
    for (const auto& v : vars) {
      if (v.kernel == 2 && (v.pdl > 0 || v.ctas)) continue;  // same code as the launch without
      double worst = 0;
      bool ok = true;
      try {
        for (const auto& c : cases) ok &= check(v, w1, w3, w2, c, &worst);
      } catch (const std::exception& ex) {
        cudaGetLastError();
        std::printf("check        %-24s skipped: %s\n", v.name.c_str(), ex.what());
        continue;
      }
      std::printf("check real   %-24s %s (worst normalized %.2e)\n", v.name.c_str(), ok ? "ok" : "FAIL", worst);
      all_ok &= ok;
    }
  }
  std::printf("correctness: %s\n", all_ok ? "ALL OK" : "FAILURES");
  if (quick) return all_ok ? 0 : 1;

  // ---- timing ----
  const size_t flush_bytes = std::max<size_t>(size_t(256) << 20, 4 * size_t(prop.l2CacheSize));
  void* flush;
  CK(cudaMalloc(&flush, flush_bytes));
  fill(flush, flush_bytes, kFillBytes, 2, 0, 0, S);
  const int kGraph = 16, warm = 3;
  const size_t maxn = 8;
  void *x16, *h16, *ys;
  CK(cudaMalloc(&x16, maxn * D * 2));
  CK(cudaMalloc(&h16, maxn * K * I * 2));
  CK(cudaMalloc(&ys, maxn * K * D * 4));
  fill(x16, maxn * D, kFillF16, 3, -1.f, 1.f, S);
  fill(h16, maxn * K * I, kFillF16, 4, -1.f, 1.f, S);
  const double w13 = 2.0 * double(I * D / 2 + I * D / 32), w2b = double(D * I / 2 + D * I / 32);
  std::printf("\n%-26s %-10s %3s %8s %8s %7s\n", "variant", "kernel", "n", "us/call", "GB/s", "%copy");
  struct Best {
    double pct = 0;
    std::string name;
  } best[2][2];
  for (int n : {1, 8}) {
    const int runs = warm + kGraph;
    std::mt19937 g(1234 + n);
    std::vector<int32_t> idx;
    double uavg = 0;
    for (int c = 0; c < runs; ++c) {
      std::set<int> used;
      for (int t = 0; t < n; ++t) {
        std::vector<int32_t> p(E);
        for (int i = 0; i < E; ++i) p[i] = i;
        for (int k = 0; k < K; ++k) {
          std::swap(p[k], p[k + g() % (E - k)]);
          idx.push_back(p[k]);
          used.insert(p[k]);
        }
      }
      uavg += double(used.size());
    }
    uavg /= runs;
    int32_t* didx;
    CK(cudaMalloc(&didx, idx.size() * 4));
    CK(cudaMemcpy(didx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    for (int which = 0; which < 2; ++which)
      for (const auto& v : vars) {
        GemvArgs a = which == 0 ? args_for(v, w1, &w3) : args_for(v, w2, nullptr);
        if (which == 0)
          a.x = x16, a.x_tok_stride = D, a.x_by_token = 1, a.out = h16, a.out_half = 1, a.o_tok_stride = I, a.limit = 10.f;
        else
          a.x = h16, a.x_tok_stride = I, a.out = ys, a.o_tok_stride = D;
        a.n = n, a.topk = K;
        auto call = [&](int i) {
          GemvArgs b = a;
          b.idx = didx + size_t(i % runs) * n * K;
          launch_gemv(b, S);
        };
        try {
          for (int i = 0; i < warm; ++i) call(i);
          CK(cudaStreamSynchronize(S));
        } catch (const std::exception& ex) {
          std::printf("%-26s skipped: %s\n", v.name.c_str(), ex.what());
          cudaGetLastError();
          continue;
        }
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(S, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < kGraph; ++i) call(warm + i);
        CK(cudaStreamEndCapture(S, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaGraphLaunch(exec, S));
        std::vector<double> gt;
        for (int r = 0; r < 5; ++r) {
          read_stream(flush, flush_bytes, sink, S);
          CK(cudaEventRecord(ea, S));
          CK(cudaGraphLaunch(exec, S));
          CK(cudaEventRecord(eb, S));
          gt.push_back(ms_between() * 1e3 / kGraph);
        }
        CK(cudaGetLastError());
        cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
        std::sort(gt.begin(), gt.end());
        const double us = gt[2];
        const double bytes = which == 0 ? uavg * w13 + n * D * 2.0 + n * K * I * 2.0 : uavg * w2b + n * K * I * 2.0 + n * K * D * 4.0;
        const double gbps = bytes / (us * 1e-6) / 1e9, pct = 100.0 * gbps / copy_gbps;
        std::printf("%-26s %-10s %3d %8.2f %8.0f %6.1f%%  (min %.2f max %.2f)\n", v.name.c_str(), which ? "down" : "gate+up", n, us,
                    gbps, pct, gt.front(), gt.back());
        Best& b = best[which][n == 8];
        if (pct > b.pct) b.pct = pct, b.name = v.name;
      }
    cudaFree(didx);
  }
  std::printf("\ncopy %.0f GB/s. best: gate+up n1 %.1f%% (%s), n8 %.1f%% (%s); down n1 %.1f%% (%s), n8 %.1f%% (%s)\n", copy_gbps,
              best[0][0].pct, best[0][0].name.c_str(), best[0][1].pct, best[0][1].name.c_str(), best[1][0].pct,
              best[1][0].name.c_str(), best[1][1].pct, best[1][1].name.c_str());
  std::printf("correctness: %s\n", all_ok ? "ALL OK" : "FAILURES");
  return 0;
}
