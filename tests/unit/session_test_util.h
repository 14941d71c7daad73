// Shared by the session tests of both backends (test_session_rewind.cpp, tests/cuda/test_cuda_forward.cpp): token runs
// and an engine over csa-long, whose CSA and HCA windows of 4 and 8 and sliding window of 8 put every kind of cache
// boundary inside a call of a few dozen tokens. Also the masked-sampling check both backends run.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "plumb/engine.h"
#include "plumb/text.h"

namespace plumb_test {

// n token ids of csa-long's 256-token vocabulary, a different run for each salt.
inline std::vector<int32_t> csa_long_ids(size_t n, int salt) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 37 + 11 + size_t(salt) * 101) % 256);
  return t;
}

// A committed fixture's model (tests/data/golden/NAME) on `backend` with `patches`, in passes of 7 tokens.
inline std::shared_ptr<plumb::Engine> golden_engine(const std::string& name, const std::string& backend,
                                                    const std::string& patches = "") {
  plumb::EngineOptions o;
  o.backend = backend, o.patches = patches, o.prefill_chunk = 7;
  return plumb::Engine::load(std::string(PLUMB_TEST_DATA) + "/golden/" + name, o);
}
// csa-long on `backend` with `patches`, in passes of 7 tokens (a 60-token call: 9 passes).
inline std::shared_ptr<plumb::Engine> csa_long_engine(const std::string& backend, const std::string& patches = "") {
  return golden_engine("csa-long", backend, patches);
}

// Session::forward_sample_masked against its definition, on `e`: the token is what plumb::Sampler draws from the
// logits of another session's forward() with every token outside the mask set to -inf (written here, not by the
// library), over three samplers (greedy; the defaults; no top-k with penalties, the GPU's sorted path) and masks of
// one token (at ids across the 32-bit words: the bit layout), a few and most of the vocabulary, the first call a
// 60-token prompt (several passes); an empty `allowed` is forward_sample; an `allowed` that throws ends the call with
// its exception, the tokens fed and nothing drawn (the sampler's next draw is the one it would have made).
inline void check_masked_sampling(const plumb::Engine& e, const std::string& what) {
  SCOPED_TRACE(what);
  const int32_t V = e.info().vocab_size;
  std::vector<plumb::SamplingParams> settings(3);
  settings[0].temperature = 0;
  settings[1].seed = 7;
  settings[2].seed = 11, settings[2].top_k = 0, settings[2].top_p = 0.97f, settings[2].min_p = 0,
  settings[2].repeat_penalty = 1.3f, settings[2].presence_penalty = 0.2f;
  for (const auto& sp : settings) {
    SCOPED_TRACE("temperature " + std::to_string(sp.temperature) + ", top_k " + std::to_string(sp.top_k));
    auto s = e.new_session(), ref = e.new_session();
    plumb::Sampler a(sp, V), b(sp, V);
    std::mt19937 g(sp.seed + 1);
    std::vector<int32_t> feed = csa_long_ids(60, 3), history = feed;
    for (auto& t : feed) t %= V;
    for (int step = 0; step < 24; ++step) {
      std::vector<char> ok(size_t(V), 0);
      const int kind = step % 4;
      if (kind == 0) ok[size_t((step * 37 + 31) % V)] = 1;                // one token
      for (int32_t i = 0; i < V && kind > 0; ++i) ok[size_t(i)] = kind == 1 ? g() % 16 == 0 : kind == 2 ? g() % 8 != 0 : 1;
      ok[size_t(g() % uint32_t(V))] = 1;  // (never empty)
      const int32_t got = s->forward_sample_masked(feed, a, history, [&](std::span<uint32_t> bits) {
        ASSERT_EQ(bits.size(), size_t((V + 31) / 32));
        for (uint32_t w : bits) ASSERT_EQ(w, 0u) << "the mask's words come zeroed";
        for (int32_t i = 0; i < V; ++i)
          if (ok[size_t(i)]) bits[size_t(i) / 32] |= 1u << (i % 32);
      });
      std::vector<float> l = ref->forward(feed);
      for (int32_t i = 0; i < V; ++i)
        if (!ok[size_t(i)]) l[size_t(i)] = -std::numeric_limits<float>::infinity();
      const int32_t want = b.sample(l, history);
      ASSERT_EQ(got, want) << "step " << step << " (mask kind " << kind << ")";
      ASSERT_TRUE(ok[size_t(got)]) << "step " << step << ": token " << got << " is masked out";
      history.push_back(got), feed = {got};
    }
    // An empty function: forward_sample.
    EXPECT_EQ(s->forward_sample_masked(feed, a, history, {}), ref->forward_sample(feed, b, history));
    // A throwing mask: the token fed, no draw made; the session and the sampler go on as the reference's.
    const int64_t at = s->position();
    EXPECT_THROW(s->forward_sample_masked(std::vector<int32_t>{5 % V}, a, history,
                                          [](std::span<uint32_t>) { throw std::runtime_error("no grammar"); }),
                 std::runtime_error);
    EXPECT_EQ(s->position(), at + 1);
    ref->forward(std::vector<int32_t>{5 % V});
    history.push_back(5 % V);
    const std::vector<int32_t> next = {7 % V};
    EXPECT_EQ(s->forward_sample(next, a, history), ref->forward_sample(next, b, history));
  }
}


