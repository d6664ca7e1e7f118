// ops/copy.h: fill, zero, row gather/scatter, pad-copy and sum_rows on every
// backend against the scalar reference (exact: these ops move values, and
// sum_rows is defined by its order), index and shape errors, and the dispatch
// message for a device without kernels.
#include "ops/copy.h"

#include <gtest/gtest.h>

#include "core/parallel_for.h"
#include "op_harness.h"
#include "ops/ref/copy_ref.h"

namespace kestrel {
namespace {

using namespace testing;

// The dtypes the data-movement ops are used with: float activations and
// weights, and i32 ids / positions.
std::vector<DType> copy_dtypes() { return {DType::F32, DType::BF16, DType::I32}; }

// Values exactly representable in every dtype of copy_dtypes().
std::vector<double> small_ints(int64_t n, uint64_t seed) {
  auto v = randn(n, seed, 40.0);
  for (double& x : v) x = std::round(x);
  return v;
}

// The exact values of t (bf16 holds these integers exactly).
std::vector<double> exact(const Tensor& t) { return values(t); }

TEST(CopyOps, GatherRowsMatchesReference) {
  for (Device dev : available_devices())
    for (DType dt : copy_dtypes())
      for (auto [R, C] : {std::pair<int64_t, int64_t>{5, 3}, {1, 1}, {9, 17}}) {
        SCOPED_TRACE(case_name(dev, dt) + " R=" + std::to_string(R) + " C=" + std::to_string(C));
        const auto src = small_ints(R * C, 1);
        const std::vector<int32_t> idx = {int32_t(R - 1), 0, int32_t(R / 2), int32_t(R - 1)};  // repeats allowed
        const int64_t n = int64_t(idx.size());
        Tensor dst = nan_tensor({n, C}, dt == DType::I32 ? DType::F32 : dt, dev);
        if (dt == DType::I32) dst = Tensor::zeros({n, C}, DType::I32, MemCategory::Other, dev);
        ops::gather_rows(make_tensor(src, {R, C}, dt, dev), make_ids(idx, dev), dst);
        std::vector<double> want(size_t(n * C));
        ops::ref::gather_rows(src.data(), idx.data(), want.data(), n, C);
        EXPECT_EQ(exact(dst), want);
      }
}

TEST(CopyOps, ScatterRowsMatchesReferenceAndKeepsOtherRows) {
  for (Device dev : available_devices())
    for (DType dt : copy_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      const int64_t R = 7, C = 5;
      const std::vector<int32_t> idx = {6, 0, 3};
      const int64_t n = int64_t(idx.size());
      const auto src = small_ints(n * C, 2);
      auto before = small_ints(R * C, 3);
      Tensor dst = make_tensor(before, {R, C}, dt, dev);
      ops::scatter_rows(make_tensor(src, {n, C}, dt, dev), make_ids(idx, dev), dst);
      ops::ref::scatter_rows(src.data(), idx.data(), before.data(), n, C);
      EXPECT_EQ(exact(dst), before);
    }
}

TEST(CopyOps, PadRowsCopiesIntoTheTopOfAZeroedTensor) {
  for (Device dev : available_devices())
    for (DType dt : copy_dtypes())
      for (auto [r, R] : {std::pair<int64_t, int64_t>{3, 8}, {4, 4}, {0, 2}}) {
        SCOPED_TRACE(case_name(dev, dt) + " r=" + std::to_string(r) + " R=" + std::to_string(R));
        const int64_t C = 6;
        const auto src = small_ints(r * C, 4);
        Tensor dst = make_tensor(std::vector<double>(size_t(R * C), 99.0), {R, C}, dt, dev);
        ops::pad_rows(make_tensor(src, {r, C}, dt, dev), dst);
        std::vector<double> want(size_t(R * C));
        ops::ref::pad_rows(src.data(), want.data(), r, R, C);
        EXPECT_EQ(exact(dst), want);
      }
  // 1-D i32 (ids padded to a bucket length).
  Tensor ids = Tensor::from_ints({7, 7, 7, 7, 7}, {5});
  ops::pad_rows(Tensor::from_ints({1, 2}, {2}), ids);
  EXPECT_EQ(exact(ids), (std::vector<double>{1, 2, 0, 0, 0}));
}

TEST(CopyOps, PadRowsWithAFillValue) {
  for (Device dev : available_devices())
    for (DType dt : copy_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      const int64_t r = 3, R = 5;
      const auto src = small_ints(r, 8);
      Tensor dst = make_tensor(std::vector<double>(size_t(R), 7.0), {R}, dt, dev);
      ops::pad_rows(make_tensor(src, {r}, dt, dev), dst, -100.f);  // targets: -100 = ignored
      std::vector<double> want(static_cast<size_t>(R));
      ops::ref::pad_rows(src.data(), want.data(), r, R, 1, -100.0);
      EXPECT_EQ(exact(dst), want);
    }
}

TEST(CopyOps, CopyColsMatchesReference) {
  for (Device dev : available_devices())
    for (DType dt : copy_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      // Shard: columns [4, 10) of a [3, 12] weight; unshard: back into a [3, 12] at column 4.
      const int64_t R = 3, C = 12, b = 4, w = 6;
      const auto full = small_ints(R * C, 9);
      Tensor shard = make_tensor(std::vector<double>(size_t(R * w), 55.0), {R, w}, dt, dev);
      ops::copy_cols(make_tensor(full, {R, C}, dt, dev), b, shard, 0, w);
      std::vector<double> want(static_cast<size_t>(R * w));
      ops::ref::copy_cols(full.data(), C, b, want.data(), w, 0, R, w);
      EXPECT_EQ(exact(shard), want);
      auto back = std::vector<double>(size_t(R * C), 1.0);
      Tensor whole = make_tensor(back, {R, C}, dt, dev);
      ops::copy_cols(shard, 0, whole, b, w);
      ops::ref::copy_cols(want.data(), w, 0, back.data(), C, b, R, w);
      EXPECT_EQ(exact(whole), back);
    }
  Tensor a = Tensor::zeros({2, 4}, DType::F32, MemCategory::Other), c = Tensor::zeros({2, 2}, DType::F32, MemCategory::Other);
  EXPECT_THROW_MSG(ops::copy_cols(a, 3, c, 0, 2), "are out of range");
  Tensor d = Tensor::zeros({3, 2}, DType::F32, MemCategory::Other);
  EXPECT_THROW_MSG(ops::copy_cols(a, 0, d, 0, 2), "dst must have shape [2, *]");
}

// MLA's decompression: kv [T, H*(nope+v)] (kv_b_proj's output) and k_pe
// [T, rope] into k [T, H*(nope+rope)] = [k_nope_h | k_pe] and v [T, H*v];
// the dst columns not copied keep their values.
TEST(CopyOps, CopyHeadColsMatchesReference) {
  for (Device dev : available_devices())
    for (DType dt : copy_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      const int64_t T = 5, H = 3, nope = 4, rope = 3, vd = 5;
      const auto kv = small_ints(T * H * (nope + vd), 20), pe = small_ints(T * rope, 21);
      auto kd = small_ints(T * H * (nope + rope), 22), vv = small_ints(T * H * vd, 23);
      Tensor kv_t = make_tensor(kv, {T, H * (nope + vd)}, dt, dev), pe_t = make_tensor(pe, {T, rope}, dt, dev);
      Tensor k = make_tensor(kd, {T, H * (nope + rope)}, dt, dev), v = make_tensor(vv, {T, H * vd}, dt, dev);
      ops::copy_head_cols(kv_t, H, 0, k, H, 0, nope);     // k_nope_h
      ops::copy_head_cols(pe_t, 1, 0, k, H, nope, rope);  // k_pe, broadcast to every head
      ops::copy_head_cols(kv_t, H, nope, v, H, 0, vd);    // v_h
      ops::ref::copy_head_cols(kv.data(), nope + vd, H, 0, kd.data(), nope + rope, H, 0, T, nope);
      ops::ref::copy_head_cols(pe.data(), rope, 1, 0, kd.data(), nope + rope, H, nope, T, rope);
      ops::ref::copy_head_cols(kv.data(), nope + vd, H, nope, vv.data(), vd, H, 0, T, vd);
      EXPECT_EQ(exact(k), kd);
      EXPECT_EQ(exact(v), vv);
      // Into the middle of wider heads, leaving columns on both sides.
      const auto src = small_ints(T * H * 6, 24);
      auto want = small_ints(T * H * 9, 25);
      Tensor dst = make_tensor(want, {T, H * 9}, dt, dev);
      ops::copy_head_cols(make_tensor(src, {T, H * 6}, dt, dev), H, 1, dst, H, 3, 4);
      ops::ref::copy_head_cols(src.data(), 6, H, 1, want.data(), 9, H, 3, T, 4);
      EXPECT_EQ(exact(dst), want);
    }
}

// The gradient of a broadcast: dk_pe[t] = sum over heads of dk[t, h, nope:].
TEST(CopyOps, SumHeadColsAddsInHeadOrder) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      const int64_t T = 7, H = 5, W = 11, col = 6, n = 5;
      const auto src = round_to(randn(T * H * W, 26, 3.0), dt);
      Tensor dst = nan_tensor({T, n}, DType::F32, dev);
      ops::sum_head_cols(make_tensor(src, {T, H * W}, dt, dev), H, col, dst, n);
      // The f32 reference in the same order: bit-identical.
      std::vector<float> s(src.begin(), src.end()), want(size_t(T * n));
      ops::ref::sum_head_cols(s.data(), W, H, col, want.data(), T, n);
      EXPECT_EQ(dst.to_host<float>(), want);
    }
  // Order matters in f32: 1e8 + 1 - 1e8 is 0.
  Tensor a = Tensor::from_vector({1e8f, 1.f, -1e8f}, {1, 3}), d = Tensor::empty({1, 1}, DType::F32);
  ops::sum_head_cols(a, 3, 0, d, 1);
  EXPECT_EQ(d.get(0), 0.f);
}

