// Linear layers over weights packed once into the GEMM library's own layout.
//
// A BLAS call y = x @ W^T copies (packs) W into the panels its micro-kernel
// reads on every call: for the rollout, which multiplies the same weights
// hundreds of times between two weight updates, that is a pass over every
// weight per step, and at decode sizes (33-256 rows) the packing and the
// per-call blocking decisions cost as much as the product. Here W is packed
// once by oneDNN's matmul for an unknown row count (its "gemm:jit"
// implementation with runtime M, weights in its blocked format), and every
// later call only packs the few activation rows. Measured on an Intel Xeon
// (AVX-512, 2 threads, docs/benchmarks.md "Packed rollout weights"): f32
// 1.2-1.5x OpenBLAS's sgemm at 33-256 rows; bf16 weights run on the CPU's
// bf16 units (AMX, AVX512-BF16) with f32 accumulation, 2.5x the widening
// path at 256 rows.
//
// Same contract as ops::linear_fwd: f32 math (bf16 products are exact in
// f32, sums in f32), y rounded once. The summation order is the library's,
// so results agree with linear_fwd to f32 rounding, not bitwise.
//
// Used when oneDNN (the OpenMP build, libdnnl2) is installed, KESTREL_BLAS
// is unset, auto or dnnl, KESTREL_PACKED_WEIGHTS is not 0, deterministic
// mode is off (its GEMMs are fixed tiles of one library), and, for f32
// weights, the packed product is measured not slower than the BLAS here
// (packed_choice.h). The packed copy is allocated by Kestrel's allocator
// (category Params), so it counts in the memory stats and plans.
#pragma once
#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <tuple>

#include "core/tensor.h"

namespace kestrel::cpu {

class PackedLinearWeight;

// True when weights can be packed here (see above): the library is probed
// once per process, the switches are read at every call. *why (when given)
// says why not, or which library packs.
bool packed_linear_enabled(std::string* why = nullptr);
// True when weights of dtype dt are packed here: packing is enabled and, for
// f32, the packed product is not slower than the BLAS on this machine
// (packed_choice.h: measured once per machine and cached). *why says which
// library packs and the measured rates, or why not.
bool dtype_packs_here(DType dt, std::string* why = nullptr);

// W[out, in] (f32 or bf16, CPU) packed for y = x @ W^T; nullptr when this
// dtype does not pack here (dtype_packs_here), or when only oneDNN's
// reference code multiplies it (bf16 without AVX-512): the caller then
// multiplies unpacked. The pack
// is a copy: later changes to w are not seen (the owner repacks after a
// weight update).
std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const Tensor& w);

namespace detail {
// pack_linear_weight without the f32 verdict (the verdict's own measurement
// packs with it); outside_allocator: the copy is not counted in Kestrel's
// memory statistics.
std::shared_ptr<const PackedLinearWeight> pack_linear_weight_unmeasured(const Tensor& w, bool outside_allocator);
}  // namespace detail

// Bytes a pack of an [out, in] weight of dtype dt takes (0 when such a
// weight is not packed here): what pack_linear_weight allocates, for memory
// plans.
int64_t packed_linear_bytes(int64_t out, int64_t in, DType dt);

// bf16 weights on a CPU with AMX: the packed matmul (AMX tiles) overtakes the
// skinny kernel (skinny_gemm.h) past this many rows: 1.1x at 20 rows, 1.4x
// at 28, 1.5x at 32 on the small config (bench_skinny_gemm_bench --dtype
// bf16, docs/benchmarks.md "Packed rollout weights").
constexpr int64_t kPackedBf16AmxMinRows = 16;
// Products of more than this many rows multiply by packed weights of this
// dtype: kSkinnyMaxRows (below it the skinny kernel, which packs nothing, is
// as fast or faster), kPackedBf16AmxMinRows for bf16 on AMX.
int64_t packed_linear_min_rows(DType weight_dtype);

// True when packed_linear takes these operands: x[M, in] of the weight's
// dtype, y[M, out] f32 or the weight's dtype, b[out] f32 or bf16, M >= 1.
bool packed_linear_applies(const PackedLinearWeight& w, const Tensor& x, const Tensor* b, const Tensor& y);

// y[M, out] = x[M, in] @ W^T (+ b[out]). y must not alias x. Runs on the
// OpenMP team.
void packed_linear(const PackedLinearWeight& w, const Tensor& x, const Tensor* b, Tensor& y);

// What was packed: rows (out), columns (in), dtype, bytes, and a fingerprint
// of sampled elements of the source weight, for a cheap staleness check.
int64_t packed_rows(const PackedLinearWeight& w);
int64_t packed_cols(const PackedLinearWeight& w);
DType packed_dtype(const PackedLinearWeight& w);
int64_t packed_bytes(const PackedLinearWeight& w);
// A hash of 64 elements of w spread over it (with its shape and dtype):
// equal for a pack and its unchanged source; a weight update changes it
// with near certainty (it moves every element).
uint64_t weight_fingerprint(const Tensor& w);
uint64_t packed_fingerprint(const PackedLinearWeight& w);

// A set of packed weights, one per weight tensor a model's linears use (the
// rollout engine's, rollout/decode_linear.h), packed on first use and kept
// until clear(): the engine clears them when the trainer changes the weights
// (Engine::update_weights_version) and when it sleeps. As a guard against an
// update that was not announced, each use compares a fingerprint of sampled
// elements of the weight with the pack's and repacks on a difference
// (counted in stale_repacks()).
class WeightPacks {
 public:
  // w's pack, nullptr when it is not packed here (pack_linear_weight).
  const PackedLinearWeight* get(const Tensor& w);
  // y = x @ w^T (+ b) by w's pack when x has more than
  // packed_linear_min_rows(w) rows and the pack takes the operands
  // (packed_linear_applies); false, with nothing done, otherwise.
  bool linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
  void clear();
  int64_t count() const { return int64_t(by_data_.size()); }
  int64_t bytes() const;
  int64_t stale_repacks() const { return stale_repacks_; }

 private:
  // By (data, rows, cols, dtype): two views of one buffer never evict each other.
  using Key = std::tuple<const void*, int64_t, int64_t, int>;
  std::map<Key, std::shared_ptr<const PackedLinearWeight>> by_data_;
  int64_t stale_repacks_ = 0;
  int packable_[2] = {-1, -1};  // whether f32, bf16 weights pack here; -1: not asked yet
};

}  // namespace kestrel::cpu
