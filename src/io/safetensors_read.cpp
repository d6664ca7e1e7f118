// Reading safetensors: mmap, header validation, zero-copy views, and model
// folders (single file or index + shards).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/json_limits.h"
#include "io/convert.h"
#include "io/safetensors.h"

namespace kestrel::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The Rust reference implementation refuses headers above 100 MB; so do we,
// so a corrupt length cannot make us parse gigabytes of garbage.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

bool parse_st_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> table[] = {{"F32", DType::F32}, {"BF16", DType::BF16},
                                                        {"F16", DType::F16}, {"I32", DType::I32},
                                                        {"I64", DType::I64}, {"U8", DType::U8}};
  for (auto& [n, t] : table)
    if (s == n) { *out = t; return true; }
  return false;
}

bool is_known_other_st_dtype(const std::string& s) {
  static const char* other[] = {"F64", "I8", "I16", "U16", "U32", "U64", "BOOL", "F8_E4M3", "F8_E5M2",
                                "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};
  for (auto* o : other)
    if (s == o) return true;
  return false;
}

// Multiplies with overflow detection: shapes come from untrusted files.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

bool is_floating(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

}  // namespace

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_size_);
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return KS_ERR(path, ": cannot open safetensors file: ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return KS_ERR(path, ": cannot stat: ", std::strerror(e));
  }
  const uint64_t size = uint64_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    return KS_ERR(path, ": truncated safetensors file: ", size,
                  " bytes, shorter than the 8-byte header length; re-download or re-save the file");
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  if (map == MAP_FAILED) return KS_ERR(path, ": mmap failed: ", std::strerror(map_errno));

  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->map_size_ = size;
  f->self_ = f;
  const auto* bytes = static_cast<const unsigned char*>(map);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian regardless of host
  if (n > size - 8)
    return KS_ERR(path, ": truncated safetensors file: header length ", n, " runs past the end of the file (",
                  size, " bytes, so at most ", size - 8, " header bytes); re-download or re-save the file");
  if (n > kMaxHeaderBytes)
    return KS_ERR(path, ": safetensors header of ", n, " bytes exceeds the ", kMaxHeaderBytes,
                  "-byte limit; the file is corrupt");
  f->data_offset_ = 8 + size_t(n);
  const uint64_t data_size = size - 8 - n;

  const std::string_view header_text(reinterpret_cast<const char*>(bytes + 8), size_t(n));
  if (json_nesting_depth(header_text) > kMaxJsonDepth)
    return KS_ERR(path, ": safetensors header nested deeper than ", kMaxJsonDepth,
                  " levels (a header nests 3); the file is corrupt");
  json header;
  try {
    header = json::parse(header_text);
  } catch (const json::parse_error& e) {
    // e.what() carries the parser's position ("at line 1, column 17").
    return KS_ERR(path, ": safetensors header is not valid JSON: ", e.what(), " (byte offset ", e.byte,
                  " in the header)");
  } catch (const json::exception& e) {  // out_of_range: a number that overflows (1e999999)
    return KS_ERR(path, ": safetensors header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) return KS_ERR(path, ": safetensors header must be a JSON object, got ", header.type_name());

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) return KS_ERR(path, ": __metadata__ must be an object of strings, got ", e.type_name());
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string())
          return KS_ERR(path, ": __metadata__ value for '", m.key(), "' must be a string, got ", m.value().dump());
        f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    if (!e.is_object()) return KS_ERR(where, ": header entry must be an object, got ", e.type_name());
    auto dt = e.find("dtype");
    auto sh = e.find("shape");
    auto off = e.find("data_offsets");
    if (dt == e.end() || sh == e.end() || off == e.end())
      return KS_ERR(where, ": header entry needs 'dtype', 'shape' and 'data_offsets'");
    if (!dt->is_string()) return KS_ERR(where, ": 'dtype' must be a string, got ", dt->dump());
    TensorInfo info;
    info.name = name;
    const std::string dts = dt->get<std::string>();
    if (!parse_st_dtype(dts, &info.dtype)) {
      return KS_ERR(where, ": unsupported dtype ", dts, is_known_other_st_dtype(dts) ? "" : " (not a safetensors dtype)",
                    "; supported are F32, BF16, F16, I32, I64, U8 (convert the checkpoint, e.g. to bf16)");
    }
    if (!sh->is_array()) return KS_ERR(where, ": 'shape' must be an array, got ", sh->dump());
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) return KS_ERR(where, ": shape ", sh->dump(), " must hold non-negative integers");
      const uint64_t v = d.get<uint64_t>();
      if (v > uint64_t(INT64_MAX) || mul_overflows(numel, v, &numel))
        return KS_ERR(where, ": shape ", sh->dump(), " overflows");
      info.shape.push_back(int64_t(v));
    }
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      return KS_ERR(where, ": 'data_offsets' must be [begin, end] non-negative integers, got ", off->dump());
    const uint64_t b = (*off)[0].get<uint64_t>(), en = (*off)[1].get<uint64_t>();
    if (b > en) return KS_ERR(where, ": data_offsets ", off->dump(), " has begin after end");
    uint64_t nbytes = 0;
    if (mul_overflows(numel, dtype_size(info.dtype), &nbytes) || nbytes != en - b)
      return KS_ERR(where, ": shape ", shape_str(info.shape), " of ", dts, " needs ", numel, " x ",
                    dtype_size(info.dtype), " bytes but data_offsets ", off->dump(), " span ", en - b, " bytes");
    if (en > data_size)
      return KS_ERR(where, ": data_offsets ", off->dump(), " point past the end of the file (data section is ",
                    data_size, " bytes); the file is truncated or corrupt");
    info.begin = size_t(b);
    info.end = size_t(en);
    f->infos_.push_back(std::move(info));
  }

  std::sort(f->infos_.begin(), f->infos_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorInfo* prev = nullptr;  // last non-empty tensor
  for (const auto& t : f->infos_) {
    if (t.begin == t.end) continue;
    if (prev && t.begin < prev->end)
      return KS_ERR(path, ": tensors '", prev->name, "' [", prev->begin, ", ", prev->end, ") and '", t.name, "' [",
                    t.begin, ", ", t.end, ") overlap in the data section; the file is corrupt");
    prev = &t;
  }
  for (size_t i = 0; i < f->infos_.size(); ++i) f->index_[f->infos_[i].name] = i;
  return f;
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) != 0; }

