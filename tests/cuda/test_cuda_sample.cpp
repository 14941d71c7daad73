// GPU sampling (src/cuda/fwd_sample.cu, API in src/cuda/sample.h) against plumb::Sampler.
//
// Every row is sampled twice: by plumb::Sampler (seeded; sample() and distribution()) and by fwd_sample with the
// u that Sampler::sample draws from the same seed. Compared: the token, the size of the final distribution, and
// its first entries (ids, float probabilities).
//   greedy and top-k paths (cuda/sample.h: exact): identical tokens and sizes required; ids identical; each
//     probability within 1 float ulp (bit-identical unless CUDA's fp64 exp and the host libm's differ by an ulp
//     somewhere in the row; the count of non-identical probabilities is printed).
//   sorted path (top_k 0 or > 1024 on a large vocabulary: parallel sums): sizes identical; a token may differ only
//     when u lies within 1e-12 of one of the CPU's cumulative boundaries (counted, printed); probabilities within
//     2 float ulps.
// On a mismatch the row, both tokens, both sizes, u and the CPU's cumulative values around both tokens are
// printed. Rows with NaN logits go through every case (until session 57 only the greedy ones: the CPU sampler ranked
// NaN by std::sort's undefined order): a NaN is -inf (probability zero, never greedy's pick) for both samplers. A row
// with no finite logit (all -inf, a +inf, all NaN: kinds 7, 8 and 10) is Sampler's error and the GPU's kSampleNoFinite
// with n 0, on every path.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "cuda/kernels.h"
#include "cuda/sample.h"
#include "cuda_test_util.h"
#include "plumb/text.h"