// sum_head_cols is the transpose of the broadcast copy_head_cols:
// <copy(x), y> = <x, sum(y)> over the copied columns.
TEST(CopyOps, SumHeadColsIsTheBroadcastsTranspose) {
  const int64_t T = 4, H = 3, W = 7, col = 2, n = 4;
  const auto x = round_to(randn(T * n, 27), DType::F32), y = round_to(randn(T * H * W, 28), DType::F32);
  Tensor cx = Tensor::zeros({T, H * W}, DType::F32, MemCategory::Other), sy = Tensor::empty({T, n}, DType::F32);
  ops::copy_head_cols(make_tensor(x, {T, n}, DType::F32), 1, 0, cx, H, col, n);
  ops::sum_head_cols(make_tensor(y, {T, H * W}, DType::F32), H, col, sy, n);
  EXPECT_NEAR(dot(values(cx), y), dot(x, values(sy)), 1e-5);  // sy summed in f32
}

TEST(CopyOps, HeadColsSameResultsAtAnyThreadCount) {
  const int64_t T = 2048, H = 16, W = 96;
  const auto src = round_to(randn(T * H * W, 29), DType::F32);
  auto run = [&](int threads) {
    set_num_threads(threads);
    Tensor s = make_tensor(src, {T, H * W}, DType::F32), c = Tensor::zeros({T, H * 64}, DType::F32, MemCategory::Other),
           sum = Tensor::empty({T, 64}, DType::F32);
    ops::copy_head_cols(s, H, 32, c, H, 0, 64);
    ops::sum_head_cols(s, H, 16, sum, 64);
    return std::make_pair(c.to_host<float>(), sum.to_host<float>());
  };
  const int saved = num_threads();
  const auto one = run(1), two = run(2);
  set_num_threads(saved);
  EXPECT_EQ(one, two);
}

