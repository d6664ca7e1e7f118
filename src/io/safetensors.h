// safetensors: the Hugging Face weight format, read by mmap with a
// bounds-checked header, written atomically. Single files and sharded
// folders (model.safetensors.index.json) are both handled.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace kestrel::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  size_t begin = 0, end = 0;  // byte offsets into the data section
};

// One mmap'd .safetensors file. Tensors returned by get() borrow the mapping
// (zero copy) and keep it alive.
class SafetensorsFile {
 public:
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path);
  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return infos_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  Result<TensorInfo> info(const std::string& name) const;
  // Zero-copy view of a tensor as stored (dtype as on disk).
  Result<Tensor> get(const std::string& name) const;

  ~SafetensorsFile();

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  size_t data_offset_ = 0;
  std::vector<TensorInfo> infos_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<SafetensorsFile> self_;
};

// A model folder's weights: model.safetensors, or the shards listed in
// model.safetensors.index.json.
class WeightSource {
 public:
  static Result<WeightSource> open_dir(const std::string& dir);
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  // The stored tensor, checked against the expected shape; converted to `dtype`
  // into a fresh tensor of category `cat` (never borrowed, safe to update).
  Result<Tensor> load(const std::string& name, const Shape& expect_shape, DType dtype,
                      MemCategory cat = MemCategory::Params) const;
  bool sharded() const { return files_.size() > 1 || has_index_; }

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> file index
  bool has_index_ = false;
  std::string dir_;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// Writes one .safetensors file atomically (temp file, fsync, rename), tensors
// in the given order, stored in `dtype` when set or each tensor's own dtype.
Status save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {{"format", "pt"}},
                        const DType* dtype = nullptr);
// Writes a folder's weights: one model.safetensors when the total is below
// max_shard_bytes, else model-0000i-of-0000n.safetensors shards plus
// model.safetensors.index.json, as transformers' save_pretrained does.
Status save_weights_dir(const std::string& dir, const std::vector<NamedTensor>& tensors, DType dtype,
                        size_t max_shard_bytes = size_t(5) << 30);

}  // namespace kestrel::io
