#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/testing.h"
#include "io/safetensors.h"
#include "io_test_util.h"

using namespace kestrel;
using namespace kestrel::io;
using kestrel::testing::st_bytes;
using kestrel::testing::TempDir;
using kestrel::testing::write_bytes;

namespace {

Tensor filled(Shape shape, DType dt, float scale) {
  Tensor t = Tensor::empty(std::move(shape), dt, MemCategory::Other);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dt == DType::U8 ? float(i % 200) : scale * float(i - 3));
  return t;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string error_of(const std::string& path) {
  auto r = SafetensorsFile::open(path);
  EXPECT_FALSE(r.is_ok()) << "expected open to fail for " << path;
  return r.is_ok() ? std::string() : r.status().message();
}

}  // namespace

TEST(Safetensors, RoundTripAllDtypesZeroCopy) {
  TempDir tmp;
  std::vector<NamedTensor> ts = {
      {"a.f32", filled({2, 3}, DType::F32, 0.5f)},  {"b.bf16", filled({4}, DType::BF16, 1.25f)},
      {"c.f16", filled({3, 1}, DType::F16, -0.75f)}, {"d.i32", filled({5}, DType::I32, 7.0f)},
      {"e.i64", filled({2, 2}, DType::I64, 11.0f)},  {"f.u8", filled({7}, DType::U8, 1.0f)},
      {"g.empty", Tensor::empty({0, 4}, DType::F32)}, {"h.scalar", filled({}, DType::F32, 2.0f)},
  };
  const std::string path = tmp.file("x.safetensors");
  ASSERT_TRUE(save_safetensors(path, ts, {{"format", "pt"}, {"step", "7"}}).is_ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(getpid())));

  // Header length is a multiple of 8, padded with spaces; __metadata__ first.
  const std::string raw = read_text(path);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw.substr(8, 15), "{\"__metadata__\"");
  EXPECT_EQ(raw.find_last_not_of(' ', 8 + n - 1), raw.find_last_of('}', 8 + n - 1));

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ((*f)->metadata().at("step"), "7");
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  ASSERT_EQ((*f)->tensors().size(), ts.size());
  // Data order: by element size, largest first (as the reference writer does,
  // so every tensor is aligned), in the given order within one size.
  const std::vector<std::string> order = {"e.i64", "a.f32", "d.i32", "g.empty", "h.scalar", "b.bf16", "c.f16", "f.u8"};
  for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ((*f)->tensors()[i].name, order[i]);
  for (const auto& nt : ts) {
    auto got = (*f)->get(nt.name);
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    EXPECT_EQ(got->dtype(), nt.tensor.dtype()) << nt.name;
    EXPECT_EQ(got->shape(), nt.tensor.shape()) << nt.name;
    EXPECT_FALSE(got->storage()->owned()) << nt.name << " should borrow the mapping";
    ASSERT_EQ(got->nbytes(), nt.tensor.nbytes());
    EXPECT_EQ(std::memcmp(got->raw(), nt.tensor.raw(), nt.tensor.nbytes()), 0) << nt.name;
  }
  // A borrowed tensor keeps the mapping alive after the file object is dropped.
  Tensor keep = (*f)->get("a.f32").value();
  f = Result<std::shared_ptr<SafetensorsFile>>(Status::error("dropped"));
  EXPECT_EQ(keep.get(5), 0.5f * 2);
}

TEST(Safetensors, SaveConvertsDtype) {
  TempDir tmp;
  const std::string path = tmp.file("c.safetensors");
  Tensor a = Tensor::from_vector({1.0f, 1.00390625f, -3.3f, 65504.0f}, {4});
  DType bf = DType::BF16;
  ASSERT_TRUE(save_safetensors(path, {{"a", a}}, {}, &bf).is_ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok());
  Tensor got = (*f)->get("a").value();
  ASSERT_EQ(got.dtype(), DType::BF16);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got.get(i), round_bf16(a.get(i)));
  EXPECT_TRUE((*f)->metadata().empty());
}