TEST(CopyOps, HeadColsBadArgumentsFailWithAMessage) {
  Tensor src = Tensor::zeros({2, 12}, DType::F32, MemCategory::Other), dst = Tensor::zeros({2, 8}, DType::F32, MemCategory::Other);
  EXPECT_THROW_MSG(ops::copy_head_cols(src, 2, 0, dst, 4, 0, 2), "src_heads = 2 must be n_heads = 4");
  EXPECT_THROW_MSG(ops::copy_head_cols(src, 5, 0, dst, 5, 0, 1), "does not split into src_heads = 5 heads");
  EXPECT_THROW_MSG(ops::copy_head_cols(src, 4, 0, dst, 3, 0, 1), "src_heads = 4 must be n_heads = 3");
  EXPECT_THROW_MSG(ops::copy_head_cols(src, 4, 1, dst, 4, 0, 3), "columns [1, 4) of each 3-wide head of src");
  EXPECT_THROW_MSG(ops::copy_head_cols(src, 4, 0, dst, 4, 1, 2), "into [1, 3) of each 2-wide head of dst");
  Tensor rows3 = Tensor::zeros({3, 8}, DType::F32, MemCategory::Other);
  EXPECT_THROW_MSG(ops::copy_head_cols(src, 4, 0, rows3, 4, 0, 1), "dst must have shape [2, *]");
  Tensor bf = Tensor::zeros({2, 8}, DType::BF16, MemCategory::Other);
  EXPECT_THROW_MSG(ops::copy_head_cols(src, 4, 0, bf, 4, 0, 1), "must have the dtype of src");
  Tensor big = Tensor::zeros({2, 24}, DType::F32, MemCategory::Other);
  Tensor view = big.slice_rows(0, 1), view2 = big.slice_rows(1, 2);
  EXPECT_NO_THROW(ops::copy_head_cols(view, 2, 0, view2, 2, 0, 12));
  Tensor overlap = big.slice_rows(0, 2);
  EXPECT_THROW_MSG(ops::copy_head_cols(big, 2, 0, overlap, 2, 0, 1), "overlap");
  Tensor sum = Tensor::empty({2, 2}, DType::F32);
  EXPECT_THROW_MSG(ops::sum_head_cols(src, 4, 2, sum, 2), "columns [2, 4) of each 3-wide head of src");
  EXPECT_THROW_MSG(ops::sum_head_cols(src, 4, 0, sum, 3), "dst must have shape [2, 3]");
  EXPECT_THROW_MSG(ops::sum_head_cols(src, 4, 0, bf, 2), "dst must be f32");
  EXPECT_THROW_MSG(ops::sum_head_cols(Tensor::from_ints({1, 2}, {1, 2}), 1, 0, sum, 2), "src must be f32 or bf16");
}

