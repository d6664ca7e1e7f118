#include "parallel/reshard.h"

#include <algorithm>

#include "ops/copy.h"

namespace kestrel::parallel {

namespace {

int64_t inner_from(const Shape& s, size_t from) {
  int64_t k = 1;
  for (size_t i = from; i < s.size(); ++i) k *= s[i];
  return k;
}

// Index of the dim-0 block `rank` keeps, in units of the shard's extent.
int64_t block_index(const ShardSpec& spec, int rank, int size) {
  if (spec.kind != ShardKind::KvHeads || spec.n_kv_heads % size == 0) return rank;
  return rank / (size / spec.n_kv_heads);  // replicated kv heads: n / Hkv consecutive ranks share one
}

}  // namespace

void cut_shard_into(const Tensor& full, const ShardSpec& spec, int rank, int size, Tensor& dst,
                    const std::string& name) {
  KS_CHECK(size >= 1 && rank >= 0 && rank < size, "cut_shard_into: rank ", rank, " of ", size);
  const Shape& fs = full.shape();
  const Shape ss = shard_shape(fs, spec, size, name);  // also validates divisibility, naming the tensor
  KS_CHECK(dst.numel() == shape_numel(ss), "reshard of '", name, "': destination ", dst.describe(),
           " is not the ", shard_kind_name(spec.kind), " shard ", shape_str(ss), " of ", shape_str(fs), " over ",
           size, " ranks");
  if (spec.kind == ShardKind::Replicated || size == 1) {
    dst.copy_from(full);
    return;
  }
  if (spec.kind != ShardKind::Row) {
    // A dim-0 block is one contiguous range of the full tensor; rows past its
    // end (vocabulary padding) are zeros.
    const int64_t inner = inner_from(fs, 1), rows = ss[0], begin = block_index(spec, rank, size) * rows;
    const int64_t end = std::min(begin + rows, fs[0]);
    if (end - begin == rows) {
      dst.copy_from(full.view({fs[0], inner}).slice_rows(begin, begin + rows));
      return;
    }
    dst.zero_();
    if (end > begin) {
      Tensor real = dst.view({rows, inner}).slice_rows(0, end - begin);
      real.copy_from(full.view({fs[0], inner}).slice_rows(begin, end));
    }
    return;
  }
  // Row-parallel [out, in]: columns [rank*in/n, (rank+1)*in/n) of every row.
  // Viewed as [out*n, in/n] (row r's block j is row r*n + j) each piece is a row.
  const int64_t out = fs[0], w = ss[1] * inner_from(fs, 2);
  const Tensor pieces = full.view({out * size, w});
  Tensor d = dst.view({out, w});
  if (full.dtype() == dst.dtype()) {
    ops::copy_cols(full.view({out, size * w}), rank * w, d, 0, w);  // [out, n*w] -> [out, w]
    return;
  }
  for (int64_t r = 0; r < out; ++r) {
    Tensor row = d.slice_rows(r, r + 1);
    row.copy_from(pieces.slice_rows(r * size + rank, r * size + rank + 1));
  }
}

ReshardBytes reshard_tensor(comm::ProcessGroup& src_tp, const Tensor& src_shard, const ShardSpec& spec,
                            const Shape& full_shape, int dst_rank, int dst_size, Tensor& dst,
                            const std::string& name) {
  ReshardBytes bytes;
  Tensor full = src_shard;  // replicated tensors and size-1 groups already hold the full tensor
  if (src_tp.size() > 1 && spec.kind != ShardKind::Replicated) {
    full = gather_tensor(src_tp, src_shard, spec, full_shape);
    bytes.received = int64_t(src_tp.size() - 1) * int64_t(src_shard.nbytes());
  }
  KS_CHECK(full.shape() == full_shape, "reshard of '", name, "': the source holds ", full.describe(),
           ", expected the full shape ", shape_str(full_shape));
  cut_shard_into(full, spec, dst_rank, dst_size, dst, name);
  bytes.copied = int64_t(dst.nbytes());
  return bytes;
}

}  // namespace kestrel::parallel
