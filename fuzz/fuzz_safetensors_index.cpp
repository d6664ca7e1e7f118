// model.safetensors.index.json of a sharded folder: the input is the index;
// the folder holds two valid shards (a.safetensors: "w" F32[2];
// b.safetensors: "v" BF16[1,2]) and a file that is no safetensors (c.bin).
#include <filesystem>

#include "fuzz_common.h"
#include "io/safetensors.h"

namespace {
std::string shard(const std::string& header_json, size_t data_bytes) {
  std::string h = header_json;
  while (h.size() % 8) h += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((h.size() >> (8 * i)) & 0xff);
  return out + h + std::string(data_bytes, '\x01');
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kestrel;
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_path("shards");
    std::filesystem::create_directories(d);
    const std::string a = shard(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
    const std::string b = shard(R"({"__metadata__":{"format":"pt"},"v":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]}})", 4);
    fuzz::write_file(d + "/a.safetensors", reinterpret_cast<const uint8_t*>(a.data()), a.size());
    fuzz::write_file(d + "/b.safetensors", reinterpret_cast<const uint8_t*>(b.data()), b.size());
    fuzz::write_file(d + "/c.bin", reinterpret_cast<const uint8_t*>("not safetensors"), 15);
    return d;
  }();
  fuzz::write_file(dir + "/model.safetensors.index.json", data, size);
  auto ws = io::WeightSource::open_dir(dir);
  if (!ws) return 0;
  for (const auto& name : ws.value().names()) {
    (void)ws.value().file_of(name);
    (void)ws.value().load(name, name == "w" ? Shape{2} : Shape{1, 2}, DType::F32, MemCategory::Other);
  }
  return 0;
}
