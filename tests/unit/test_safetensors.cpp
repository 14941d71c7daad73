// Safetensors reader/writer: round trips, every header corruption, truncation and byte fuzzing, sharding,
// decoding.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

namespace fs = std::filesystem;
using plumb::Checkpoint;
using plumb::DType;
using plumb::OwnedTensor;
using plumb::SafetensorsFile;

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

// A file with an explicit header length field, header text and data buffer, for hand-made corruptions.
std::vector<uint8_t> raw_file(uint64_t header_len, const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out;
  for (int i = 0; i < 8; ++i) out.push_back(uint8_t(header_len >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0xAB);
  return out;
}

template <typename T>
std::vector<uint8_t> as_bytes(std::initializer_list<T> values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (values.size()) std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = uint8_t(seed + 37 * i);
  return out;
}

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("plumb_st_" + std::to_string(::getpid()) + "_" + info->name() + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a hand-made file and expects open() to throw an Error naming the file and each of `needles`.
  void expect_rejected(const std::vector<uint8_t>& bytes, std::initializer_list<std::string> needles) {
    const std::string p = path("bad.safetensors");
    write_bytes(p, bytes);
    try {
      SafetensorsFile::open(p);
      ADD_FAILURE() << "open() accepted a corrupt file";
    } catch (const plumb::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      for (const auto& n : needles)
        EXPECT_NE(msg.find(n), std::string::npos) << "want '" << n << "' in: " << msg;
    }
  }

  void expect_header_rejected(const std::string& header, size_t data_bytes,
                              std::initializer_list<std::string> needles) {
    expect_rejected(raw_file(header.size(), header, data_bytes), needles);
  }

  // A small valid file whose last byte belongs to a tensor, so every proper prefix of it is invalid.
  std::string write_sample(const std::string& name) {
    const std::string p = path(name);
    plumb::write_safetensors(p,
                             {{"a.weight", DType::BF16, {2, 3}, pattern(12, 1)},
                              {"b.scale", DType::F8_E8M0, {3}, pattern(3, 2)},
                              {"c.bias", DType::F32, {4}, pattern(16, 3)}},
                             {{"format", "pt"}});
    return p;
  }

  fs::path dir_;
};

TEST_F(Safetensors, RoundTripsEveryDtypeZeroSizeScalarAndMetadata) {
  const std::vector<OwnedTensor> tensors = {
      {"f32", DType::F32, {2, 3}, pattern(24, 1)},     {"bf16", DType::BF16, {3}, pattern(6, 2)},
      {"f16", DType::F16, {1, 2}, pattern(4, 3)},      {"e4m3", DType::F8_E4M3, {5}, pattern(5, 4)},
      {"e8m0", DType::F8_E8M0, {2, 2}, pattern(4, 5)}, {"i8", DType::I8, {3}, pattern(3, 6)},
      {"u8", DType::U8, {7}, pattern(7, 7)},           {"i32", DType::I32, {2}, pattern(8, 8)},
      {"i64", DType::I64, {}, pattern(8, 9)},          {"empty", DType::F32, {0, 4}, {}},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "round trip"}};
  const std::string p = path("rt.safetensors");
  plumb::write_safetensors(p, tensors, meta);

  const auto bytes = read_bytes(p);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "data buffer must start 8-byte aligned";

  const auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f->path(), p);
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), tensors.size());
  for (const auto& t : tensors) {
    const plumb::TensorView* v = f->find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(v->name, t.name);
    EXPECT_EQ(v->dtype, t.dtype) << t.name;
    EXPECT_EQ(v->shape, t.shape) << t.name;
    EXPECT_EQ(v->file, p);
    ASSERT_EQ(v->nbytes, t.bytes.size()) << t.name;
    EXPECT_EQ(std::vector<uint8_t>(v->data, v->data + v->nbytes), t.bytes) << t.name;
  }
  EXPECT_EQ(f->find("absent"), nullptr);
  EXPECT_EQ(f->find("empty")->numel(), 0);
}

