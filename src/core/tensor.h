// A Tensor is a typed, shaped, contiguous view into shared storage.
// Views (reshape, row ranges) share storage through a byte offset; there are no
// strides, because every kernel in Kestrel works on packed row-major buffers.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/status.h"

namespace kestrel {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);

// Owns (or borrows) a block of bytes on one device.
class Storage {
 public:
  // Allocated through an allocator and returned to it.
  Storage(Allocator* alloc, size_t bytes, MemCategory cat);
  // Borrowed memory (an mmap'd file, a peer's buffer); `keepalive` holds its owner.
  Storage(void* data, size_t bytes, Device dev, std::shared_ptr<void> keepalive);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  MemCategory category() const { return cat_; }
  bool owned() const { return alloc_ != nullptr; }
  Allocator* allocator() const { return alloc_; }

  // Moves the bytes into a new allocation from `target` (another device, or
  // pinned host memory) and frees the old one: every Tensor view of this
  // storage follows, so a model's parameters can leave the device between
  // phases (param_offload) without their holders (optimizer, rollout views)
  // noticing. Raw pointers taken before are stale afterwards (a CUDA graph
  // compares the addresses it captured: rollout/decode_graphs.cpp). Owned
  // storage only; a no-op when target is the current allocator.
  void relocate(Allocator* target);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::CPU;
  MemCategory cat_ = MemCategory::Other;
  Allocator* alloc_ = nullptr;
  std::shared_ptr<void> keepalive_;
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(Shape shape, DType dtype, MemCategory cat = MemCategory::Activations,
                      Device dev = Device::CPU);
  static Tensor zeros(Shape shape, DType dtype, MemCategory cat = MemCategory::Activations,
                      Device dev = Device::CPU);
  // Host memory from pinned_host_allocator() (core/device_hooks.h): the host
  // side of what streams to and from a device.
  static Tensor empty_pinned(Shape shape, DType dtype, MemCategory cat);
  static Tensor from_blob(void* data, Shape shape, DType dtype, std::shared_ptr<void> keepalive = nullptr,
                          Device dev = Device::CPU);
  // Convenience for tests and small host data.
  static Tensor from_vector(const std::vector<float>& v, Shape shape, MemCategory cat = MemCategory::Other);
  static Tensor from_ints(const std::vector<int32_t>& v, Shape shape);
  // A tensor holding v (T's dtype: float, int32_t, int64_t, uint8_t), on the
  // host or, copied there, on device dev.
  template <class T>
  static Tensor from_host(const std::vector<T>& v, Shape shape, MemCategory cat = MemCategory::Other,
                          Device dev = Device::CPU) {
    Tensor t = empty(std::move(shape), dtype_of<T>::value, cat, dev);
    KS_CHECK(t.numel() == int64_t(v.size()), "from_host: ", v.size(), " values for shape ", shape_str(t.shape()));
    t.write_host_bytes(v.data());
    return t;
  }

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::CPU; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return size_t(numel_) * dtype_size(dtype_); }
  size_t offset_bytes() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Host pointers to the data: for ops/ and backend/ (and io/'s file
  // readers) only; everything else moves data through ops and the copy
  // methods below (scripts/check_data_access.sh enforces it).
  void* raw() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <class T>
  T* data() const {
    KS_DCHECK(defined(), "data() on an undefined tensor");
    KS_DCHECK(dtype_of<T>::value == dtype_, "tensor is ", dtype_name(dtype_), ", accessed as ",
              dtype_name(dtype_of<T>::value));
    return static_cast<T*>(raw());
  }

  // Same storage, new shape with the same element count; one dim may be -1.
  Tensor view(Shape shape) const;
  // Rows [begin, end) along dim 0, sharing storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // A deep copy (same device), optionally converted.
  Tensor clone(MemCategory cat = MemCategory::Other) const;
  Tensor to(DType dtype, MemCategory cat = MemCategory::Other) const;
  // A deep copy on device dev (same dtype): host <-> device moves.
  Tensor copy_to(Device dev, MemCategory cat = MemCategory::Other) const;
  // Copies src into this tensor, converting dtype; shapes must have equal numel.
  void copy_from(const Tensor& src);
  // zero_, fill_ and copy_from work on any device: host memory here, other
  // devices through the hooks their backend registers (core/device_hooks.h).
  void zero_();
  void fill_(float v);
  // True when both are views starting at the same byte of memory.
  bool same_data(const Tensor& other) const;

  // Element read/write through float, any floating or integer dtype (tests, debugging).
  float get(int64_t flat_index) const;
  void set(int64_t flat_index, float v);
  std::vector<float> to_float_vector() const;
  // The values as a host vector of T, which must be the tensor's dtype (any device).
  template <class T>
  std::vector<T> to_host() const {
    KS_CHECK(dtype_of<T>::value == dtype_, "to_host: tensor is ", describe(), ", read as ",
             dtype_name(dtype_of<T>::value));
    std::vector<T> out(static_cast<size_t>(numel_));
    read_host_bytes(out.data());
    return out;
  }
  // The same into out, resized to numel (its storage reused: a buffer read
  // every step, such as the rollout's logits, is not allocated and faulted in anew).
  template <class T>
  void to_host(std::vector<T>& out) const {
    KS_CHECK(dtype_of<T>::value == dtype_, "to_host: tensor is ", describe(), ", read as ",
             dtype_name(dtype_of<T>::value));
    out.resize(static_cast<size_t>(numel_));
    read_host_bytes(out.data());
  }

  std::string describe() const;  // "f32[2, 3]"

 private:
  void write_host_bytes(const void* src);  // nbytes() from host memory into this tensor
  void read_host_bytes(void* dst) const;   // nbytes() of this tensor into host memory

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
};

}  // namespace kestrel
