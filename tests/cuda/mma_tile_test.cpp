// The tensor-core product the attention kernels build on (backend/cuda/mma.cuh,
// kernels_attention_mma.cu): one warp's mma.sync m16n8k16, its fragments
// loaded by the PTX ISA's layout formulas, equals the plain product. On a GPU
// this checks Kestrel's reading of the layout against the hardware (a wrong
// reading would fail here by name, not as a diffuse attention mismatch); on
// the emulator, the emulator's shuffle-based mma. Skipped without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace kestrel {
namespace {

uint16_t bf16_bits_of(float v) {  // v is a small integer: exact in bf16 (the upper half of its f32 bits)
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return uint16_t(u >> 16);
}

TEST(CudaMma, TileProductFollowsThePtxFragmentLayout) {
  if (!cuda::available()) GTEST_SKIP() << cuda::describe();
  cuda::init();
  // Distinct small integers everywhere, so a misplaced element changes the result and every sum is exact.
  std::vector<float> a(16 * 16), b(16 * 8);
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) a[size_t(i * 16 + k)] = float((i * 5 + k * 3) % 11 - 5);
  for (int k = 0; k < 16; ++k)
    for (int j = 0; j < 8; ++j) b[size_t(k * 8 + j)] = float((k * 7 + j * 2) % 9 - 4);
  std::vector<uint16_t> ab(a.size()), bb(b.size());
  for (size_t i = 0; i < a.size(); ++i) ab[i] = bf16_bits_of(a[i]);
  for (size_t i = 0; i < b.size(); ++i) bb[i] = bf16_bits_of(b[i]);
  const std::vector<float> c = cuda::mma_tile_product(ab, bb);
  ASSERT_EQ(c.size(), size_t(16 * 8));
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      float want = 0.f;
      for (int k = 0; k < 16; ++k) want += a[size_t(i * 16 + k)] * b[size_t(k * 8 + j)];
      EXPECT_EQ(c[size_t(i * 8 + j)], want) << "C[" << i << "][" << j << "]";
    }
}

}  // namespace
}  // namespace kestrel