TEST_F(Safetensors, OwnedTensorsRoundTripThroughDecoders) {
  const plumb::Tensor t({2, 2}, std::vector<float>{1.0f, -2.5f, 3.25f, 0.0f});
  const plumb::IndexTensor ids({3}, std::vector<int64_t>{7, -1, int64_t(1) << 40});
  const std::string p = path("owned.safetensors");
  plumb::write_safetensors(p, {plumb::owned_f32("t", t), plumb::owned_i64("ids", ids)});
  const auto f = SafetensorsFile::open(p);
  const plumb::Tensor t2 = plumb::to_f32(*f->find("t"));
  EXPECT_EQ(t2.shape, t.shape);
  EXPECT_EQ(t2.data, t.data);
  const plumb::IndexTensor ids2 = plumb::to_i64(*f->find("ids"));
  EXPECT_EQ(ids2.shape, ids.shape);
  EXPECT_EQ(ids2.data, ids.data);
  EXPECT_TRUE(f->metadata().empty());
}

TEST_F(Safetensors, WriterRejectsInconsistentTensors) {
  const std::string p = path("w.safetensors");
  EXPECT_THROW(plumb::write_safetensors(p, {{"x", DType::F32, {3}, pattern(8, 0)}}), plumb::Error);
  EXPECT_THROW(plumb::write_safetensors(p, {{"x", DType::U8, {1}, {1}}, {"x", DType::U8, {1}, {2}}}),
               plumb::Error);
  EXPECT_THROW(plumb::write_safetensors(p, {{"__metadata__", DType::U8, {1}, {1}}}), plumb::Error);
}

TEST_F(Safetensors, ZeroSizeTensorsAreLegalAnywhere) {
  // An empty tensor at offset 4 sits inside the range of "w"; it occupies no bytes, so nothing overlaps.
  const std::string h = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("e":{"dtype":"BF16","shape":[3,0],"data_offsets":[4,4]},)"
                        R"("z":{"dtype":"I64","shape":[0],"data_offsets":[8,8]}})";
  const std::string p = path("zero.safetensors");
  write_bytes(p, raw_file(h.size(), h, 8));
  const auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f->find("e")->nbytes, 0u);
  EXPECT_EQ(f->find("z")->nbytes, 0u);
  EXPECT_EQ(plumb::to_f32(*f->find("e")).numel(), 0);
}

TEST_F(Safetensors, RejectsFileShorterThanLengthField) {
  expect_rejected({}, {"too short"});
  expect_rejected({1, 0, 0, 0, 0, 0, 0}, {"too short"});
}

TEST_F(Safetensors, RejectsHeaderLengthBeyondFile) {
  expect_rejected(raw_file(1000, "{}", 0), {"header length 1000", "exceeds"});
}

TEST_F(Safetensors, RejectsAbsurdHeaderLength) {
  expect_rejected(raw_file(uint64_t(1) << 40, "{}", 0), {"absurdly large"});
  expect_rejected(raw_file(~uint64_t(0), "{}", 0), {"absurdly large"});
}

TEST_F(Safetensors, RejectsInvalidJson) {
  expect_header_rejected(R"({"w": )", 0, {"not valid JSON"});
  expect_header_rejected(std::string("{\"a\0\":1}", 8), 0, {"not valid JSON"});
  expect_header_rejected("{\"\xff\xfe\":{}}", 0, {"not valid JSON"});  // invalid UTF-8
  expect_header_rejected("", 0, {"not valid JSON"});
}

TEST_F(Safetensors, RejectsHeaderThatIsNotAnObject) {
  expect_header_rejected("[1, 2]", 0, {"not an object"});
  expect_header_rejected(R"("text")", 0, {"not an object"});
}

TEST_F(Safetensors, RejectsUnknownDtype) {
  expect_header_rejected(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8,
                         {"unknown dtype 'F64'", "w"});
}

TEST_F(Safetensors, RejectsMissingFields) {
  expect_header_rejected(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 1, {"'w'", "dtype"});
  expect_header_rejected(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", 1, {"'w'", "shape"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[1]}})", 1, {"'w'", "data_offsets"});
}

