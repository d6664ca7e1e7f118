#include "model/batch.h"

#include "core/status.h"

namespace kestrel::model {

namespace {

// Appends one sequence at rows [t, t + q.size()) with positions from `pos0`.
void put_sequence(const std::vector<int32_t>& q, int32_t pos0, PackedBatch& b, int64_t& t, int64_t s) {
  auto* ids = b.input_ids.data<int32_t>();
  auto* pos = b.positions.data<int32_t>();
  auto* tgt = b.targets.data<int32_t>();
  for (size_t j = 0; j < q.size(); ++j, ++t) {
    ids[t] = q[j];
    pos[t] = pos0 + int32_t(j);
    tgt[t] = j + 1 < q.size() ? q[j + 1] : -1;
  }
  b.cu_seqlens.data<int32_t>()[s + 1] = int32_t(t);
  b.max_seqlen = std::max<int64_t>(b.max_seqlen, int64_t(pos0) + int64_t(q.size()));
}

PackedBatch allocate(int64_t tokens, int64_t seqs) {
  PackedBatch b;
  b.num_tokens = tokens;
  b.num_seqs = seqs;
  b.input_ids = Tensor::empty({tokens}, DType::I32, MemCategory::Activations);
  b.positions = Tensor::empty({tokens}, DType::I32, MemCategory::Activations);
  b.targets = Tensor::empty({tokens}, DType::I32, MemCategory::Activations);
  b.cu_seqlens = Tensor::empty({seqs + 1}, DType::I32, MemCategory::Activations);
  b.cu_seqlens.data<int32_t>()[0] = 0;
  return b;
}

}  // namespace

PackedBatch pack_sequences(const std::vector<std::vector<int32_t>>& seqs) {
  KS_CHECK(!seqs.empty(), "pack_sequences: no sequences");
  int64_t total = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    KS_CHECK(!seqs[i].empty(), "pack_sequences: sequence ", i, " is empty");
    total += int64_t(seqs[i].size());
  }
  PackedBatch b = allocate(total, int64_t(seqs.size()));
  int64_t t = 0;
  for (size_t s = 0; s < seqs.size(); ++s) put_sequence(seqs[s], 0, b, t, int64_t(s));
  return b;
}

PackedBatch pack_prefix_groups(const std::vector<PrefixGroup>& groups) {
  KS_CHECK(!groups.empty(), "pack_prefix_groups: no groups");
  int64_t total = 0, n_seqs = 0;
  bool shared = false;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& grp = groups[g];
    KS_CHECK(!grp.continuations.empty(), "pack_prefix_groups: group ", g, " has no continuation");
    if (!grp.prefix.empty()) {
      total += int64_t(grp.prefix.size());
      ++n_seqs;
      shared = true;
    }
    for (size_t c = 0; c < grp.continuations.size(); ++c) {
      KS_CHECK(!grp.continuations[c].empty(), "pack_prefix_groups: continuation ", c, " of group ", g, " is empty");
      total += int64_t(grp.continuations[c].size());
      ++n_seqs;
    }
  }
  PackedBatch b = allocate(total, n_seqs);
  if (shared) b.prefix_of = Tensor::empty({n_seqs}, DType::I32, MemCategory::Activations);
  int32_t* pre = shared ? b.prefix_of.data<int32_t>() : nullptr;
  int64_t t = 0, s = 0;
  for (const auto& grp : groups) {
    int32_t parent = -1;
    if (!grp.prefix.empty()) {
      parent = int32_t(s);
      pre[s] = -1;
      put_sequence(grp.prefix, 0, b, t, s++);
    }
    for (const auto& c : grp.continuations) {
      if (pre) pre[s] = parent;
      put_sequence(c, int32_t(grp.prefix.size()), b, t, s++);
    }
  }
  return b;
}

}  // namespace kestrel::model
