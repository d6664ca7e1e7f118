#include "core/tensor.h"

#include <cstring>

#include "core/device_hooks.h"
#include <sstream>

namespace kestrel {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) {
    KS_CHECK(d >= 0, "negative dimension in shape ", shape_str(s));
    n *= d;
  }
  return n;
}

Storage::Storage(Allocator* alloc, size_t bytes, MemCategory cat)
    : bytes_(bytes), device_(alloc->device()), cat_(cat), alloc_(alloc) {
  data_ = alloc->allocate(bytes, cat);
}

Storage::Storage(void* data, size_t bytes, Device dev, std::shared_ptr<void> keepalive)
    : data_(data), bytes_(bytes), device_(dev), keepalive_(std::move(keepalive)) {}

Storage::~Storage() {
  if (alloc_) alloc_->deallocate(data_, bytes_, cat_);
}

void Storage::relocate(Allocator* target) {
  KS_CHECK(owned(), "Storage::relocate: borrowed memory (an mmap'd file, a peer's buffer) cannot be moved");
  KS_CHECK(target != nullptr, "Storage::relocate: no target allocator");
  if (target == alloc_) return;
  void* fresh = target->allocate(bytes_, cat_);
  const Device to = target->device();
  if (bytes_ && device_ == Device::CPU && to == Device::CPU) {
    std::memcpy(fresh, data_, bytes_);
  } else if (bytes_) {
    // Byte views of both allocations through the device's copy hook (which
    // synchronises a host-side transfer, so the old block may be freed at once).
    const Shape shape{int64_t(bytes_)};
    Tensor dst = Tensor::from_blob(fresh, shape, DType::U8, nullptr, to);
    const Tensor src = Tensor::from_blob(data_, shape, DType::U8, nullptr, device_);
    device_memory_hooks(to != Device::CPU ? to : device_, "Storage::relocate").copy(dst, src);
  }
  alloc_->deallocate(data_, bytes_, cat_);
  data_ = fresh;
  device_ = to;
  alloc_ = target;
}

static Allocator* allocator_for(Device dev) {
  if (Allocator* a = device_allocator(dev)) return a;
  KS_FAIL("not supported yet: tensors on device ", device_name(dev), " (build with KESTREL_CUDA=ON)");
}

Tensor Tensor::empty(Shape shape, DType dtype, MemCategory cat, Device dev) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(allocator_for(dev), t.nbytes(), cat);
  return t;
}

Tensor Tensor::empty_pinned(Shape shape, DType dtype, MemCategory cat) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(pinned_host_allocator(), t.nbytes(), cat);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, MemCategory cat, Device dev) {
  Tensor t = empty(std::move(shape), dtype, cat, dev);
  t.zero_();
  return t;
}

Tensor Tensor::from_blob(void* data, Shape shape, DType dtype, std::shared_ptr<void> keepalive, Device dev) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, t.nbytes(), dev, std::move(keepalive));
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, Shape shape, MemCategory cat) {
  KS_CHECK(int64_t(v.size()) == shape_numel(shape), "from_vector: ", v.size(), " values for shape ",
           shape_str(shape));
  return from_host(v, std::move(shape), cat);
}

Tensor Tensor::from_ints(const std::vector<int32_t>& v, Shape shape) {
  KS_CHECK(int64_t(v.size()) == shape_numel(shape), "from_ints: ", v.size(), " values for shape ",
           shape_str(shape));
  return from_host(v, std::move(shape), MemCategory::Other);
}

// Host tensors are read and written in place; a device tensor goes through a
// host staging tensor and its backend's copy hook.
void Tensor::write_host_bytes(const void* src) {
  if (device() == Device::CPU) {
    if (nbytes()) std::memcpy(raw(), src, nbytes());
    return;
  }
  Tensor host = from_blob(const_cast<void*>(src), shape_, dtype_);
  device_memory_hooks(device(), "Tensor::from_host").copy(*this, host);
}

void Tensor::read_host_bytes(void* dst) const {
  if (device() == Device::CPU) {
    if (nbytes()) std::memcpy(dst, raw(), nbytes());
    return;
  }
  Tensor host = from_blob(dst, shape_, dtype_);
  device_memory_hooks(device(), "Tensor::to_host").copy(host, *this);
}

bool Tensor::same_data(const Tensor& other) const {
  return defined() && other.defined() && device() == other.device() && raw() == other.raw();
}

int64_t Tensor::size(int64_t d) const {
  if (d < 0) d += dim();
  KS_CHECK(d >= 0 && d < dim(), "dimension ", d, " out of range for ", describe());
  return shape_[size_t(d)];
}