TEST_F(Safetensors, RejectsIllTypedFields) {
  expect_header_rejected(R"({"w":3})", 0, {"'w'", "not a JSON object"});
  expect_header_rejected(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1, {"'w'", "dtype"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":"1","data_offsets":[0,1]}})", 1, {"'w'", "shape"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[1]}})", 1,
                         {"'w'", "data_offsets"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 2,
                         {"'w'", "data_offsets"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":["0","1"]}})", 1,
                         {"'w'", "data_offsets"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1,
                         {"'w'", "data_offsets"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0.0,1.0]}})", 1,
                         {"'w'", "data_offsets"});
}

TEST_F(Safetensors, RejectsNegativeShapeEntry) {
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0,
                         {"'w'", "non-negative"});
}

TEST_F(Safetensors, RejectsNonIntegerShapeEntry) {
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", 2, {"'w'", "2.5"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", 2,
                         {"'w'", "non-negative"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}})", 2,
                         {"'w'", "non-negative"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[null],"data_offsets":[0,2]}})", 2,
                         {"'w'", "non-negative"});
}

TEST_F(Safetensors, RejectsShapeProductOverflow) {
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})", 0,
                         {"'w'", "64 bits"});
  expect_header_rejected(R"({"w":{"dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0,
                         {"'w'", "64 bits"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", 0,
                         {"'w'", "non-negative"});
  // A zero anywhere makes the product 0, however large the other entries.
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[0,9223372036854775807],"data_offsets":[0,1]}})", 1,
                         {"'w'", "needs 0"});
}

TEST_F(Safetensors, RejectsOffsetsEndBeforeBegin) {
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[8,4]}})", 8,
                         {"'w'", "before begin"});
}

TEST_F(Safetensors, RejectsOffsetsBeyondDataBuffer) {
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", 8, {"'w'", "beyond"});
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[9,9]}})", 8, {"'w'", "beyond"});
  // Offsets past INT64_MAX: no buffer is that large, refused as offsets out of range.
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,)"
                         R"(18446744073709551615]}})",
                         8, {"'w'", "data_offsets", "64-bit"});
}

TEST_F(Safetensors, RejectsByteSizeMismatch) {
  expect_header_rejected(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
                         {"'w'", "span 8 bytes", "needs 12"});
}

TEST_F(Safetensors, RejectsOverlappingTensors) {
  expect_header_rejected(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                         12, {"'a'", "'b'", "overlap"});
  expect_header_rejected(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                         4, {"overlap"});
}

TEST_F(Safetensors, RejectsNonStringMetadata) {
  expect_header_rejected(R"({"__metadata__":{"format":"pt","step":3}})", 0, {"__metadata__", "'step'"});
  expect_header_rejected(R"({"__metadata__":["pt"]})", 0, {"__metadata__"});
}

TEST_F(Safetensors, RejectsDuplicateKeys) {
  expect_header_rejected(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                         R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                         2, {"duplicate key 'w'"});
  expect_header_rejected(R"({"w":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1,
                         {"duplicate key 'dtype'"});
}

TEST_F(Safetensors, RejectsEveryTruncation) {
  const std::string p = write_sample("cut.safetensors");
  // Shrinking one file in place, from the longest prefix down, keeps this to one syscall per length.
  for (auto len = fs::file_size(p); len-- > 0;) {
    fs::resize_file(p, len);
    EXPECT_THROW(SafetensorsFile::open(p), plumb::Error) << "truncated to " << len << " bytes";
  }
}

TEST_F(Safetensors, ArbitraryHeaderBytesNeverCrash) {
  const std::string p = write_sample("fuzz.safetensors");
  const auto bytes = read_bytes(p);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  // Bytes that break strings, nesting, numbers and UTF-8, or turn offsets and dims into other numbers.
  const char replacements[] = {'\0', '\xFF', '"', '}', ',', '9', '0'};
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  for (size_t pos = 0; pos < 8 + header_len; ++pos) {
    for (char r : replacements) {
      f.seekp(std::streamoff(pos)).put(r).flush();
      try {
        const auto st = SafetensorsFile::open(p);
        for (const auto& [name, v] : st->tensors()) plumb::to_f32(v);  // touches every accepted byte
      } catch (const plumb::Error&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << "byte " << pos << " = " << int(uint8_t(r)) << ": non-plumb exception " << e.what();
      }
    }
    f.seekp(std::streamoff(pos)).put(char(bytes[pos])).flush();
  }
  ASSERT_TRUE(f.good());
}

