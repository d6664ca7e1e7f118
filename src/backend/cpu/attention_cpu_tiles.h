// Register-tiled building blocks of the flash-attention CPU kernels, on the
// kVec-float vectors of simd_layer.inc (8 with AVX2, 16 with AVX-512). Each
// micro-tile is sized to its level's registers: accumulators, loaded operands
// and broadcasts fit AVX2's 16 without spilling (at most 12 accumulators),
// and AVX-512's 32 take 16 accumulators. Internal to attention_cpu_isa.inc and
// attention_block_cpu_isa.inc (the CP block kernels), which include it inside
// their ISA namespace: no include guard, no includes.
//
// Rows are f32, padded to dp = round_up(head_dim, kVec) floats. A score block
// holds up to kBlock queries x kBlock keys (row stride kBlock).
//
// Causality is given per row as a key limit: row r of a block sees keys
// j < lim(r), where lim is non-decreasing in r (see Limits). Masked pairs are
// skipped outright, never multiplied by 0, so a NaN/Inf in a later token
// never reaches an earlier one.
namespace attn {

using simd::hmax;
using simd::hsum;
using simd::iota;
using simd::load;
using simd::splat;
using simd::store;
using simd::vf;
using simd::vi;
constexpr int64_t kVec = simd::kW;
inline vf exp2v(vf x) { return simd::exp2(x); }

constexpr int64_t kBlock = 64;  // queries per query block == keys per key block
constexpr int64_t kKeyTile = 2 * kVec;  // keys per score micro-tile (2 vectors)
constexpr int64_t kTransposeRows = 16;  // rows per tile of the K/V transposes (one line of floats)

// Row stride in floats of a key-major buffer (K^T, V^T) for n keys: room
// for the last score tile, plus one cache line when the stride would be an
// even number of 64-byte lines. tile_abt reads one line from each of `depth`
// consecutive rows; at a stride of 2^k lines those rows share a few L1 sets
// and evict each other (512 keys, a 2 KB stride, put a head's 64 rows into 2
// of the 64 sets of a 32 KB 8-way L1). An odd number of lines spreads them
// over all the sets.
inline int64_t key_major_stride(int64_t n) {
  constexpr int64_t kLine = 16;  // floats per 64-byte line; kKeyTile is a multiple of it
  const int64_t ld = (std::max<int64_t>(n, 1) + kKeyTile - 1) / kKeyTile * kKeyTile;
  return (ld / kLine) % 2 == 0 ? ld + kLine : ld;
}

// Causal key limits of one (query block, key block) pair in a sequence's
// key coordinates: query row r sits at position q0 + r and sees keys up to
// it; the key block starts at k0 and holds nk keys.
// Any limits type of the block_* helpers below has lim(r) (non-decreasing in
// r) and lim.first_row(j, nr): the first row r < nr with lim(r) > j (nr if
// none), for keys j < lim(nr - 1). attention_block_cpu_isa.inc has another,
// for limits given per row.
struct Limits {
  int64_t q0, k0, nk;
  int64_t operator()(int64_t r) const { return std::clamp<int64_t>(q0 + r - k0 + 1, 0, nk); }
  // lim(r) > j  <=>  r >= j + k0 - q0.
  int64_t first_row(int64_t j, int64_t nr) const { return std::clamp<int64_t>(j + k0 - q0, 0, nr); }
};

// Rows of a score micro-tile: with AVX2's 16 registers, 6 x kKeyTile is 12
// accumulators beside two key vectors and a broadcast (15 registers; 4 rows
// ran 5% slower); AVX-512's 32 hold 8 rows (16 accumulators), so each key
// vector loaded feeds 8 FMAs. A score block's A operand, S and dS are padded
// to whole row tiles (kBlockRows rows).
constexpr int64_t kAbtRows = kVec >= 16 ? 8 : 6;
// Rows of a score block's A operand and of S, dS: kBlock padded to whole row tiles.
constexpr int64_t kBlockRows = (kBlock + kAbtRows - 1) / kAbtRows * kAbtRows;

// C[r][0:2kVec] = sum_{c < depth} A[r][c] * BT[c][0:2kVec] for kAbtRows rows:
// a kAbtRows x kKeyTile tile of a score block, keys vectorized (BT is the
// key-major transpose of K or V).
inline void tile_abt(const float* A, int64_t lda, const float* BT, int64_t ldbt, int64_t depth, float* C) {
  constexpr int R = int(kAbtRows);
  vf acc[R][2] = {};
  for (int64_t c = 0; c < depth; ++c) {
    const vf b0 = load(BT + c * ldbt), b1 = load(BT + c * ldbt + kVec);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vf a = splat(A[r * lda + c]);
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    store(C + r * kBlock, acc[r][0]);
    store(C + r * kBlock + kVec, acc[r][1]);
  }
}

// Score block rows [0, nr) (A must hold round_up(nr, kAbtRows) rows), each
// row tile only over the key tiles its last row can see. BT must hold
// round_up(lim(last row), kKeyTile) readable columns.
template <class Lim>
inline void block_abt(const float* A, int64_t lda, const float* BT, int64_t ldbt, int64_t depth, int64_t nr,
                      const Lim& lim, float* C) {
  for (int64_t r = 0; r < nr; r += kAbtRows) {
    const int64_t nk = lim(std::min(r + kAbtRows - 1, nr - 1));
    for (int64_t j = 0; j < nk; j += kKeyTile)
      tile_abt(A + r * lda, lda, BT + j, ldbt, depth, C + r * kBlock + j);
  }
}

// sum_c a[c] * b[c] over a padded row of dp floats (padding zero in either):
// the backward's D = rowsum(dO * O), in kVec lanes rather than one serial
// chain of dp adds.
inline float row_dot(const float* a, const float* b, int64_t dp) {
  vf acc{};
  for (int64_t c = 0; c < dp; c += kVec) acc += load(a + c) * load(b + c);
  return hsum(acc);
}

// Out[r][0:8NV] += sum_{j < n} W[r][j] * B[j][0:8NV] for r < R.
// TW = true reads W transposed (W[j][r]): the P^T dO and dS^T Q products.
template <int R, int NV, bool TW>
inline void tile_wb(const float* W, int64_t ldw, const float* B, int64_t ldb, int64_t n, float* Out,
                    int64_t ldo) {
  vf acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = load(Out + r * ldo + kVec * v);
  for (int64_t j = 0; j < n; ++j) {
    vf b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = load(B + j * ldb + kVec * v);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const vf w = splat(TW ? W[j * ldw + r] : W[r * ldw + j]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += w * b[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store(Out + r * ldo + kVec * v, acc[r][v]);
}

// tile_wb over the full padded width dp: 4 rows in 2-vector chunks, 1 row in
// 4-vector chunks (8 accumulators either way) with AVX2's 16 registers; with
// AVX-512's 32, 4 rows take 4-vector chunks (16 accumulators): each W
// broadcast feeds twice the FMAs and a head of 64 floats is one pass.
template <int R, bool TW>
inline void rows_wb(const float* W, int64_t ldw, const float* B, int64_t dp, int64_t n, float* Out) {
  if (n <= 0) return;
  constexpr int64_t kMaxNV = R == 4 ? (kVec >= 16 ? 4 : 2) : 4;
  for (int64_t v0 = 0; v0 < dp / kVec; v0 += kMaxNV) {
    const float* b = B + v0 * kVec;
    float* o = Out + v0 * kVec;
    switch (std::min<int64_t>(kMaxNV, dp / kVec - v0)) {
      case 1: tile_wb<R, 1, TW>(W, ldw, b, dp, n, o, dp); break;
      case 2: tile_wb<R, 2, TW>(W, ldw, b, dp, n, o, dp); break;
      case 3: if constexpr (kMaxNV >= 3) tile_wb<R, 3, TW>(W, ldw, b, dp, n, o, dp); break;
      default: if constexpr (kMaxNV >= 4) tile_wb<R, 4, TW>(W, ldw, b, dp, n, o, dp); break;
    }
  }
}

// Out[r] += sum_{j < lim(r)} W[r][j] * B[j] over one score block: W rows
// r < nr (stride kBlock), B rows [nk x dp], Out rows [nr x dp].
template <class Lim>
inline void block_wb(const float* W, const float* B, int64_t dp, int64_t nr, const Lim& lim, float* Out) {
  int64_t r = 0;
  for (; r + 4 <= nr; r += 4) {
    const float* w = W + r * kBlock;
    float* o = Out + r * dp;
    const int64_t lo = lim(r);
    rows_wb<4, false>(w, kBlock, B, dp, lo, o);  // keys every row of the tile sees
    for (int64_t i = 1; i < 4; ++i)              // the triangle beyond them
      rows_wb<1, false>(w + i * kBlock + lo, kBlock, B + lo * dp, dp, lim(r + i) - lo, o + i * dp);
  }
  for (; r < nr; ++r) rows_wb<1, false>(W + r * kBlock, kBlock, B, dp, lim(r), Out + r * dp);
}

// Out[j] += sum_{r < nr, j < lim(r)} W[r][j] * A[r] over one score block (the
// transposed product for dK, dV): keys j < lim(nr - 1).
template <class Lim>
inline void block_wtb(const float* W, const float* A, int64_t dp, int64_t nr, const Lim& lim, float* Out) {
  if (nr <= 0) return;
  const int64_t nk = lim(nr - 1);
  auto first = [&](int64_t j) { return lim.first_row(j, nr); };  // the first row that sees key j < nk
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) {
    const float* w = W + j;
    float* o = Out + j * dp;
    const int64_t r3 = first(j + 3);  // rows from r3 on see all 4 keys of the tile
    if (nr > r3) rows_wb<4, true>(w + r3 * kBlock, kBlock, A + r3 * dp, dp, nr - r3, o);
    for (int64_t i = 0; i < 3; ++i) {  // rows that only some keys of the tile see
      const int64_t ri = first(j + i);
      if (r3 > ri) rows_wb<1, true>(w + ri * kBlock + i, kBlock, A + ri * dp, dp, r3 - ri, o + i * dp);
    }
  }
  for (; j < nk; ++j) {
    const int64_t r0 = first(j);
    if (nr > r0) rows_wb<1, true>(W + r0 * kBlock + j, kBlock, A + r0 * dp, dp, nr - r0, Out + j * dp);
  }
}

}  // namespace attn
