// Fuzz harness: any bytes as a model's config.json. ModelConfig::from_json either rejects it with a plumb::Error
// (naming the field) or returns a config whose derived sizes are consistent; other exceptions (nlohmann's type
// errors included), crashes and sanitizer reports are bugs. Text that is not JSON is rejected before the config
// sees it, as ModelConfig::load does.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  const auto j = nlohmann::json::parse(in.rest(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const plumb::ModelConfig c = plumb::ModelConfig::from_json(j, "fuzz/config.json");
    PLUMB_FUZZ_CHECK(c.hidden > 0 && c.n_layers > 0 && c.vocab > 0);
    PLUMB_FUZZ_CHECK(c.top_k >= 1 && c.top_k <= c.n_experts);
    PLUMB_FUZZ_CHECK(int(c.attn.size()) == c.n_layers && int(c.mlp.size()) == c.n_layers);
    // The grouped output projection slices the heads' concatenated outputs (n_heads x head_dim) into o_groups equal
    // parts, as the official code's view does: a group may end inside a head.
    PLUMB_FUZZ_CHECK(c.n_heads > 0 && c.head_dim > 0 && c.o_groups > 0 && int64_t(c.n_heads) * c.head_dim % c.o_groups == 0);
    PLUMB_FUZZ_CHECK(c.rope_dim >= 0 && c.rope_dim <= c.head_dim && c.hc_mult > 0);
    (void)c.summary();
  } catch (const plumb::Error&) {
  }
  return 0;
}
