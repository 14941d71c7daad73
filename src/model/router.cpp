// Router reference (spec section 6): fp32 logits, stable scores, top-k over score + bias, renormalize with floor.
#include "model/router.h"

#include <algorithm>
#include <functional>
#include <numeric>

#include "model/ops.h"

namespace plumb {

float router_score(ScoreFunc f, float logit, bool naive_softplus) {
  switch (f) {
    case ScoreFunc::SqrtSoftplus:
      // The naive form is fault.softplus_naive: log(1 + exp(x)) is 0 below -16.6 and inf above 88.7 in fp32.
      return std::sqrt(naive_softplus ? std::log(1.0f + std::exp(logit)) : ops::softplus(logit));
    case ScoreFunc::Sigmoid: return ops::sigmoid(logit);
    case ScoreFunc::Softmax: break;  // needs the whole row: handled by the caller
  }
  return logit;
}

// DeepSeek-V3 grouped selection: rank the n_group groups of E/n_group experts by the sum of each group's two
// best selection scores, keep the best topk_group groups, and exclude the other groups' experts (-inf).
void mask_groups(float* sel, int64_t E, int n_group, int topk_group) {
  const int64_t per = E / n_group;
  std::vector<float> gscore(static_cast<size_t>(n_group));
  for (int g = 0; g < n_group; ++g) {
    std::vector<float> v(sel + g * per, sel + (g + 1) * per);
    std::partial_sort(v.begin(), v.begin() + std::min<int64_t>(2, per), v.end(), std::greater<float>());
    gscore[size_t(g)] = v[0] + (per > 1 ? v[1] : 0.0f);
  }
  const auto keep = ops::topk_lowest_index_first(gscore.data(), n_group, topk_group);
  std::vector<bool> kept(static_cast<size_t>(n_group), false);
  for (auto g : keep) kept[size_t(g)] = true;
  for (int g = 0; g < n_group; ++g)
    if (!kept[size_t(g)])
      for (int64_t e = g * per; e < (g + 1) * per; ++e) sel[e] = -INFINITY;
}

RoutedWeights<Rsf::Unfolded> route_unfolded(const MoeWeights& w, const ModelConfig& c, MlpType type, const RouterInputs& in,
                                            const RouterOptions& opt) {
  const int64_t n = in.x.dim(0), E = c.n_experts, K = c.top_k;
  RoutedWeights<Rsf::Unfolded> r{IndexTensor({n, K}), Tensor({n, K}),
                                 opt.bf16_logits || opt.bf16_weight ? ops::linear_bf16_weight(in.x, w.gate, opt.bf16_logits)
                                                                    : ops::linear(in.x, w.gate),
                                 Tensor()};
  std::vector<float> score(static_cast<size_t>(E)), sel(static_cast<size_t>(E));
  if (type == MlpType::Learned) r.select = Tensor({n, E});
  for (int64_t t = 0; t < n; ++t) {
    const float* lg = r.logits.row(t);
    if (c.score == ScoreFunc::Softmax) {
      std::copy(lg, lg + E, score.begin());
      ops::softmax(score.data(), E);
    } else {
      for (int64_t e = 0; e < E; ++e) score[size_t(e)] = router_score(c.score, lg[e], opt.softplus_naive);
    }
    int64_t* idx = r.idx.ptr() + t * K;
    if (type == MlpType::Hash) {
      const int32_t tok = in.tokens[size_t(t)];
      for (int64_t k = 0; k < K; ++k) idx[k] = w.tid2eid[int64_t(tok) * K + k];
    } else {
      // The correction bias steers selection only; the weights use the unbiased scores.
      for (int64_t e = 0; e < E; ++e) sel[size_t(e)] = score[size_t(e)] + w.bias[e];
      if (c.n_group > 1 && c.topk_group < c.n_group) mask_groups(sel.data(), E, c.n_group, c.topk_group);
      std::copy(sel.begin(), sel.end(), r.select.row(t));
      const auto order = opt.cuda_ties ? ops::topk_lowest_index_first(sel.data(), E, K)
                                       : ops::topk_like_torch(sel.data(), E, K, /*sorted=*/false);
      std::copy(order.begin(), order.end(), idx);
    }
    float sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += score[size_t(idx[k])];
    const float denom = !opt.renorm ? 1.0f : opt.unfloored ? sum : sum + kRenormFloor;
    for (int64_t k = 0; k < K; ++k) r.weight[t * K + k] = score[size_t(idx[k])] / denom;
  }
  return r;
}

template <Rsf P>
void tap_routing(const Tap& tap, const RoutedWeights<P>& r, double rsf) {
  tap("ffn.gate.logits", r.logits);
  if (r.select.numel()) tap("ffn.gate.scores", r.select);
  if (!tap.on("ffn.gate.indices") && !tap.on("ffn.gate.weights")) return;
  const int64_t n = r.idx.dim(0), K = r.idx.dim(1);
  IndexTensor idx({n, K});
  Tensor wt({n, K});
  const float f = P == Rsf::Folded ? 1.0f : float(rsf);
  std::vector<int64_t> ord(static_cast<size_t>(K));
  for (int64_t t = 0; t < n; ++t) {
    std::iota(ord.begin(), ord.end(), 0);
    std::stable_sort(ord.begin(), ord.end(), [&](int64_t a, int64_t b) { return r.idx[t * K + a] < r.idx[t * K + b]; });
    for (int64_t k = 0; k < K; ++k) {
      idx[t * K + k] = r.idx[t * K + ord[size_t(k)]];
      wt[t * K + k] = r.weight[t * K + ord[size_t(k)]] * f;
    }
  }
  tap.index("ffn.gate.indices", idx);
  tap("ffn.gate.weights", wt);
}

template void tap_routing<Rsf::Folded>(const Tap&, const RoutedWeights<Rsf::Folded>&, double);
template void tap_routing<Rsf::Unfolded>(const Tap&, const RoutedWeights<Rsf::Unfolded>&, double);

}  // namespace plumb
