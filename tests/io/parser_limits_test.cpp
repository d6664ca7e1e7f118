// Bad inputs of issue 20 that reached the io readers: a float tensor stored
// as I32 (converted as integers, log-probs near -8e8, exit 0) and JSON
// nested deeper than any real file.
#include <cstring>

#include "io/io_test_util.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace kestrel::io {
namespace {

using kestrel::testing::has_substr;
using kestrel::testing::TempDir;

TEST(StoredDtype, IntegerTensorIsNeverReadAsWeights) {
  TempDir d;
  float vals[2] = {0.5f, -0.25f};
  std::string data(reinterpret_cast<const char*>(vals), 8);
  kestrel::testing::write_bytes(d.file("model.safetensors"),
                                kestrel::testing::st_bytes(R"({"w":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", data));
  auto ws = WeightSource::open_dir(d.path());
  ASSERT_TRUE(ws.is_ok()) << ws.status().message();
  for (DType want : {DType::F32, DType::BF16}) {
    auto t = ws.value().load("w", Shape{2}, want);
    ASSERT_FALSE(t.is_ok());
    EXPECT_TRUE(has_substr(t.status().message(), d.file("model.safetensors") + ": tensor 'w' is stored as I32 but is read as"));
    EXPECT_TRUE(has_substr(t.status().message(), "F32, BF16 or F16 expected"));
  }
  // Float storage of any width still converts.
  kestrel::testing::write_bytes(d.file("model.safetensors"),
                                kestrel::testing::st_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data));
  auto ws2 = WeightSource::open_dir(d.path());
  ASSERT_TRUE(ws2.is_ok());
  EXPECT_TRUE(ws2.value().load("w", Shape{2}, DType::BF16).is_ok());
}

TEST(JsonDepth, DeepHeadersAndConfigsAreRefused) {
  TempDir d;
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');
  kestrel::testing::write_bytes(d.file("model.safetensors"), kestrel::testing::st_bytes("{\"a\":" + deep + "}", ""));
  auto f = SafetensorsFile::open(d.file("model.safetensors"));
  ASSERT_FALSE(f.is_ok());
  EXPECT_TRUE(has_substr(f.status().message(), "safetensors header nested deeper than 256 levels"));
  auto c = parse_model_config("{\"a\": " + deep + "}", "m/config.json");
  ASSERT_FALSE(c.is_ok());
  EXPECT_TRUE(has_substr(c.status().message(), "m/config.json: JSON nested deeper than 256 levels"));
  kestrel::testing::write_bytes(d.file("model.safetensors.index.json"), "{\"weight_map\": " + deep + "}");
  std::filesystem::remove(d.file("model.safetensors"));
  auto ws = WeightSource::open_dir(d.path());
  ASSERT_FALSE(ws.is_ok());
  EXPECT_TRUE(has_substr(ws.status().message(), "model.safetensors.index.json: JSON nested deeper than 256 levels"));
}

}  // namespace
}  // namespace kestrel::io
