// verify-golden's comparison rules on real fixtures: the indexer top-k is a set per row whatever the tap's width.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "plumb/tools.h"
#include "model_test_util.h"

namespace {

namespace fs = std::filesystem;

int verify(const fs::path& dir) {
  plumb::tools::VerifyGoldenOptions o;
  o.dir = dir.string(), o.patches = "numerics.official", o.quiet = true;
  return plumb::tools::verify_golden(o);
}

// v-small-chunks-ref (DeepSeek's official code) pads every indexer row to index_topk (4) with -1, where plumb's tap,
// as transformers', is as wide as the entries visible (1 at the first step): the fixture passes. The same golden with
// one row's set changed (step s0's last row loses its one entry) must fail, so the width rule is not a free pass.
TEST(VerifyGoldenIndexer, TopkWidthMayDifferButTheSetsMustAgree) {
  const fs::path src = fs::path(PLUMB_TEST_DATA) / "golden" / "v-small-chunks-ref";
  EXPECT_EQ(verify(src), 0);

  plumb_test::TempDir tmp;
  const fs::path dir = tmp.path() / "changed";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "golden.json", "model.safetensors"})
    fs::copy_file(fs::canonical(src / f), dir / f);  // (model.safetensors is a link to the base fixture's)
  const auto golden = plumb::SafetensorsFile::open((src / "golden.safetensors").string());
  std::vector<plumb::OwnedTensor> out;
  bool changed = false;
  for (const auto& [name, v] : golden->tensors()) {
    plumb::OwnedTensor t{name, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)};
    if (name == "s0.L1.attn.indexer.topk") {
      ASSERT_EQ(v.dtype, plumb::DType::I64);
      ASSERT_EQ(v.shape, (plumb::Shape{5, 4}));
      int64_t row[4];
      std::memcpy(row, t.bytes.data() + 4 * 4 * 8, sizeof(row));
      ASSERT_EQ(row[0], 0) << "the last row's one visible entry";
      row[0] = -1;
      std::memcpy(t.bytes.data() + 4 * 4 * 8, row, sizeof(row));
      changed = true;
    }
    out.push_back(std::move(t));
  }
  ASSERT_TRUE(changed);
  plumb::write_safetensors((dir / "golden.safetensors").string(), out);
  EXPECT_EQ(verify(dir), 1);
}

}  // namespace
