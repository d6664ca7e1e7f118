// cli::check_layout_fits, the start-up check kestrel train runs: ok for the
// built-in run on this machine's memory, an error with the peak, its phase and
// the advice when the device is too small, and an error naming the key for a
// layout the model does not divide.
#include <gtest/gtest.h>

#include "cli/commands.h"
#include "config/config.h"

namespace kestrel::cli {
namespace {

config::Config builtin_run(std::vector<std::string> extra = {}) {
  config::LoadOptions lo;
  lo.overrides = builtin_train_layer();
  lo.overrides.insert(lo.overrides.end(), extra.begin(), extra.end());
  auto c = config::load(lo);
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return std::move(c).value();
}

TEST(CheckLayoutFits, BuiltinRunFitsAndATinyDeviceDoesNot) {
  const config::Config c = builtin_run();
  EXPECT_TRUE(check_layout_fits(c, "builtin:arith-sft", 1, int64_t(24) << 30).is_ok());
  const Status s = check_layout_fits(c, "builtin:arith-sft", 1, int64_t(40) << 20);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("exceeds the device memory 40.0 MiB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("actor update"), std::string::npos) << s.message();
}

// A run on the GPU is checked against the GPU's memory (kestrel train passes
// cuda::total_memory), and the message says so.
TEST(CheckLayoutFits, AGpuRunIsCheckedAgainstTheGpu) {
  const config::Config c = builtin_run();
  const Status s = check_layout_fits(c, "builtin:arith-sft", 1, int64_t(40) << 20, Device::CUDA);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("exceeds the device memory 40.0 MiB of the GPU"), std::string::npos) << s.message();
  EXPECT_TRUE(check_layout_fits(c, "builtin:arith-sft", 1, int64_t(24) << 30, Device::CUDA).is_ok());
}

TEST(CheckLayoutFits, ALayoutTheModelDoesNotDivideNamesTheKey) {
  const config::Config c = builtin_run({"actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3"});
  const Status s = check_layout_fits(c, "builtin:arith-sft", 3, int64_t(24) << 30);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("tensor_model_parallel_size"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kestrel::cli
