// Helpers of the cli tests: a command's configuration from overrides.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"

namespace kestrel::cli::testing {

// A load under a command's key table `s` from key=value overrides.
inline Result<config::Config> load(const config::Schema& s, const std::vector<std::string>& ov) {
  config::LoadOptions lo;
  lo.schema = &s;
  lo.overrides = ov;
  return config::load(lo);
}

// The same, expected to load (a test failure naming the error otherwise).
inline config::Config ok(const config::Schema& s, const std::vector<std::string>& ov) {
  auto c = load(s, ov);
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return std::move(c).value();
}

}  // namespace kestrel::cli::testing
