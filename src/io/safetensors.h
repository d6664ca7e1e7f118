// safetensors: the Hugging Face weight format, read by mmap with a
// bounds-checked header, written atomically. Single files and sharded
// folders (model.safetensors.index.json) are both handled.
//
// File layout: u64 little-endian N, then N bytes of JSON header (padded with
// spaces to a multiple of 8 by writers), then the data section. Each header
// entry is {"dtype", "shape", "data_offsets": [begin, end)} with offsets
// relative to the data section; "__metadata__" is a string -> string map.
#pragma once
#include <map>
#include <memory>
#include <set>
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

// The safetensors dtype string ("F32", "BF16", ...) for a DType.
const char* safetensors_dtype_name(DType t);

// One mmap'd .safetensors file. Tensors returned by get() borrow the mapping
// (zero copy) and keep it alive.
class SafetensorsFile {
 public:
  // Every header field is validated here (lengths, JSON, dtypes, shapes vs
  // byte ranges, offsets inside the data section, no overlaps), so get()
  // never reads outside the mapping.
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path);
  const std::string& path() const { return path_; }
  // In data-section order.
  const std::vector<TensorInfo>& tensors() const { return infos_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  Result<TensorInfo> info(const std::string& name) const;
  // Zero-copy view of a tensor as stored (dtype as on disk). The mapping is
  // read-only: never write through the returned tensor. A tensor whose bytes
  // are not aligned to its element size (possible in foreign files) is copied
  // into an owned tensor instead.
  Result<Tensor> get(const std::string& name) const;

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

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
// model.safetensors.index.json. open_dir also accepts the path of a single
// .safetensors file.
class WeightSource {
 public:
  static Result<WeightSource> open_dir(const std::string& dir);
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  // Where a tensor is stored (for messages and tools); empty when absent.
  std::string file_of(const std::string& name) const;
  // The stored tensor, checked against the expected shape; converted to `dtype`
  // into a fresh tensor of category `cat` (never borrowed, safe to update).
  Result<Tensor> load(const std::string& name, const Shape& expect_shape, DType dtype,
                      MemCategory cat = MemCategory::Params) const;
  bool sharded() const { return files_.size() > 1 || has_index_; }
  const std::string& dir() const { return dir_; }

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> file index
  bool has_index_ = false;
  std::string dir_;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
  // Stored in its own dtype even when the writer is given one (a tensor HF
  // keeps in f32 in every precision, e.g. DeepSeek-V3's e_score_correction_bias).
  bool own_dtype = false;
};

// Writes one .safetensors file atomically (temp file `<path>.tmp.<pid>`,
// fsync, rename, fsync of the folder), stored in `dtype` when set or each
// tensor's own dtype. Data is in the given order, except that tensors with
// larger elements come first (stable), as the reference writer does, so every
// tensor stays aligned for zero-copy reads.
Status save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {{"format", "pt"}},
                        const DType* dtype = nullptr);
// Writes a folder's weights: one model.safetensors when everything fits in one
// shard of max_shard_bytes, else model-0000i-of-0000n.safetensors shards plus
// model.safetensors.index.json, split as transformers' save_pretrained does
// (in order; a new shard starts when the next tensor would overflow; a tensor
// larger than the limit gets a shard of its own). Stale weight files of the
// other layout in `dir` are removed so the folder stays unambiguous.
// huggingface_hub's split of a state dict into shard files
// (split_state_dict_into_shards_factory): tensors in order, a new shard when
// the next tensor would pass max_shard_bytes, an oversized tensor alone; the
// open shard last. bytes[i]: tensor i's size on disk. Indices per shard.
std::vector<std::vector<size_t>> hf_shard_plan(const std::vector<size_t>& bytes, size_t max_shard_bytes);
// "model-00001-of-00003.safetensors" for shard i (0-based) of n.
std::string hf_shard_file_name(size_t i, size_t n);
// Removes the weight files of `dir` (model.safetensors, its index, shard
// files) not named in `keep`: what a save just made did not write, so a
// reader cannot pick up a stale single file or stale shards.
void remove_stale_weight_files(const std::string& dir, const std::set<std::string>& keep);

Status save_weights_dir(const std::string& dir, const std::vector<NamedTensor>& tensors, DType dtype,
                        size_t max_shard_bytes = size_t(5) << 30);

}  // namespace kestrel::io
