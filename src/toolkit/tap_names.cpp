// Tap-name anatomy: parsing "L<i>.<suffix>", the per-layer execution order and the op behind each tap.
#include "toolkit/tap_names.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <climits>
#include <fmt/format.h>
#include <tuple>

namespace plumb::toolkit {

namespace {

// The order of Model::forward (model.cpp, attention.cpp, hyper_connection.cpp, router.cpp, experts.cpp).
constexpr std::array<const char*, 20> kLayerOrder = {
    "hc_attn.post",     "hc_attn.comb",     "hc_attn.collapsed", "attn.q",          "attn.kv",
    "attn.compressed",  "attn.indexer.scores", "attn.indexer.topk", "attn.out",     "hc_ffn.post",
    "hc_ffn.comb",      "hc_ffn.collapsed", "ffn.gate.logits",   "ffn.gate.scores", "ffn.gate.indices",
    "ffn.gate.weights", "ffn.routed",       "ffn.shared",        "ffn.out",         "out"};

}  // namespace

TapName parse_tap(const std::string& name) {
  TapName t;
  t.suffix = name;
  if (name.size() < 3 || name[0] != 'L') return t;
  const auto dot = name.find('.');
  if (dot == std::string::npos || dot == 1) return t;
  unsigned v = 0;  // unsigned: "L-0.x" is no layer's tap
  const auto [p, ec] = std::from_chars(name.data() + 1, name.data() + dot, v);
  if (ec != std::errc() || p != name.data() + dot || v > unsigned(INT_MAX)) return t;
  t.layer = int(v);
  t.suffix = name.substr(dot + 1);
  return t;
}

int suffix_rank(const std::string& suffix) {
  for (size_t i = 0; i < kLayerOrder.size(); ++i)
    if (suffix == kLayerOrder[i]) return int(i);
  // Finer taps added later (e.g. ffn.experts.<e>) sit next to their parent op.
  if (suffix.rfind("ffn.experts.", 0) == 0) return 16;
  if (suffix.rfind("attn.", 0) == 0) return 7;
  return int(kLayerOrder.size());
}

void sort_execution_order(std::vector<std::string>& names) {
  auto key = [](const std::string& n) {
    const TapName t = parse_tap(n);
    if (t.layer >= 0) return std::tuple<int, int, std::string>(t.layer, suffix_rank(t.suffix), t.suffix);
    const int model_rank = n == "logits" ? 2 : n == "hc_head.out" ? 0 : 1;
    return std::tuple<int, int, std::string>(1 << 30, model_rank, n);
  };
  std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) { return key(a) < key(b); });
}

std::string tap_op(const std::string& name) {
  const TapName t = parse_tap(name);
  const std::string& s = t.suffix;
  if (s == "logits") return "final norm + LM head";
  if (s == "hc_head.out") return "hc head (final stream collapse)";
  if (s.rfind("hc_attn.", 0) == 0)
    return t.layer > 0 ? "mHC pre-mix before attention (reads the previous layer's hc_post output)"
                       : "mHC pre-mix before attention";
  if (s == "attn.q") return "query projection + q_norm + RoPE";
  if (s == "attn.kv") return "KV projection + kv_norm + RoPE";
  if (s == "attn.compressed") return "KV compressor";
  if (s == "attn.indexer.scores") return "lightning indexer scores";
  if (s == "attn.indexer.topk") return "lightning indexer top-k";
  if (s == "attn.out") return "attention (softmax with sink) + grouped output projection";
  if (s.rfind("hc_ffn.", 0) == 0) return "hc_post after attention + mHC pre-mix before the MoE";
  if (s == "ffn.gate.logits") return "router GEMM";
  if (s == "ffn.gate.scores") return "router score function + selection bias";
  if (s == "ffn.gate.indices") return "router top-k selection";
  if (s == "ffn.gate.weights") return "router score + top-k renormalization";
  if (s == "ffn.routed") return "routed experts (SwiGLU) weighted sum";
  if (s == "ffn.shared") return "shared expert (SwiGLU)";
  if (s == "ffn.out") return "MoE combine (routed + shared)";
  if (s == "out") return "hc_post after the MoE (residual stream mixing)";
  if (s.rfind("ffn.experts.", 0) == 0) return "one routed expert (SwiGLU)";
  return "op producing " + name;
}

bool depends_on_hc_post(const std::string& name) {
  const TapName t = parse_tap(name);
  if (t.suffix.rfind("hc_ffn.", 0) == 0 || t.suffix == "out") return true;
  return t.layer > 0 && t.suffix.rfind("hc_attn.", 0) == 0;
}

bool is_moe_tap(const std::string& name) {
  const TapName t = parse_tap(name);
  return t.layer >= 0 && t.suffix.rfind("ffn.", 0) == 0;
}

std::vector<std::string> selection_score_taps(const std::string& index_tap) {
  const TapName t = parse_tap(index_tap);
  const std::string p = fmt::format("L{}.", t.layer);
  if (t.suffix == "ffn.gate.indices") return {p + "ffn.gate.scores", p + "ffn.gate.logits"};
  if (t.suffix == "attn.indexer.topk") return {p + "attn.indexer.scores"};
  return {};
}

}  // namespace plumb::toolkit
