// Internals of the Parquet reader (src/io/parquet/): the Thrift compact
// protocol, the footer and page-header structs, decompression, the value and
// level encodings, and one column chunk decoded into levels and values.
//
// Everything here reads untrusted bytes through bounds-checked cursors and
// throws ParquetError on anything malformed; the public entry points
// (parquet.h) catch it and return a Status naming the file and column.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/status.h"

namespace kestrel::io::parquet {

// A malformed or unsupported file; never leaves the parquet module.
struct ParquetError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  throw ParquetError(detail::concat(std::forward<Args>(args)...));
}

// ---- Thrift compact protocol --------------------------------------------

// Wire types of the compact protocol.
enum TType : uint8_t {
  kStop = 0, kBoolTrue = 1, kBoolFalse = 2, kByte = 3, kI16 = 4, kI32 = 5, kI64 = 6,
  kDouble = 7, kBinary = 8, kList = 9, kSet = 10, kMap = 11, kStruct = 12,
};

// A cursor over [p, end) that decodes compact-protocol values; every read
// checks the bounds, nesting is limited (corrupt input cannot recurse deeply).
class ThriftReader {
 public:
  ThriftReader(const uint8_t* p, size_t n, const char* what) : p_(p), begin_(p), end_(p + n), what_(what) {}
  size_t consumed() const { return size_t(p_ - begin_); }

  uint8_t byte();
  uint64_t varint();
  int64_t zigzag() { const uint64_t v = varint(); return int64_t(v >> 1) ^ -int64_t(v & 1); }
  // Typed field values: `type` is the field's wire type, checked.
  bool boolean(uint8_t type);
  int32_t i32(uint8_t type);
  int64_t i64(uint8_t type);
  std::string binary(uint8_t type);
  // A list header: element count (bounded by the bytes left) and element type.
  size_t list(uint8_t type, uint8_t* elem_type);
  void skip(uint8_t type);
  // Calls f(field_id, wire_type) for each field of a struct until STOP; f
  // must consume the field's value (or call skip).
  template <class F>
  void fields(F&& f) {
    enter();
    int16_t last = 0;
    for (;;) {
      const uint8_t b = byte();
      const uint8_t type = b & 0x0f;
      if (type == kStop) break;
      const int delta = b >> 4;
      const int64_t id = delta ? last + delta : zigzag();
      if (id < -32768 || id > 32767) fail(what_, ": Thrift field id ", id, " out of range");
      last = int16_t(id);
      f(last, type);
    }
    --depth_;
  }
  // A struct-typed field: checks the wire type, then decodes its fields.
  template <class F>
  void nested(uint8_t type, F&& f) {
    expect(type, kStruct);
    fields(std::forward<F>(f));
  }
  [[noreturn]] void bad(const std::string& msg) const { fail(what_, ": ", msg, " at byte ", consumed()); }

 private:
  void expect(uint8_t type, uint8_t want) const;
  void enter() { if (++depth_ > 48) bad("Thrift structures nested too deeply"); }
  const uint8_t* p_;
  const uint8_t* begin_;
  const uint8_t* end_;
  const char* what_;
  int depth_ = 0;
};

// ---- footer and page headers (parquet.thrift) ----------------------------

enum class PhysType : int32_t { Boolean = 0, Int32 = 1, Int64 = 2, Int96 = 3, Float = 4, Double = 5,
                                ByteArray = 6, FixedLenByteArray = 7 };
const char* phys_type_name(int32_t t);
const char* encoding_name(int32_t e);
const char* codec_name(int32_t c);

enum Encoding : int32_t { kPlain = 0, kPlainDictionary = 2, kRle = 3, kBitPacked = 4, kDeltaBinaryPacked = 5,
                          kDeltaLengthByteArray = 6, kDeltaByteArray = 7, kRleDictionary = 8, kByteStreamSplit = 9 };
enum Codec : int32_t { kUncompressed = 0, kSnappy = 1, kGzip = 2, kLzo = 3, kBrotli = 4, kLz4 = 5, kZstd = 6,
                       kLz4Raw = 7 };

// Logical annotations the reader distinguishes (LogicalType union member or ConvertedType).
enum class Logical { None, String, Enum, Json, List, Map, Integer, Unknown /* always-null column */, Other };

struct SchemaElement {
  int32_t type = -1;         // PhysType, -1 for groups
  int32_t type_length = 0;
  int32_t repetition = 0;    // 0 required, 1 optional, 2 repeated
  std::string name;
  int32_t num_children = 0;
  int32_t converted_type = -1;
  Logical logical = Logical::None;
  std::string logical_name;  // for messages: "DECIMAL", "TIMESTAMP", ...
  int32_t int_bits = 0;      // Integer: 8, 16, 32, 64
  bool int_signed = true;
};