TEST_F(Safetensors, OpenRejectsMissingFileAndDirectory) {
  EXPECT_THROW(SafetensorsFile::open(path("nope.safetensors")), plumb::Error);
  EXPECT_THROW(SafetensorsFile::open(dir_.string()), plumb::Error);
}

// ---- decoding ----

TEST_F(Safetensors, DecodesEveryDtypeIncludingUnalignedData) {
  const std::string p = path("dec.safetensors");
  // The leading 1-byte tensor pushes every later tensor off its natural alignment.
  plumb::write_safetensors(p, {
                                  {"pad", DType::U8, {1}, {0}},
                                  {"f32", DType::F32, {2}, as_bytes<float>({1.5f, -2.0f})},
                                  {"bf16", DType::BF16, {2}, as_bytes<uint16_t>({0x3FC0, 0xC000})},
                                  {"f16", DType::F16, {2}, as_bytes<uint16_t>({0x3E00, 0xC000})},
                                  {"e4m3", DType::F8_E4M3, {2}, {0x3C, 0xC0}},
                                  {"e8m0", DType::F8_E8M0, {2}, {0x80, 0x7E}},
                                  {"i8", DType::I8, {2}, as_bytes<int8_t>({-3, 127})},
                                  {"u8", DType::U8, {2}, {200, 0}},
                                  {"i32", DType::I32, {2}, as_bytes<int32_t>({-70000, 5})},
                                  {"i64", DType::I64, {2}, as_bytes<int64_t>({5000000000, -1})},
                              });
  const auto f = SafetensorsFile::open(p);
  EXPECT_NE(reinterpret_cast<uintptr_t>(f->find("f32")->data) % 4, 0u);
  EXPECT_NE(reinterpret_cast<uintptr_t>(f->find("i64")->data) % 8, 0u);

  const std::map<std::string, std::vector<float>> want = {
      {"f32", {1.5f, -2.0f}},  {"bf16", {1.5f, -2.0f}},    {"f16", {1.5f, -2.0f}},
      {"e4m3", {1.5f, -2.0f}}, {"e8m0", {2.0f, 0.5f}},     {"i8", {-3.0f, 127.0f}},
      {"u8", {200.0f, 0.0f}},  {"i32", {-70000.0f, 5.0f}}, {"i64", {5e9f, -1.0f}},
  };
  for (const auto& [name, values] : want) {
    const plumb::Tensor t = plumb::to_f32(*f->find(name));
    EXPECT_EQ(t.shape, plumb::Shape{2}) << name;
    EXPECT_EQ(t.data, values) << name;
  }

  const std::map<std::string, std::vector<int64_t>> want_i = {
      {"i8", {-3, 127}}, {"u8", {200, 0}}, {"i32", {-70000, 5}}, {"i64", {5000000000, -1}}};
  for (const auto& [name, values] : want_i) EXPECT_EQ(plumb::to_i64(*f->find(name)).data, values) << name;

  for (const char* name : {"f32", "bf16", "f16", "e4m3", "e8m0"}) {
    try {
      plumb::to_i64(*f->find(name));
      ADD_FAILURE() << "to_i64 accepted " << name;
    } catch (const plumb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

TEST(SafetensorsDtype, NamesParseAndSizes) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F8_E4M3, DType::F8_E8M0, DType::I8, DType::U8,
                  DType::I32, DType::I64})
    EXPECT_EQ(plumb::parse_dtype(plumb::dtype_name(t), "test"), t);
  EXPECT_EQ(plumb::dtype_size(DType::F8_E8M0), 1u);
  EXPECT_EQ(plumb::dtype_size(DType::BF16), 2u);
  EXPECT_EQ(plumb::dtype_size(DType::I64), 8u);
  EXPECT_THROW(plumb::parse_dtype("f32", "ctx"), plumb::Error);
}

// ---- checkpoints ----

