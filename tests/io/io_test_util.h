// Helpers for io tests: a per-test temporary folder and raw byte writers for
// hand-made (malformed) fixtures.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace kestrel::testing {

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("kestrel_io_") + (info ? info->test_suite_name() + std::string("_") + info->name() : "x") +
                       "_" + std::to_string(::getpid());
    path_ = (std::filesystem::temp_directory_path() / name).string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// A safetensors file from a header text and a data section, with the given
// header length field (defaults to the header's true length).
inline std::string st_bytes(const std::string& header, const std::string& data, int64_t len_field = -1) {
  uint64_t n = len_field < 0 ? header.size() : uint64_t(len_field);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

}  // namespace kestrel::testing

namespace kestrel::testing {
inline ::testing::AssertionResult has_substr(const std::string& s, const std::string& sub) {
  if (s.find(sub) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "message:\n  " << s << "\ndoes not contain:\n  " << sub;
}
}  // namespace kestrel::testing
#define EXPECT_HAS(s, sub) EXPECT_TRUE(::kestrel::testing::has_substr((s), (sub)))
