// A .safetensors file: header validation, then every tensor read back and
// converted to f32 through WeightSource::load (the model-load path).
#include "fuzz_common.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kestrel;
  static const std::string path = fuzz::scratch_path("model.safetensors");
  fuzz::write_file(path, data, size);
  auto ws = io::WeightSource::open_dir(path);
  if (!ws) return 0;
  for (const auto& name : ws.value().names()) {
    auto f = io::SafetensorsFile::open(path);
    if (!f) std::abort();  // opened once, must open again
    auto info = f.value()->info(name);
    if (!info) std::abort();
    if (info.value().end - info.value().begin > (size_t(1) << 22)) continue;
    (void)ws.value().load(name, info.value().shape, DType::F32, MemCategory::Other);
    (void)ws.value().load(name, info.value().shape, DType::BF16, MemCategory::Other);
    (void)ws.value().load(name, info.value().shape, DType::I32, MemCategory::Other);
  }
  return 0;
}
