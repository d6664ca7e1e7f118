// Device-side pieces shared by the attention kernel files (kernels_attention.cu,
// kernels_attention_mma.cu): the problem's dims and the key ranges a block of
// packed query rows visits. Included inside each file's
// `namespace kestrel::cuda::launch` anonymous namespace, after device_util.cuh.
#pragma once

// T packed rows; H query heads over Hkv kv heads; q.k width hd, value width vd.
struct Dims {
  int64_t T;
  int H, Hkv, hd, vd;
  float scale;
};

// Whether a score is kept, inside a key range of sequence `owner`
// (for_each_key_range's): its operand was loaded (in_tile), the row side's
// sequence is owner, and, for a causal range, the key is not after the query
// (both packed row indices).
__device__ __forceinline__ bool score_visible(bool in_tile, int row_seq, int owner, bool causal, int64_t key,
                                              int64_t query) {
  return in_tile && row_seq == owner && (!causal || key <= query);
}

// The key ranges a block of query rows [i0, i1] sees, in visiting order: for each sequence b
// the block touches, b's prefix (all of it) then b's own keys up to min(end of b, i1 + 1).
// f(key_begin, key_end, owner b, causal) for each.
template <class F>
__device__ void for_each_key_range(const int32_t* cu, int n, const int32_t* prefix_of, int64_t i0, int64_t i1, F f) {
  const int b0 = seq_of(cu, n, i0), b1 = seq_of(cu, n, i1);
  for (int b = b0; b <= b1; ++b) {
    const int p = prefix_of ? prefix_of[b] : -1;
    if (p >= 0) f(int64_t(cu[p]), int64_t(cu[p + 1]), b, false);
    const int64_t e = cu[b + 1] < i1 + 1 ? cu[b + 1] : i1 + 1;
    f(int64_t(cu[b]), e, b, true);
  }
}
