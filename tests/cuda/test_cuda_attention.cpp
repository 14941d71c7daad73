// Sparse decode attention on the GPU: the split-K patch (attn.splitk_decode, fwd_attn_splitk.cu) against the unsplit
// twin (fwd_attend) and both against an fp64 softmax on the host, over sliding, HCA (long: 8K entries; the twin's
// rounds: 40K) and CSA (selection holes) key lists, decode and prefill sizes, head counts that fill or leave part
// of a 16-head block, logits large enough that the running max moves; the split plan's invariance: a query gives the same bits whether
// its splits are sized by this step's keys or by a larger bound (what a captured graph uses); and (printed, not
// asserted) the kernels' times at the model's decode shape. attn.splitk_f16 (f16 tensor-core products) against
// the host and the fp64 split kernel, and its plan invariance.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <set>

#include "cuda/fwd_kernels.h"
#include "cuda_test_util.h"

namespace {

using plumb_cuda_test::Cmp;
using plumb_cuda_test::compare;
using namespace plumb_cuda_test::kernels;

struct AttnCase {
  const char* name;
  int type;  // 0 sliding, 1 CSA, 2 HCA
  int n, Hq;
  int64_t Dh, window, pos0, rate, ne, ksel;
  float qscale;  // logit magnitude: large values saturate the softmax and move the running max across tiles
};

struct Data {
  std::vector<float> q, kv, ring, entries, sink;
  std::vector<int64_t> sel;
};

Data make_data(const AttnCase& c, uint32_t seed) {
  Rng rng(seed);
  Data x;
  x.q = rng.floats(size_t(c.n * c.Hq * c.Dh), -c.qscale, c.qscale);
  x.kv = rng.floats(size_t(c.n * c.Dh), -1.0f, 1.0f);
  x.ring = rng.floats(size_t(c.window * c.Dh), -1.0f, 1.0f);
  x.entries = rng.floats(size_t(std::max<int64_t>(c.ne, 1) * c.Dh), -1.0f, 1.0f);
  x.sink = rng.floats(size_t(c.Hq), -2.0f, 2.0f);
  if (c.type == 1) {  // distinct visible entries per token, some slots -1 (holes), in place as the indexer leaves them
    x.sel.assign(size_t(c.n * c.ksel), -1);
    for (int t = 0; t < c.n; ++t) {
      const int64_t visible = std::min((c.pos0 + t + 1) / c.rate, c.ne);
      for (int64_t j = 0; j < c.ksel && j < visible; ++j)
        if (rng.integer(0, 9) != 0) x.sel[size_t(t * c.ksel + j)] = rng.integer(0, int(visible - 1));
    }
  }
  return x;
}

// fp64 softmax with the sink over the query's keys (KeyList's order: window, then entries / selection slots).
std::vector<float> host_attention(const AttnCase& c, const Data& x) {
  std::vector<float> out(size_t(c.n * c.Hq * c.Dh));
  const float scale = 1.0f / std::sqrt(float(c.Dh));
  for (int t = 0; t < c.n; ++t) {
    const int64_t p = c.pos0 + t, ws = std::max<int64_t>(0, p - c.window + 1);
    std::vector<const float*> keys;
    for (int64_t q = ws; q <= p; ++q)
      keys.push_back(q < c.pos0 ? &x.ring[size_t((q % c.window) * c.Dh)] : &x.kv[size_t((q - c.pos0) * c.Dh)]);
    if (c.type == 2)
      for (int64_t e = 0; e < std::min((p + 1) / c.rate, c.ne); ++e) keys.push_back(&x.entries[size_t(e * c.Dh)]);
    if (c.type == 1)
      for (int64_t j = 0; j < c.ksel; ++j) {
        const int64_t e = x.sel[size_t(t * c.ksel + j)];
        if (e >= 0) keys.push_back(&x.entries[size_t(e * c.Dh)]);
      }
    for (int h = 0; h < c.Hq; ++h) {
      const float* qh = &x.q[size_t((t * c.Hq + h) * c.Dh)];
      std::vector<double> lg(keys.size());
      double m = x.sink[size_t(h)];
      for (size_t j = 0; j < keys.size(); ++j) {
        double dot = 0;
        for (int64_t i = 0; i < c.Dh; ++i) dot += double(qh[i]) * keys[j][i];
        lg[j] = dot * scale, m = std::max(m, lg[j]);
      }
      double s = std::exp(double(x.sink[size_t(h)]) - m);
      for (double& v : lg) s += (v = std::exp(v - m));
      for (int64_t i = 0; i < c.Dh; ++i) {
        double o = 0;
        for (size_t j = 0; j < keys.size(); ++j) o += lg[j] * keys[j][i];
        out[size_t((t * c.Hq + h) * c.Dh + i)] = float(o / s);
      }
    }
  }
  return out;
}

struct Device {
  DeviceBuffer q, kv, ring, entries, sink, sel, pos, out;
  d::AttendArgs a;
  Device(const AttnCase& c, const Data& x) {
    q = to_device(x.q), kv = to_device(x.kv), ring = to_device(x.ring), entries = to_device(x.entries);
    sink = to_device(x.sink), pos = to_device(std::vector<int64_t>{c.pos0});
    out = DeviceBuffer(x.q.size() * 4);
    if (c.type == 1) sel = to_device(x.sel);
    a.q = q.as<float>(), a.chunk_kv = kv.as<float>(), a.ring = ring.as<float>(), a.entries = entries.as<float>();
    a.sel = c.type == 1 ? sel.as<int64_t>() : nullptr;
    a.sink = sink.as<float>(), a.pos = pos.as<int64_t>();
    a.n = c.n, a.Hq = c.Hq, a.ksel = int(c.ksel), a.type = c.type;
    a.Dh = c.Dh, a.window = c.window, a.ne = c.ne, a.rate = c.rate;
    a.scale = 1.0f / std::sqrt(float(c.Dh));
    a.out = out.as<float>();
  }
  std::vector<float> result() { return to_host<float>(out, size_t(a.n) * size_t(a.Hq) * size_t(a.Dh)); }
};

int64_t max_keys(const AttnCase& c) { return c.window + (c.type == 2 ? c.ne : c.type == 1 ? c.ksel : 0); }

// Each run starts from an output of NaNs (all bits set), so a path that leaves a row unwritten cannot pass on the
// previous run's values.
std::vector<float> run_twin(const AttnCase& c, Device& dv) {
  dv.out.fill_byte(0xFF);
  DeviceBuffer logits(size_t(c.n * c.Hq * max_keys(c)) * 4);
  dv.a.logits = logits.as<float>(), dv.a.ld_logits = max_keys(c);
  d::fwd_attend(dv.a, nullptr);
  return dv.result();
}

std::vector<float> run_split(const AttnCase& c, Device& dv, int64_t bound, int* splits = nullptr) {
  const d::SplitPlan plan = d::fwd_attend_splitk_plan(c.n, c.Hq, c.Dh, bound, d::sm_count());
  dv.out.fill_byte(0xFF);
  // The partials' scratch starts as NaNs (all bits set): the merge reads only what the split launch wrote.
  DeviceBuffer scratch = to_device(std::vector<uint8_t>(std::max<size_t>(plan.scratch_bytes, 8), 0xFF));
  dv.a.logits = nullptr, dv.a.ld_logits = 0;
  d::fwd_attend_splitk(dv.a, plan, scratch.get(), nullptr);
  if (splits) *splits = plan.splits;
  return dv.result();
}

const AttnCase kCases[] = {
    {"sliding, decode", 0, 1, 8, 512, 128, 1000, 1, 0, 0, 1.0f},
    {"sliding, start of sequence", 0, 3, 4, 512, 128, 0, 1, 0, 0, 1.0f},
    {"HCA, 8K entries, decode", 2, 1, 4, 512, 128, 32767, 4, 8192, 0, 1.0f},
    {"HCA, 8K entries, saturated", 2, 2, 4, 512, 128, 32766, 4, 8192, 0, 8.0f},
    {"CSA with holes", 1, 4, 8, 512, 128, 4000, 4, 1000, 512, 3.0f},
    {"CSA, head_dim 192", 1, 2, 4, 192, 64, 700, 4, 175, 96, 1.0f},
    {"HCA, prefill of 300 tokens", 2, 300, 2, 512, 128, 2000, 16, 144, 0, 2.0f},
    {"sliding, 24 tokens", 0, 24, 4, 512, 128, 500, 1, 0, 0, 4.0f},
    {"HCA, 64 heads, 8K entries, decode", 2, 1, 64, 512, 128, 32767, 4, 8192, 0, 2.0f},
    {"CSA, 20 heads (two blocks, one partly empty)", 1, 3, 20, 512, 128, 3000, 4, 750, 300, 3.0f},
    {"sliding, head_dim 64, 2 tokens", 0, 2, 16, 64, 32, 20, 1, 0, 0, 2.0f},
    {"CSA, 8 tokens of 64 heads, short context (decode at batch 8)", 1, 8, 64, 512, 128, 250, 4, 64, 64, 2.0f},
};

// attn.splitk_f16 against the host's fp64 softmax, every case: q, keys and probabilities rounded to f16 (2^-11
// relative each) and fp32 sums put the outputs within ~1e-3 of the largest, measured per case and bounded at 4e-3
// (the registry allows 1e-2 for the whole forward); and not the fp64 kernel's bits (the patch applied). A wrong
// fragment (a transposed operand, keys paired with the wrong probabilities) moves outputs by O(1) of their size.
TEST_F(GpuTest, AttentionSplitKF16MatchesFp64) {
  double worst = 0;
  int64_t differ = 0, total = 0;
  for (const AttnCase& c : kCases) {
    const Data x = make_data(c, 7u + unsigned(c.n * 131 + c.type));
    Device dv(c, x);
    const auto ref = host_attention(c, x);
    const auto fp64 = run_split(c, dv, max_keys(c));
    dv.a.f16 = 1;
    const auto h = run_split(c, dv, max_keys(c));
    expect_close(std::string(c.name) + ", f16 split-K vs host fp64", h, ref, c.Dh, 4e-3);
    worst = std::max(worst, compare(h.data(), ref.data(), int64_t(ref.size())).norm);
    for (size_t i = 0; i < h.size(); ++i) differ += std::memcmp(&h[i], &fp64[i], 4) != 0;
    total += int64_t(h.size());
  }
  std::printf("attn.splitk_f16: worst normalized error against the host %.3e; %lld of %lld outputs differ from the fp64 kernel's\n",
              worst, (long long)differ, (long long)total);
  EXPECT_GT(differ, total / 2) << "attn.splitk_f16 gave the fp64 kernel's bits: did it run?";
}

TEST_F(GpuTest, AttentionSplitKMatchesUnsplitTwin) {
  for (const AttnCase& c : kCases) {
    const Data x = make_data(c, 7u + unsigned(c.n * 131 + c.type));
    Device dv(c, x);
    const auto twin = run_twin(c, dv);
    const auto ref = host_attention(c, x);
    std::printf("%s: %d splits of <= %lld keys\n", c.name, d::fwd_attend_splitk_plan(c.n, c.Hq, c.Dh, max_keys(c), d::sm_count()).splits,
                (long long)d::fwd_attend_splitk_plan(c.n, c.Hq, c.Dh, max_keys(c), d::sm_count()).chunk);
    const auto split = run_split(c, dv, max_keys(c));
    expect_close(std::string(c.name) + ", split-K vs unsplit twin", split, twin, c.Dh, 1e-6);
    // Against fp64 logits: both round each logit to float (the reference's fp32 scores), ~1e-7 of its size.
    expect_close(std::string(c.name) + ", split-K vs host fp64", split, ref, c.Dh, 2e-6);
    expect_close(std::string(c.name) + ", unsplit twin vs host fp64", twin, ref, c.Dh, 2e-6);
  }
}

// Keyless splits between live ones: one token of a CSA layer whose selection has a run of 96 holes (slots 64-159,
// keys 192-287: splits 6, 7 and 8 of 32 keys see no key, m = -inf, and must add exact zeros in the merge, as the
// empty splits of a graph's wider grid do). The output matches the unsplit twin and the host's fp64 softmax, and is
// the same bits under the exact bound and a graph's wider one.
TEST_F(GpuTest, AttentionSplitKKeylessSplitsAddNothing) {
  const AttnCase c{"CSA, a run of holes", 1, 1, 64, 512, 128, 4000, 4, 1000, 512, 3.0f};
  Data x = make_data(c, 4242u);
  for (int64_t j = 0; j < c.ksel; ++j)  // every slot a distinct entry but for the run
    x.sel[size_t(j)] = j >= 64 && j < 160 ? -1 : (j * 7) % c.ne;
  Device dv(c, x);
  int splits = 0;
  const auto split = run_split(c, dv, max_keys(c), &splits);
  ASSERT_GE(splits, 10) << "the case needs splits past the holes";
  ASSERT_EQ(d::fwd_attend_splitk_plan(c.n, c.Hq, c.Dh, max_keys(c), d::sm_count()).keys_per_split(max_keys(c)), 32);
  const auto wide = run_split(c, dv, max_keys(c) * 3 + 700);
  const auto twin = run_twin(c, dv);
  expect_close("keyless splits, split-K vs unsplit twin", split, twin, c.Dh, 1e-6);
  expect_close("keyless splits, split-K vs host fp64", split, host_attention(c, x), c.Dh, 2e-6);
  for (size_t i = 0; i < split.size(); ++i)
    ASSERT_EQ(std::memcmp(&split[i], &wide[i], 4), 0) << "element " << i << ": " << split[i] << " vs " << wide[i];
}

// The unsplit twin stages a query's key rows and probabilities in shared memory, in rounds where a query has more
// keys than one round takes (AttendArgs::stage_keys; ~16.6K keys by default): rounds of 16 and 48 keys give the
// default's bits on every case (each thread's keys in the same order), and a query of 40K keys (HCA over 160K
// positions at rate 4: more than one round at the default) matches the host's fp64 softmax and the split-K kernel.
TEST_F(GpuTest, AttentionUnsplitTakesLongKeyListsInRounds) {
  for (const AttnCase& c : kCases) {
    const Data x = make_data(c, 11u + unsigned(c.n * 7 + c.type));
    Device dv(c, x);
    const auto whole = run_twin(c, dv);
    for (const int64_t stage : {16, 48}) {
      dv.a.stage_keys = stage;
      const auto rounds = run_twin(c, dv);
      for (size_t i = 0; i < whole.size(); ++i)
        ASSERT_EQ(std::memcmp(&whole[i], &rounds[i], 4), 0) << c.name << ", rounds of " << stage << " keys: element " << i << " "
                                                             << rounds[i] << " against " << whole[i] << " in one round";
    }
  }
  const AttnCase c{"HCA, 40K entries, decode", 2, 1, 2, 64, 16, 4 * 40000 + 3, 4, 40000, 0, 2.0f};
  const Data x = make_data(c, 5u);
  Device dv(c, x);
  dv.a.stage_keys = 5000;
  EXPECT_THROW(run_twin(c, dv), std::runtime_error);  // (not a multiple of 16: refused by name)
  dv.a.stage_keys = 0;
  const auto twin = run_twin(c, dv);
  expect_close(std::string(c.name) + ", unsplit twin vs host fp64", twin, host_attention(c, x), c.Dh, 2e-6);
  expect_close(std::string(c.name) + ", split-K vs unsplit twin", run_split(c, dv, max_keys(c)), twin, c.Dh, 1e-6);
}

// The plan on the host: every query of up to max_keys keys fits the grid, keys per split are whole tiles, and up
// to 256 tokens a wider bound (a graph's) changes the grid only, never how a query is split; for devices of several
// sizes (the plan is the host's arithmetic: no GPU needed).
TEST(AttentionSplitPlan, EveryQueryFitsAndAWiderBoundSplitsAlike) {
  int64_t checked = 0;
  for (const int sms : {132, 78})
  for (const int n : {1, 2, 3, 4, 5, 8, 9, 24, 256, 300})
    for (const int Hq : {4, 20, 64})
      for (const int64_t mk : {int64_t(1), int64_t(31), int64_t(64), int64_t(65), int64_t(704), int64_t(8320), int64_t(20000)}) {
        const d::SplitPlan p = d::fwd_attend_splitk_plan(n, Hq, 512, mk, sms), w = d::fwd_attend_splitk_plan(n, Hq, 512, mk * 3 + 700, sms);
        ASSERT_GE(p.splits, 1);
        ASSERT_GE(w.splits, p.splits);
        EXPECT_EQ(p.scratch_bytes, p.splits > 1 ? size_t(n) * size_t(Hq) * (512 * 4 + 12) * size_t(p.splits) : 0);
        for (int64_t count = 0; count <= mk; ++count) {
          const int64_t per = p.keys_per_split(count);
          ASSERT_TRUE(per > 0 && per % 32 == 0) << n << " " << Hq << " " << mk << " " << count;
          ASSERT_LE((count + per - 1) / per, p.splits) << n << " tokens, " << Hq << " heads, " << mk << " keys, query of " << count;
          if (n <= 256) {
            ASSERT_EQ(w.keys_per_split(count), per) << n << " " << Hq << " " << mk << " " << count;
          }
          ++checked;
        }
      }
  EXPECT_GT(checked, 1600000);
}

// Graph mode sizes the grid by the caches' capacity: more (empty) splits must not change a bit. (A query split at
// the plan's cap keeps its splits under a wider bound: those cases check the same bits trivially.)
TEST_F(GpuTest, AttentionSplitKIsInvariantToTheKeyBound) {
  int grew = 0;
  for (const int f16 : {0, 1})  // both products' kernels (attn.splitk_f16)
  for (const AttnCase& c : kCases) {
    if (c.n > 256) continue;  // longer chunks never run as graphs (their plan depends on the bound)
    const Data x = make_data(c, 99u + unsigned(c.n));
    Device dv(c, x);
    dv.a.f16 = f16;
    int s_exact = 0, s_wide = 0;
    const auto exact = run_split(c, dv, max_keys(c), &s_exact);
    const auto wide = run_split(c, dv, max_keys(c) * 3 + 700, &s_wide);
    ASSERT_GE(s_wide, s_exact) << c.name;
    grew += s_wide > s_exact;
    for (size_t i = 0; i < exact.size(); ++i)
      ASSERT_EQ(std::memcmp(&exact[i], &wide[i], 4), 0) << c.name << (f16 ? " (f16)" : "") << ": element " << i << " "
                                                        << exact[i] << " (" << s_exact << " splits) vs " << wide[i] << " (" << s_wide
                                                        << " splits)";
  }
  EXPECT_GE(grew, 16);
}

// The output's inverse RoPE and f16 copy stored by the split-K kernels themselves (AttendArgs::out_inv_freq: the
// merge kernel, or the split kernel where one split suffices) against the split-K output then fwd_rope_f16, bit for
// bit, fp32 rows and f16 copy; every case, so both store paths run (one split: the short sliding case).
TEST_F(GpuTest, AttentionSplitKFusedOutputRotationMatchesRopeLaunch) {
  int direct = 0, merged = 0;
  for (const AttnCase& c : kCases) {
    const Data x = make_data(c, 5u + unsigned(c.n * 7 + c.type));
    const int64_t rd = std::min<int64_t>(64, c.Dh / 2), off = c.Dh - rd;
    Rng rng(11u + unsigned(c.Dh));
    DeviceBuffer inv = to_device(rng.floats(size_t(rd / 2), 1e-4f, 1.0f));
    const size_t rows = size_t(c.n) * size_t(c.Hq), elems = rows * size_t(c.Dh);
    Device dv(c, x);
    int splits = 0;
    run_split(c, dv, max_keys(c), &splits);
    (splits == 1 ? direct : merged)++;
    DeviceBuffer ref16(elems * 2);
    d::fwd_rope_f16(dv.a.out, int64_t(rows), c.Dh, off, inv.as<float>(), 1.25f, dv.a.pos, c.Hq, 1, ref16.as<uint16_t>(), nullptr);
    DeviceBuffer out16(elems * 2);
    Device fused(c, x);
    fused.a.out_inv_freq = inv.as<float>(), fused.a.out_rope_off = off, fused.a.out_af = 1.25f, fused.a.out16 = out16.as<uint16_t>();
    run_split(c, fused, max_keys(c));
    expect_same_bytes(fused.out, dv.out, elems * 4, std::string(c.name) + ": fused rotation, fp32 rows");
    expect_same_bytes(out16, ref16, elems * 2, std::string(c.name) + ": fused rotation, f16 copy");
  }
  EXPECT_GE(direct, 1);
  EXPECT_GE(merged, 1);
  // The unsplit twin has no fused rotation: it refuses the request by name.
  const AttnCase& c = kCases[0];
  Device dv(c, make_data(c, 1u));
  DeviceBuffer o16(size_t(c.n * c.Hq * c.Dh) * 2), logits(size_t(c.n * c.Hq * max_keys(c)) * 4);
  dv.a.out_inv_freq = dv.a.sink, dv.a.out16 = o16.as<uint16_t>(), dv.a.logits = logits.as<float>(), dv.a.ld_logits = max_keys(c);
  EXPECT_THROW(d::fwd_attend(dv.a, nullptr), std::runtime_error);
}

// cuda.batch_rows with rows on both sides of the indexer's limit (session 87): one split-K launch over rows of several
// sessions, each with its own ring, entries and position, where row t attends by its own kind (AttendArgs::type_rows:
// 1 its selection of ksel entries, 2 every visible entry in order, its selection slots unread), against each row's
// own one-token launch as its session's step runs it, bit for bit, at V4-Flash's attention shape (64 heads of 512,
// window 128, index_topk 512, rate 4). The queries as gpu_attention gives them to each: the batch's normalized and
// rotated by one fwd_rms_norm_rope over its 8 x 64 rows at each row's position (the warp-per-row kernel), a selecting
// row's own by fwd_rms_norm_rope over its 64 rows (the block kernel), an entry-taking row's own inside its attention
// launch (AttendArgs::q_inv_freq). Visible entries from 2 to 2250 (each row's buffer exactly that long, so memcheck
// sees a read past it), so the own launches split their keys from 1 to 33 ways where the batch has one grid for all;
// an entry-taking row's selection holds valid entries that would change its output if read.
TEST_F(GpuTest, AttentionSplitKRowsOfBothKindsAreEachRowsOwnLaunch) {
  constexpr int kRows = 8, Hq = 64;
  constexpr int64_t Dh = 512, W = 128, rate = 4, ksel = 512, rd = 64;
  constexpr double eps = 1e-6;
  constexpr float af = 1.25f;
  const std::vector<int64_t> pos = {2400, 99, 5000, 1000, 9000, 2047, 2051, 7};
  Rng rng(2087);
  std::vector<int8_t> types(kRows);
  std::vector<int64_t> sel(size_t(kRows * ksel));
  std::vector<DeviceBuffer> rings, entries;
  std::vector<const float*> ring_ptrs, entry_ptrs;
  int64_t ne_max = 0;
  for (int t = 0; t < kRows; ++t) {
    const int64_t visible = (pos[size_t(t)] + 1) / rate;
    types[size_t(t)] = visible <= ksel ? 2 : 1;  // (indexer_skippable: pos_end / rate <= index_topk)
    ne_max = std::max(ne_max, visible);
    rings.push_back(to_device(rng.floats(size_t(W * Dh), -1.0f, 1.0f)));
    entries.push_back(to_device(rng.floats(size_t(std::max<int64_t>(visible, 1) * Dh), -1.0f, 1.0f)));
    ring_ptrs.push_back(rings.back().as<float>()), entry_ptrs.push_back(entries.back().as<float>());
    if (types[size_t(t)] == 1) {  // the top-k of >= ksel entries: ksel distinct ones, no hole, in score order
      std::vector<int64_t> all(static_cast<size_t>(visible));
      for (int64_t e = 0; e < visible; ++e) all[size_t(e)] = e;
      for (int64_t j = 0; j < ksel; ++j) std::swap(all[size_t(j)], all[size_t(j + rng.integer(0, int(visible - 1 - j)))]);
      std::copy(all.begin(), all.begin() + ksel, sel.begin() + t * ksel);
    } else {  // unread: valid entries, repeated, that would change the sums if they were read
      for (int64_t j = 0; j < ksel; ++j) sel[size_t(t * ksel + j)] = rng.integer(0, int(visible - 1));
    }
  }
  ASSERT_EQ(std::count(types.begin(), types.end(), int8_t(2)), 4);
  const std::vector<float> q_raw = rng.floats(size_t(kRows * Hq * Dh), -2.0f, 2.0f);
  DeviceBuffer kv = to_device(rng.floats(size_t(kRows * Dh), -1.0f, 1.0f)), sink = to_device(rng.floats(size_t(Hq), -2.0f, 2.0f));
  DeviceBuffer inv = to_device(rng.floats(size_t(rd / 2), 1e-4f, 1.0f)), dpos = to_device(pos), sel_d = to_device(sel);
  DeviceBuffer types_d = to_device(types), ring_rows = to_device(ring_ptrs), entry_rows = to_device(entry_ptrs);
  const size_t row_elems = size_t(Hq * Dh);
  auto base = [&](d::AttendArgs& a) {
    a.sink = sink.as<float>(), a.Hq = Hq, a.Dh = Dh, a.window = W, a.rate = rate, a.scale = 1.0f / std::sqrt(float(Dh));
  };
  // The batch: one launch over the rows.
  DeviceBuffer qb = to_device(q_raw), out_b(size_t(kRows) * row_elems * 4);
  d::fwd_rms_norm_rope(qb.as<float>(), kRows * Hq, Dh, nullptr, eps, Dh - rd, int(rd / 2), inv.as<float>(), af, dpos.as<int64_t>(), -Hq, nullptr);
  d::AttendArgs ab;
  base(ab);
  ab.q = qb.as<float>(), ab.chunk_kv = kv.as<float>(), ab.pos = dpos.as<int64_t>(), ab.n = kRows, ab.type = 1;
  ab.sel = sel_d.as<int64_t>(), ab.ksel = int(ksel), ab.ne = ne_max, ab.out = out_b.as<float>();
  ab.ring_rows = ring_rows.as<const float*>(), ab.entries_rows = entry_rows.as<const float*>(), ab.type_rows = types_d.as<int8_t>();
  const d::SplitPlan pb = d::fwd_attend_splitk_plan_rows(kRows, Hq, Dh, W + ksel, d::sm_count());
  DeviceBuffer scratch_b(std::max<size_t>(pb.scratch_bytes, 8));
  out_b.fill_byte(0xFF);
  d::fwd_attend_splitk(ab, pb, scratch_b.get(), nullptr);
  // Each row's own launch.
  std::set<int> own_splits;
  for (int t = 0; t < kRows; ++t) {
    const int64_t visible = (pos[size_t(t)] + 1) / rate;
    DeviceBuffer q1 = to_device(std::vector<float>(q_raw.begin() + t * row_elems, q_raw.begin() + (t + 1) * row_elems));
    DeviceBuffer out1(row_elems * 4);
    d::AttendArgs a;
    base(a);
    a.q = q1.as<float>(), a.chunk_kv = kv.as<float>() + t * Dh, a.pos = dpos.as<int64_t>() + t, a.n = 1, a.type = types[size_t(t)];
    a.ring = rings[size_t(t)].as<float>(), a.entries = entries[size_t(t)].as<float>(), a.ne = visible, a.out = out1.as<float>();
    if (a.type == 1) {
      d::fwd_rms_norm_rope(q1.as<float>(), Hq, Dh, nullptr, eps, Dh - rd, int(rd / 2), inv.as<float>(), af, a.pos, Hq, nullptr);
      a.sel = sel_d.as<int64_t>() + t * ksel, a.ksel = int(ksel);
    } else {
      a.q_inv_freq = inv.as<float>(), a.q_rope_off = Dh - rd, a.q_rope_half = int(rd / 2), a.q_af = af, a.q_eps = eps;
    }
    const d::SplitPlan p1 = d::fwd_attend_splitk_plan(1, Hq, Dh, W + (a.type == 1 ? ksel : visible), d::sm_count());
    own_splits.insert(p1.splits);
    DeviceBuffer scratch1(std::max<size_t>(p1.scratch_bytes, 8));
    out1.fill_byte(0xFF);
    d::fwd_attend_splitk(a, p1, scratch1.get(), nullptr);
    const std::vector<float> got = to_host<float>(out_b, size_t(kRows) * row_elems), want = to_host<float>(out1, row_elems);
    for (size_t i = 0; i < row_elems; ++i)
      ASSERT_EQ(std::memcmp(&got[size_t(t) * row_elems + i], &want[i], 4), 0)
          << "row " << t << " (type " << int(types[size_t(t)]) << ", position " << pos[size_t(t)] << "): element " << i << " is "
          << got[size_t(t) * row_elems + i] << ", its own launch " << want[i];
  }
  EXPECT_GE(own_splits.size(), 3u) << "the own launches did not split their keys in several ways";
  std::printf("[ type_rows ] batch grid %d splits; own launches %zu split counts (%d to %d)\n", pb.splits, own_splits.size(),
              *own_splits.begin(), *own_splits.rbegin());
  // The unsplit kernel and launches that are not rows of several sessions refuse per-row types by name.
  EXPECT_THROW(d::fwd_attend(ab, nullptr), std::runtime_error);
  ab.ring_rows = nullptr;
  EXPECT_THROW(d::fwd_attend_splitk(ab, pb, scratch_b.get(), nullptr), std::runtime_error);
}

// Times per call (host clock over back-to-back calls, the keys warm in L2) of the unsplit twin and of the split-K
// kernel with the plan and with fixed keys per split, at the model's shape (64 heads x 512, HCA) for a short and a long
// context, decode of 1 and 8 tokens; and the split kernel's error against the twin there. For the notes: the
// kernel bench (`plumb bench --only attention`) is the reference measurement.
TEST_F(GpuTest, AttentionSplitKTimes) {
  auto time_us = [](auto&& fn) {
    for (int i = 0; i < 3; ++i) fn();
    plumb::cuda::synchronize();
    const int reps = 30;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    plumb::cuda::synchronize();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  for (const int64_t ne : {int64_t(576), int64_t(8192)})
    for (const int n : {1, 8}) {
      const AttnCase c{"timing", 2, n, 64, 512, 128, ne * 128 - n, 128, ne, 0, 1.0f};
      const Data x = make_data(c, 5u + unsigned(n));
      Device dv(c, x);
      const int64_t keys = max_keys(c);
      DeviceBuffer logits(size_t(c.n * c.Hq * keys) * 4);
      d::AttendArgs tw = dv.a;
      tw.logits = logits.as<float>(), tw.ld_logits = keys;
      const double t_twin = time_us([&] { d::fwd_attend(tw, nullptr); });
      const auto twin = dv.result();
      const d::SplitPlan plan = d::fwd_attend_splitk_plan(n, c.Hq, c.Dh, keys, d::sm_count());
      std::printf("HCA %lld keys, 64 heads x 512, n = %d: twin %.1f us; split-K plan: %d splits of %lld keys", (long long)keys, n, t_twin,
                  plan.splits, (long long)plan.keys_per_split(keys));
      std::printf("\n  ");
      for (const int64_t chunk : {int64_t(0), int64_t(64), int64_t(128), int64_t(256), int64_t(512), int64_t(1024)}) {
        d::SplitPlan p = plan;  // chunk 0: the plan; else fixed keys per split
        if (chunk) p.chunk = chunk, p.cap = 0, p.splits = int((keys + chunk - 1) / chunk);
        p.scratch_bytes = p.splits > 1 ? size_t(c.n * c.Hq) * size_t(c.Dh * 4 + 12) * size_t(p.splits) : 0;
        DeviceBuffer scratch(std::max<size_t>(p.scratch_bytes, 8));
        d::AttendArgs sa = dv.a;
        sa.logits = nullptr, sa.ld_logits = 0;
        const double t = time_us([&] { d::fwd_attend_splitk(sa, p, scratch.get(), nullptr); });
        if (chunk) std::printf(" %lld per split %.1f us", (long long)chunk, t);
        else std::printf(" plan %.1f us", t);
        const Cmp e = compare(dv.result().data(), twin.data(), int64_t(twin.size()));
        EXPECT_LE(e.norm, 1e-6) << "chunk " << chunk;
        std::printf(" [%.1e]", e.norm);
        if (chunk == 0) {  // the plan again with attn.splitk_f16
          sa.f16 = 1;
          const double th = time_us([&] { d::fwd_attend_splitk(sa, p, scratch.get(), nullptr); });
          const Cmp eh = compare(dv.result().data(), twin.data(), int64_t(twin.size()));
          EXPECT_LE(eh.norm, 4e-3);
          std::printf(" f16 %.1f us [%.1e];", th, eh.norm);
        }
      }
      std::printf("\n");
    }
}

}  // namespace
