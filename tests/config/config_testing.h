// Helpers for the config tests: load from overrides / temporary YAML files.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"

namespace kestrel::config::testing {

inline Result<Config> load_overrides(const std::vector<std::string>& overrides,
                                     const std::vector<std::string>& files = {}) {
  LoadOptions o;
  o.config_files = files;
  o.overrides = overrides;
  return load(o);
}

// The error message of a load that must fail ("" with a test failure when it loaded).
inline std::string load_error(const std::vector<std::string>& overrides, const std::vector<std::string>& files = {}) {
  auto r = load_overrides(overrides, files);
  EXPECT_FALSE(r.is_ok()) << "expected the config to be rejected";
  return r.is_ok() ? "" : r.status().message();
}

// A YAML file under the test temp dir; removed with the object.
class TempYaml {
 public:
  TempYaml(const std::string& name, const std::string& text) {
    path_ = (std::filesystem::path(::testing::TempDir()) / ("kestrel_cfg_" + name + ".yaml")).string();
    std::ofstream(path_) << text;
  }
  ~TempYaml() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kestrel::config::testing