using namespace plumb;
using namespace plumb_cuda_test;
namespace cd = plumb::cuda::detail;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) : p(bytes ? cd::dmalloc(bytes) : nullptr) {}
  ~DevBuf() {
    if (p) cd::dfree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

SamplingParams params(float T, int k, float tp, float mp, float rep = 1.0f, float pres = 0.0f, float freq = 0.0f) {
  SamplingParams s;
  s.temperature = T, s.top_k = k, s.top_p = tp, s.min_p = mp;
  s.repeat_penalty = rep, s.presence_penalty = pres, s.frequency_penalty = freq;
  s.penalty_last_n = 64;
  return s;
}

cd::SampleParams to_gpu(const SamplingParams& s) {
  cd::SampleParams g;
  g.temperature = s.temperature, g.top_k = s.top_k, g.top_p = s.top_p, g.min_p = s.min_p;
  g.repeat_penalty = s.repeat_penalty, g.presence_penalty = s.presence_penalty, g.frequency_penalty = s.frequency_penalty;
  return g;
}

const char* sample_path_name(int path) { return path == cd::kSampleGreedy ? "greedy" : path == cd::kSampleTopK ? "top-k" : "sorted"; }

// Sampler::sample's draw for a fresh Sampler with this seed.
double first_draw(uint64_t seed) {
  std::mt19937_64 g(seed);
  return double(g() >> 11) * 0x1.0p-53;
}

// The penalty window as fwd_sample takes it: the distinct tokens of the last `last_n` and their counts.
void penalty_window(const std::vector<int32_t>& hist, int last_n, std::vector<int32_t>& ids, std::vector<int32_t>& counts) {
  std::map<int32_t, int32_t> c;
  const size_t n = last_n < 0 ? hist.size() : std::min(hist.size(), size_t(last_n));
  for (size_t i = hist.size() - n; i < hist.size(); ++i) ++c[hist[i]];
  ids.clear(), counts.clear();
  for (const auto& [id, k] : c) ids.push_back(id), counts.push_back(k);
}

// Row kinds: 0 normal(0, 3); 1 uniform in [-10, 10] on a 1/4 grid (many exact ties); 2 normal with 30% -inf;
// 3 peaked (one logit at 25: usually a single-token distribution); 4 all -inf but 5; 5 values in {-1, -0, +0,
// 1, 2} (huge tie groups, -0 vs +0); 6 normal with the maximum repeated at 6 more ids; 7 all -inf; 8 one +inf;
// 9 normal with 5% NaN, NaN at index 0 in every other such row; 10 all NaN.
constexpr int kKinds = 11;
std::vector<float> make_row(int kind, int V, std::mt19937& g, int row) {
  std::vector<float> l(static_cast<size_t>(V));
  std::normal_distribution<float> nd(0.0f, 3.0f), n1(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(-10.0f, 10.0f), u01(0.0f, 1.0f);
  std::uniform_int_distribution<int> id(0, V - 1);
  switch (kind) {
    case 0: for (auto& x : l) x = nd(g); break;
    case 1: for (auto& x : l) x = std::round(ud(g) * 4.0f) / 4.0f; break;
    case 2: for (auto& x : l) x = u01(g) < 0.3f ? -kInf : nd(g); break;
    case 3:
      for (auto& x : l) x = n1(g);
      l[size_t(id(g))] = 25.0f;
      break;
    case 4:
      for (auto& x : l) x = -kInf;
      for (int i = 0; i < 5; ++i) l[size_t(id(g))] = n1(g) * 2.0f;
      break;
    case 5: {
      const float vals[5] = {-1.0f, -0.0f, 0.0f, 1.0f, 2.0f};
      for (auto& x : l) x = vals[std::uniform_int_distribution<int>(0, 4)(g)];
      break;
    }
    case 6: {
      for (auto& x : l) x = nd(g);
      const float m = *std::max_element(l.begin(), l.end());
      for (int i = 0; i < 6; ++i) l[size_t(id(g))] = m;
      break;
    }
    case 7: for (auto& x : l) x = -kInf; break;
    case 8:
      for (auto& x : l) x = nd(g);
      l[size_t(id(g))] = kInf;
      break;
    case 10: for (auto& x : l) x = std::numeric_limits<float>::quiet_NaN(); break;
    default:
      for (auto& x : l) x = u01(g) < 0.05f ? std::numeric_limits<float>::quiet_NaN() : nd(g);
      if (row % 2) l[0] = std::numeric_limits<float>::quiet_NaN();
      break;
  }
  return l;
}

struct GpuOut {
  std::vector<int32_t> tok, n, ids;
  std::vector<float> probs;
};

constexpr int kCap = 256;

// One launch of fwd_sample over `rows` rows (logits row-major), synchronous for the test.
GpuOut run_gpu(const std::vector<float>& logits, int rows, int V, const cd::SampleParams& p, const std::vector<int32_t>& pen_ids,
               const std::vector<int32_t>& pen_counts, const std::vector<double>& u) {
  DevBuf dl(logits.size() * sizeof(float)), du(u.size() * sizeof(double));
  DevBuf dpi(pen_ids.size() * sizeof(int32_t)), dpc(pen_counts.size() * sizeof(int32_t));
  DevBuf dtok(size_t(rows) * 4), dn(size_t(rows) * 4), dids(size_t(rows) * kCap * 4), dpr(size_t(rows) * kCap * 4);
  const size_t sb = cd::fwd_sample_scratch_bytes(rows, V, &p);
  DevBuf scratch(sb);
  cd::h2d(dl.p, logits.data(), logits.size() * sizeof(float));
  cd::h2d(du.p, u.data(), u.size() * sizeof(double));
  cd::h2d(dpi.p, pen_ids.data(), pen_ids.size() * sizeof(int32_t));
  cd::h2d(dpc.p, pen_counts.data(), pen_counts.size() * sizeof(int32_t));
  cd::SampleOut out;
  out.token = dtok.as<int32_t>(), out.n = dn.as<int32_t>(), out.ids = dids.as<int32_t>(), out.probs = dpr.as<float>();
  out.cap = kCap;
  // Slots past each row's n stay unwritten by the kernel: all bits set (ids -1, probs NaN), so that the whole
  // arrays come back defined (compute-sanitizer's initcheck reads every downloaded byte).
  cd::dmemset(dids.p, 0xFF, size_t(rows) * kCap * 4);
  cd::dmemset(dpr.p, 0xFF, size_t(rows) * kCap * 4);
  cd::fwd_sample(dl.as<float>(), rows, V, p, dpi.as<int32_t>(), dpc.as<int32_t>(), int(pen_ids.size()), du.as<double>(), out,
                 scratch.p, sb, nullptr);
  cd::dsync();
  GpuOut r;
  r.tok.resize(size_t(rows)), r.n.resize(size_t(rows)), r.ids.resize(size_t(rows) * kCap), r.probs.resize(size_t(rows) * kCap);
  cd::d2h(r.tok.data(), dtok.p, r.tok.size() * 4);
  cd::d2h(r.n.data(), dn.p, r.n.size() * 4);
  cd::d2h(r.ids.data(), dids.p, r.ids.size() * 4);
  cd::d2h(r.probs.data(), dpr.p, r.probs.size() * 4);
  return r;
}

int64_t ulp_diff(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return 0;
  if (std::isnan(a) || std::isnan(b)) return INT64_MAX;
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4), std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = int32_t(0x80000000u - uint32_t(ia));  // monotone integer image
  if (ib < 0) ib = int32_t(0x80000000u - uint32_t(ib));
  return std::llabs(int64_t(ia) - int64_t(ib));
}

struct Tally {
  int64_t rows = 0, tok_equal = 0, near_boundary = 0, failures = 0, draws = 0, probs = 0, probs_not_bitwise = 0, no_finite = 0;
  int64_t max_ulp = 0;
};

// Compares one launch's rows with Sampler. Returns the number of failures (also added to t).
int64_t compare_rows(const char* name, const SamplingParams& sp, int V, int rows, const std::vector<float>& logits,
                     const std::vector<int>& kinds, const std::vector<int32_t>& hist, const std::vector<uint64_t>& seeds,
                     const std::vector<double>& u, const GpuOut& g, Tally& t) {
  const int path = cd::fwd_sample_path(to_gpu(sp), V);
  const bool exact = path != cd::kSampleSorted;
  int64_t fails = 0, printed = 0;
  for (int r = 0; r < rows; ++r) {
    SamplingParams s = sp;
    s.seed = seeds[size_t(r)];
    Sampler sampler(s, V);
    std::span<const float> row(logits.data() + size_t(r) * size_t(V), size_t(V));
    // A row with no finite logit: Sampler throws, the GPU writes kSampleNoFinite and n 0 (no distribution).
    std::vector<std::pair<int32_t, float>> dist;
    int32_t cpu = cd::kSampleNoFinite;
    try {
      dist = sampler.distribution(row, hist);
      cpu = sampler.sample(row, hist);
    } catch (const plumb::Error&) {
      ++t.no_finite;
    }
    const int32_t gpu = g.tok[size_t(r)];
    const int gn = g.n[size_t(r)];
    ++t.rows;
    if (dist.size() > 1) ++t.draws;
    bool bad = false, near = false;
    std::vector<double> cum(dist.size());
    double c = 0;
    for (size_t i = 0; i < dist.size(); ++i) cum[i] = c += dist[i].second;
    if (gpu == cpu) {
      ++t.tok_equal;
    } else {
      double dmin = 1e300;
      for (double x : cum) dmin = std::min(dmin, std::fabs(u[size_t(r)] - x));
      near = !exact && dmin <= 1e-12;
      if (near) ++t.near_boundary;
      else bad = true;
    }
    if (gn != int(dist.size())) bad = true;
    const size_t m = std::min({dist.size(), size_t(kCap), size_t(std::max(gn, 0))});
    int64_t row_ulp = 0;
    bool ids_bad = false;
    for (size_t i = 0; i < m; ++i) {
      const int32_t gid = g.ids[size_t(r) * kCap + i];
      const float gp = g.probs[size_t(r) * kCap + i];
      if (gid != dist[i].first) ids_bad = true;
      const int64_t du = ulp_diff(gp, dist[i].second);
      ++t.probs;
      if (du) ++t.probs_not_bitwise;
      row_ulp = std::max(row_ulp, du);
    }
    t.max_ulp = std::max(t.max_ulp, row_ulp);
    if (ids_bad || row_ulp > (exact ? 1 : 2)) bad = true;
    if (near || bad) {
      if (printed++ < 6) {
        auto idx_of = [&](int32_t id) {
          for (size_t i = 0; i < dist.size(); ++i)
            if (dist[i].first == id) return int64_t(i);
          return int64_t(-1);
        };
        const int64_t ic = idx_of(cpu), ig = idx_of(gpu);
        std::printf("  %s %s V=%d row %d (kind %d): gpu token %d (n %d) vs cpu %d (n %zu), u=%.17g, max ulp %" PRId64
                    "%s%s\n",
                    near ? "NEAR-BOUNDARY" : "MISMATCH", name, V, r, kinds[size_t(r)], gpu, gn, cpu, dist.size(), u[size_t(r)],
                    row_ulp, ids_bad ? ", ids differ" : "", near ? " (tolerated: sorted path)" : "");
        for (int64_t at : {ic, ig}) {
          if (at < 0) continue;
          for (int64_t i = std::max<int64_t>(0, at - 2); i <= std::min<int64_t>(int64_t(dist.size()) - 1, at + 2); ++i)
            std::printf("    cpu dist[%" PRId64 "] id %d p %.9g cum %.17g%s\n", i, dist[size_t(i)].first,
                        double(dist[size_t(i)].second), cum[size_t(i)], i == at ? " <" : "");
        }
      }
    }
    if (bad) ++fails;
  }
  t.failures += fails;
  return fails;
}

// history: 100 tokens whose last 64 form the window; repeats (counts up to 5), each row's argmax among them (so
// the penalties change greedy picks), tokens with negative logits (the multiply branch), -1 and V + 5 (ignored).
std::vector<int32_t> make_history(int V, const std::vector<float>& logits, int rows, std::mt19937& g) {
  std::uniform_int_distribution<int> id(0, V - 1);
  std::vector<int32_t> h;
  for (int i = 0; i < 36; ++i) h.push_back(id(g));  // outside the window
  for (int r = 0; r < rows && h.size() < 70; ++r) {
    const float* l = logits.data() + size_t(r) * size_t(V);
    h.push_back(int32_t(std::max_element(l, l + V) - l));
  }
  const int32_t rep = id(g);
  for (int i = 0; i < 5; ++i) h.push_back(rep);
  h.push_back(-1), h.push_back(V + 5);
  while (h.size() < 100) h.push_back(id(g));
  std::shuffle(h.begin() + 36, h.end(), g);
  return h;
}

struct SampleCase {
  const char* name;
  SamplingParams sp;
};

std::vector<SampleCase> sample_cases() {
  return {
      {"greedy(T=0)", params(0.0f, 40, 0.95f, 0.05f)},
      {"greedy(top_k=1)", params(0.8f, 1, 0.95f, 0.05f)},
      {"temperature", params(0.7f, 0, 1.0f, 0.0f)},
      {"top_k=2", params(1.0f, 2, 1.0f, 0.0f)},
      {"top_k=40", params(0.8f, 40, 1.0f, 0.0f)},
      {"top_k=1024", params(1.2f, 1024, 1.0f, 0.0f)},
      {"default(40,.95,.05)", params(0.8f, 40, 0.95f, 0.05f)},
      {"top_k=1024,top_p=.9", params(1.0f, 1024, 0.9f, 0.0f)},
      {"top_k=500,min_p=.02", params(1.0f, 500, 1.0f, 0.02f)},
      {"top_p=.9", params(0.9f, 0, 0.9f, 0.0f)},
      {"min_p=.1", params(1.0f, 0, 1.0f, 0.1f)},
      {"top_k=2000,.95,.01", params(1.0f, 2000, 0.95f, 0.01f)},
      {"penalties,default", params(0.8f, 40, 0.95f, 0.05f, 1.3f, 0.4f, 0.15f)},
      {"penalties,greedy", params(0.0f, 40, 0.95f, 0.05f, 1.5f, 0.5f, 0.5f)},
      {"penalties,top_p=.95", params(1.0f, 0, 0.95f, 0.0f, 1.1f, 0.2f, 0.1f)},
  };
}

// Rows of every kind, sampled on both sides and compared.
Tally run_case(const SampleCase& c, int V, int rows, uint32_t seed, bool print = true) {
  std::mt19937 g(seed);
  std::vector<float> logits;
  std::vector<int> kinds;
  for (int r = 0; r < rows; ++r) {
    const int kind = r % kKinds;
    kinds.push_back(kind);
    auto l = make_row(kind, V, g, r);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  const auto hist = make_history(V, logits, rows, g);
  std::vector<int32_t> pen_ids, pen_counts;
  penalty_window(hist, c.sp.penalty_last_n, pen_ids, pen_counts);
  std::vector<uint64_t> seeds;
  std::vector<double> u;
  for (int r = 0; r < rows; ++r) seeds.push_back(uint64_t(seed) * 100003u + uint64_t(r)), u.push_back(first_draw(seeds.back()));
  const GpuOut go = run_gpu(logits, rows, V, to_gpu(c.sp), pen_ids, pen_counts, u);
  Tally t;
  compare_rows(c.name, c.sp, V, rows, logits, kinds, hist, seeds, u, go, t);
  if (print)
    std::printf("%-22s V=%-6d %-6s rows %3" PRId64 ": tokens equal %3" PRId64 " (no finite logit %" PRId64 "), near-boundary %" PRId64
                ", failures %" PRId64 ", u consumed %3" PRId64 ", probs %5" PRId64 " (not bit-identical %" PRId64 ", max %" PRId64 " ulp)\n",
                c.name, V, sample_path_name(cd::fwd_sample_path(to_gpu(c.sp), V)), t.rows, t.tok_equal, t.no_finite, t.near_boundary,
                t.failures, t.draws, t.probs, t.probs_not_bitwise, t.max_ulp);
  return t;
}

class CudaSample : public GpuTest {};

}  // namespace

TEST_F(CudaSample, MatchesSamplerOnRandomRows) {
  Tally all;
  uint32_t seed = 1;
  for (int V : {1000, 32000, 129280})
    for (const auto& c : sample_cases()) {
      const Tally t = run_case(c, V, 24, seed++);
      all.rows += t.rows, all.tok_equal += t.tok_equal, all.near_boundary += t.near_boundary, all.failures += t.failures;
      all.probs += t.probs, all.probs_not_bitwise += t.probs_not_bitwise, all.max_ulp = std::max(all.max_ulp, t.max_ulp);
      all.no_finite += t.no_finite;
    }
  std::printf("all: rows %" PRId64 ", tokens equal %" PRId64 " (rows without a finite logit %" PRId64 "), near-boundary "
              "(sorted path) %" PRId64 ", failures %" PRId64 ", probabilities %" PRId64 " (not bit-identical %" PRId64 ", max %" PRId64
              " ulp)\n", all.rows, all.tok_equal, all.no_finite, all.near_boundary, all.failures, all.probs, all.probs_not_bitwise,
              all.max_ulp);
  EXPECT_EQ(all.failures, 0);
  EXPECT_GT(all.no_finite, 0);  // (kinds 7, 8 and 10 in every case: each path's refusal compared)
}

// fwd_mask_logits (structured output's mask, in place) against the mask written here: every masked logit -inf, every
// other one the same bits (NaN, infinities and -0 included), per row, for vocabularies that end inside a 32-bit word.
TEST_F(CudaSample, MaskLogitsSetsExactlyTheMaskedOnesToMinusInf) {
  std::mt19937 g(17);
  for (int V : {1, 31, 1000, 129280})
    for (int rows : {1, 3}) {
      const int words = (V + 31) / 32;
      std::vector<float> l(size_t(rows) * V);
      for (size_t i = 0; i < l.size(); ++i)
        l[i] = i % 11 == 3 ? std::nanf("") : i % 13 == 5 ? kInf : i % 17 == 2 ? -0.0f : float(int(g() % 2001) - 1000) / 100.0f;
      std::vector<uint32_t> bits(size_t(rows) * words);
      for (auto& w : bits) w = uint32_t(g());
      std::vector<float> want = l;
      for (int r = 0; r < rows; ++r)
        for (int i = 0; i < V; ++i)
          if (!((bits[size_t(r) * words + i / 32] >> (i % 32)) & 1)) want[size_t(r) * V + i] = -kInf;
      DevBuf dl(l.size() * 4), db(bits.size() * 4);
      cd::h2d(dl.p, l.data(), l.size() * 4);
      cd::h2d(db.p, bits.data(), bits.size() * 4);
      cd::fwd_mask_logits(dl.as<float>(), rows, V, db.as<uint32_t>(), nullptr);
      cd::dsync();
      std::vector<float> got(l.size());
      cd::d2h(got.data(), dl.p, got.size() * 4);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << "V " << V << " rows " << rows << ": row " << i / size_t(V)
                                                         << " id " << i % size_t(V) << " got " << got[i] << " want " << want[i];
    }
}

// Many rows in one launch (each its own u): the exact path at V4's vocabulary and a wide top-k at 32K.
TEST_F(CudaSample, ManyRowsPerLaunch) {
  const Tally a = run_case({"default,256 rows", params(0.8f, 40, 0.95f, 0.05f)}, 129280, 256, 777);
  const Tally b = run_case({"top_k=1024,p=.9,128r", params(1.0f, 1024, 0.9f, 0.0f)}, 32000, 128, 778);
  const Tally c = run_case({"flat T=3,k=300,128r", params(3.0f, 300, 1.0f, 0.0f)}, 32000, 128, 779);
  EXPECT_EQ(a.failures + b.failures + c.failures, 0);
}

// Small sizes for compute-sanitizer (memcheck / racecheck): every path, the refinement loop (V 5000 with huge
// tie groups: more survivors than fit in shared memory), penalties.
TEST_F(CudaSample, Smoke) {
  int64_t fails = 0;
  const SampleCase cs[] = {{"greedy", params(0.0f, 40, 0.95f, 0.05f, 1.3f, 0.4f, 0.15f)},
                     {"default", params(0.8f, 40, 0.95f, 0.05f, 1.3f, 0.4f, 0.15f)},
                     {"top_k=1024", params(1.0f, 1024, 0.9f, 0.0f)},
                     {"sorted", params(1.0f, 0, 0.95f, 0.0f, 1.1f, 0.0f, 0.0f)}};
  for (const auto& c : cs) fails += run_case(c, 5000, 10, 4242).failures;
  EXPECT_EQ(fails, 0);
}

// The RNG contract over a generation: one Sampler (sample() with a growing history) against fwd_sample one row
// at a time, with the host keeping a pending u and drawing a new one only when the GPU says it consumed it.
TEST_F(CudaSample, SequenceMatchesSamplerSample) {
  const int V = 32000, steps = 300;
  SamplingParams sp = params(0.9f, 40, 0.95f, 0.05f, 1.1f, 0.3f, 0.05f);
  sp.seed = 20261129;
  Sampler sampler(sp, V);
  std::mt19937_64 rng(sp.seed);
  double pending = double(rng() >> 11) * 0x1.0p-53;
  std::mt19937 g(5);
  std::vector<int32_t> hist;
  for (int i = 0; i < 20; ++i) hist.push_back(int32_t(g() % V));
  int mismatches = 0, draws = 0;
  for (int step = 0; step < steps; ++step) {
    auto l = make_row(step % 3 == 2 ? 3 : step % 2 ? 6 : 0, V, g, step);  // peaked rows: no draw
    for (int32_t t : hist) l[size_t(t)] += 0.5f;  // make the penalties matter
    std::vector<int32_t> ids, counts;
    penalty_window(hist, sp.penalty_last_n, ids, counts);
    const GpuOut go = run_gpu(l, 1, V, to_gpu(sp), ids, counts, {pending});
    const int32_t cpu = sampler.sample(l, hist);
    if (go.tok[0] != cpu && mismatches++ < 5)
      std::printf("  step %d: gpu %d vs cpu %d (u %.17g, n %d)\n", step, go.tok[0], cpu, pending, go.n[0]);
    if (go.n[0] > 1) pending = double(rng() >> 11) * 0x1.0p-53, ++draws;
    hist.push_back(cpu);
  }
  std::printf("sequence: %d steps, %d draws, %d mismatches\n", steps, draws, mismatches);
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(draws, 0);
  EXPECT_LT(draws, steps);
}

// Captured in a CUDA graph and replayed: the same tokens as a direct launch (no host sync or allocation inside),
// and the device time per launch (graph replays between events, V = 129280).
TEST_F(CudaSample, GraphCaptureAndTiming) {
  const int V = 129280;
  const SampleCase cs[] = {{"greedy", params(0.0f, 40, 0.95f, 0.05f)},
                     {"greedy+penalties", params(0.0f, 40, 0.95f, 0.05f, 1.3f, 0.4f, 0.15f)},
                     {"top_k=40 (default)", params(0.8f, 40, 0.95f, 0.05f)},
                     {"default+penalties", params(0.8f, 40, 0.95f, 0.05f, 1.3f, 0.4f, 0.15f)},
                     {"top_k=1024", params(1.0f, 1024, 0.95f, 0.0f)},
                     {"sorted top_p=.95", params(1.0f, 0, 0.95f, 0.0f)}};
  cd::Stream s = cd::stream_create();
  void* e0 = cd::event_create();
  void* e1 = cd::event_create();
  for (int rows : {1, 8}) {
    std::mt19937 g(99 + rows);
    std::vector<float> logits;
    for (int r = 0; r < rows; ++r) {
      auto l = make_row(r % 2 ? 6 : 0, V, g, r);
      logits.insert(logits.end(), l.begin(), l.end());
    }
    const auto hist = make_history(V, logits, rows, g);
    std::vector<int32_t> pen_ids, pen_counts;
    penalty_window(hist, 64, pen_ids, pen_counts);
    std::vector<double> u;
    for (int r = 0; r < rows; ++r) u.push_back(first_draw(uint64_t(r) + 11));
    for (const auto& c : cs) {
      const cd::SampleParams p = to_gpu(c.sp);
      const GpuOut direct = run_gpu(logits, rows, V, p, pen_ids, pen_counts, u);
      DevBuf dl(logits.size() * 4), du(u.size() * 8), dpi(pen_ids.size() * 4), dpc(pen_counts.size() * 4), dtok(size_t(rows) * 4),
          dn(size_t(rows) * 4);
      const size_t sb = cd::fwd_sample_scratch_bytes(rows, V, &p);
      DevBuf scratch(sb);
      cd::h2d(dl.p, logits.data(), logits.size() * 4);
      cd::h2d(du.p, u.data(), u.size() * 8);
      cd::h2d(dpi.p, pen_ids.data(), pen_ids.size() * 4);
      cd::h2d(dpc.p, pen_counts.data(), pen_counts.size() * 4);
      cd::dmemset(dtok.p, 0xFF, size_t(rows) * 4);
      cd::SampleOut out;
      out.token = dtok.as<int32_t>(), out.n = dn.as<int32_t>();
      cd::capture_begin(s);
      cd::fwd_sample(dl.as<float>(), rows, V, p, dpi.as<int32_t>(), dpc.as<int32_t>(), int(pen_ids.size()), du.as<double>(), out,
                     scratch.p, sb, s);
      void* exec = cd::capture_end_instantiate(s);
      cd::graph_launch(exec, s);
      cd::dsync();
      std::vector<int32_t> tok(static_cast<size_t>(rows));
      cd::d2h(tok.data(), dtok.p, tok.size() * 4);
      EXPECT_EQ(tok, direct.tok) << c.name << " rows " << rows << ": graph replay differs from a direct launch";
      const int reps = 50;
      for (int i = 0; i < 3; ++i) cd::graph_launch(exec, s);
      cd::event_record(e0, s);
      for (int i = 0; i < reps; ++i) cd::graph_launch(exec, s);
      cd::event_record(e1, s);
      const float ms = cd::event_elapsed_ms(e0, e1);
      std::printf("timing V=%d rows %d %-20s %-6s: %7.1f us per launch (graph replay)\n", V, rows, c.name,
                  sample_path_name(cd::fwd_sample_path(p, V)), 1000.0 * ms / reps);
      cd::graph_destroy(exec);
    }
  }
  cd::event_destroy(e0);
  cd::event_destroy(e1);
  cd::stream_destroy(s);
}
