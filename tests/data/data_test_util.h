// Helpers for the data tests: a scratch folder per test and the built-in
// arith tokenizer written once.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/testing.h"
#include "data/builtin_tokenizer.h"
#include "data/chat_tokenizer.h"

namespace kestrel::data::testutil {

inline std::string scratch_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("kestrel_data_test_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

inline const TokenizerFiles& arith_files() {
  static const TokenizerFiles f = arith_tokenizer();
  return f;
}

inline const ChatTokenizer& arith_chat_tokenizer() {
  static const ChatTokenizer t = [] {
    const std::string dir = scratch_dir("arith_tokenizer");
    EXPECT_TRUE(write_tokenizer_files(dir, arith_files()).is_ok());
    return ChatTokenizer::from_dir(dir).value();
  }();
  return t;
}

}  // namespace kestrel::data::testutil