// A logits row against the row it should equal: the largest |got - want| (infinite where got is NaN) and its index,
// and want's argmax (the next token greedy decoding picks).
struct RowGap {
  float gap = 0;
  int32_t at = 0, best = 0;
};
inline RowGap row_gap(const float* got, std::span<const float> want) {
  RowGap g;
  for (int32_t v = 0; v < int32_t(want.size()); ++v) {
    const float x = got[v], d = x == x ? std::abs(x - want[size_t(v)]) : INFINITY;
    if (d > g.gap) g.gap = d, g.at = v;
    if (want[size_t(v)] > want[size_t(g.best)]) g.best = v;
  }
  return g;
}

// plumb::forward_batch against each session's own forward(), on `e` (a model of 256 tokens or more; csa-long and
// kernel-dims: a hash layer, sliding, CSA and HCA with windows of 4, 8 and 8): five
// sessions started at different points of the caches' cycles (0, 3, 7, 13 and 29 tokens fed), stepped together 24
// times (after the first 12, each session takes 6 steps alone, so a session's own decode graph is captured and
// replayed between batches), the rows in another order each step and one session left out every third step, each
// row within `tol` of what a twin session's forward() gives for the same token (tol 0: the same bits); every token
// is its own row's argmax, as greedy decoding picks. Then every session goes on as its twin for a 9-token call: the
// batch left the caches as the single steps did. compare_below: rows at that position or later are only checked to
// be finite, and the 9-token call is not compared (kernels that differ between a batch and a single step move the
// indexer's scores, so once its top-k selects, a near tie can pick another entry: an O(1) change, not the kernels'
// rounding; session 83 measured 0.73 on kernel-dims under cuda.fast at position 20).
inline void check_forward_batch(const plumb::Engine& e, float tol, const std::string& what, int64_t compare_below = INT64_MAX) {
  SCOPED_TRACE(what);
  const int32_t V = e.info().vocab_size;
  const std::vector<size_t> fed = {0, 3, 7, 13, 29};
  std::vector<std::unique_ptr<plumb::Session>> s, twin;
  std::vector<int32_t> next;
  for (size_t i = 0; i < fed.size(); ++i) {
    s.push_back(e.new_session()), twin.push_back(e.new_session());
    const auto head = csa_long_ids(fed[i], int(i) + 5);
    if (!head.empty()) s[i]->forward(head), twin[i]->forward(head);
    next.push_back(int32_t((i * 53 + 1) % size_t(V)));
  }
  float worst = 0;
  // Row r's largest difference to `want` (asserted within tol), and the argmax of `want`.
  auto compare = [&](const float* got, const std::vector<float>& want, const std::string& where, int64_t pos) {
    const RowGap g = row_gap(got, want);
    if (pos >= compare_below) {
      EXPECT_LT(g.gap, INFINITY) << where << ": a NaN logit at " << g.at;
      return g.best;
    }
    worst = std::max(worst, g.gap);
    EXPECT_LE(g.gap, tol) << where << ": logit " << g.at << " is " << got[g.at] << ", its own forward's " << want[size_t(g.at)];
    return g.best;
  };
  for (int step = 0; step < 24; ++step) {
    if (step == 12)
      for (int k = 0; k < 6; ++k)
        for (size_t i = 0; i < s.size(); ++i) {
          const std::vector<int32_t> one = {next[i]};
          const std::vector<float> got = s[i]->forward(one);
          next[i] = compare(got.data(), twin[i]->forward(one), "session " + std::to_string(i) + " alone between batches",
                            s[i]->position() - 1);
          if (::testing::Test::HasFailure()) return;
        }
    std::vector<size_t> order;
    for (size_t k = 0; k < s.size(); ++k) {
      const size_t i = (k * 3 + size_t(step)) % s.size();  // (5 is prime to 3: a permutation)
      if (step % 3 != 2 || i != size_t(step) % s.size()) order.push_back(i);
    }
    std::vector<plumb::Session*> ptrs;
    std::vector<int32_t> toks;
    for (size_t i : order) ptrs.push_back(s[i].get()), toks.push_back(next[i]);
    const std::vector<float> got = plumb::forward_batch(ptrs, toks);
    ASSERT_EQ(got.size(), order.size() * size_t(V));
    for (size_t r = 0; r < order.size(); ++r) {
      const size_t i = order[r];
      const std::vector<float> want = twin[i]->forward(std::vector<int32_t>{next[i]});
      ASSERT_EQ(s[i]->position(), twin[i]->position());
      next[i] = compare(got.data() + r * size_t(V), want, "step " + std::to_string(step) + ", row " + std::to_string(r) + " (session " +
                                                              std::to_string(i) + ", position " + std::to_string(s[i]->position() - 1) + ")",
                        s[i]->position() - 1);
      if (::testing::Test::HasFailure()) return;
    }
  }
  for (size_t i = 0; i < s.size() && compare_below == INT64_MAX; ++i) {
    const auto tail = csa_long_ids(9, int(i) + 20);
    const std::vector<float> got = s[i]->forward_all(tail), want = twin[i]->forward_all(tail);
    ASSERT_EQ(got.size(), want.size());
    float d = 0;
    for (size_t k = 0; k < got.size(); ++k) d = std::max(d, std::abs(got[k] - want[k]));
    EXPECT_LE(d, tol) << "session " << i << " after the batch steps";
  }
  std::printf("[ forward_batch ] %s: largest difference to single steps %.3g\n", what.c_str(), double(worst));
}

