// verify-golden's comparison rules on real fixtures (the indexer top-k is a set per row whatever the tap's width), and
// the fixture loader's refusals of integers that are not integers.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "plumb/tools.h"
#include "tools/golden_fixture.h"
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

// A golden.json whose step fields are numbers but not integers of their range is refused by name. nlohmann's get<>
// would static_cast them: 1e119 as an int64 is undefined behaviour (tests/fuzz found it), 2^32 + 5 as a token
// wrapped to 5. Each case is one step's fields; the fixture's tensors are never read.
TEST(GoldenFixtureLoad, RefusesNumbersThatAreNotIntegersOfTheirRange) {
  plumb_test::TempDir tmp;
  const fs::path dir = tmp.path() / "fixture";
  fs::create_directories(dir);
  const auto write = [&](const std::string& step) {
    std::ofstream(dir / "golden.json") << R"({"format": "dsv4-golden/1", "steps": [)" << step << "]}";
  };
  const struct {
    const char* step;
    const char* says;
  } cases[] = {
      {R"({"name": "s0", "kind": "prefill", "start_pos": 1.1e119, "tokens": [1, 2]})", "start_pos 1.1e+119"},
      {R"({"name": "s0", "kind": "prefill", "start_pos": 0.5, "tokens": [1, 2]})", "start_pos 0.5"},
      {R"({"name": "s0", "kind": "prefill", "start_pos": -1, "tokens": [1, 2]})", "start_pos -1"},
      {R"({"name": "s0", "kind": "prefill", "start_pos": 0, "tokens": [1, 3.5e40]})", "token 3.5e+40"},
      {R"({"name": "s0", "kind": "prefill", "start_pos": 0, "tokens": [1, 4294967301]})", "token 4294967301"},
      {R"({"name": "s0", "kind": "prefill", "start_pos": 0, "tokens": 7})", "tokens 7, not an array"},
  };
  for (const auto& c : cases) {
    write(c.step);
    try {
      (void)plumb::GoldenFixture::load(dir.string());
      ADD_FAILURE() << "accepted " << c.step;
    } catch (const plumb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("golden.json"), std::string::npos) << e.what();
    }
  }
  // The same step with integers passes the step checks and stops only at the missing tensors' file.
  write(R"({"name": "s0", "kind": "prefill", "start_pos": 0, "tokens": [1, 2]})");
  try {
    (void)plumb::GoldenFixture::load(dir.string());
    ADD_FAILURE() << "no golden.safetensors, yet loaded";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("golden.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
