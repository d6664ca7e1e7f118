// A native Parquet reader for datasets: rows come back as JSON objects, the
// shape a JSONL line of the same table has (pyarrow's Table.to_pylist()).
//
// Built: the footer and page headers (Thrift compact protocol, decoded here),
// data pages v1 and v2, dictionary pages, PLAIN, PLAIN_DICTIONARY /
// RLE_DICTIONARY, RLE (levels, booleans), DELTA_BINARY_PACKED,
// DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY and BYTE_STREAM_SPLIT;
// UNCOMPRESSED, SNAPPY, GZIP and ZSTD pages; page CRCs when present; any
// number of row groups. Types: BOOLEAN, INT32/INT64 (signed or unsigned
// INTEGER annotations), FLOAT, DOUBLE, BYTE_ARRAY as STRING/ENUM/JSON, the
// always-null UNKNOWN, and any nesting of structs, LISTs (3-level and the
// legacy 2-level forms), MAPs with string keys (to JSON objects) and bare
// repeated fields. Anything else (binary without a string annotation,
// DECIMAL, timestamps, INT96, FIXED_LEN_BYTE_ARRAY, LZ4/BROTLI/LZO,
// encryption, external column files) fails with "not supported yet: <what>
// in <file>, column <path>".
//
// Every length, offset, count and level in the file is checked before use:
// a truncated or corrupt file is an error naming the file and what is
// wrong, never a crash (tests/io/parquet_corrupt_test.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kestrel::io::parquet {

struct ColumnChunkInfo {
  std::string path;  // dotted path in the schema, e.g. "prompt.list.element.content"
  std::string physical_type;
  std::string codec;
  std::vector<std::string> encodings;
  int64_t num_values = 0;
  int64_t compressed_bytes = 0, uncompressed_bytes = 0;
};

struct RowGroupInfo {
  int64_t num_rows = 0;
  int64_t total_byte_size = 0;
  std::vector<ColumnChunkInfo> columns;
};

struct FileState;  // the mapping, the decoded footer and the schema tree

class ParquetFile {
 public:
  // Maps the file and decodes and validates its footer and schema; no column
  // data is read yet.
  static Result<std::unique_ptr<ParquetFile>> open(const std::string& path);
  // The same from bytes in memory; `name` stands for the path in messages.
  static Result<std::unique_ptr<ParquetFile>> open_bytes(const std::string& name, std::string bytes);
  ~ParquetFile();
  ParquetFile(const ParquetFile&) = delete;
  ParquetFile& operator=(const ParquetFile&) = delete;

  const std::string& path() const;
  int64_t num_rows() const;
  int num_row_groups() const;
  RowGroupInfo row_group_info(int i) const;
  const std::string& created_by() const;
  // Top-level column names, in schema order.
  std::vector<std::string> columns() const;
  // Whether a (nested) field exists: {"reward_model", "ground_truth"}. List
  // elements are looked through: {"prompt", "content"} finds
  // prompt.list.element.content.
  bool has_field(const std::vector<std::string>& path) const;
  // The schema as an indented tree: "name: <repetition> <type>" per field.
  std::string schema_text() const;

  // Every column's type, nesting and compression is one the reader decodes
  // (checked from the footer alone, so a dataset fails before any row is read);
  // else the "not supported yet: <what> in <file>, column <path>" error.
  Status check_supported() const;

  // The rows of row group i, one JSON object per row.
  Result<std::vector<nlohmann::ordered_json>> read_row_group(int i) const;
  // Calls fn(row, index from 0) for every row, one row group in memory at a
  // time; stops at fn's first error. max_rows >= 0 stops after that many.
  Status for_each_row(const std::function<Status(nlohmann::ordered_json&, int64_t)>& fn, int64_t max_rows = -1) const;

 private:
  ParquetFile() = default;
  static Result<std::unique_ptr<ParquetFile>> parse(std::unique_ptr<FileState> st);
  std::unique_ptr<FileState> st_;
};

}  // namespace kestrel::io::parquet
