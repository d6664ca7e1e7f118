// Writing safetensors: single files (atomic) and transformers-style sharded
// folders with model.safetensors.index.json.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <vector>

#include "io/convert.h"
#include "io/safetensors.h"

namespace kestrel::io {

namespace fs = std::filesystem;

namespace {

// A file written under a temporary name and renamed into place, so readers
// never see a half-written file and a crash leaves the old one intact.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)) {
    tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  Status open() {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return KS_ERR(tmp_, ": cannot create: ", std::strerror(errno));
    return Status::ok();
  }
  Status write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return KS_ERR(tmp_, ": write failed: ", std::strerror(errno), " (disk full?)");
      }
      p += w;
      n -= size_t(w);
    }
    return Status::ok();
  }
  Status commit() {
    if (::fsync(fd_) != 0) return KS_ERR(tmp_, ": fsync failed: ", std::strerror(errno));
    if (::close(fd_) != 0) {
      fd_ = -1;
      return KS_ERR(tmp_, ": close failed: ", std::strerror(errno));
    }
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      return KS_ERR(path_, ": cannot rename ", tmp_, " into place: ", std::strerror(errno));
    committed_ = true;
    // The rename is durable only once the folder's entry is on disk.
    std::string dir = fs::path(path_).parent_path().string();
    if (dir.empty()) dir = ".";
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
    return Status::ok();
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

Status write_text_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  KS_TRY(f.open());
  KS_TRY(f.write(text.data(), text.size()));
  return f.commit();
}


bool is_shard_file_name(const std::string& s) {
  static const std::regex re("model-[0-9]{5}-of-[0-9]{5}\\.safetensors");
  return std::regex_match(s, re);
}

}  // namespace

void remove_stale_weight_files(const std::string& dir, const std::set<std::string>& keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const bool weight_file = n == "model.safetensors" || n == "model.safetensors.index.json" || is_shard_file_name(n);
    if (weight_file && !keep.count(n)) fs::remove(e.path(), ec);
  }
}

Status save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata, const DType* dtype) {
  auto out_dtype = [&](const NamedTensor& nt) { return dtype && !nt.own_dtype ? *dtype : nt.tensor.dtype(); };
  std::set<std::string> seen;
  for (const auto& nt : tensors) {
    if (nt.name.empty() || nt.name == "__metadata__")
      return KS_ERR(path, ": invalid tensor name '", nt.name, "'");
    if (!seen.insert(nt.name).second) return KS_ERR(path, ": tensor '", nt.name, "' given twice");
    if (!nt.tensor.defined()) return KS_ERR(path, ": tensor '", nt.name, "' is undefined");
  }
  // Data order: larger elements first, stable otherwise (as the Rust reference
  // writer sorts by alignment), so with an 8-aligned header every tensor is
  // aligned to its element size and readers can map it zero-copy. With one
  // dtype (the usual case) this is exactly the given order.
  std::vector<const NamedTensor*> order;
  for (const auto& nt : tensors) order.push_back(&nt);
  std::stable_sort(order.begin(), order.end(), [&](const NamedTensor* a, const NamedTensor* b) {
    return dtype_size(out_dtype(*a)) > dtype_size(out_dtype(*b));
  });

  // Header: __metadata__ first, then tensors in data order, offsets contiguous.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const NamedTensor* nt : order) {
    const DType dt = out_dtype(*nt);
    const size_t nbytes = size_t(nt->tensor.numel()) * dtype_size(dt);
    header[nt->name] = {{"dtype", safetensors_dtype_name(dt)},
                        {"shape", nt->tensor.shape()},
                        {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // pad as the reference writers do, so data starts 8-aligned
  unsigned char len[8];
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));

  AtomicFile f(path);
  KS_TRY(f.open());
  KS_TRY(f.write(len, 8));
  KS_TRY(f.write(h.data(), h.size()));
  std::vector<char> buf;
  for (const NamedTensor* nt : order) {
    const DType dt = out_dtype(*nt);
    // The file is written from host memory: a device tensor (a model or
    // optimizer on the GPU) is copied out first, one tensor at a time.
    const Tensor host = nt->tensor.device() == Device::CPU ? Tensor() : nt->tensor.copy_to(Device::CPU);
    const Tensor& t = host.defined() ? host : nt->tensor;
    if (dt == t.dtype()) {
      KS_TRY(f.write(t.raw(), t.nbytes()));
      continue;
    }
    // Convert in bounded chunks so saving a large model needs no full copy.
    constexpr int64_t kChunk = 1 << 20;
    buf.resize(size_t(kChunk) * dtype_size(dt));
    const char* src = static_cast<const char*>(t.raw());
    for (int64_t i = 0; i < t.numel(); i += kChunk) {
      const int64_t m = std::min(kChunk, t.numel() - i);
      convert_elements(src + size_t(i) * dtype_size(t.dtype()), t.dtype(), buf.data(), dt, m);
      KS_TRY(f.write(buf.data(), size_t(m) * dtype_size(dt)));
    }
  }
  return f.commit();
}

std::vector<std::vector<size_t>> hf_shard_plan(const std::vector<size_t>& bytes, size_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> cur;
  size_t cur_bytes = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (cur_bytes + bytes[i] > max_shard_bytes) {
      shards.push_back(std::move(cur));
      cur.clear();
      cur_bytes = 0;
    }
    cur.push_back(i);
    cur_bytes += bytes[i];
  }
  if (!cur.empty() || shards.empty()) shards.push_back(std::move(cur));  // the open shard last
  return shards;
}

std::string hf_shard_file_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

Status save_weights_dir(const std::string& dir, const std::vector<NamedTensor>& tensors, DType dtype,
                        size_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return KS_ERR(dir, ": cannot create folder: ", ec.message());

  std::vector<size_t> bytes;
  size_t total = 0;
  for (const auto& t : tensors) {
    if (!t.tensor.defined()) return KS_ERR(dir, ": tensor '", t.name, "' is undefined");
    bytes.push_back(size_t(t.tensor.numel()) * dtype_size(t.own_dtype ? t.tensor.dtype() : dtype));
    total += bytes.back();
  }
  const std::vector<std::vector<size_t>> shards = hf_shard_plan(bytes, max_shard_bytes);

  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (shards.size() == 1) {
    std::vector<NamedTensor> all;
    for (size_t i : shards[0]) all.push_back(tensors[i]);
    KS_TRY(save_safetensors((fs::path(dir) / "model.safetensors").string(), all, meta, &dtype));
    remove_stale_weight_files(dir, {"model.safetensors"});
    return Status::ok();
  }

  nlohmann::json weight_map = nlohmann::json::object();
  std::set<std::string> keep;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = hf_shard_file_name(s, shards.size());
    std::vector<NamedTensor> part;
    for (size_t i : shards[s]) {
      part.push_back(tensors[i]);
      weight_map[tensors[i].name] = name;
    }
    KS_TRY(save_safetensors((fs::path(dir) / name).string(), part, meta, &dtype));
    keep.insert(name);
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  // json.dumps(index, indent=2, sort_keys=True) + "\n", as transformers writes it.
  KS_TRY(write_text_atomic((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
  keep.insert("model.safetensors.index.json");
  remove_stale_weight_files(dir, keep);
  return Status::ok();
}

}  // namespace kestrel::io