Result<TensorInfo> SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return KS_ERR(path_, ": no tensor named '", name, "' (", infos_.size(), " tensors in file)");
  return infos_[it->second];
}

Result<Tensor> SafetensorsFile::get(const std::string& name) const {
  KS_ASSIGN(TensorInfo info, this->info(name));
  char* p = static_cast<char*>(map_) + data_offset_ + info.begin;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(info.dtype) != 0) {
    Tensor t = Tensor::empty(info.shape, info.dtype, MemCategory::Other);
    std::memcpy(t.raw(), p, info.end - info.begin);
    return t;
  }
  auto self = self_.lock();
  KS_CHECK(self, "SafetensorsFile::get on a file not owned by a shared_ptr");
  return Tensor::from_blob(p, info.shape, info.dtype, std::shared_ptr<void>(self));
}

// ---------------------------------------------------------------------------
// WeightSource

Result<WeightSource> WeightSource::open_dir(const std::string& dir) {
  WeightSource ws;
  ws.dir_ = dir;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {  // a single .safetensors file given directly
    KS_ASSIGN(auto f, SafetensorsFile::open(dir));
    for (const auto& t : f->tensors()) ws.where_[t.name] = 0;
    ws.files_.push_back(std::move(f));
    return ws;
  }
  if (!fs::is_directory(dir, ec)) return KS_ERR(dir, ": no such model folder");
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  // transformers prefers the single file when both are present; so do we.
  if (fs::exists(single, ec)) {
    KS_ASSIGN(auto f, SafetensorsFile::open(single.string()));
    for (const auto& t : f->tensors()) ws.where_[t.name] = 0;
    ws.files_.push_back(std::move(f));
    return ws;
  }
  if (!fs::exists(index, ec))
    return KS_ERR(dir, ": no model.safetensors or model.safetensors.index.json; point at a Hugging Face model "
                       "folder saved with safetensors (.bin/.pt checkpoints are not supported yet)");

  const std::string ipath = index.string();
  std::ifstream in(ipath, std::ios::binary);
  if (!in) return KS_ERR(ipath, ": cannot read: ", std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (json_nesting_depth(ss.str()) > kMaxJsonDepth)
    return KS_ERR(ipath, ": JSON nested deeper than ", kMaxJsonDepth, " levels (an index nests 2); the file is corrupt");
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number that overflows (1e999999)
    return KS_ERR(ipath, ": not valid JSON: ", e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return KS_ERR(ipath, ": missing the \"weight_map\" object (tensor name -> shard file)");
  ws.has_index_ = true;
  std::map<std::string, size_t> file_idx;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      return KS_ERR(ipath, ": weight_map entry for '", it.key(), "' must be a file name, got ", it.value().dump());
    const std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      return KS_ERR(ipath, ": weight_map entry for '", it.key(), "' names '", shard,
                    "', which is not a plain file name in the folder");
    auto fi = file_idx.find(shard);
    if (fi == file_idx.end()) {
      const fs::path sp = fs::path(dir) / shard;
      if (!fs::exists(sp, ec))
        return KS_ERR(ipath, ": lists shard '", shard, "' (for tensor '", it.key(), "') but ", sp.string(),
                      " does not exist; the download is incomplete");
      KS_ASSIGN(auto f, SafetensorsFile::open(sp.string()));
      fi = file_idx.emplace(shard, ws.files_.size()).first;
      ws.files_.push_back(std::move(f));
    }
    if (!ws.files_[fi->second]->contains(it.key()))
      return KS_ERR(ipath, ": says tensor '", it.key(), "' is in '", shard, "' but that file does not contain it; "
                    "the index and shards are from different saves");
    ws.where_[it.key()] = fi->second;
  }
  return ws;
}

std::vector<std::string> WeightSource::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [n, i] : where_) out.push_back(n);
  return out;
}

