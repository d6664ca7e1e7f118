// Resharding one tensor between two tensor-parallel layouts: from its shard
// over a source tp group (training) to its shard over a destination tp group
// of another size (rollout), as MindSpeed-RL's WeightContainer and verl's
// per-tensor full_tensor() + load_weights do. The full HF tensor is gathered
// over the source group (nothing moves when that group has size 1) and this
// rank's destination block is cut from it directly into the destination
// buffer, converting the dtype when the two layouts store different ones.
// The destination group is never talked to: every rank only needs the full
// tensor its own source group holds, so data-parallel replicas of the source
// model each serve the destination ranks they sit on.
#pragma once
#include <cstdint>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "parallel/sharding.h"

namespace kestrel::parallel {

// Bytes this rank moved.
struct ReshardBytes {
  int64_t received = 0;  // over the source group (all-gather of the shards)
  int64_t copied = 0;    // written into destination shards
  ReshardBytes& operator+=(const ReshardBytes& o) {
    received += o.received;
    copied += o.copied;
    return *this;
  }
};

// Writes block `rank` of `size` of the full tensor (layout `spec`) into dst,
// which must have shard_shape(full, spec, size) elements; any float dtypes.
void cut_shard_into(const Tensor& full, const ShardSpec& spec, int rank, int size, Tensor& dst,
                    const std::string& name = "");

// Collective over src_tp (every rank of it calls with its shard): dst (this
// rank's shard of the same tensor in a layout of dst_size ranks, as dst_rank)
// is overwritten. full_shape: the HF tensor's shape.
ReshardBytes reshard_tensor(comm::ProcessGroup& src_tp, const Tensor& src_shard, const ShardSpec& spec,
                            const Shape& full_shape, int dst_rank, int dst_size, Tensor& dst,
                            const std::string& name = "");

}  // namespace kestrel::parallel