TEST(CopyOps, FillAndZeroEveryDtype) {
  for (Device dev : available_devices())
    for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8}) {
      SCOPED_TRACE(case_name(dev, dt));
      Tensor t = Tensor::empty({3, 11}, dt, MemCategory::Other, dev);
      ops::fill(t, 3.0f);
      std::vector<double> want(33);
      ops::ref::fill(want.data(), 3.0, 33);
      EXPECT_EQ(exact(t), want);
      // Converted as Tensor::set converts: bf16 rounds to nearest even.
      Tensor u = Tensor::empty({4}, dt, MemCategory::Other, dev);
      ops::fill(u, 1.7f);
      Tensor w = Tensor::empty({4}, dt, MemCategory::Other);  // host memory: element writes are host-only
      for (int64_t i = 0; i < 4; ++i) w.set(i, 1.7f);
      EXPECT_EQ(exact(u), exact(w));
      ops::zero(t);
      EXPECT_EQ(exact(t), std::vector<double>(33, 0.0));
    }
}

TEST(CopyOps, SumRowsAddsInRowOrder) {
  for (Device dev : available_devices())
    for (auto [R, C] : {std::pair<int64_t, int64_t>{1, 5}, {4, 33}, {3, 1}}) {
      SCOPED_TRACE(case_name(dev, DType::F32) + " R=" + std::to_string(R));
      const auto src = round_to(randn(R * C, 5, 3.0), DType::F32);
      Tensor dst = nan_tensor({C}, DType::F32, dev);
      ops::sum_rows(make_tensor(src, {R, C}, DType::F32, dev), dst);
      // The f32 reference in the same order: bit-identical.
      std::vector<float> s(src.begin(), src.end()), want(static_cast<size_t>(C));
      ops::ref::sum_rows(s.data(), want.data(), R, C);
      EXPECT_EQ(dst.to_host<float>(), want);
    }
  // Order matters in f32: 1e8 + 1 - 1e8 is 0, 1e8 - 1e8 + 1 is 1.
  Tensor a = Tensor::from_vector({1e8f, 1.f, -1e8f}, {3, 1}), d = Tensor::empty({1}, DType::F32);
  ops::sum_rows(a, d);
  EXPECT_EQ(d.get(0), 0.f);
}