TEST(Safetensors, WeightDirSingleFileAndLoadConverts) {
  TempDir tmp;
  Tensor w = filled({3, 4}, DType::F32, 0.1f);
  ASSERT_TRUE(save_weights_dir(tmp.path(), {{"w", w}, {"b", filled({4}, DType::F32, 1.0f)}}, DType::BF16).is_ok());
  EXPECT_TRUE(std::filesystem::exists(tmp.file("model.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("model.safetensors.index.json")));
  auto ws = WeightSource::open_dir(tmp.path());
  ASSERT_TRUE(ws.is_ok()) << ws.status().message();
  EXPECT_FALSE(ws->sharded());
  EXPECT_EQ(ws->names(), (std::vector<std::string>{"b", "w"}));
  auto loaded = ws->load("w", {3, 4}, DType::F32, MemCategory::Params);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_TRUE(loaded->storage()->owned());
  EXPECT_EQ(loaded->storage()->category(), MemCategory::Params);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(loaded->get(i), round_bf16(w.get(i)));
}

TEST(Safetensors, ShardedRoundTripLikeSavePretrained) {
  TempDir tmp;
  // f32: a=48 B, b=16 B, c=200 B (over the 64 B limit: own shard), d=40 B, e=40 B.
  std::vector<NamedTensor> ts = {{"a", filled({12}, DType::F32, 1)},
                                 {"b", filled({4}, DType::F32, 2)},
                                 {"c", filled({50}, DType::F32, 3)},
                                 {"d", filled({10}, DType::F32, 4)},
                                 {"e", filled({10}, DType::F32, 5)}};
  // A stale single file from an earlier save must not shadow the shards.
  ASSERT_TRUE(save_weights_dir(tmp.path(), {{"old", filled({1}, DType::F32, 1)}}, DType::F32).is_ok());
  ASSERT_TRUE(save_weights_dir(tmp.path(), ts, DType::F32, 64).is_ok());
  EXPECT_FALSE(std::filesystem::exists(tmp.file("model.safetensors")));
  // huggingface_hub's split (checked against split_torch_state_dict_into_shards):
  // c is oversized and becomes a shard at once; [a,b] (64 B) closes when d
  // arrives; then [d], [e] (d+e = 80 B > 64).
  auto index = nlohmann::json::parse(read_text(tmp.file("model.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), 48 + 16 + 200 + 40 + 40);
  EXPECT_EQ(index["weight_map"]["c"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["a"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["b"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["d"], "model-00003-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["e"], "model-00004-of-00004.safetensors");

  auto ws = WeightSource::open_dir(tmp.path());
  ASSERT_TRUE(ws.is_ok()) << ws.status().message();
  EXPECT_TRUE(ws->sharded());
  EXPECT_FALSE(ws->contains("old"));
  for (const auto& nt : ts) {
    auto t = ws->load(nt.name, nt.tensor.shape(), DType::F32);
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    EXPECT_EQ(t->to_float_vector(), nt.tensor.to_float_vector()) << nt.name;
  }
  EXPECT_HAS(ws->file_of("c"), "model-00001-of-00004.safetensors");

  // Re-saving as one file removes the index and the shards.
  ASSERT_TRUE(save_weights_dir(tmp.path(), ts, DType::F32).is_ok());
  EXPECT_FALSE(std::filesystem::exists(tmp.file("model.safetensors.index.json")));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("model-00001-of-00004.safetensors")));
  EXPECT_FALSE(WeightSource::open_dir(tmp.path())->sharded());
}

// ---- malformed files -------------------------------------------------------

TEST(SafetensorsErrors, FileShorterThanHeaderLength) {
  TempDir tmp;
  write_bytes(tmp.file("t.safetensors"), std::string("\x05\x00\x00", 3));
  EXPECT_HAS(error_of(tmp.file("t.safetensors")), "truncated safetensors file: 3 bytes");
}

TEST(SafetensorsErrors, HeaderLengthPastEndOfFile) {
  TempDir tmp;
  write_bytes(tmp.file("t.safetensors"), st_bytes("{}", "", 1000));
  const std::string msg = error_of(tmp.file("t.safetensors"));
  EXPECT_HAS(msg, "header length 1000 runs past the end of the file (10 bytes");
  EXPECT_HAS(msg, tmp.file("t.safetensors"));
}

TEST(SafetensorsErrors, OffsetsPastEndOfFile) {
  TempDir tmp;
  write_bytes(tmp.file("t.safetensors"),
              st_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0')));
  const std::string msg = error_of(tmp.file("t.safetensors"));
  EXPECT_HAS(msg, "tensor 'w': data_offsets [0,16] point past the end of the file (data section is 8 bytes)");
}

TEST(SafetensorsErrors, UnsupportedAndUnknownDtype) {
  TempDir tmp;
  write_bytes(tmp.file("f64.safetensors"),
              st_bytes(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')));
  std::string msg = error_of(tmp.file("f64.safetensors"));
  EXPECT_HAS(msg, "f64.safetensors: tensor 'w': unsupported dtype F64;");
  write_bytes(tmp.file("bool.safetensors"),
              st_bytes(R"({"m":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0')));
  EXPECT_HAS(error_of(tmp.file("bool.safetensors")), "tensor 'm': unsupported dtype BOOL");
  write_bytes(tmp.file("q.safetensors"),
              st_bytes(R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0')));
  EXPECT_HAS(error_of(tmp.file("q.safetensors")), "unsupported dtype Q4 (not a safetensors dtype)");
}

TEST(SafetensorsErrors, ShapeDisagreesWithByteRange) {
  TempDir tmp;
  write_bytes(tmp.file("t.safetensors"),
              st_bytes(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_HAS(error_of(tmp.file("t.safetensors")), "shape [3] of BF16 needs 3 x 2 bytes but data_offsets [0,8] span 8 bytes");
}

TEST(SafetensorsErrors, OverlappingTensors) {
  TempDir tmp;
  write_bytes(tmp.file("t.safetensors"),
              st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       std::string(16, '\0')));
  EXPECT_HAS(error_of(tmp.file("t.safetensors")), "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
}

TEST(SafetensorsErrors, MalformedHeaderJsonNamesPosition) {
  TempDir tmp;
  write_bytes(tmp.file("t.safetensors"), st_bytes(R"({"w": {"dtype": "F32",,}})", ""));
  const std::string msg = error_of(tmp.file("t.safetensors"));
  EXPECT_HAS(msg, "safetensors header is not valid JSON");
  EXPECT_HAS(msg, "line 1, column 23");
}

TEST(SafetensorsErrors, BadMetadataAndEntries) {
  TempDir tmp;
  write_bytes(tmp.file("m.safetensors"), st_bytes(R"({"__metadata__":{"n":3}})", ""));
  EXPECT_HAS(error_of(tmp.file("m.safetensors")), "__metadata__ value for 'n' must be a string");
  write_bytes(tmp.file("s.safetensors"),
              st_bytes(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0')));
  EXPECT_HAS(error_of(tmp.file("s.safetensors")), "must hold non-negative integers");
  write_bytes(tmp.file("o.safetensors"), st_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", std::string(4, '\0')));
  EXPECT_HAS(error_of(tmp.file("o.safetensors")), "needs 'dtype', 'shape' and 'data_offsets'");
}

TEST(SafetensorsErrors, ShapeMismatchOnLoad) {
  TempDir tmp;
  ASSERT_TRUE(save_weights_dir(tmp.path(), {{"model.norm.weight", filled({8}, DType::F32, 1)}}, DType::F32).is_ok());
  auto ws = WeightSource::open_dir(tmp.path());
  ASSERT_TRUE(ws.is_ok());
  auto r = ws->load("model.norm.weight", {16}, DType::F32);
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.status().message(), "model.safetensors: tensor 'model.norm.weight' has shape [8], expected [16]");
}

TEST(SafetensorsErrors, MissingTensor) {
  TempDir tmp;
  ASSERT_TRUE(save_weights_dir(tmp.path(), {{"a", filled({2}, DType::F32, 1)}}, DType::F32).is_ok());
  auto ws = WeightSource::open_dir(tmp.path());
  ASSERT_TRUE(ws.is_ok());
  auto r = ws->load("lm_head.weight", {2}, DType::F32);
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.status().message(), "tensor 'lm_head.weight' not found (1 tensors in");
  auto g = SafetensorsFile::open(tmp.file("model.safetensors")).value()->get("zzz");
  EXPECT_HAS(g.status().message(), "no tensor named 'zzz'");
}

TEST(SafetensorsErrors, MissingShardAndMisplacedTensor) {
  TempDir tmp;
  std::vector<NamedTensor> ts = {{"a", filled({16}, DType::F32, 1)}, {"b", filled({16}, DType::F32, 2)}};
  ASSERT_TRUE(save_weights_dir(tmp.path(), ts, DType::F32, 64).is_ok());
  const std::string index_text = read_text(tmp.file("model.safetensors.index.json"));

  // The index points 'b' into shard 1, which does not hold it.
  auto idx = nlohmann::json::parse(index_text);
  idx["weight_map"]["b"] = "model-00001-of-00002.safetensors";
  write_bytes(tmp.file("model.safetensors.index.json"), idx.dump());
  auto r = WeightSource::open_dir(tmp.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.status().message(), "says tensor 'b' is in 'model-00001-of-00002.safetensors' but that file does not contain it");

  write_bytes(tmp.file("model.safetensors.index.json"), index_text);
  std::filesystem::remove(tmp.file("model-00002-of-00002.safetensors"));
  r = WeightSource::open_dir(tmp.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.status().message(), "lists shard 'model-00002-of-00002.safetensors' (for tensor 'b') but");
  EXPECT_HAS(r.status().message(), "does not exist");
}

TEST(SafetensorsErrors, EmptyFolder) {
  TempDir tmp;
  auto r = WeightSource::open_dir(tmp.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.status().message(), "no model.safetensors or model.safetensors.index.json");
}
