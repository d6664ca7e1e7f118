// A golden file of tests/golden/models (written by make_golden.py and
// make_moe_golden.py): the safetensors of the reference's outputs, read as
// f32 for comparisons, and its packed input batch. Shared by the parity tests
// on the CPU (tests/model) and on the device (tests/on_device).
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/batch.h"

namespace kestrel::testing {

struct GoldenFile {
  std::shared_ptr<io::SafetensorsFile> file;
  // The tensor widened to f32 (an undefined tensor, with a test failure, when missing).
  Tensor get(const std::string& name) const {
    auto r = file->get(name);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? r.value().to(DType::F32) : Tensor();
  }
  Tensor raw(const std::string& name) const { return file->get(name).value(); }
  bool has(const std::string& name) const { return file->contains(name); }
};

// The golden's input: "input_ids" cut at "cu_seqlens", packed (host tensors).
inline model::PackedBatch golden_batch(const GoldenFile& g) {
  const std::vector<int64_t> ids = g.raw("input_ids").to(DType::I64).to_host<int64_t>();
  const std::vector<int64_t> cu = g.raw("cu_seqlens").to(DType::I64).to_host<int64_t>();
  std::vector<std::vector<int32_t>> seqs;
  for (size_t s = 0; s + 1 < cu.size(); ++s) seqs.emplace_back(ids.begin() + cu[s], ids.begin() + cu[s + 1]);
  return model::pack_sequences(seqs);
}

}  // namespace kestrel::testing