struct ColumnMeta {
  int32_t type = 0;
  std::vector<int32_t> encodings;
  std::vector<std::string> path;
  int32_t codec = 0;
  int64_t num_values = 0;
  int64_t total_uncompressed_size = 0;
  int64_t total_compressed_size = 0;
  int64_t data_page_offset = 0;
  int64_t dictionary_page_offset = -1;
};

struct ColumnChunk {
  std::string file_path;  // set: the data lives in another file (not supported)
  bool has_meta = false;
  bool encrypted = false;
  ColumnMeta meta;
};

struct RowGroup {
  std::vector<ColumnChunk> columns;
  int64_t total_byte_size = 0;
  int64_t num_rows = 0;
};

struct FileMetaData {
  int32_t version = 0;
  std::vector<SchemaElement> schema;
  int64_t num_rows = 0;
  std::vector<RowGroup> row_groups;
  std::vector<std::pair<std::string, std::string>> key_value;
  std::string created_by;
};

FileMetaData decode_file_metadata(const uint8_t* p, size_t n);

enum PageType : int32_t { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };

struct PageHeader {
  int32_t type = -1;
  int32_t uncompressed_size = -1;
  int32_t compressed_size = -1;
  bool has_crc = false;
  uint32_t crc = 0;
  // DATA_PAGE / DICTIONARY_PAGE / DATA_PAGE_V2, whichever `type` says.
  int32_t num_values = -1;
  int32_t encoding = -1;
  int32_t def_encoding = kRle, rep_encoding = kRle;  // v1
  int32_t num_nulls = 0, num_rows = 0;               // v2
  int32_t def_bytes = 0, rep_bytes = 0;              // v2
  bool is_compressed = true;                         // v2
  bool has_sub_header = false;
  size_t header_bytes = 0;  // bytes the header itself took
};

// Decodes a page header from at most n bytes.
PageHeader decode_page_header(const uint8_t* p, size_t n);

// ---- decompression ---------------------------------------------------------

// Decompresses `n` bytes with `codec` into exactly `out_size` bytes.
std::vector<uint8_t> decompress(int32_t codec, const uint8_t* p, size_t n, size_t out_size);
bool codec_supported(int32_t codec);

// ---- encodings -------------------------------------------------------------

// Leaf values of one column, by JSON kind: ints (bool/int32/int64, and
// unsigned as their bit pattern), doubles (float/double), strings.
enum class ValueKind { Bool, Int, UInt, Double, String, Null };
struct Values {
  ValueKind kind = ValueKind::Null;
  std::vector<int64_t> ints;
  std::vector<double> dbls;
  std::vector<std::string> strs;
  size_t size() const;
  void reserve(size_t n);
  void append_from(const Values& dict, uint32_t index);  // dictionary lookup (index checked by caller)
};

// A bounded byte span being decoded.
struct Span {
  const uint8_t* p;
  size_t n;
};

// RLE / bit-packed hybrid: `count` values of `bit_width` bits from s
// (s.p advances past what was read). Values above max_value are an error
// (a level above the column's maximum, a dictionary index past the end).
void decode_rle_hybrid(Span& s, int bit_width, size_t count, uint32_t max_value, std::vector<uint32_t>& out,
                       const char* what);
int bit_width_of(uint32_t max_value);

// Decodes `count` values of physical type `phys` in `encoding` (not the
// dictionary encodings) into out (whose kind the caller set).
void decode_values(Span s, int32_t encoding, PhysType phys, int32_t type_length, size_t count, Values& out);
// Throws unless `s` is well-formed UTF-8 (RFC 3629): every STRING value passes through it,
// so rows always serialise as JSON.
void check_utf8(const std::string& s);

// ---- one column chunk ------------------------------------------------------

// A leaf column of one row group: one definition and repetition level per
// entry (empty when the column's maximum level is 0, i.e. all entries are at
// the maximum) and the values of the entries whose level is the maximum.
struct LeafData {
  size_t entries = 0;
  std::vector<uint16_t> def, rep;  // [entries] or empty
  Values values;                   // [entries with def == max_def]
};

struct LeafSpec {
  PhysType phys;
  int32_t type_length;
  int16_t max_def, max_rep;
  ValueKind kind;
  std::string path;  // dotted, for messages
};

// Reads every page of a column chunk. `file` is the whole file, `data_end`
// where the column data may end (the footer's start).
LeafData read_column_chunk(const uint8_t* file, size_t data_end, const ColumnMeta& meta, const LeafSpec& spec,
                           int64_t row_group_rows);

}  // namespace kestrel::io::parquet