class CheckpointTest : public Safetensors {
 protected:
  void write_shard(const std::string& name, const std::vector<std::string>& tensors) {
    std::vector<OwnedTensor> ts;
    for (size_t i = 0; i < tensors.size(); ++i)
      ts.push_back({tensors[i], DType::F32, {1}, as_bytes<float>({float(i + 1)})});
    plumb::write_safetensors(path(name), ts);
  }
  void write_index(const std::string& weight_map_json) {
    std::ofstream(path("model.safetensors.index.json"))
        << R"({"metadata":{"total_size":12},"weight_map":)" << weight_map_json << "}";
  }
  void expect_open_fails(std::initializer_list<std::string> needles) {
    try {
      Checkpoint::open(dir_.string());
      ADD_FAILURE() << "Checkpoint::open accepted a broken checkpoint";
    } catch (const plumb::Error& e) {
      const std::string msg = e.what();
      for (const auto& n : needles)
        EXPECT_NE(msg.find(n), std::string::npos) << "want '" << n << "' in: " << msg;
    }
  }
};

TEST_F(CheckpointTest, ShardedIndexHappyPath) {
  write_shard("model-00001-of-00002.safetensors", {"a", "b"});
  write_shard("model-00002-of-00002.safetensors", {"c"});
  write_index(R"({"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
              R"("c":"model-00002-of-00002.safetensors"})");
  const Checkpoint ck = Checkpoint::open(dir_.string());
  EXPECT_EQ(ck.path(), dir_.string());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(plumb::to_f32(ck.get("b")).data, std::vector<float>{2.0f});
  EXPECT_EQ(plumb::to_f32(ck.get("c")).data, std::vector<float>{1.0f});
  EXPECT_EQ(ck.get("c").file, path("model-00002-of-00002.safetensors"));
  EXPECT_EQ(ck.find("zz"), nullptr);
  try {
    ck.get("zz");
    ADD_FAILURE() << "get() of a missing tensor returned";
  } catch (const plumb::Error& e) {
    EXPECT_EQ(std::string(e.what()), "missing tensor zz in " + dir_.string());
  }
}

TEST_F(CheckpointTest, IndexNamesMissingShard) {
  write_shard("s1.safetensors", {"a"});
  write_index(R"({"a":"s1.safetensors","b":"s2.safetensors"})");
  expect_open_fails({path("s2.safetensors"), "missing"});
}

TEST_F(CheckpointTest, IndexedTensorAbsentFromShard) {
  write_shard("s1.safetensors", {"a"});
  write_index(R"({"a":"s1.safetensors","ghost":"s1.safetensors"})");
  expect_open_fails({"ghost", path("s1.safetensors"), "absent"});
}

TEST_F(CheckpointTest, DuplicateTensorAcrossShards) {
  write_shard("s1.safetensors", {"a", "b"});
  write_shard("s2.safetensors", {"b"});
  write_index(R"({"a":"s1.safetensors","b":"s2.safetensors"})");
  expect_open_fails({"duplicate tensor b", path("s1.safetensors"), path("s2.safetensors")});
}

TEST_F(CheckpointTest, MalformedIndex) {
  std::ofstream(path("model.safetensors.index.json")) << "{not json";
  expect_open_fails({"model.safetensors.index.json", "not valid JSON"});
  write_index(R"(["s1.safetensors"])");
  expect_open_fails({"weight_map"});
  write_index(R"({"a":"../elsewhere.safetensors"})");
  expect_open_fails({"plain file name"});
}

TEST_F(CheckpointTest, SingleFileDirectoryAndPath) {
  write_shard("model.safetensors", {"x", "y"});
  EXPECT_EQ(Checkpoint::open(dir_.string()).names(), (std::vector<std::string>{"x", "y"}));
  const Checkpoint ck = Checkpoint::open(path("model.safetensors"));
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_THROW(ck.get("z"), plumb::Error);
}

TEST_F(CheckpointTest, EmptyDirectoryListsWhatWasLookedFor) {
  expect_open_fails({dir_.string(), "model.safetensors.index.json", "model.safetensors"});
  try {
    Checkpoint::open(path("nonexistent"));
    ADD_FAILURE() << "opened a nonexistent path";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path("nonexistent")), std::string::npos);
  }
}

}  // namespace
