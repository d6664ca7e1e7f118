// Where tensors live, as one number: a CUDA graph replays raw device
// addresses, so its owner compares this fingerprint of every tensor it read at
// capture with the current one (weights relocated by param_offload, a KV cache
// reallocated after sleep). Addresses only; no element is read.
#pragma once
#include <cstdint>
#include <vector>

#include <xxhash.h>

#include "core/tensor.h"

namespace kestrel::ops {

inline uint64_t address_fingerprint(const std::vector<const Tensor*>& ts) {
  std::vector<const void*> p;
  p.reserve(ts.size());
  for (const Tensor* t : ts) p.push_back(t && t->defined() ? t->raw() : nullptr);
  return XXH3_64bits(p.data(), p.size() * sizeof(const void*));
}

}  // namespace kestrel::ops
