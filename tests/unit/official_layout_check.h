// The official numerics' attention against DeepSeek's own code where a query has more than 64 keys before its
// window is full (tests/data/golden/wide-window-ref, wide-prefill-ref: window 128, made by ../shared/oracle). The
// official sparse attention sums keys in blocks of 64 of its index list, whose window part has holes (-1) after
// the newest key until the window fills; which keys share a block changes the bf16 probabilities' rounding, so a
// layout without the holes differs from the official golden in half of wide-window-ref's steps (measured on the
// CPU: 51 of its 399 (token, layer) rows in 16 of 33 steps, wide-prefill-ref 89 of 474 rows; with the holes 1 and 3). Shared by the CPU suite (test_model_attention.cpp) and the CUDA suite
// (test_cuda_numerics.cpp). Teacher forced: each sublayer starts from the golden's inputs, so an attn.out element
// that differs is the attention's own.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "io/safetensors.h"
#include "model/model.h"
#include "patches/registry.h"
#include "tools/golden_fixture.h"

namespace plumb_test {

// attn.out is wo_b's output: one bf16 rounding flipped inside the attention changes most of its token's row.
struct AttnOutAgreement {
  int64_t rows = 0, differ = 0, steps_differ = 0;  // (token, layer) rows, those not bit-identical to the golden's
  double max_rel = 0;  // largest |got - ref| / max(1, max|ref|) over the attn.out taps
  std::string worst;   // step.tap of it
};

inline AttnOutAgreement official_attn_out_agreement(const std::string& fixture, const std::string& backend,
                                                    const std::string& patches = "numerics.official") {
  const auto fx = plumb::GoldenFixture::load(fixture);
  const auto model = plumb::Model::load(fixture, plumb::parse_patches(patches).options, {}, backend);
  auto state = model->new_state();
  AttnOutAgreement r;
  for (const auto& step : fx.steps) {
    plumb::GoldenForcer forcer(fx, step.name);
    model->forward(state, step.tokens, &forcer);
    bool any = false;
    for (int64_t l = 0; l < model->config().n_layers; ++l) {
      const std::string tap = fmt::format("L{}.attn.out", l);
      const plumb::TensorView* ref = fx.find(step.name, tap);
      const auto got = forcer.f32.find(tap);
      if (!ref || got == forcer.f32.end()) {
        ADD_FAILURE() << fixture << " " << step.name << "." << tap << ": missing from the " << (ref ? "engine" : "fixture");
        continue;
      }
      const plumb::Tensor reft = plumb::to_f32(*ref);
      EXPECT_EQ(got->second.shape, reft.shape) << step.name << "." << tap;
      if (got->second.shape != reft.shape) continue;
      const auto d = plumb::diff_f32(got->second, reft);
      const int64_t n = reft.dim(0), w = reft.numel() / n;
      for (int64_t t = 0; t < n; ++t)
        r.differ += !std::equal(got->second.ptr() + t * w, got->second.ptr() + (t + 1) * w, reft.ptr() + t * w);
      r.rows += n;
      any = any || d.max_abs > 0;
      if (d.rel() > r.max_rel) r.max_rel = d.rel(), r.worst = step.name + "." + tap;
    }
    r.steps_differ += any;
  }
  return r;
}

// What may remain: a bf16 rounding flipped in a rare row, one ulp (2^-8 relative) of a value below 1 (measured: 1 and
// 3 rows; not traced further: the oracle's README lists fp32 accumulation order and exp at ulp level as its known
// residuals), where the layout without holes differed in 51 of wide-window-ref's 399 rows (16 of 33 steps) and 89 of
// wide-prefill-ref's 474, by up to 0.0053.
inline void expect_official_attention_agrees(const std::string& name, const std::string& backend) {
  const auto r = official_attn_out_agreement(std::string(PLUMB_TEST_DATA) + "/golden/" + name, backend);
  std::printf("%s [%s]: %lld of %lld attn.out rows differ, in %lld steps; worst %.3g (%s)\n", name.c_str(), backend.c_str(),
              static_cast<long long>(r.differ), static_cast<long long>(r.rows), static_cast<long long>(r.steps_differ),
              r.max_rel, r.worst.c_str());
  EXPECT_LE(r.differ * 100, r.rows) << name << ": more than 1 in 100 attn.out rows differ from the official code";
  EXPECT_LE(r.steps_differ, 2) << name;
  EXPECT_LE(r.max_rel, 1.0 / 256) << name << ": worst at " << r.worst;
}

}  // namespace plumb_test
