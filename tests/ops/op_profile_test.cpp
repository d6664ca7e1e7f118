// ops/op_profile: KESTREL_OP_PROFILE's per-op table counts every dispatched
// op once under its name and shapes, and an op inside another op as part of it.
#include "ops/op_profile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "ops/dispatch.h"
#include "ops/linear.h"

namespace kestrel {
namespace {

// The report's text (open_memstream keeps it in memory).
std::string report() {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  ops::op_profile_report(f, "test");
  std::fclose(f);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

// The report's line naming `what` ("" when none does).
std::string line_of(const std::string& report, const std::string& what) {
  const size_t at = report.find(what);
  if (at == std::string::npos) return "";
  const size_t begin = report.rfind('\n', at);
  return report.substr(begin == std::string::npos ? 0 : begin + 1, at - (begin == std::string::npos ? 0 : begin + 1));
}

// An op whose host kernel runs two other ops (ops::add): it is timed, they are not.
void add_twice(const Tensor& a, const Tensor& b, Tensor& y) {
  ops::add(a, b, y);
  ops::add(a, b, y);
}
constexpr ops::detail::Kernels<void(const Tensor&, const Tensor&, Tensor&)> kAddTwice{.cpu = add_twice};

struct ProfileOn {
  ProfileOn() {
    ops::op_profile_set_enabled(true);
    ops::op_profile_reset();
  }
  ~ProfileOn() {
    ops::op_profile_reset();
    ops::op_profile_set_enabled(false);
  }
};

TEST(OpProfile, CountsEachOpUnderItsNameAndShapes) {
  ProfileOn on;
  Tensor x = Tensor::zeros({4, 3}, DType::F32), w = Tensor::zeros({5, 3}, DType::F32), y = Tensor::zeros({4, 5}, DType::F32);
  ops::linear_fwd(x, w, nullptr, y);
  ops::linear_fwd(x, w, nullptr, y);
  Tensor a = Tensor::zeros({2, 2}, DType::F32), b = Tensor::zeros({2, 2}, DType::F32), c = Tensor::zeros({2, 2}, DType::F32);
  ops::add(a, b, c);
  const std::string r = report();
  EXPECT_NE(r.find("2 op kinds"), std::string::npos) << r;
  EXPECT_EQ(line_of(r, "linear_fwd [4, 3] f32 [5, 3] [4, 5]").rfind("#        2 ", 0), 0u) << r;  // two calls
  EXPECT_EQ(line_of(r, "add [2, 2] f32 [2, 2] [2, 2]").rfind("#        1 ", 0), 0u) << r;
  // Reported means forgotten.
  EXPECT_NE(report().find("0.0 ms in 0 op kinds"), std::string::npos);
}

TEST(OpProfile, AnOpInsideAnotherCountsAsPartOfIt) {
  ProfileOn on;
  Tensor a = Tensor::zeros({2, 2}, DType::F32), b = Tensor::zeros({2, 2}, DType::F32), c = Tensor::zeros({2, 2}, DType::F32);
  ops::detail::dispatch("add_twice", kAddTwice, {&a, &b, &c}, a, b, c);
  const std::string r = report();
  EXPECT_NE(r.find("1 op kinds"), std::string::npos) << r;
  EXPECT_NE(r.find("add_twice"), std::string::npos) << r;
  // The nesting depth came back to zero: the next op is timed again.
  ops::add(a, b, c);
  EXPECT_NE(report().find("add [2, 2]"), std::string::npos);
}

TEST(OpProfile, OffRecordsNothing) {
  ops::op_profile_set_enabled(false);
  Tensor a = Tensor::zeros({2, 2}, DType::F32), b = Tensor::zeros({2, 2}, DType::F32), c = Tensor::zeros({2, 2}, DType::F32);
  ops::add(a, b, c);
  EXPECT_NE(report().find("0 op kinds"), std::string::npos);
}

}  // namespace
}  // namespace kestrel