Tensor Tensor::view(Shape shape) const {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KS_CHECK(infer < 0, "view: more than one -1 in ", shape_str(shape));
      infer = int64_t(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    KS_CHECK(known > 0 && numel_ % known == 0, "view: cannot infer ", shape_str(shape), " from ", describe());
    shape[size_t(infer)] = numel_ / known;
  }
  KS_CHECK(shape_numel(shape) == numel_, "view: ", shape_str(shape), " does not match ", describe());
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  KS_CHECK(dim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "slice_rows(", begin, ", ", end,
           ") out of range for ", describe());
  int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.numel_ = row * (end - begin);
  t.offset_ = offset_ + size_t(begin * row) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::clone(MemCategory cat) const { return to(dtype_, cat); }

Tensor Tensor::copy_to(Device dev, MemCategory cat) const {
  Tensor t = empty(shape_, dtype_, cat, dev);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype, MemCategory cat) const {
  Tensor t = empty(shape_, dtype, cat, device());
  t.copy_from(*this);
  return t;
}

namespace {
template <class F>
void for_each_float(const Tensor& t, F&& f) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::F32: { auto* p = static_cast<const float*>(t.raw()); for (int64_t i = 0; i < n; ++i) f(i, p[i]); break; }
    case DType::BF16: { auto* p = static_cast<const uint16_t*>(t.raw()); for (int64_t i = 0; i < n; ++i) f(i, bf16_to_float(p[i])); break; }
    case DType::F16: { auto* p = static_cast<const uint16_t*>(t.raw()); for (int64_t i = 0; i < n; ++i) f(i, f16_to_float(p[i])); break; }
    case DType::I32: { auto* p = static_cast<const int32_t*>(t.raw()); for (int64_t i = 0; i < n; ++i) f(i, float(p[i])); break; }
    case DType::I64: { auto* p = static_cast<const int64_t*>(t.raw()); for (int64_t i = 0; i < n; ++i) f(i, float(p[i])); break; }
    case DType::U8: { auto* p = static_cast<const uint8_t*>(t.raw()); for (int64_t i = 0; i < n; ++i) f(i, float(p[i])); break; }
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  KS_CHECK(src.numel() == numel_, "copy_from: ", src.describe(), " into ", describe());
  if (device() != Device::CPU || src.device() != Device::CPU) {
    device_memory_hooks(device() != Device::CPU ? device() : src.device(), "Tensor::copy_from").copy(*this, src);
    return;
  }
  if (src.dtype() == dtype_) {
    if (nbytes()) std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  if (src.dtype() == DType::F32 && (dtype_ == DType::BF16 || dtype_ == DType::F16)) {
    // The model-copy refresh of mixed precision: round to nearest even, as set() does.
    const float* s = static_cast<const float*>(src.raw());
    uint16_t* d = static_cast<uint16_t*>(raw());
    const bool bf = dtype_ == DType::BF16;
#pragma omp parallel for schedule(static) if (numel_ > (1 << 16))
    for (int64_t i = 0; i < numel_; ++i) d[i] = bf ? float_to_bf16(s[i]) : float_to_f16(s[i]);
    return;
  }
  const bool int_to_int = (dtype_ == DType::I32 || dtype_ == DType::I64) &&
                          (src.dtype() == DType::I32 || src.dtype() == DType::I64);
  if (int_to_int) {
    for (int64_t i = 0; i < numel_; ++i) {
      int64_t v = src.dtype() == DType::I32 ? static_cast<const int32_t*>(src.raw())[i]
                                             : static_cast<const int64_t*>(src.raw())[i];
      if (dtype_ == DType::I32) static_cast<int32_t*>(raw())[i] = int32_t(v);
      else static_cast<int64_t*>(raw())[i] = v;
    }
    return;
  }
  if (dtype_ == DType::F32) {
    float* d = static_cast<float*>(raw());
    for_each_float(src, [&](int64_t i, float v) { d[i] = v; });
  } else {
    for_each_float(src, [&](int64_t i, float v) { set(i, v); });
  }
}

void Tensor::zero_() {
  if (device() != Device::CPU) return device_memory_hooks(device(), "Tensor::zero_").fill(*this, 0.f);
  if (nbytes()) std::memset(raw(), 0, nbytes());
}

void Tensor::fill_(float v) {
  if (device() != Device::CPU) return device_memory_hooks(device(), "Tensor::fill_").fill(*this, v);
  if (dtype_ == DType::F32) {
    float* d = static_cast<float*>(raw());
    for (int64_t i = 0; i < numel_; ++i) d[i] = v;
  } else {
    for (int64_t i = 0; i < numel_; ++i) set(i, v);
  }
}

float Tensor::get(int64_t i) const {
  KS_CHECK(i >= 0 && i < numel_, "get(", i, ") out of range for ", describe());
  KS_CHECK(device() == Device::CPU, "get(", i, "): element access reads host memory; ", describe(), " is on ",
           device_name(device()), " (read it with to_host() or to_float_vector())");
  switch (dtype_) {
    case DType::F32: return static_cast<const float*>(raw())[i];
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(raw())[i]);
    case DType::F16: return f16_to_float(static_cast<const uint16_t*>(raw())[i]);
    case DType::I32: return float(static_cast<const int32_t*>(raw())[i]);
    case DType::I64: return float(static_cast<const int64_t*>(raw())[i]);
    case DType::U8: return float(static_cast<const uint8_t*>(raw())[i]);
  }
  return 0;
}

void Tensor::set(int64_t i, float v) {
  KS_CHECK(i >= 0 && i < numel_, "set(", i, ") out of range for ", describe());
  KS_CHECK(device() == Device::CPU, "set(", i, "): element access writes host memory; ", describe(), " is on ",
           device_name(device()), " (write it with ops::fill or copy_from)");
  switch (dtype_) {
    case DType::F32: static_cast<float*>(raw())[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(raw())[i] = float_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(raw())[i] = float_to_f16(v); break;
    case DType::I32: static_cast<int32_t*>(raw())[i] = int32_t(v); break;
    case DType::I64: static_cast<int64_t*>(raw())[i] = int64_t(v); break;
    case DType::U8: static_cast<uint8_t*>(raw())[i] = uint8_t(v); break;
  }
}

std::vector<float> Tensor::to_float_vector() const {
  if (device() != Device::CPU) {
    Tensor host = empty(shape_, dtype_, MemCategory::Other);
    host.copy_from(*this);
    return host.to_float_vector();
  }
  std::vector<float> out(static_cast<size_t>(numel_));
  for_each_float(*this, [&](int64_t i, float v) { out[size_t(i)] = v; });
  return out;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype_)) + shape_str(shape_);
}

}  // namespace kestrel