// plumb::forward_batch_sample against the host: twin sessions stepped by plumb::forward_batch in the same batches (the
// same pass, so the same logits), each row then drawn by a twin sampler (same parameters and seed) as
// Session::forward_sample_masked draws on the host. Rows: greedy; the defaults twice in a row (one launch on the GPU);
// penalties over the row's history, greedy and sampled (a launch each); a mask (even ids only); no sampler (its logits
// come back); top-k off with top-p 0.9. Every token and logits row must be equal, the draws in step (the next step's tokens
// show it). Then a step with two rows' own failures: a mask that throws, and a mask that lets nothing through (no
// finite logit: the sampler's error); the other rows drawn, every session fed, and the step after in step again.
inline void check_forward_batch_sample(const plumb::Engine& e, const std::string& what) {
  SCOPED_TRACE(what);
  const int32_t V = e.info().vocab_size;
  std::vector<plumb::SamplingParams> params(8);
  params[0].temperature = 0;
  params[1].seed = 11, params[2].seed = 12;
  // Penalties, greedy (a window that missed a token would let the previous argmax win again) and sampled.
  for (size_t i : {size_t(3), size_t(7)}) {
    params[i].repeat_penalty = 2.0f, params[i].presence_penalty = 1.5f, params[i].frequency_penalty = 0.5f;
    params[i].penalty_last_n = 16;
  }
  params[3].temperature = 0;
  params[7].seed = 17, params[7].temperature = 1.0f, params[7].top_k = 0, params[7].top_p = 1.0f, params[7].min_p = 0;
  params[4].seed = 14, params[4].temperature = 1.5f;
  params[6].seed = 15, params[6].top_k = 0, params[6].top_p = 0.9f, params[6].min_p = 0;
  const size_t no_sampler = 5, masked = 4;
  std::vector<std::unique_ptr<plumb::Session>> s, twin;
  std::vector<plumb::Sampler> sa, sb;
  std::vector<std::vector<int32_t>> hist;
  std::vector<int32_t> next;
  for (size_t i = 0; i < params.size(); ++i) {
    s.push_back(e.new_session()), twin.push_back(e.new_session());
    sa.emplace_back(params[i], V), sb.emplace_back(params[i], V);
    hist.push_back(csa_long_ids(3 + 2 * i, int(i) + 40));
    s[i]->forward(hist[i]), twin[i]->forward(hist[i]);
    next.push_back(int32_t((i * 31 + 2) % size_t(V)));
  }
  auto even_only = [](std::span<uint32_t> bits) {
    for (size_t id = 0; id < bits.size() * 32; id += 2) bits[id / 32] |= 1u << (id % 32);
  };
  auto host_draw = [&](size_t i, std::vector<float> row, bool mask_even) {
    if (mask_even)
      for (size_t id = 1; id < row.size(); id += 2) row[id] = -std::numeric_limits<float>::infinity();
    return sb[i].sample(row, hist[i]);
  };
  auto step = [&](int k, const std::function<void(std::vector<plumb::BatchRow>&)>& edit) {
    std::vector<plumb::BatchRow> rows(params.size());
    std::vector<plumb::Session*> ps, pt;
    for (size_t i = 0; i < rows.size(); ++i) {
      hist[i].push_back(next[i]);  // (the history holds the token fed, as generate() passes it)
      rows[i].token = next[i], rows[i].history = hist[i];
      if (i != no_sampler) rows[i].sampler = &sa[i];
      if (i == masked) rows[i].allowed = even_only;
      ps.push_back(s[i].get()), pt.push_back(twin[i].get());
    }
    if (edit) edit(rows);
    plumb::forward_batch_sample(ps, rows);
    const std::vector<float> want = plumb::forward_batch(pt, next);
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::string where = "step " + std::to_string(k) + ", row " + std::to_string(i);
      EXPECT_EQ(s[i]->position(), twin[i]->position()) << where;
      const std::vector<float> row(want.begin() + ptrdiff_t(i * size_t(V)), want.begin() + ptrdiff_t((i + 1) * size_t(V)));
      if (!rows[i].sampler) {
        EXPECT_EQ(rows[i].logits, row) << where << ": the logits that came back";
        next[i] = int32_t((size_t(k) * 7 + 1) % size_t(V));
        continue;
      }
      if (rows[i].error) continue;  // (the caller checks it)
      const int32_t t = host_draw(i, row, i == masked);
      EXPECT_EQ(rows[i].sampled, t) << where;
      next[i] = t;
    }
    return rows;
  };
  for (int k = 0; k < 8 && !::testing::Test::HasFailure(); ++k) step(k, {});
  // Row 4's mask throws, row 2's lets nothing through.
  const auto rows = step(8, [](std::vector<plumb::BatchRow>& r) {
    r[4].allowed = [](std::span<uint32_t>) { throw std::runtime_error("the mask failed"); };
    r[2].allowed = [](std::span<uint32_t>) {};
  });
  for (size_t i : {size_t(2), size_t(4)}) {
    ASSERT_TRUE(rows[i].error) << "row " << i << " drew " << rows[i].sampled;
    try {
      std::rethrow_exception(rows[i].error);
    } catch (const std::exception& x) {
      EXPECT_NE(std::string(x.what()).find(i == 4 ? "the mask failed" : "finite"), std::string::npos) << x.what();
    }
    // The twins' host draws fail alike, drawing nothing (row 2: the sampler refuses the empty row).
    if (i == 2) {
      std::vector<float> none(size_t(V), -std::numeric_limits<float>::infinity());
      EXPECT_THROW(sb[i].sample(none, hist[i]), plumb::Error);
    }
    next[i] = int32_t(i + 1);
  }
  for (int k = 9; k < 11 && !::testing::Test::HasFailure(); ++k) step(k, {});
}

}  // namespace plumb_test
