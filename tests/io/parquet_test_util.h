// Helpers for the Parquet reader tests: fixture paths (tests/data/parquet,
// written by make_fixtures.py with pyarrow), JSONL rows and file bytes.
#pragma once
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/parquet/parquet.h"

namespace kestrel::testing {

inline std::string pq_fixture(const std::string& name) {
  std::string path = KESTREL_SOURCE_DIR;  // appended, not one `+` chain: GCC 12's false -Wstringop-overflow
  path += "/tests/data/parquet/";
  return path + name;
}

inline std::vector<nlohmann::ordered_json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<nlohmann::ordered_json> rows;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(nlohmann::ordered_json::parse(line));
  return rows;
}

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Every row of a Parquet file, or the error.
inline Result<std::vector<nlohmann::ordered_json>> read_parquet_rows(const std::string& path) {
  auto f = io::parquet::ParquetFile::open(path);
  if (!f) return f.status();
  std::vector<nlohmann::ordered_json> rows;
  Status s = (*f)->for_each_row([&](nlohmann::ordered_json& r, int64_t) {
    rows.push_back(std::move(r));
    return Status::ok();
  });
  if (!s) return s;
  return rows;
}

}  // namespace kestrel::testing
