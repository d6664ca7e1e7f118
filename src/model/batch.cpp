#include "model/batch.h"

#include <algorithm>

#include "core/status.h"
#include "parallel/cp_split.h"

namespace kestrel::model {

namespace {

// Appends one sequence (sequence s, from row h.input_ids.size()) to the host
// mirrors with positions from `pos0`.
void put_sequence(const std::vector<int32_t>& q, int32_t pos0, PackedBatch& b) {
  PackedBatch::Host& h = b.host;
  for (size_t j = 0; j < q.size(); ++j) {
    h.input_ids.push_back(q[j]);
    h.positions.push_back(pos0 + int32_t(j));
    h.targets.push_back(j + 1 < q.size() ? q[j + 1] : -1);
  }
  h.cu_seqlens.push_back(int32_t(h.input_ids.size()));
  b.max_seqlen = std::max<int64_t>(b.max_seqlen, int64_t(pos0) + int64_t(q.size()));
}

PackedBatch start(int64_t tokens, int64_t seqs) {
  PackedBatch b;
  b.num_tokens = tokens;
  b.num_seqs = seqs;
  b.host.input_ids.reserve(size_t(tokens));
  b.host.positions.reserve(size_t(tokens));
  b.host.targets.reserve(size_t(tokens));
  b.host.cu_seqlens.reserve(size_t(seqs + 1));
  b.host.cu_seqlens.push_back(0);
  return b;
}

// The tensors from the complete host mirrors.
void upload(PackedBatch& b) {
  const PackedBatch::Host& h = b.host;
  KS_CHECK(int64_t(h.input_ids.size()) == b.num_tokens && int64_t(h.cu_seqlens.size()) == b.num_seqs + 1,
           "pack: ", h.input_ids.size(), " tokens and ", h.cu_seqlens.size(), " offsets for ", b.num_tokens,
           " tokens and ", b.num_seqs, " sequences");
  const int64_t T = b.num_tokens, B = b.num_seqs;
  b.input_ids = Tensor::from_host(h.input_ids, {T}, MemCategory::Activations);
  b.positions = Tensor::from_host(h.positions, {T}, MemCategory::Activations);
  b.targets = Tensor::from_host(h.targets, {T}, MemCategory::Activations);
  b.cu_seqlens = Tensor::from_host(h.cu_seqlens, {B + 1}, MemCategory::Activations);
  if (!h.prefix_of.empty()) b.prefix_of = Tensor::from_host(h.prefix_of, {B}, MemCategory::Activations);
}

}  // namespace

PackedBatch to_device(const PackedBatch& b, Device dev) {
  if (b.input_ids.device() == dev) return b;
  KS_CHECK(!b.record_routing || b.record_routing->device() == dev, "to_device: the routing record of a batch moved "
           "to ", device_name(dev), " must be allocated there too");
  const auto moved = [dev](const Tensor& t) { return t.defined() ? t.copy_to(dev, MemCategory::Activations) : Tensor(); };
  PackedBatch out = b;
  out.input_ids = moved(b.input_ids);
  out.positions = moved(b.positions);
  out.cu_seqlens = moved(b.cu_seqlens);
  out.targets = moved(b.targets);
  out.prefix_of = moved(b.prefix_of);
  out.routed_experts = moved(b.routed_experts);
  // A cp rank's share: its layout's row tables go with it (the cp attention's kernels read them).
  if (b.cp) out.cp = std::make_shared<const parallel::CpLayout>(parallel::cp_layout_on(*b.cp, dev));
  return out;
}

PackedBatch pack_sequences(const std::vector<std::vector<int32_t>>& seqs) {
  KS_CHECK(!seqs.empty(), "pack_sequences: no sequences");
  int64_t total = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    KS_CHECK(!seqs[i].empty(), "pack_sequences: sequence ", i, " is empty");
    total += int64_t(seqs[i].size());
  }
  PackedBatch b = start(total, int64_t(seqs.size()));
  for (const auto& q : seqs) put_sequence(q, 0, b);
  upload(b);
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
  PackedBatch b = start(total, n_seqs);
  std::vector<int32_t>& pre = b.host.prefix_of;  // stays empty when no group has a prefix
  if (shared) pre.reserve(size_t(n_seqs));
  int32_t s = 0;
  for (const auto& grp : groups) {
    int32_t parent = -1;
    if (!grp.prefix.empty()) {
      parent = s++;
      pre.push_back(-1);
      put_sequence(grp.prefix, 0, b);
    }
    for (const auto& c : grp.continuations) {
      if (shared) pre.push_back(parent);
      ++s;
      put_sequence(c, int32_t(grp.prefix.size()), b);
    }
  }
  upload(b);
  return b;
}

}  // namespace kestrel::model
