// optim/checkpoint_io.h: the optimizer state through a .safetensors file, with
// full masters ("master.<name>") and with held (sharded) masters ("master").
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "optim/checkpoint_io.h"

using namespace kestrel;
using namespace kestrel::optim;

namespace {

std::vector<ParamSlot> mixed(bool held) {
  std::vector<ParamSlot> ps;
  const int64_t sizes[] = {6, 11};
  for (int i = 0; i < 2; ++i) {
    ParamSlot p;
    p.name = "layer" + std::to_string(i) + ".weight";
    std::vector<float> v(static_cast<size_t>(sizes[i]));
    for (size_t k = 0; k < v.size(); ++k) v[k] = 0.1f * float(k) - 0.3f * float(i);
    p.model_copy = Tensor::from_vector(v, {sizes[i]}).to(DType::BF16, MemCategory::Params);
    if (!held) p.master = p.model_copy.to(DType::F32, MemCategory::OptimizerState);
    p.grad = Tensor::zeros({sizes[i]}, DType::F32, MemCategory::Grads);
    for (int64_t k = 0; k < sizes[i]; ++k) p.grad.set(k, 0.01f * float((k * 7 + i) % 5) - 0.02f);
    ps.push_back(std::move(p));
  }
  return ps;
}

std::string tmp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("kestrel_optim_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

}  // namespace

TEST(CheckpointIo, RoundTripFullAndHeldMasters) {
  for (bool held : {false, true}) {
    const int64_t lo = held ? 4 : 0, hi = held ? 15 : -1;
    AdamW a(mixed(held), AdamWConfig{}, lo, hi);
    a.step(1e-2);
    const std::string path = tmp_file(held ? "held.safetensors" : "full.safetensors");
    ASSERT_TRUE(save_optimizer_state(path, a).is_ok());
    AdamW b(mixed(held), AdamWConfig{}, lo, hi);
    Status st = load_optimizer_state(path, b);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(b.step_count(), 1);
    a.step(1e-2);
    b.step(1e-2);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(a.master_view(i).to_float_vector(), b.master_view(i).to_float_vector()) << held << " " << i;
      EXPECT_EQ(a.params()[i].model_copy.to_float_vector(), b.params()[i].model_copy.to_float_vector());
    }
    // The other mode (or another dp layout) is refused, naming the file.
    AdamW other(mixed(!held), AdamWConfig{}, lo, hi);
    Status bad = load_optimizer_state(path, other);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.message().find(path), std::string::npos) << bad.message();
    std::remove(path.c_str());
  }
}
