#include "model/batch.h"

#include "core/status.h"

namespace kestrel::model {

PackedBatch pack_sequences(const std::vector<std::vector<int32_t>>& seqs) {
  KS_CHECK(!seqs.empty(), "pack_sequences: no sequences");
  int64_t total = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    KS_CHECK(!seqs[i].empty(), "pack_sequences: sequence ", i, " is empty");
    total += int64_t(seqs[i].size());
  }
  PackedBatch b;
  b.num_tokens = total;
  b.num_seqs = int64_t(seqs.size());
  b.input_ids = Tensor::empty({total}, DType::I32, MemCategory::Activations);
  b.positions = Tensor::empty({total}, DType::I32, MemCategory::Activations);
  b.targets = Tensor::empty({total}, DType::I32, MemCategory::Activations);
  b.cu_seqlens = Tensor::empty({b.num_seqs + 1}, DType::I32, MemCategory::Activations);
  auto* ids = b.input_ids.data<int32_t>();
  auto* pos = b.positions.data<int32_t>();
  auto* tgt = b.targets.data<int32_t>();
  auto* cu = b.cu_seqlens.data<int32_t>();
  int64_t t = 0;
  cu[0] = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto& q = seqs[s];
    for (size_t j = 0; j < q.size(); ++j, ++t) {
      ids[t] = q[j];
      pos[t] = int32_t(j);
      tgt[t] = j + 1 < q.size() ? q[j + 1] : -1;
    }
    cu[s + 1] = int32_t(t);
    b.max_seqlen = std::max<int64_t>(b.max_seqlen, int64_t(q.size()));
  }
  return b;
}

}  // namespace kestrel::model
