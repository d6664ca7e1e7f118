// Bad inputs of issue 20 in the data layer: a JSONL row nested 100,000 deep
// crashed while its error message was formatted; `builtin arith` with 10^10
// problems grew ~70 MB/s until memory ran out.
#include <gtest/gtest.h>

#include "data/arith.h"
#include "data/data_test_util.h"
#include "data/dataset.h"

namespace kestrel::data {
namespace {

using testutil::arith_chat_tokenizer;
using testutil::scratch_dir;
using testutil::write_text;

TEST(DatasetLimits, DeepRowIsAnErrorNamingFileAndLine) {
  const std::string d = scratch_dir("deep_row"), f = d + "/train.jsonl";
  // Appended piece by piece: GCC 12 warns falsely (-Warray-bounds, -Wstringop-overflow) on the one-expression concatenation.
  std::string text = R"({"data_source": "arith", "prompt": "a", "reward_model": {"ground_truth": "1"}})";
  text += "\n{\"prompt\": ";
  text.append(100000, '[');
  text.append(100000, ']');
  text += "}\n";
  write_text(f, text);
  EXPECT_TRUE(check_rl_files({f}, RlDatasetOptions{}).is_ok());  // the first row is fine
  auto r = load_rl_dataset({f}, arith_chat_tokenizer(), RlDatasetOptions{});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find(f + ":2: JSON nested deeper than 256 levels"), std::string::npos)
      << r.status().message().substr(0, 300);
  RlDatasetOptions o;
  o.skip_malformed = true;
  LoadStats st;
  auto rows = load_rl_dataset({f}, arith_chat_tokenizer(), o, &st);
  ASSERT_TRUE(rows.is_ok()) << rows.status().message();
  EXPECT_EQ(rows.value().size(), 1u);
  EXPECT_EQ(st.skipped_malformed, 1);
}

TEST(DatasetLimits, ArithSizesAreBounded) {
  const std::string d = scratch_dir("arith_big");
  const Status s = write_arith_dataset(d, 10'000'000'000, 10, ArithOptions{});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("builtin arith: num_train = 10000000000 is out of range [0, 1000000] "
                             "(data.arith.num_train, or --num-train of kestrel builtin arith)"), std::string::npos)
      << s.message();
  EXPECT_FALSE(write_arith_dataset(d, 10, -1, ArithOptions{}).is_ok());
  EXPECT_TRUE(write_arith_dataset(d, 3, 2, ArithOptions{}).is_ok());
}

}  // namespace
}  // namespace kestrel::data
