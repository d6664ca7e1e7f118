// The Parquet reader against files pyarrow wrote (tests/data/parquet,
// make_fixtures.py): every row equals the JSON pyarrow recorded, for each
// compression, encoding and page version, and the nested types.
#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "io/parquet/internal.h"
#include "io/parquet_test_util.h"

namespace kestrel::io::parquet {
namespace {

using kestrel::testing::pq_fixture;
using kestrel::testing::read_jsonl;
using kestrel::testing::read_parquet_rows;
using oj = nlohmann::ordered_json;

class Gsm8kVariant : public ::testing::TestWithParam<const char*> {};

// verl's gsm8k layout in each writer configuration reads back as the JSONL rows.
TEST_P(Gsm8kVariant, RowsEqualTheJsonl) {
  const std::string path = pq_fixture(std::string("gsm8k_") + GetParam() + ".parquet");
  const auto want = read_jsonl(pq_fixture("gsm8k.jsonl"));
  ASSERT_EQ(want.size(), 10u);
  auto f = ParquetFile::open(path);
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_EQ((*f)->num_rows(), 10);
  EXPECT_EQ((*f)->num_row_groups(), 3);
  EXPECT_EQ((*f)->row_group_info(2).num_rows, 2);
  EXPECT_EQ((*f)->columns(), (std::vector<std::string>{"data_source", "prompt", "ability", "reward_model", "extra_info"}));
  auto rows = read_parquet_rows(path);
  ASSERT_TRUE(rows) << rows.status().message();
  ASSERT_EQ(rows->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ((*rows)[i], want[i]) << "row " << i;
  // Key order too (ordered_json compares it): the shape a JSONL line has.
  EXPECT_EQ((*rows)[3].dump(), want[3].dump());
}

INSTANTIATE_TEST_SUITE_P(Writers, Gsm8kVariant, ::testing::Values("snappy", "zstd_v2", "gzip_plain", "none_v2", "delta"));

TEST(ParquetReader, EveryTypeWithNullsMatchesPyarrow) {
  const auto want = read_jsonl(pq_fixture("types.expected.jsonl"));
  for (const char* name : {"types.parquet", "types_v1_snappy.parquet"}) {
    auto rows = read_parquet_rows(pq_fixture(name));
    ASSERT_TRUE(rows) << rows.status().message();
    ASSERT_EQ(rows->size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ((*rows)[i], want[i]) << name << " row " << i;
  }
}

TEST(ParquetReader, UnsignedAndExtremeValuesKeepTheirJsonKinds) {
  auto rows = read_parquet_rows(pq_fixture("types.parquet"));
  ASSERT_TRUE(rows) << rows.status().message();
  const oj& r0 = (*rows)[0];
  EXPECT_TRUE(r0["u64"].is_number_unsigned());
  EXPECT_EQ(r0["u64"].get<uint64_t>(), UINT64_MAX);
  EXPECT_EQ(r0["i64"].get<int64_t>(), INT64_MIN);
  EXPECT_TRUE(r0["b"].is_boolean());
  EXPECT_TRUE(r0["nothing"].is_null());
  EXPECT_TRUE((*rows)[2]["li"].is_null());  // a null list
  EXPECT_TRUE((*rows)[1]["li"].is_array() && (*rows)[1]["li"].empty());  // an empty one
}

TEST(ParquetReader, SchemaTextAndFields) {
  auto f = ParquetFile::open(pq_fixture("gsm8k_snappy.parquet"));
  ASSERT_TRUE(f) << f.status().message();
  const std::string s = (*f)->schema_text();
  EXPECT_NE(s.find("prompt: optional group (LIST)\n  list: repeated group\n    element: optional group\n"
                   "      role: optional BYTE_ARRAY (STRING)\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("  index: optional INT64\n"), std::string::npos) << s;
  EXPECT_TRUE((*f)->has_field({"reward_model", "ground_truth"}));
  EXPECT_TRUE((*f)->has_field({"prompt", "content"}));  // through the list wrapper
  EXPECT_TRUE((*f)->has_field({"prompt", "list", "element", "role"}));
  EXPECT_FALSE((*f)->has_field({"reward_model", "answer"}));
  EXPECT_FALSE((*f)->has_field({"messages"}));
  const RowGroupInfo g = (*f)->row_group_info(0);
  ASSERT_EQ(g.columns.size(), 10u);
  EXPECT_EQ(g.columns[1].path, "prompt.list.element.role");
  EXPECT_EQ(g.columns[1].codec, "SNAPPY");
  EXPECT_NE((*f)->created_by().find("parquet-cpp-arrow"), std::string::npos);
}

TEST(ParquetReader, ForEachRowStopsAtMaxRows) {
  auto f = ParquetFile::open(pq_fixture("gsm8k_snappy.parquet"));
  ASSERT_TRUE(f);
  std::vector<int64_t> seen;
  ASSERT_TRUE((*f)->for_each_row([&](oj&, int64_t i) { seen.push_back(i); return Status::ok(); }, 5));
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  Status s = (*f)->for_each_row([&](oj&, int64_t i) { return i == 6 ? KS_ERR("stop at 6") : Status::ok(); });
  EXPECT_EQ(s.message(), "stop at 6");
}

TEST(ParquetReader, MissingAndNonParquetFilesNameThePath) {
  auto m = ParquetFile::open("/nonexistent/train.parquet");
  ASSERT_FALSE(m);
  EXPECT_NE(m.status().message().find("/nonexistent/train.parquet: cannot open"), std::string::npos);
  auto j = ParquetFile::open(pq_fixture("gsm8k.jsonl"));
  ASSERT_FALSE(j);
  EXPECT_NE(j.status().message().find("gsm8k.jsonl: not a Parquet file"), std::string::npos) << j.status().message();
}

// What is not built fails from the footer (check_supported) and when read,
// with "not supported yet: <what> in <file>, column <path>".
TEST(ParquetReader, UnsupportedTypesAndCodecsAreNamed) {
  struct Case {
    const char *name, *what, *column;
  };
  const Case cases[] = {
      {"unsupported_binary.parquet", "not supported yet: binary values (BYTE_ARRAY without a STRING annotation) in ",
       "extra"},
      {"unsupported_timestamp.parquet", "not supported yet: TIMESTAMP values in ", "extra"},
      {"unsupported_lz4.parquet", "not supported yet: LZ4_RAW compression in ", "data_source"},  // every column
  };
  for (const auto& [name, want, column] : cases) {
    const std::string path = pq_fixture(name);
    auto f = ParquetFile::open(path);
    ASSERT_TRUE(f) << f.status().message();
    const std::string full = std::string(want) + path + ", column " + column;
    EXPECT_EQ((*f)->check_supported().message(), full);
    auto rows = (*f)->read_row_group(0);
    ASSERT_FALSE(rows) << name;
    EXPECT_EQ(rows.status().message(), full);
  }
  auto ok = ParquetFile::open(pq_fixture("types.parquet"));
  ASSERT_TRUE(ok);
  EXPECT_TRUE((*ok)->check_supported()) << (*ok)->check_supported().message();
}

// ---- the building blocks, on hand-made bytes --------------------------------

TEST(ParquetEncoding, RleHybridRunsAndBitPacking) {
  // A run of 5 x value 3 (header 5<<1, 1 value byte), then one bit-packed
  // group of 8 values of 2 bits (header 1<<1|1): 0,1,2,3,0,1,2,3.
  const uint8_t bytes[] = {10, 3, 3, 0b11100100, 0b11100100};
  Span s{bytes, sizeof bytes};
  std::vector<uint32_t> out;
  decode_rle_hybrid(s, 2, 13, 3, out, "levels");
  EXPECT_EQ(out, (std::vector<uint32_t>{3, 3, 3, 3, 3, 0, 1, 2, 3, 0, 1, 2, 3}));
  // The same bytes with a maximum of 2: the level overflows.
  Span s2{bytes, sizeof bytes};
  out.clear();
  try {
    decode_rle_hybrid(s2, 2, 13, 2, out, "definition levels");
    FAIL() << "no error";
  } catch (const ParquetError& e) {
    EXPECT_NE(std::string(e.what()).find("definition levels: value 3 exceeds the maximum 2"), std::string::npos);
  }
  // More values asked than the data holds.
  Span s3{bytes, 2};
  out.clear();
  EXPECT_THROW(decode_rle_hybrid(s3, 2, 13, 3, out, "levels"), ParquetError);
}

TEST(ParquetEncoding, StringsMustBeWellFormedUtf8) {
  // Accepted: ASCII, 2/3/4-byte forms at their bounds (U+0080, U+07FF, U+0800, U+D7FF,
  // U+E000, U+FFFF, U+10000, U+10FFFF).
  for (const char* ok : {"plain", "\xC2\x80", "\xDF\xBF", "\xE0\xA0\x80", "\xED\x9F\xBF", "\xEE\x80\x80",
                         "\xEF\xBF\xBF", "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF"})
    EXPECT_NO_THROW(check_utf8(ok)) << ok;
  // Refused: overlong forms (C0/C1 leads, E0 80, F0 80), surrogates (ED A0), above U+10FFFF
  // (F4 90, F5), a lone continuation byte, a truncated sequence, a bad continuation.
  // The first was found by fuzz_parquet: nlohmann's dump() threw on a row holding it.
  for (const char* bad : {"ab\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xF0\x80\x80\x80", "\xED\xA0\x80",
                          "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\x80", "\xE2\x82", "\xE2\x28\xA1"}) {
    EXPECT_THROW(check_utf8(bad), ParquetError) << bad;
  }
}

TEST(ParquetEncoding, DeltaBinaryPackedFromTheSpec) {
  // parquet-format's example 1: 1, 2, 3, 4, 5 -> block 128, 4 miniblocks, 5 values,
  // first 1, min delta 1, bit widths 0: header then min delta and 4 widths.
  const uint8_t bytes[] = {0x80, 0x01, 4, 5, 2, 2, 0, 0, 0, 0};
  Values v;
  v.kind = ValueKind::Int;
  decode_values(Span{bytes, sizeof bytes}, kDeltaBinaryPacked, PhysType::Int64, 0, 5, v);
  EXPECT_EQ(v.ints, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  Values w;
  w.kind = ValueKind::Int;
  EXPECT_THROW(decode_values(Span{bytes, sizeof bytes}, kDeltaBinaryPacked, PhysType::Int64, 0, 6, w), ParquetError);
}

TEST(ParquetCodec, CorruptCompressedDataIsAnError) {
  const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2, 3};
  for (int32_t codec : {int32_t(kSnappy), int32_t(kZstd), int32_t(kGzip)})
    EXPECT_THROW(decompress(codec, junk, sizeof junk, 100), ParquetError) << codec_name(codec);
  EXPECT_THROW(decompress(kUncompressed, junk, sizeof junk, 9), ParquetError);
  EXPECT_THROW(decompress(kLz4Raw, junk, sizeof junk, 9), ParquetError);
  // A page claiming gigabytes from a few bytes is refused before allocating.
  EXPECT_THROW(decompress(kGzip, junk, sizeof junk, size_t(1) << 30), ParquetError);
}

TEST(ParquetThrift, TruncatedAndDeepInputIsAnError) {
  // A struct field (id 1, type 12) nested 100 times.
  std::vector<uint8_t> deep(100, 0x1c);
  EXPECT_THROW(decode_page_header(deep.data(), deep.size()), ParquetError);
  const uint8_t trunc[] = {0x15, 0x80};  // field 1 i32, varint cut off
  EXPECT_THROW(decode_page_header(trunc, sizeof trunc), ParquetError);
  const uint8_t big_list[] = {0x19, 0xf5, 0xff, 0xff, 0xff, 0x0f};  // list of 2^32-ish i32
  EXPECT_THROW(decode_file_metadata(big_list, sizeof big_list), ParquetError);
}

}  // namespace
}  // namespace kestrel::io::parquet
