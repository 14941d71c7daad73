// Forward-op kernels against their twins: the router's fast kernels against the block-per-token twin, the fused
// decode launches (row ops, the compressor's one launch, the small-batch and one-token linears) bit for bit against
// the launches they replace. (hc_pre's: test_cuda_fwd_hc.cpp.)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include <fmt/format.h>

#include "cuda/fwd_kernels.h"
#include "cuda_test_util.h"

namespace {

using namespace plumb_cuda_test::kernels;  // (GpuTest, Rng, expect_close, expect_same_bytes too)

// ---- router (fwd_route): the fast kernels (a warp per token, or at 8 experts per lane a thread per expert) bit for
// bit against the block-per-token twin ----

struct RouteOut {
  std::vector<int32_t> idx;
  std::vector<float> weight, select;
};

RouteOut run_route(d::RouteArgs a, const std::vector<float>& logits, const std::vector<float>& bias, const std::vector<int32_t>& tid2eid,
                   const std::vector<int32_t>& toks, bool twin) {
  DeviceBuffer dl = to_device(logits), db = to_device(bias.empty() ? std::vector<float>{0.0f} : bias),
               dm = to_device(tid2eid.empty() ? std::vector<int32_t>{0} : tid2eid), dt = to_device(toks);
  DeviceBuffer di(size_t(a.n * a.K) * 4), dw(size_t(a.n * a.K) * 4), ds(size_t(a.n * a.E) * 4);
  for (auto* b : {&di, &dw, &ds}) b->fill_byte(0xAB);
  a.logits = dl.as<float>(), a.tokens = dt.as<int32_t>();
  a.bias = a.hash ? nullptr : db.as<float>();
  a.tid2eid = a.hash ? dm.as<int32_t>() : nullptr;
  a.idx = di.as<int32_t>(), a.weight = dw.as<float>(), a.select = ds.as<float>();
  a.twin = twin ? 1 : 0;
  d::fwd_route(a, nullptr);
  return {to_host<int32_t>(di, size_t(a.n * a.K)), to_host<float>(dw, size_t(a.n * a.K)), to_host<float>(ds, size_t(a.n * a.E))};
}

// The official numerics' combine: each token's K expert outputs added to an fp32 zero in ascending expert id (slot
// order among repeated ids), as the official per-expert loop and the CPU's run_routed do. Values of mixed magnitude
// make fp32 sums of 6 terms depend on their order: the host's sum in id order must match bit for bit, and at least
// one element must differ from the slot-order sum, else the test could not tell the two orders apart.
void check_official_combine(int64_t D) {
  const int n = 3, K = 6;
  Rng rng(77);
  std::vector<float> ys = rng.floats(size_t(n * K * D), -1.0f, 1.0f);
  for (size_t i = 0; i < ys.size(); i += 3) ys[i] *= 3.0e6f;  // large terms that cancel: rounding depends on order
  const std::vector<int32_t> ids = {5, 1, 9, 3, 7, 0, /**/ 2, 2, 8, 4, 6, 1, /**/ 0, 1, 2, 3, 4, 5};  // repeats in token 1
  DeviceBuffer dys = to_device(ys), dids = to_device(ids), y(size_t(n * D) * 4), y_slot(size_t(n * D) * 4);
  d::fwd_moe_combine(dys.as<float>(), nullptr, n, K, D, 1.0f, y.as<float>(), nullptr, dids.as<int32_t>());
  d::fwd_moe_combine(dys.as<float>(), nullptr, n, K, D, 1.0f, y_slot.as<float>(), nullptr);
  const auto got = to_host<float>(y, size_t(n * D)), slot = to_host<float>(y_slot, size_t(n * D));
  int order_matters = 0;
  for (int t = 0; t < n; ++t) {
    std::vector<int> ord(K);
    for (int k = 0; k < K; ++k) ord[size_t(k)] = k;
    std::stable_sort(ord.begin(), ord.end(), [&](int a, int b) { return ids[size_t(t * K + a)] < ids[size_t(t * K + b)]; });
    for (int64_t d0 = 0; d0 < D; ++d0) {
      float want = 0, in_slots = 0;
      for (int k : ord) want += ys[size_t((t * K + k) * D + d0)];
      for (int k = 0; k < K; ++k) in_slots += ys[size_t((t * K + k) * D + d0)];
      const size_t i = size_t(t * D + d0);
      ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << "D " << D << ", token " << t << " dim " << d0 << ": got " << got[i] << " want " << want;
      ASSERT_EQ(std::memcmp(&slot[i], &in_slots, 4), 0) << "D " << D << ", token " << t << " dim " << d0 << " (slot order)";
      order_matters += std::memcmp(&want, &in_slots, 4) != 0;
    }
  }
  EXPECT_GT(order_matters, 0) << "no element's sum depends on the order: the data cannot tell the orders apart";
}

// D = 300: blocks of 256 columns, the second partial (each block finds its token's order itself).
TEST_F(GpuTest, OfficialCombineSumsInExpertIdOrder) {
  for (const int64_t D : {int64_t(64), int64_t(300)}) check_official_combine(D);
}

TEST_F(GpuTest, RouterWarpMatchesBlockTwin) {
  Rng rng(4242);
  int cases = 0, wide = 0;  // wide: the fast kernel's wide form (route_wide_kernel: a thread per expert)
  struct Shape {
    int E, K, groups, topk_groups;
  };
  const Shape shapes[] = {{256, 6, 1, 1}, {256, 8, 8, 4}, {64, 6, 1, 1}, {96, 16, 1, 1}, {40, 32, 1, 1}, {512, 16, 16, 3},
                          {288, 1, 1, 1}, {32, 32, 4, 1}, {320, 6, 64, 2}};
  for (const Shape& sh : shapes)
    for (int n : {1, 3, 8, 13})
      for (int score = 0; score < 3; ++score)
        for (int hash = 0; hash < 2; ++hash) {
          const int E = sh.E, K = sh.K, V = 50;
          d::RouteArgs a;
          a.n = n, a.E = E, a.K = K, a.score = score, a.hash = hash;
          a.n_group = hash ? 1 : sh.groups, a.topk_group = hash ? 1 : sh.topk_groups;
          const int variant = rng.integer(0, 3);  // renorm / unfloored / naive softplus / fold
          a.renorm = variant != 1, a.unfloored = variant == 2, a.softplus_naive = variant == 3 && score == 0;
          a.fold = rng.integer(0, 1) ? 1.0f : 2.5f;
          // Logits: ordinary rows; a row on four levels with the bias on four levels (many exact ties); a row far
          // below zero (scores underflow to 0: all equal); a row far above zero; a row with NaN, +-inf and -0.
          std::vector<float> lg = rng.floats(size_t(n * E), -3.0f, 3.0f);
          for (int t = 0; t < n; ++t) {
            float* r = lg.data() + size_t(t) * E;
            switch (t % 5) {
              case 1:
                for (int e = 0; e < E; ++e) r[e] = 0.5f * float(rng.integer(0, 3));
                break;
              case 2:
                for (int e = 0; e < E; ++e) r[e] = -200.0f - float(rng.integer(0, 3));
                break;
              case 3:
                for (int e = 0; e < E; ++e) r[e] = 90.0f + float(rng.integer(0, 3));
                break;
              case 4:
                r[E / 3] = NAN, r[E / 2] = INFINITY, r[E - 1] = -INFINITY, r[1] = -0.0f, r[2] = NAN;
                break;
              default: break;
            }
          }
          std::vector<float> bias(static_cast<size_t>(E));
          for (int e = 0; e < E; ++e) bias[size_t(e)] = n % 2 ? 0.01f * float(rng.integer(0, 3)) : rng.uniform(-0.05f, 0.05f);
          std::vector<int32_t> tid2eid(static_cast<size_t>(V * K)), toks(static_cast<size_t>(n));
          for (auto& v : tid2eid) v = rng.integer(0, E - 1);
          for (auto& v : toks) v = rng.integer(0, V - 1);
          wide += d::route_wide_form(a) ? 1 : 0;
          const RouteOut w = run_route(a, lg, bias, tid2eid, toks, false), b = run_route(a, lg, bias, tid2eid, toks, true);
          const std::string tag = "E " + std::to_string(E) + " K " + std::to_string(K) + " groups " + std::to_string(a.n_group) + "/" +
                                  std::to_string(a.topk_group) + " n " + std::to_string(n) + " score " + std::to_string(score) +
                                  " hash " + std::to_string(hash) + " variant " + std::to_string(variant);
          ASSERT_TRUE(w.idx == b.idx) << tag << ": indices differ";
          ASSERT_EQ(0, std::memcmp(w.weight.data(), b.weight.data(), w.weight.size() * 4)) << tag << ": weights differ";
          if (!hash) {
            ASSERT_EQ(0, std::memcmp(w.select.data(), b.select.data(), w.select.size() * 4)) << tag << ": selection scores differ";
          }
          ++cases;
        }
  std::printf("  router warp kernel vs block kernel: %d cases bit-identical (%d of them on the fast kernel's wide form)\n", cases,
              wide);
  EXPECT_GT(wide, 0) << "no case ran the fast kernel's wide form (a thread per expert)";
}

// The decode launches fused in session 5 against the separate launches they replace, bit for bit: several matrices
// over one input row in one launch (fwd_linear_one_multi) vs fwd_linear per matrix; norm + RoPE (fwd_rms_norm_rope)
// vs fwd_rms_norm then fwd_rope; the norm's f16 copy vs launch_to_f16 of its result; the inverse RoPE with its f16
// copy (fwd_rope_f16) vs fwd_rope then launch_to_f16; norm + RoPE over many rows (a warp per row) vs the same
// separate launches; norm + RoPE with a second set of rows rotated in the same launch (RopeRows) vs two launches.
TEST_F(GpuTest, FusedDecodeOpsMatchSeparateLaunches) {
  Rng rng(41);

  // 1. One token through three matrices (bf16 [40, 256], f32 [16, 256], bf16 [6, 256]) in one launch.
  const int64_t K = 256;
  const int64_t rows[3] = {40, 16, 6};
  const int dtypes[3] = {1, 0, 1};
  std::vector<DeviceBuffer> w(3), ya(3), yb(3);
  d::LinearSegs g;
  for (int i = 0; i < 3; ++i) {
    const auto vals = rng.floats(size_t(rows[i] * K), -1.0f, 1.0f);
    if (dtypes[i] == 1) {
      std::vector<uint16_t> b16(vals.size());
      for (size_t j = 0; j < vals.size(); ++j) b16[j] = plumb::fmt8::f32_to_bf16(vals[j]);
      w[size_t(i)] = to_device(b16);
    } else {
      w[size_t(i)] = to_device(vals);
    }
    ya[size_t(i)] = DeviceBuffer(size_t(rows[i]) * 4), yb[size_t(i)] = DeviceBuffer(size_t(rows[i]) * 4);
    d::DMat m;
    m.w = w[size_t(i)].get(), m.rows = rows[i], m.cols = K, m.layout = 0, m.dtype = dtypes[i];
    ASSERT_TRUE(d::fwd_linear_one_fits(m));
    g.add(m, ya[size_t(i)].as<float>());
  }
  DeviceBuffer x = to_device(rng.floats(size_t(K), -2.0f, 2.0f));
  d::fwd_linear_one_multi(g, x.as<float>(), nullptr);
  for (int i = 0; i < 3; ++i) {
    d::fwd_linear(g.seg[i].w, x.as<float>(), 1, K, 0, rows[i], yb[size_t(i)].as<float>(), rows[i], nullptr);
    expect_same_bytes(ya[size_t(i)], yb[size_t(i)], size_t(rows[i]) * 4, "fwd_linear_one_multi");
  }

  // 2-4. Rows of 64 values (6 rows, 3 per position), RoPE on the last 16 dims at device position 37.
  const int64_t R = 6, dim = 64, off = 48, per_pos = 3;
  const int half = int((dim - off) / 2);
  const auto v = rng.floats(size_t(R * dim), -3.0f, 3.0f);
  DeviceBuffer nw = to_device(rng.floats(size_t(dim), 0.5f, 1.5f)), inv = to_device(rng.floats(size_t(half), 0.001f, 1.0f));
  DeviceBuffer pos = to_device(std::vector<int64_t>{37});
  for (const float* wn : {static_cast<const float*>(nw.as<float>()), static_cast<const float*>(nullptr)}) {
    DeviceBuffer a = to_device(v), b = to_device(v), a16(size_t(R * dim) * 2), b16(size_t(R * dim) * 2);
    d::fwd_rms_norm_rope(a.as<float>(), R, dim, wn, 1e-6, off, half, inv.as<float>(), 1.0f, pos.as<int64_t>(), per_pos, nullptr);
    d::fwd_rms_norm(b.as<float>(), R, dim, dim, wn, 1e-6, nullptr);
    d::fwd_rope(b.as<float>(), R, dim, off, half, inv.as<float>(), 1.0f, pos.as<int64_t>(), 0, per_pos, 1, 0, nullptr);
    expect_same_bytes(a, b, size_t(R * dim) * 4, "fwd_rms_norm_rope");

    DeviceBuffer c = to_device(v), e = to_device(v);
    d::fwd_rms_norm(c.as<float>(), R, dim, dim, wn, 1e-6, nullptr, a16.as<uint16_t>());
    d::fwd_rms_norm(e.as<float>(), R, dim, dim, wn, 1e-6, nullptr);
    d::launch_to_f16(e.get(), d::kF32, int(R), dim, dim, b16.as<uint16_t>(), nullptr);
    expect_same_bytes(c, e, size_t(R * dim) * 4, "fwd_rms_norm with out16 (f32 result)");
    expect_same_bytes(a16, b16, size_t(R * dim) * 2, "fwd_rms_norm's f16 copy");
  }
  DeviceBuffer a = to_device(v), b = to_device(v), a16(size_t(R * dim) * 2), b16(size_t(R * dim) * 2);
  d::fwd_rope_f16(a.as<float>(), R, dim, off, inv.as<float>(), 1.0f, pos.as<int64_t>(), per_pos, 1, a16.as<uint16_t>(), nullptr);
  d::fwd_rope(b.as<float>(), R, dim, off, half, inv.as<float>(), 1.0f, pos.as<int64_t>(), 0, per_pos, 1, 1, nullptr);
  d::launch_to_f16(b.get(), d::kF32, int(R), dim, dim, b16.as<uint16_t>(), nullptr);
  expect_same_bytes(a, b, size_t(R * dim) * 4, "fwd_rope_f16 (f32 rows)");
  expect_same_bytes(a16, b16, size_t(R * dim) * 2, "fwd_rope_f16's f16 copy");

  // 5. Norm + RoPE over many rows (a warp per row: the query heads of a batch) against the block-per-row norm and
  // RoPE: rows not a multiple of 8 blocks' rows, rows shorter than a warp's first pass, not a multiple of 32, and
  // 1024 long; with and without weights.
  for (const int64_t dm : {int64_t(512), int64_t(96), int64_t(1000), int64_t(1024)}) {
    const int64_t RR = 1043, of = dm - 64, pp = 64;
    const auto vv = rng.floats(size_t(RR * dm), -3.0f, 3.0f);
    DeviceBuffer nw2 = to_device(rng.floats(size_t(dm), 0.5f, 1.5f)), inv2 = to_device(rng.floats(32, 0.001f, 1.0f));
    for (const float* wn : {static_cast<const float*>(nw2.as<float>()), static_cast<const float*>(nullptr)}) {
      DeviceBuffer a2 = to_device(vv), b2 = to_device(vv);
      d::fwd_rms_norm_rope(a2.as<float>(), RR, dm, wn, 1e-6, of, 32, inv2.as<float>(), 1.0f, pos.as<int64_t>(), pp, nullptr);
      d::fwd_rms_norm(b2.as<float>(), RR, dm, dm, wn, 1e-6, nullptr);
      d::fwd_rope(b2.as<float>(), RR, dm, of, 32, inv2.as<float>(), 1.0f, pos.as<int64_t>(), 0, pp, 1, 0, nullptr);
      const std::string what = fmt::format("fwd_rms_norm_rope, {} rows of {}{}", RR, dm, wn ? "" : ", no weight");
      expect_same_bytes(a2, b2, size_t(RR * dm) * 4, what);
    }
  }

  // 6. Norm + RoPE of the query heads with the indexer query's RoPE in the same launch (RopeRows) against the two
  // launches: 1 and 3 tokens (one launch), 8 (512 rows: the warp kernel, then the RoPE launch).
  for (const int nt : {1, 3, 8}) {
    const int64_t qr = nt * 64, qd = 512, ir = nt * 64, id = 128;
    const auto qv = rng.floats(size_t(qr * qd), -3.0f, 3.0f), iv = rng.floats(size_t(ir * id), -3.0f, 3.0f);
    DeviceBuffer inv3 = to_device(rng.floats(32, 0.001f, 1.0f));
    DeviceBuffer qa = to_device(qv), qb = to_device(qv), ia = to_device(iv), ib = to_device(iv);
    d::RopeRows rr;
    rr.x = ia.as<float>(), rr.rows = ir, rr.ld = id, rr.off = id - 64, rr.half = 32, rr.per_pos = 64;
    d::fwd_rms_norm_rope(qa.as<float>(), qr, qd, nullptr, 1e-6, qd - 64, 32, inv3.as<float>(), 1.0f, pos.as<int64_t>(), 64, nullptr, &rr);
    d::fwd_rms_norm_rope(qb.as<float>(), qr, qd, nullptr, 1e-6, qd - 64, 32, inv3.as<float>(), 1.0f, pos.as<int64_t>(), 64, nullptr);
    d::fwd_rope(ib.as<float>(), ir, id, id - 64, 32, inv3.as<float>(), 1.0f, pos.as<int64_t>(), 0, 64, 1, 0, nullptr);
    expect_same_bytes(qa, qb, size_t(qr * qd) * 4, "norm + RoPE with RopeRows, " + std::to_string(nt) + " tokens: the normed rows");
    expect_same_bytes(ia, ib, size_t(ir * id) * 4, "norm + RoPE with RopeRows, " + std::to_string(nt) + " tokens: the RoPE rows");
  }
}

// Window w's entry as compressor.h defines it, on the host from every position's rows (kv, gate: [width] each):
// softmax pooling over the series (the previous window's first half with CSA's overlap, then the window's own
// slots, gate + ape), RMSNorm with `norm`, RoPE of the last 2 * rope_half dims at position w * m (reference numerics).
std::vector<float> host_compressed_entry(const std::vector<std::vector<float>>& kv, const std::vector<std::vector<float>>& gate,
                                         const std::vector<float>& ape, const std::vector<float>& norm, const std::vector<float>& inv,
                                         int overlap, int m, int64_t c, int64_t w, int rope_half, double eps) {
  const int64_t width = overlap ? 2 * c : c;
  std::vector<float> e(static_cast<size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch) {
    std::vector<float> g, v;
    if (overlap && w > 0)
      for (int s = 0; s < m; ++s) {
        const size_t q = size_t((w - 1) * m + s);
        g.push_back(gate[q][size_t(ch)] + ape[size_t(s * width + ch)]), v.push_back(kv[q][size_t(ch)]);
      }
    const int64_t off = overlap ? c : 0;
    for (int r = 0; r < m; ++r) {
      const size_t q = size_t(w * m + r);
      g.push_back(gate[q][size_t(off + ch)] + ape[size_t(r * width + off + ch)]), v.push_back(kv[q][size_t(off + ch)]);
    }
    const float mx = *std::max_element(g.begin(), g.end());
    double sum = 0;
    for (const float x : g) sum += double(std::exp(x - mx));
    float acc = 0;
    for (size_t s = 0; s < g.size(); ++s) acc += float(double(std::exp(g[s] - mx)) / sum) * v[s];
    e[size_t(ch)] = acc;
  }
  double ss = 0;
  for (const float x : e) ss += double(x) * x;
  const float inv_rms = float(1.0 / std::sqrt(ss / double(c) + eps));
  for (int64_t ch = 0; ch < c; ++ch) e[size_t(ch)] = norm[size_t(ch)] * (e[size_t(ch)] * inv_rms);
  for (int k = 0; k < rope_half; ++k) {
    const size_t i = size_t(c - 2 * rope_half + 2 * k);
    const float ang = float(w * m) * inv[size_t(k)], co = std::cos(ang), si = std::sin(ang), a = e[i], b = e[i + 1];
    e[i] = a * co - b * si, e[i + 1] = b * co + a * si;
  }
  return e;
}

// The compressor's one-token launch against the four launches it replaces (pool, finish, carry, stash), bit for bit,
// and (reference numerics) each completed entry against the host's: single-token steps through several windows
// (CSA's overlapping series with m 4, HCA's with m 8 and with m 40, whose windows the batched pool reads from
// memory, 16 slots per batch and a partial last one; series longer than the kernels' slot table: m 300, and 130
// overlapping; the official numerics' bf16 stores, with the indexer's rotation and with the FP8 KV simulation), the
// entries, the pending ring and the previous window's series compared after every step. Then the same windows fed
// as whole-window chunks (m rows from a window boundary, cuda.comp_deferred's chunks), which take the one launch too.
TEST_F(GpuTest, CompressOneLaunchMatchesSeparateLaunches) {
  Rng rng(77);
  struct Case {
    int overlap, m;
    int64_t c;
    int official, rotate, kv_fp8;
  };
  for (const Case& k : {Case{1, 4, 64, 0, 0, 0}, Case{0, 8, 32, 0, 0, 0}, Case{0, 40, 32, 0, 0, 0}, Case{1, 4, 128, 1, 1, 0},
                        Case{0, 4, 128, 1, 0, 1}, Case{0, 300, 32, 0, 0, 0}, Case{1, 130, 32, 0, 0, 0}, Case{1, 4, 512, 0, 0, 0}}) {
    const int64_t width = k.overlap ? 2 * k.c : k.c, steps = 3 * k.m + 2, cap = steps / k.m + 1;
    const int rope_half = 8;
    const auto ape_h = rng.floats(size_t(k.m * width), -0.5f, 0.5f), norm_h = rng.floats(size_t(k.c), 0.5f, 1.5f);
    const auto inv_h = rng.floats(size_t(rope_half), 0.01f, 1.0f);
    DeviceBuffer ape = to_device(ape_h), norm = to_device(norm_h), inv = to_device(inv_h), pos(8);
    std::vector<std::vector<float>> kv_h, gate_h;  // every position's rows
    for (int64_t t = 0; t < steps; ++t)
      kv_h.push_back(rng.floats(size_t(width), -2.0f, 2.0f)), gate_h.push_back(rng.floats(size_t(width), -2.0f, 2.0f));
    for (const int chunk : {1, k.m}) {
      struct State {
        DeviceBuffer pk, pg, vk, vg, e;
      };
      std::vector<State> st(2);
      for (State& s : st) {
        s.pk = DeviceBuffer(size_t(k.m * width) * 4), s.pg = DeviceBuffer(size_t(k.m * width) * 4);
        s.vk = DeviceBuffer(size_t(k.m * k.c) * 4), s.vg = DeviceBuffer(size_t(k.m * k.c) * 4), s.e = DeviceBuffer(size_t(cap * k.c) * 4);
        for (DeviceBuffer* b : {&s.pk, &s.pg, &s.vk, &s.vg, &s.e}) b->fill_byte(0);
      }
      // (whole windows only: the two rows past the third window are single-token steps' alone)
      for (int64_t t = 0; t + chunk <= steps; t += chunk) {
        std::vector<float> kv_rows, gate_rows;
        for (int64_t q = t; q < t + chunk; ++q) {
          kv_rows.insert(kv_rows.end(), kv_h[size_t(q)].begin(), kv_h[size_t(q)].end());
          gate_rows.insert(gate_rows.end(), gate_h[size_t(q)].begin(), gate_h[size_t(q)].end());
        }
        DeviceBuffer kv = to_device(kv_rows), gate = to_device(gate_rows);
        pos.upload(&t, 8);
        for (int i = 0; i < 2; ++i) {
          d::CompressArgs a;
          a.rows_kv = kv.as<float>(), a.rows_gate = gate.as<float>();
          a.pend_kv = st[size_t(i)].pk.as<float>(), a.pend_gate = st[size_t(i)].pg.as<float>();
          a.prev_kv = st[size_t(i)].vk.as<float>(), a.prev_gate = st[size_t(i)].vg.as<float>();
          a.ape = ape.as<float>(), a.norm = norm.as<float>(), a.inv_freq = inv.as<float>(), a.pos = pos.as<int64_t>();
          a.n = chunk, a.overlap = k.overlap, a.m = k.m, a.nw_max = (t + chunk) % k.m == 0 ? 1 : 0, a.rope_half = rope_half;
          a.c = k.c, a.eps = 1e-6, a.attention_factor = 1.0f, a.entries = st[size_t(i)].e.as<float>();
          a.official = k.official, a.rotate = k.rotate, a.kv_fp8 = k.kv_fp8, a.one_launch = i == 0;
          a.whole_window = chunk == k.m && i == 0;
          d::fwd_compress(a, nullptr);
        }
        const int64_t last = t + chunk - 1;
        const std::string what = "overlap " + std::to_string(k.overlap) + ", m " + std::to_string(k.m) + ", official " +
                                 std::to_string(k.official) + ", chunk " + std::to_string(chunk) + ", step " + std::to_string(last);
        for (const auto& [x, y, name] : {std::tuple{&st[0].e, &st[1].e, "entries"}, {&st[0].pk, &st[1].pk, "pending kv"},
                                         {&st[0].pg, &st[1].pg, "pending gate"}, {&st[0].vk, &st[1].vk, "previous kv"},
                                         {&st[0].vg, &st[1].vg, "previous gate"}})
          expect_same_bytes(*x, *y, x->bytes(), what + ": " + name);
        if ((last + 1) % k.m == 0 && !k.official) {  // window w completed: its entry against the host's (sums in other orders)
          const int64_t w = (last + 1) / k.m - 1;
          const auto want = host_compressed_entry(kv_h, gate_h, ape_h, norm_h, inv_h, k.overlap, k.m, k.c, w, rope_half, 1e-6);
          const auto got = to_host<float>(st[0].e, size_t((w + 1) * k.c));
          for (int64_t ch = 0; ch < k.c; ++ch) {
            const float g = got[size_t(w * k.c + ch)], r = want[size_t(ch)];
            ASSERT_LE(std::fabs(g - r), 2e-5 * std::max(1.0f, std::fabs(r))) << what << ": entry " << w << ", channel " << ch << " got " << g << " want " << r;
          }
        }
      }
      // The windows were pooled: three entries written, the fourth slot untouched.
      const auto e = to_host<float>(st[0].e, size_t(cap * k.c));
      double mag = 0, rest = 0;
      for (int64_t j = 0; j < cap * k.c; ++j) (j < 3 * k.c ? mag : rest) += std::fabs(double(e[size_t(j)]));
      EXPECT_GT(mag, 0.0) << "no entry was written (chunk " << chunk << ")";
      EXPECT_EQ(rest, 0.0) << "an entry past the completed windows was written (chunk " << chunk << ")";
    }
  }
}

// Plain weights [rows, cols] on the device, dtype 0 (f32), 1 (bf16) or 2 (f16: sign, exponent 10..17, any
// mantissa); *vals gets their exact values.
DeviceBuffer plain_weights(Rng& rng, int dtype, int64_t rows, int64_t cols, std::vector<float>* vals) {
  const size_t n = size_t(rows * cols);
  vals->resize(n);
  if (dtype == 0) {
    *vals = rng.floats(n, -1.0f, 1.0f);
    return to_device(*vals);
  }
  std::vector<uint16_t> h(n);
  for (size_t j = 0; j < n; ++j) {
    if (dtype == 1) {
      h[j] = plumb::fmt8::f32_to_bf16(rng.uniform(-1.0f, 1.0f));
      (*vals)[j] = plumb::fmt8::bf16_to_f32(h[j]);
    } else {
      h[j] = uint16_t((rng.integer(0, 1) << 15) | (rng.integer(10, 17) << 10) | rng.integer(0, 1023));
      (*vals)[j] = plumb::fmt8::f16_to_f32(h[j]);
    }
  }
  return to_device(h);
}

// fwd_linear's output for n tokens (rows [r0, r0 + nr) of the [., cols] weights wv, x rows ldx apart, y rows ldy
// apart) against the host: fp64 sums of the exact products rounded to float. The sums' orders differ, so a value
// may differ by one ulp where its sum lies next to a rounding boundary; at least 99 % must match exactly.
void expect_linear_matches_host(const std::string& what, const std::vector<float>& wv, int64_t cols, int64_t r0, int64_t nr,
                                const std::vector<float>& xv, int n, int64_t ldx, const std::vector<float>& got, int64_t ldy) {
  int64_t exact = 0;
  for (int t = 0; t < n; ++t)
    for (int64_t r = 0; r < nr; ++r) {
      double s = 0;
      for (int64_t k = 0; k < cols; ++k) s += double(wv[size_t((r0 + r) * cols + k)]) * double(xv[size_t(t * ldx + k)]);
      const float want = float(s), g = got[size_t(t * ldy + r)];
      exact += g == want;
      ASSERT_LE(std::fabs(double(g) - double(want)), double(std::nextafter(std::fabs(want), INFINITY) - std::fabs(want)))
          << what << ": token " << t << ", row " << r << " got " << g << " want " << want;
    }
  EXPECT_GE(double(exact), 0.99 * double(n * nr)) << what << ": " << exact << " of " << n * nr << " values exact";
}

// fwd_linear for 2 to 130 tokens against the host: fp64 sums of the exact products rounded to float, within one ulp
// and nearly every value exact. Columns a multiple of 32 take the fp64 tensor-core kernel (every plain dtype; row
// counts and offsets off the 8-row tiles, partial 32-token tiles, strided x and y rows); others linear_kernel
// (token groups of 8; rows split over 4 warps, or a warp per row): 16-byte rows (bf16 with 1032 columns) and rows
// that are not (f32 with 257 columns: element by element), and x rows not 16-byte aligned (ldx 4097).
TEST_F(GpuTest, SmallBatchLinearMatchesHost) {
  Rng rng(98);
  struct Case {
    int dtype, n;
    int64_t rows, cols, r0, nr, ldx, ldy;
  };
  const Case cases[] = {{1, 2, 256, 4096, 0, 256, 4096, 256}, {1, 8, 64, 4096, 0, 64, 4160, 70}, {0, 13, 37, 1024, 3, 31, 1024, 40},
                        {2, 5, 9, 2048, 1, 7, 2048, 7},       {0, 3, 11, 257, 0, 11, 260, 11},
                        // enough blocks with a warp per row: that layout (aligned rows, and f32 rows of 257)
                        {1, 16, 600, 1032, 0, 600, 1032, 600}, {0, 20, 600, 257, 0, 600, 257, 600},
                        // the fp64 tensor-core kernel at batch sizes (the router gate at 32 and 128 tokens; partial tiles)
                        {1, 32, 256, 4096, 0, 256, 4096, 256}, {1, 128, 256, 4096, 0, 256, 4096, 256},
                        {0, 33, 64, 4096, 0, 64, 4100, 64},    {2, 130, 45, 512, 5, 38, 520, 41},
                        {1, 40, 13, 32, 0, 13, 36, 16},        {1, 9, 64, 4096, 0, 64, 4097, 64}};
  for (const Case& c : cases) {
    std::vector<float> wv;
    DeviceBuffer w = plain_weights(rng, c.dtype, c.rows, c.cols, &wv);
    const auto xv = rng.floats(size_t(c.n) * size_t(c.ldx), -2.0f, 2.0f);
    DeviceBuffer x = to_device(xv), y(size_t(c.n) * size_t(c.ldy) * 4);
    y.fill_byte(0xFF);
    d::DMat m;
    m.w = w.get(), m.rows = c.rows, m.cols = c.cols, m.layout = 0, m.dtype = c.dtype;
    d::fwd_linear(m, x.as<float>(), c.n, c.ldx, c.r0, c.nr, y.as<float>(), c.ldy, nullptr);
    const auto got = to_host<float>(y, size_t(c.n) * size_t(c.ldy));
    const std::string what = "dtype " + std::to_string(c.dtype) + " n " + std::to_string(c.n) + " [" + std::to_string(c.rows) +
                             ", " + std::to_string(c.cols) + "]";
    expect_linear_matches_host(what, wv, c.cols, c.r0, c.nr, xv, c.n, c.ldx, got, c.ldy);
    if (c.ldy > c.nr) {  // nothing past the rows
      uint32_t bits;
      std::memcpy(&bits, &got[size_t(c.nr)], 4);
      EXPECT_EQ(bits, 0xFFFFFFFFu) << "dtype " << c.dtype << " n " << c.n << ": written past the rows";
    }
  }
}

// The indexed linear (the routed experts' twin: a slot per grid row) past grid.y's 65535: a step of n tokens x
// top-k slots can have more (8192 tokens x top-8), so the launcher splits the slots into launches of whole input
// rows. 70001 slots over 3 f32 matrices, 7 slots per input row (a chunk of 65534 slots: 9362 rows), every slot
// against the host's fp64 sum, and nothing written past the last slot.
TEST_F(GpuTest, IndexedLinearTakesMoreSlotsThanAGridRow) {
  Rng rng(99);
  const int E = 3, x_div = 7, nslots = 70001, xrows = (nslots + x_div - 1) / x_div;
  const int64_t rows = 5, cols = 24;
  std::vector<std::vector<float>> wv(E);
  std::vector<DeviceBuffer> w;
  std::vector<d::DMat> mats(E);
  for (int e = 0; e < E; ++e) {
    w.push_back(plain_weights(rng, 0, rows, cols, &wv[size_t(e)]));
    mats[size_t(e)].w = w.back().get(), mats[size_t(e)].rows = rows, mats[size_t(e)].cols = cols;
  }
  std::vector<int32_t> idx(static_cast<size_t>(nslots));
  for (auto& i : idx) i = rng.integer(0, E - 1);
  const auto xv = rng.floats(size_t(xrows) * size_t(cols), -2.0f, 2.0f);
  DeviceBuffer dm = to_device(mats), di = to_device(idx), x = to_device(xv), y(size_t(nslots + 1) * size_t(rows) * 4);
  y.fill_byte(0xFF);
  d::fwd_linear_indexed(dm.as<d::DMat>(), di.as<int32_t>(), nslots, x_div, x.as<float>(), cols, rows, cols, y.as<float>(), rows,
                        nullptr);
  const auto got = to_host<float>(y, size_t(nslots + 1) * size_t(rows));
  int64_t bad = 0;
  for (int sl = 0; sl < nslots; ++sl)
    for (int64_t r = 0; r < rows; ++r) {
      const float* W = wv[size_t(idx[size_t(sl)])].data() + r * cols;
      const float* xs = xv.data() + int64_t(sl / x_div) * cols;
      double acc = 0;
      for (int64_t c = 0; c < cols; ++c) acc += double(xs[c]) * double(W[c]);
      const float g = got[size_t(sl) * size_t(rows) + size_t(r)];
      if (std::fabs(double(g) - acc) > 1e-5 * std::max(1.0, std::fabs(acc)) && bad++ < 5)
        ADD_FAILURE() << "slot " << sl << " (chunk " << sl / 65534 << ") row " << r << ": " << g << " vs " << acc;
    }
  EXPECT_EQ(bad, 0);
  uint32_t bits;
  std::memcpy(&bits, &got[size_t(nslots) * size_t(rows)], 4);
  EXPECT_EQ(bits, 0xFFFFFFFFu) << "written past the last slot";
}

// bench --skeleton's SkipWeightsScope: fwd_linear (the one-token kernel at 1 token, the fp64 tensor cores at 8) launches
// nothing while it lives, nested scopes restore the outer setting, and after it the same call writes its rows.
TEST_F(GpuTest, SkipWeightsScopeSkipsTheLinears) {
  Rng rng(5);
  const int64_t rows = 64, cols = 256;
  std::vector<float> wv;
  DeviceBuffer w = plain_weights(rng, 1, rows, cols, &wv);
  d::DMat m;
  m.w = w.get(), m.rows = rows, m.cols = cols, m.layout = 0, m.dtype = 1;
  for (int n : {1, 8}) {
    DeviceBuffer x = to_device(rng.floats(size_t(n * cols), -1.0f, 1.0f)), y(size_t(n * rows) * 4);
    y.fill_byte(0xFF);
    auto run = [&] { d::fwd_linear(m, x.as<float>(), n, cols, 0, rows, y.as<float>(), rows, nullptr); };
    {
      d::SkipWeightsScope skip(true);
      run();
      {
        d::SkipWeightsScope inner(false);
        EXPECT_FALSE(d::weights_skipped());
      }
      EXPECT_TRUE(d::weights_skipped());
      run();
    }
    EXPECT_FALSE(d::weights_skipped());
    plumb::cuda::synchronize();
    auto words = to_host<uint32_t>(y, size_t(n * rows));
    EXPECT_EQ(std::count(words.begin(), words.end(), 0xFFFFFFFFu), std::ptrdiff_t(words.size())) << n << " tokens: written while skipped";
    run();
    plumb::cuda::synchronize();
    const auto vals = to_host<float>(y, size_t(n * rows));
    EXPECT_EQ(std::count_if(vals.begin(), vals.end(), [](float v) { return std::isfinite(v); }), std::ptrdiff_t(vals.size()))
        << n << " tokens: not written after the scope";
  }
}

// The one-token GEMV (fwd_linear with one token; its persistent grid, the pair-major staged row, the rounds and
// their prefetch) against the host: fp64 sums of the exact products, rounded to float. The sums' orders differ,
// so a row may differ by one ulp where its sum lies next to a rounding boundary; nearly every row must match
// exactly. Shapes: fewer pairs of rows than blocks, several pairs per block (3001 rows), three and six rounds per
// lane (12288 columns) with a row offset and an odd row count. Then several bf16 matrices in one launch
// (fwd_linear_one_multi) bit for bit against fwd_linear per matrix for one token, and 2-4 tokens over three
// matrices (linear16_multi_kernel: cuda.comp_deferred's windows) against a one-token launch per token, bit for bit:
// bf16 at 1024, 4096, 7168 and 12288 columns (the last two in launches of 3 + 1 and 2 + 2 tokens), f32 and f16 at
// 4096.
TEST_F(GpuTest, OneTokenLinearMatchesHost) {
  Rng rng(97);
  struct Case {
    int dtype;
    int64_t rows, cols, r0, nr;
  };
  const Case cases[] = {{1, 5, 256, 0, 5},     {0, 5, 256, 0, 5},     {2, 5, 256, 0, 5},       {1, 3001, 4096, 0, 3001},
                        {1, 37, 12288, 3, 30}, {0, 37, 12288, 3, 31}, {2, 37, 12288, 3, 31}};
  for (const Case& c : cases) {
    std::vector<float> wv;
    DeviceBuffer w = plain_weights(rng, c.dtype, c.rows, c.cols, &wv);
    const auto xv = rng.floats(size_t(c.cols), -2.0f, 2.0f);
    DeviceBuffer x = to_device(xv), y(size_t(c.nr) * 4);
    d::DMat m;
    m.w = w.get(), m.rows = c.rows, m.cols = c.cols, m.layout = 0, m.dtype = c.dtype;
    ASSERT_TRUE(d::fwd_linear_one_fits(m));
    d::fwd_linear(m, x.as<float>(), 1, c.cols, c.r0, c.nr, y.as<float>(), c.nr, nullptr);
    const auto got = to_host<float>(y, size_t(c.nr));
    const std::string what = "dtype " + std::to_string(c.dtype) + " [" + std::to_string(c.rows) + ", " + std::to_string(c.cols) +
                             "] r0 " + std::to_string(c.r0);
    expect_linear_matches_host(what, wv, c.cols, c.r0, c.nr, xv, 1, c.cols, got, c.nr);
  }

  const int64_t K = 1024, rows[3] = {40, 1000, 7};
  std::vector<DeviceBuffer> w(3), ya(3), yb(3);
  d::LinearSegs g;
  for (int i = 0; i < 3; ++i) {
    std::vector<float> vals;
    w[size_t(i)] = plain_weights(rng, 1, rows[i], K, &vals);
    ya[size_t(i)] = DeviceBuffer(size_t(rows[i]) * 4), yb[size_t(i)] = DeviceBuffer(size_t(rows[i]) * 4);
    d::DMat m;
    m.w = w[size_t(i)].get(), m.rows = rows[i], m.cols = K, m.layout = 0, m.dtype = 1;
    g.add(m, ya[size_t(i)].as<float>());
  }
  DeviceBuffer x = to_device(rng.floats(size_t(K), -2.0f, 2.0f));
  d::fwd_linear_one_multi(g, x.as<float>(), nullptr);
  for (int i = 0; i < 3; ++i) {
    d::fwd_linear(g.seg[i].w, x.as<float>(), 1, K, 0, rows[i], yb[size_t(i)].as<float>(), rows[i], nullptr);
    const auto a = to_host<float>(ya[size_t(i)], size_t(rows[i])), b = to_host<float>(yb[size_t(i)], size_t(rows[i]));
    for (int64_t r = 0; r < rows[i]; ++r)
      ASSERT_EQ(std::memcmp(&a[size_t(r)], &b[size_t(r)], 4), 0) << "bf16 segment " << i << " row " << r << ": one launch "
                                                                   << a[size_t(r)] << ", per matrix " << b[size_t(r)];
  }

  // (bf16 at 1024 and 4096 columns, V4-Pro's 7168 (3 tokens per launch, then 1) and 12288 (2 and 2); f32 and f16
  // at 4096; three segments: pairs of rows of one block's step span segments, and a segment ends in half a pair)
  struct Multi {
    int dtype;
    int64_t cols;
  };
  for (const Multi mc : {Multi{1, 1024}, Multi{1, 4096}, Multi{1, 7168}, Multi{1, 12288}, Multi{0, 4096}, Multi{2, 4096}})
    for (const int ntok : {2, 3, 4}) {
      const int64_t cols = mc.cols, mrows[3] = {1024, 37, 6};
      std::vector<DeviceBuffer> mw(3), my(3);
      d::LinearSegs mg;
      mg.ntok = ntok, mg.ldx = cols;
      for (int i = 0; i < 3; ++i) {
        std::vector<float> vals;
        mw[size_t(i)] = plain_weights(rng, mc.dtype, mrows[i], cols, &vals);
        my[size_t(i)] = DeviceBuffer(size_t(ntok) * size_t(mrows[i]) * 4);
        d::DMat m;
        m.w = mw[size_t(i)].get(), m.rows = mrows[i], m.cols = cols, m.layout = 0, m.dtype = mc.dtype;
        mg.add(m, my[size_t(i)].as<float>());
        mg.seg[i].ldy = mrows[i];
      }
      DeviceBuffer xs = to_device(rng.floats(size_t(ntok) * size_t(cols), -2.0f, 2.0f));
      d::fwd_linear_one_multi(mg, xs.as<float>(), nullptr);
      for (int i = 0; i < 3; ++i) {
        const auto all = to_host<float>(my[size_t(i)], size_t(ntok) * size_t(mrows[i]));
        DeviceBuffer one(size_t(mrows[i]) * 4);
        for (int t = 0; t < ntok; ++t) {
          d::fwd_linear(mg.seg[i].w, xs.as<float>() + t * cols, 1, cols, 0, mrows[i], one.as<float>(), mrows[i], nullptr);
          const auto b = to_host<float>(one, size_t(mrows[i]));
          for (int64_t r = 0; r < mrows[i]; ++r)
            ASSERT_EQ(std::memcmp(&all[size_t(t * mrows[i] + r)], &b[size_t(r)], 4), 0)
                << ntok << " tokens, dtype " << mc.dtype << ", " << cols << " columns, segment " << i << ", token " << t << ", row " << r << ": one launch "
                << all[size_t(t * mrows[i] + r)] << ", the token alone " << b[size_t(r)];
        }
      }
    }
  d::LinearSegs bad = g;  // 5 tokens: more than a launch takes
  bad.ntok = 5, bad.ldx = K;
  EXPECT_THROW(d::fwd_linear_one_multi(bad, x.as<float>(), nullptr), std::runtime_error);
}

}  // namespace