TEST(CopyOps, SameResultsAtAnyThreadCount) {
  const int64_t R = 4096, C = 96;  // past the parallel thresholds
  const auto src = round_to(randn(R * C, 6), DType::F32);
  std::vector<int32_t> idx(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) idx[size_t(i)] = int32_t((i * 7919) % R);  // a permutation
  auto run = [&](int threads) {
    set_num_threads(threads);
    Tensor s = make_tensor(src, {R, C}, DType::F32), g = Tensor::empty({R, C}, DType::F32),
           sc = Tensor::zeros({R, C}, DType::F32, MemCategory::Other), sum = Tensor::empty({C}, DType::F32);
    ops::gather_rows(s, make_ids(idx), g);
    ops::scatter_rows(g, make_ids(idx), sc);
    ops::sum_rows(s, sum);
    return std::make_tuple(g.to_host<float>(), sc.to_host<float>(), sum.to_host<float>());
  };
  const int saved = num_threads();
  const auto one = run(1), two = run(2);
  set_num_threads(saved);
  EXPECT_EQ(one, two);
  // scatter undoes gather through the same permutation.
  EXPECT_EQ(std::get<1>(one), make_tensor(src, {R, C}, DType::F32).to_host<float>());
}

TEST(CopyOps, BadIndicesAndShapesFailWithAMessage) {
  Tensor src = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}), dst = Tensor::empty({2, 2}, DType::F32);
  EXPECT_THROW_MSG(ops::gather_rows(src, Tensor::from_ints({0, 3}, {2}), dst), "index[1] = 3 is outside the 3 rows");
  EXPECT_THROW_MSG(ops::gather_rows(src, Tensor::from_ints({0, -1}, {2}), dst), "index[1] = -1");
  EXPECT_THROW_MSG(ops::gather_rows(src, Tensor::from_ints({0}, {1}), dst), "index must have shape [2]");
  Tensor wide = Tensor::empty({2, 3}, DType::F32);
  EXPECT_THROW_MSG(ops::gather_rows(src, Tensor::from_ints({0, 1}, {2}), wide), "same row shape");
  Tensor big = Tensor::zeros({4, 2}, DType::F32);
  EXPECT_THROW_MSG(ops::scatter_rows(dst, Tensor::from_ints({1, 1}, {2}), big), "must be distinct");
  EXPECT_THROW_MSG(ops::scatter_rows(dst, Tensor::from_ints({0, 4}, {2}), big), "index[1] = 4 is outside");
  EXPECT_THROW_MSG(ops::pad_rows(big, src), "has more rows than dst");
  EXPECT_THROW_MSG(ops::pad_rows(Tensor::from_ints({1, 2}, {1, 2}), dst), "must have the dtype of");
  EXPECT_THROW_MSG(ops::pad_rows(big.slice_rows(0, 2), big), "overlap");
  EXPECT_THROW_MSG(ops::sum_rows(src, wide), "dst must have shape [2]");
  Tensor two = Tensor::empty({2}, DType::F32);
  EXPECT_THROW_MSG(ops::sum_rows(Tensor::empty({0, 2}, DType::F32), two), "at least one row");
}

TEST(CopyOps, DeviceWithoutKernelsIsNotSupportedYet) {
  // A tensor tagged CUDA over host memory: dispatch must refuse it before any kernel runs.
  std::vector<float> mem(8);
  Tensor cuda = Tensor::from_blob(mem.data(), {4, 2}, DType::F32, nullptr, Device::CUDA);
#if !KESTREL_HAVE_CUDA  // a build with the CUDA backend has these kernels
  EXPECT_THROW_MSG(ops::fill(cuda, 1.f), "not supported yet: CUDA kernel for ops::fill");
  EXPECT_THROW_MSG(ops::zero(cuda), "not supported yet: CUDA kernel for ops::zero");
#endif
  Tensor host = Tensor::zeros({4, 2}, DType::F32, MemCategory::Other);
  EXPECT_THROW_MSG(ops::pad_rows(host, cuda), "tensors on different devices (cpu and cuda)");
  EXPECT_EQ(mem, std::vector<float>(8, 0.f));
}

}  // namespace
}  // namespace kestrel
