// Host side of the CUDA data-movement ops and RoPE (kernels_copy.cu).
#include "backend/cuda/copy_ops.h"

#include <vector>

#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/cuda_util.h"
#include "core/device_hooks.h"

namespace kestrel::cuda {
namespace {

size_t row_bytes(const Tensor& t) { return t.size(0) ? t.nbytes() / size_t(t.size(0)) : size_t(0); }

// The index values on the host, each in [0, rows); names the op and the entry otherwise.
// Empty while a graph captures: the read back would synchronise, which a capture
// cannot contain, so the graph's owner checks its host copy of the index before
// every replay instead (cuda_graph.h).
std::vector<int32_t> checked_index(const char* op, const Tensor& index, int64_t rows) {
  if (capturing()) return {};
  const std::vector<int32_t> ix = index.to_host<int32_t>();
  for (size_t i = 0; i < ix.size(); ++i)
    if (ix[i] < 0 || ix[i] >= rows)
      KS_FAIL("ops::", op, ": index[", i, "] = ", ix[i], " is outside the ", rows, " rows [0, ", rows, ")");
  return ix;
}

}  // namespace

void fill(Tensor& x, float v) { device_memory_hooks(Device::CUDA, "ops::fill").fill(x, v); }

void zero(Tensor& x) {
  if (x.nbytes()) KS_CUDA_CHECK(cudaMemsetAsync(x.raw(), 0, x.nbytes(), stream()));
}

void gather_rows(const Tensor& src, const Tensor& index, Tensor& dst) {
  checked_index("gather_rows", index, src.size(0));
  launch::gather_rows(src.raw(), dst.raw(), static_cast<const int32_t*>(index.raw()), index.numel(), row_bytes(dst),
                      stream());
  check_launch("gather_rows");
}

void scatter_rows(const Tensor& src, const Tensor& index, Tensor& dst) {
  const int64_t rows = dst.size(0);
  const std::vector<int32_t> ix = checked_index("scatter_rows", index, rows);
  std::vector<int64_t> seen(size_t(rows), -1);
  for (size_t i = 0; i < ix.size(); ++i) {
    if (seen[size_t(ix[i])] >= 0)
      KS_FAIL("ops::scatter_rows: index[", seen[size_t(ix[i])], "] and index[", i, "] are both ", ix[i],
              " (indices must be distinct)");
    seen[size_t(ix[i])] = int64_t(i);
  }
  launch::scatter_rows(src.raw(), dst.raw(), static_cast<const int32_t*>(index.raw()), index.numel(), row_bytes(src),
                       stream());
  check_launch("scatter_rows");
}

void pad_rows(const Tensor& src, Tensor& dst, float fill_value) {
  const size_t top = src.nbytes();
  if (top) KS_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), top, cudaMemcpyDeviceToDevice, stream()));
  const int64_t rest = dst.numel() - src.numel();
  if (rest > 0) {
    Tensor tail = Tensor::from_blob(static_cast<char*>(dst.raw()) + top, {rest}, dst.dtype(), nullptr, Device::CUDA);
    fill(tail, fill_value);
  }
}

void copy_cols(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t ncols) {
  const size_t es = dtype_size(src.dtype());
  launch::copy_cols(src.raw(), row_bytes(src), size_t(src_col) * es, dst.raw(), row_bytes(dst), size_t(dst_col) * es,
                    src.size(0), size_t(ncols) * es, stream());
  check_launch("copy_cols");
}

void sum_rows(const Tensor& src, Tensor& dst) {
  launch::sum_rows(static_cast<const float*>(src.raw()), src.size(0), src.numel() / src.size(0),
                   static_cast<float*>(dst.raw()), stream());
  check_launch("sum_rows");
}

void copy_head_cols(const Tensor& src, int64_t src_heads, int64_t src_col, Tensor& dst, int64_t n_heads,
                    int64_t dst_col, int64_t ncols) {
  const int64_t T = dst.size(0);
  const size_t es = dtype_size(src.dtype());
  const size_t Ws = size_t(src.size(1) / src_heads) * es, Wd = size_t(dst.size(1) / n_heads) * es;
  if (src_heads == n_heads) {  // rows of one head each: [T * n_heads, W]
    launch::copy_cols(src.raw(), Ws, size_t(src_col) * es, dst.raw(), Wd, size_t(dst_col) * es, T * n_heads,
                      size_t(ncols) * es, stream());
  } else {  // one source head broadcast: a copy per destination head
    for (int64_t h = 0; h < n_heads; ++h)
      launch::copy_cols(src.raw(), Ws, size_t(src_col) * es, dst.raw(), size_t(dst.size(1)) * es,
                        size_t(h) * Wd + size_t(dst_col) * es, T, size_t(ncols) * es, stream());
  }
  check_launch("copy_head_cols");
}

void sum_head_cols(const Tensor& src, int64_t n_heads, int64_t src_col, Tensor& dst, int64_t ncols) {
  launch::sum_head_cols(src.raw(), float_kind(src, "sum_head_cols"), src.size(0), n_heads, src.size(1) / n_heads,
                        src_col, static_cast<float*>(dst.raw()), ncols, stream());
  check_launch("sum_head_cols");
}

void rope_apply(const char* op, Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                int64_t n_heads, int64_t rot_offset, int64_t rot_dim, bool interleaved, bool inverse) {
  const int64_t P = cos.size(0), T = positions.size(0);
  // Not while a graph captures (checked_index's reason): its owner checks the positions.
  const std::vector<int32_t> pos = capturing() ? std::vector<int32_t>() : positions.to_host<int32_t>();
  for (int64_t t = 0; t < int64_t(pos.size()); ++t)
    if (pos[size_t(t)] < 0 || pos[size_t(t)] >= P)
      KS_FAIL(op, ": position ", pos[size_t(t)], " of token ", t, " is outside the RoPE table [0, ", P,
              "); build the table with max_positions > the longest sequence");
  launch::rope(x.raw(), float_kind(x, op), T, static_cast<const int32_t*>(positions.raw()),
               static_cast<const float*>(cos.raw()), static_cast<const float*>(sin.raw()), n_heads,
               x.size(1) / n_heads, rot_offset, rot_dim, interleaved, inverse, stream());
  check_launch(op);
}

}  // namespace kestrel::cuda
