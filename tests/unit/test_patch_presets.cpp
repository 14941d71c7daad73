// Patch presets (src/patches/registry.cpp): `cuda.fast` is accepted wherever a patch name is and stands for its
// patches; it is the same list as bench/gpu_forward.sh's FAST (the device runs' configuration), so the two cannot
// drift; a preset holds no fault; naming a patch beside its preset keeps it once, writing a name twice is an Error.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/strings.h"
#include "patches/registry.h"
#include "toolkit/bisect.h"

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) plumb::append_item(s, x);
  return s;
}

TEST(PatchPresets, EveryMemberIsARegisteredPatchAndNoneIsAFault) {
  ASSERT_FALSE(plumb::patch_presets().empty());
  for (const auto& pr : plumb::patch_presets()) {
    EXPECT_EQ(plumb::find_patch(pr.name), nullptr) << pr.name << " is also a patch's name";
    std::set<std::string> seen;
    for (const auto& m : pr.patches) {
      const plumb::Patch* p = plumb::find_patch(m);
      ASSERT_NE(p, nullptr) << pr.name << ": " << m;
      EXPECT_FALSE(p->fault) << pr.name << ": " << m;
      EXPECT_TRUE(seen.insert(m).second) << pr.name << " lists " << m << " twice";
    }
  }
}

TEST(PatchPresets, APresetParsesAsItsPatches) {
  const plumb::PatchPreset* fast = plumb::find_preset("cuda.fast");
  ASSERT_NE(fast, nullptr);
  const auto a = plumb::parse_patches("cuda.fast"), b = plumb::parse_patches(join(fast->patches));
  EXPECT_EQ(a.names(), b.names());
  EXPECT_EQ(a.names(), join(fast->patches));
  EXPECT_TRUE(a.options.cuda_hc_fold && a.options.attn_splitk_decode && a.options.cuda_graph);
  EXPECT_FALSE(a.options.attn_splitk_f16);
  // More patches beside it, before or after; a member named again counts once, where it first came.
  EXPECT_TRUE(plumb::parse_patches("cuda.fast,attn.splitk_f16").options.attn_splitk_f16);
  EXPECT_EQ(plumb::parse_patches("attn.splitk_f16,cuda.fast").names(), "attn.splitk_f16," + join(fast->patches));
  EXPECT_EQ(plumb::parse_patches("cuda.fast,cuda.graph").names(), join(fast->patches));
  EXPECT_EQ(plumb::parse_patches("cuda.graph,cuda.fast").active.size(), fast->patches.size());
  // Configurations and bisect take it too (bisect searches its patches one by one).
  EXPECT_EQ(plumb::parse_config("cuda:cuda.fast").patches.names(), join(fast->patches));
  EXPECT_EQ(plumb::toolkit::split_patch_list("cuda.fast"), fast->patches);
  // Written twice, or unknown: Errors, the unknown one's message naming the presets too.
  EXPECT_THROW(plumb::parse_patches("cuda.fast,cuda.fast"), plumb::Error);
  EXPECT_THROW(plumb::parse_patches("cuda.graph,cuda.graph"), plumb::Error);
  try {
    plumb::parse_patches("cuda.fastest");
    ADD_FAILURE() << "an unknown name parsed";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda.fast (a preset)"), std::string::npos) << e.what();
  }
}

// bench/gpu_forward.sh runs the device's checks and benches with FAST=${FAST:-list}: the same patches as cuda.fast.
TEST(PatchPresets, CudaFastIsTheDeviceScriptsFast) {
  std::ifstream f(PLUMB_TEST_DATA "/../../bench/gpu_forward.sh");
  ASSERT_TRUE(f) << "bench/gpu_forward.sh not found";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  // (plain string search: GCC 12's <regex> draws -Wmaybe-uninitialized from its own headers)
  const std::string key = "\nFAST=${FAST:-";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos) << "no FAST=${FAST:-...} line";
  const size_t from = at + key.size(), to = text.find('}', from);
  ASSERT_NE(to, std::string::npos);
  EXPECT_EQ(plumb::split_list(text.substr(from, to - from)), plumb::find_preset("cuda.fast")->patches)
      << "bench/gpu_forward.sh's FAST and the cuda.fast preset differ: change both";
}

}  // namespace