bool WeightSource::contains(const std::string& name) const { return where_.count(name) != 0; }

std::string WeightSource::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : files_[it->second]->path();
}

Result<Tensor> WeightSource::load(const std::string& name, const Shape& expect_shape, DType dtype,
                                  MemCategory cat) const {
  auto it = where_.find(name);
  if (it == where_.end())
    return KS_ERR(dir_, ": tensor '", name, "' not found (", where_.size(), " tensors in ",
                  sharded() ? "model.safetensors.index.json" : files_.empty() ? "the folder" : files_[0]->path(),
                  "); the checkpoint does not match config.json (architecture, tie_word_embeddings?)");
  const auto& file = files_[it->second];
  KS_ASSIGN(Tensor src, file->get(name));
  // A float tensor stored as I32 would be converted value by value into
  // integers-as-weights (log-probs near -8e8, exit 0): weights and integer
  // tensors never stand in for each other.
  if (is_floating(src.dtype()) != is_floating(dtype))
    return KS_ERR(file->path(), ": tensor '", name, "' is stored as ", safetensors_dtype_name(src.dtype()),
                  " but is read as ", safetensors_dtype_name(dtype), is_floating(dtype) ? " weights (F32, BF16 or F16 expected)" : "",
                  "; the header's dtype is wrong or the file is not this model's checkpoint");
  if (src.shape() != expect_shape)
    return KS_ERR(file->path(), ": tensor '", name, "' has shape ", shape_str(src.shape()), ", expected ",
                  shape_str(expect_shape), " from config.json; the checkpoint does not match its config");
  Tensor out = Tensor::empty(expect_shape, dtype, cat);
  convert_elements(src.raw(), src.dtype(), out.raw(), dtype, src.numel());
  return out;
}

}  // namespace kestrel::io
