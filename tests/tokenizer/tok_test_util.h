// Helpers shared by the tokenizer tests: the committed corpus and goldens.
#pragma once
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/testing.h"

namespace kestrel::tokenizer::testutil {

inline std::string read_file(const std::string& rel) {
  std::ifstream f(kestrel::testing::source_path(rel), std::ios::binary);
  EXPECT_TRUE(f.good()) << "missing " << rel << " (run tests/golden/tokenizer/make_tokenizer_golden.py)";
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline const std::string& corpus() {
  static const std::string c = read_file("tests/golden/tokenizer/corpus.txt");
  return c;
}

// Lines with their '\n', as make_tokenizer_golden.py splits them.
inline std::vector<std::string> corpus_lines() {
  std::vector<std::string> lines;
  const std::string& c = corpus();
  size_t b = 0;
  for (size_t i = 0; i < c.size(); ++i)
    if (c[i] == '\n') {
      lines.push_back(c.substr(b, i + 1 - b));
      b = i + 1;
    }
  if (b < c.size()) lines.push_back(c.substr(b));
  return lines;
}

inline std::string golden_dir(const std::string& name) { return kestrel::testing::source_path("tests/golden/tokenizer/" + name); }

}  // namespace kestrel::tokenizer::testutil
