// A truncated or corrupt Parquet file is a Status error naming the file,
// never a crash or a stray exception: fixtures with bytes flipped in every
// position of the footer and page headers and throughout the data,
// truncated at many lengths, and hand-made structural faults (bad magic,
// footer length past the file, page sizes past the chunk, level overflow).
// Run under the asan preset too (AddressSanitizer + UBSan).
#include <gtest/gtest.h>

#include <cstring>

#include "io/io_test_util.h"
#include "io/parquet/internal.h"
#include "io/parquet_test_util.h"

namespace kestrel::io::parquet {
namespace {

using kestrel::testing::pq_fixture;
using kestrel::testing::read_all;

// Opens and reads every row of `bytes` (in memory, named x.parquet);
// returns "" when it reads, else the error. Any exception fails the test
// (it escaped the reader).
std::string try_read(const std::string& bytes) {
  auto f = ParquetFile::open_bytes("x.parquet", bytes);
  Status s = f ? (*f)->for_each_row([](nlohmann::ordered_json&, int64_t) { return Status::ok(); }) : f.status();
  if (s) return "";
  EXPECT_NE(s.message().find("x.parquet"), std::string::npos) << "error does not name the file: " << s.message();
  return s.message();
}

uint32_t footer_len(const std::string& b) {
  uint32_t n;
  std::memcpy(&n, b.data() + b.size() - 8, 4);
  return n;
}

TEST(ParquetCorrupt, BadMagicAndFooterLength) {
  const std::string good = read_all(pq_fixture("gsm8k_snappy.parquet"));
  ASSERT_EQ(try_read(good), "");
  std::string b = good;
  b[0] = 'X';
  EXPECT_NE(try_read(b).find("not a Parquet file (no PAR1 magic at the start)"), std::string::npos);
  b = good;
  b[b.size() - 1] = 'X';
  EXPECT_NE(try_read(b).find("no PAR1 magic at the end"), std::string::npos);
  b = good;
  const uint32_t past = uint32_t(b.size());
  std::memcpy(&b[b.size() - 8], &past, 4);
  EXPECT_NE(try_read(b).find("footer length"), std::string::npos);
  EXPECT_NE(try_read("PAR1PAR1").find("too short"), std::string::npos);
  // The footer cut short (its length rewritten to match): truncated Thrift.
  const uint32_t flen = footer_len(good);
  b = good.substr(0, good.size() - 8 - flen) + good.substr(good.size() - 8 - flen, flen / 2);
  const uint32_t half = flen / 2;
  b.append(reinterpret_cast<const char*>(&half), 4);
  b += "PAR1";
  EXPECT_NE(try_read(b).find("corrupt or unsupported Parquet footer: footer (FileMetaData): "), std::string::npos)
      << try_read(b);
}

TEST(ParquetCorrupt, TruncatedFilesAreErrors) {
  const std::string good = read_all(pq_fixture("gsm8k_zstd_v2.parquet"));
  for (size_t n = 0; n < good.size(); n += 37) EXPECT_NE(try_read(good.substr(0, n)), "") << "length " << n;
  // Column data cut out but the footer kept: chunks lie past their data.
  const uint32_t flen = footer_len(good);
  const std::string footer = good.substr(good.size() - 8 - flen);
  const std::string msg = try_read(good.substr(0, 200) + footer);
  EXPECT_NE(msg, "");
}

TEST(ParquetCorrupt, EveryDataByteOfAnUncompressedFile) {
  // Uncompressed pages, so levels and dictionary indices are hit directly.
  const std::string good = read_all(pq_fixture("gsm8k_none_v2.parquet"));
  std::string b;
  // Every byte of the data section set to 0xff in turn: the levels, the
  // dictionary indices, the page headers. Some reads still succeed (a flip
  // inside a string value), the rest are errors, none crash.
  int errors = 0, level_errors = 0;
  const size_t data_end = good.size() - 8 - footer_len(good);
  for (size_t i = 4; i < data_end; ++i) {
    b = good;
    b[i] = char(0xff);
    const std::string m = try_read(b);
    errors += !m.empty();
    level_errors += m.find("levels: value") != std::string::npos;
  }
  EXPECT_GT(errors, 100);
  EXPECT_GT(level_errors, 0);
}

// ---- hand-made column chunks: one optional INT32 column (max_def 1) -------

// A compact-protocol writer for page headers.
struct ThriftWriter {
  std::string b;
  std::vector<int> stack;
  int last = 0;
  void varint(uint64_t v) {
    for (; v >= 0x80; v >>= 7) b += char(v | 0x80);
    b += char(v);
  }
  void field(int id, uint8_t t) { b += char(((id - last) << 4) | t); last = id; }
  void i32(int id, int64_t v) { field(id, kI32); varint(uint64_t((v << 1) ^ (v >> 63))); }
  void begin(int id) { field(id, kStruct); stack.push_back(last); last = 0; }
  void end() { b += '\0'; last = stack.back(); stack.pop_back(); }
};

// Definition levels (u32 length, one RLE run of n x level), then n_values PLAIN int32s.
std::string v1_body(int n, int level, int n_values) {
  const std::string run = {char(n << 1), char(level)};
  const uint32_t len = uint32_t(run.size());
  std::string body(reinterpret_cast<const char*>(&len), 4);
  body += run;
  for (int32_t i = 0; i < n_values; ++i) body.append(reinterpret_cast<const char*>(&i), 4);
  return body;
}

std::string v1_page(int num_values, const std::string& body, int compressed_size = -1) {
  ThriftWriter w;
  w.i32(1, kDataPage);
  w.i32(2, int64_t(body.size()));
  w.i32(3, compressed_size >= 0 ? compressed_size : int64_t(body.size()));
  w.begin(5);
  w.i32(1, num_values);
  w.i32(2, kPlain);
  w.i32(3, kRle);
  w.i32(4, kRle);
  w.end();
  w.b += '\0';
  return w.b + body;
}

// Reads a chunk placed right after the 4-byte magic; "" or the error.
std::string read_chunk(const std::string& chunk, int64_t num_values, int64_t total_size = -1,
                       std::vector<int64_t>* out = nullptr) {
  const std::string file = "PAR1" + chunk;
  ColumnMeta m;
  m.type = int32_t(PhysType::Int32);
  m.codec = kUncompressed;
  m.num_values = num_values;
  m.total_compressed_size = total_size >= 0 ? total_size : int64_t(chunk.size());
  m.data_page_offset = 4;
  const LeafSpec spec{PhysType::Int32, 0, 1, 0, ValueKind::Int, "c"};
  try {
    LeafData d = read_column_chunk(reinterpret_cast<const uint8_t*>(file.data()), file.size(), m, spec, num_values);
    if (out) *out = d.values.ints;
    return "";
  } catch (const ParquetError& e) {
    return e.what();
  }
}

TEST(ParquetCorrupt, HandMadeChunkFaults) {
  std::vector<int64_t> vals;
  ASSERT_EQ(read_chunk(v1_page(3, v1_body(3, 1, 3)), 3, -1, &vals), "");
  EXPECT_EQ(vals, (std::vector<int64_t>{0, 1, 2}));
  auto has = [](const std::string& msg, const std::string& want) {
    EXPECT_NE(msg.find(want), std::string::npos) << "got: " << msg;
  };
  has(read_chunk(v1_page(3, v1_body(3, 1, 3), 1000), 3), "page of 1000 bytes runs past the column chunk");
  has(read_chunk(v1_page(3, v1_body(3, 2, 3)), 3), "definition levels: value 2 exceeds the maximum 1");
  has(read_chunk(v1_page(5, v1_body(5, 1, 5)), 3), "page of 5 values overflows the column chunk");
  has(read_chunk(v1_page(3, v1_body(3, 1, 3)), 6), "column chunk ends after 3 of its 6 values");
  has(read_chunk(v1_page(3, v1_body(3, 1, 2)), 3), "PLAIN values: 3 values need 12 bytes, the page has 8");
  has(read_chunk(v1_page(3, v1_body(3, 1, 3)), 3, 1 << 20), "lies outside the file's data section");
  has(read_chunk(v1_page(3, v1_body(3, 1, 3)).substr(0, 5), 3), "page header: truncated Thrift data");
  // A run of 60 levels where the page has 3 values: only 3 are taken.
  ASSERT_EQ(read_chunk(v1_page(3, v1_body(60, 1, 3)), 3, -1, &vals), "");
  EXPECT_EQ(vals.size(), 3u);
}

class FlipEveryByte : public ::testing::TestWithParam<const char*> {};

// Each byte of the file XORed with a few patterns: the reader returns rows
// or an error, never crashes (ASan/UBSan in the asan preset).
TEST_P(FlipEveryByte, NeverCrashes) {
  const std::string good = read_all(pq_fixture(GetParam()));
  int errors = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    static const uint8_t kPatterns[] = {0x01, 0x80, 0x5a};
    std::string b = good;
    b[i] = char(uint8_t(b[i]) ^ kPatterns[i % 3]);
    errors += !try_read(b).empty();
  }
  EXPECT_GT(errors, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FlipEveryByte,
                         ::testing::Values("gsm8k_snappy.parquet", "gsm8k_delta.parquet", "gsm8k_zstd_v2.parquet",
                                           "types.parquet"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!isalnum(uint8_t(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace kestrel::io::parquet
