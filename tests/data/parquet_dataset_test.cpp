// Parquet datasets through the same loaders as JSONL: verl's gsm8k layout
// written by pyarrow (tests/data/parquet) loads into the same samples as
// the same rows in JSONL; the schema check names the missing column.
#include <filesystem>
#include <fstream>

#include "data/dataset.h"
#include "data_test_util.h"

namespace kestrel::data {
namespace {

using testutil::arith_chat_tokenizer;
using testutil::scratch_dir;

std::string fixture(const std::string& name) { return std::string(KESTREL_SOURCE_DIR) + "/tests/data/parquet/" + name; }

TEST(ParquetDataset, RlSamplesEqualTheJsonlSamples) {
  LoadStats js, ps;
  const auto want = load_rl_dataset({fixture("gsm8k.jsonl")}, arith_chat_tokenizer(), RlDatasetOptions{}, &js).value();
  ASSERT_EQ(want.size(), 10u);
  for (const char* v : {"snappy", "zstd_v2", "gzip_plain", "none_v2", "delta"}) {
    const std::string f = fixture(std::string("gsm8k_") + v + ".parquet");
    const auto got = load_rl_dataset({f}, arith_chat_tokenizer(), RlDatasetOptions{}, &ps).value();
    ASSERT_EQ(got.size(), want.size()) << v;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].prompt_ids, want[i].prompt_ids) << v << " row " << i;
      EXPECT_EQ(got[i].messages, want[i].messages);
      EXPECT_EQ(got[i].data_source, want[i].data_source);
      EXPECT_EQ(got[i].ground_truth, want[i].ground_truth);
      EXPECT_EQ(got[i].ability, "math");
      EXPECT_EQ(got[i].extra_info, want[i].extra_info);
      EXPECT_EQ(got[i].origin, f + ":row " + std::to_string(i));
    }
    EXPECT_EQ(ps.summary(), js.summary());
  }
}

TEST(ParquetDataset, SftSamplesEqualTheJsonlSamples) {
  const auto want = load_sft_dataset({fixture("sft_messages.jsonl")}, arith_chat_tokenizer(), SftDatasetOptions{}).value();
  const auto got = load_sft_dataset({fixture("sft_messages.parquet")}, arith_chat_tokenizer(), SftDatasetOptions{}).value();
  ASSERT_EQ(got.size(), 6u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].ids, want[i].ids) << i;
    EXPECT_EQ(got[i].loss_mask, want[i].loss_mask) << i;
  }
}

TEST(ParquetDataset, MaxSamplesAndMixedFiles) {
  RlDatasetOptions o;
  o.max_samples = 12;
  const auto rows =
      load_rl_dataset({fixture("gsm8k_snappy.parquet"), fixture("gsm8k.jsonl")}, arith_chat_tokenizer(), o).value();
  ASSERT_EQ(rows.size(), 12u);
  EXPECT_EQ(rows[10].origin, fixture("gsm8k.jsonl") + ":1");
  o.max_samples = 5;
  EXPECT_EQ(load_rl_dataset({fixture("gsm8k_delta.parquet")}, arith_chat_tokenizer(), o).value().size(), 5u);
}

TEST(ParquetDataset, SchemaCheckNamesTheMissingColumnAndListsThePresentOnes) {
  EXPECT_TRUE(check_rl_files({fixture("gsm8k_snappy.parquet"), fixture("gsm8k.jsonl")}, RlDatasetOptions{}));
  RlDatasetOptions o;
  o.prompt_key = "question";
  for (const char* f : {"gsm8k_snappy.parquet", "gsm8k.jsonl"}) {
    const Status s = check_rl_files({fixture(f)}, o);
    ASSERT_FALSE(s) << f;
    EXPECT_NE(s.message().find(fixture(f) + ": no column 'question'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("data_source, prompt, ability, reward_model, extra_info"), std::string::npos) << s.message();
  }
  const Status t = check_rl_files({fixture("types.parquet")}, RlDatasetOptions{});
  ASSERT_FALSE(t);
  EXPECT_NE(t.message().find("no column 'prompt', 'data_source', 'reward_model.ground_truth'"), std::string::npos)
      << t.message();
  // A column the reader cannot decode fails here too, from the footer alone.
  const Status u = check_rl_files({fixture("unsupported_timestamp.parquet")}, RlDatasetOptions{});
  EXPECT_EQ(u.message().rfind("not supported yet: TIMESTAMP values in " + fixture("unsupported_timestamp.parquet") +
                                  ", column extra",
                              0),
            0u)
      << u.message();
  const Status m = check_rl_files({"/nonexistent/train.parquet"}, RlDatasetOptions{});
  EXPECT_NE(m.message().find("/nonexistent/train.parquet: no such file"), std::string::npos) << m.message();
  // SFT: messages, or prompt + response.
  EXPECT_TRUE(check_sft_files({fixture("sft_messages.parquet"), fixture("sft_messages.jsonl")}, SftDatasetOptions{}));
  const Status sft = check_sft_files({fixture("gsm8k_snappy.parquet")}, SftDatasetOptions{});
  ASSERT_FALSE(sft);
  EXPECT_NE(sft.message().find("no column 'response'"), std::string::npos) << sft.message();
}

TEST(ParquetDataset, CorruptFileIsAnErrorEvenWhenSkippingMalformedRows) {
  const std::string d = scratch_dir("pq_corrupt"), f = d + "/train.parquet";
  std::string bytes;
  {
    std::ifstream in(fixture("gsm8k_snappy.parquet"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Garble the first column chunk's pages (its dictionary page starts at byte 4).
  for (size_t i = 4; i < 40; ++i) bytes[i] = char(0x55);
  std::ofstream(f, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  RlDatasetOptions o;
  o.skip_malformed = true;
  auto r = load_rl_dataset({f}, arith_chat_tokenizer(), o);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find(f + ": row group 0, column data_source: "), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace kestrel::data
