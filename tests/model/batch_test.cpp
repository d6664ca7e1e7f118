// model::PackedBatch's host mirrors: pack_sequences and pack_prefix_groups
// fill the host vectors and build the tensors from them, element for element.

#include <gtest/gtest.h>

#include "model/batch.h"

using namespace kestrel;

namespace {

// Every tensor of b holds exactly its host mirror.
void expect_mirrored(const model::PackedBatch& b) {
  const model::PackedBatch::Host& h = b.host;
  EXPECT_EQ(b.input_ids.to_host<int32_t>(), h.input_ids);
  EXPECT_EQ(b.positions.to_host<int32_t>(), h.positions);
  EXPECT_EQ(b.targets.to_host<int32_t>(), h.targets);
  EXPECT_EQ(b.cu_seqlens.to_host<int32_t>(), h.cu_seqlens);
  EXPECT_EQ(b.input_ids.shape(), (Shape{b.num_tokens}));
  EXPECT_EQ(b.cu_seqlens.shape(), (Shape{b.num_seqs + 1}));
  if (h.prefix_of.empty()) {
    EXPECT_FALSE(b.prefix_of.defined());
  } else {
    ASSERT_TRUE(b.prefix_of.defined());
    EXPECT_EQ(b.prefix_of.shape(), (Shape{b.num_seqs}));
    EXPECT_EQ(b.prefix_of.to_host<int32_t>(), h.prefix_of);
  }
}

}  // namespace

TEST(PackedBatch, PackSequencesFillsTheHostMirrors) {
  const model::PackedBatch b = model::pack_sequences({{3, 7, 1}, {9}, {11, 0, 4, 17}});
  EXPECT_EQ(b.num_tokens, 8);
  EXPECT_EQ(b.num_seqs, 3);
  EXPECT_EQ(b.max_seqlen, 4);
  EXPECT_EQ(b.host.input_ids, (std::vector<int32_t>{3, 7, 1, 9, 11, 0, 4, 17}));
  EXPECT_EQ(b.host.positions, (std::vector<int32_t>{0, 1, 2, 0, 0, 1, 2, 3}));
  EXPECT_EQ(b.host.targets, (std::vector<int32_t>{7, 1, -1, -1, 0, 4, 17, -1}));
  EXPECT_EQ(b.host.cu_seqlens, (std::vector<int32_t>{0, 3, 4, 8}));
  EXPECT_TRUE(b.host.prefix_of.empty());
  expect_mirrored(b);
}

TEST(PackedBatch, PackPrefixGroupsFillsTheHostMirrors) {
  // Group 0: prefix {1, 2} and continuations {3, 4}, {5}; group 1: no prefix,
  // one continuation {6, 7}.
  const model::PackedBatch b = model::pack_prefix_groups({{{1, 2}, {{3, 4}, {5}}}, {{}, {{6, 7}}}});
  EXPECT_EQ(b.num_tokens, 7);
  EXPECT_EQ(b.num_seqs, 4);
  EXPECT_EQ(b.max_seqlen, 4);
  EXPECT_EQ(b.host.input_ids, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(b.host.positions, (std::vector<int32_t>{0, 1, 2, 3, 2, 0, 1}));
  EXPECT_EQ(b.host.targets, (std::vector<int32_t>{2, -1, 4, -1, -1, 7, -1}));
  EXPECT_EQ(b.host.cu_seqlens, (std::vector<int32_t>{0, 2, 4, 5, 7}));
  EXPECT_EQ(b.host.prefix_of, (std::vector<int32_t>{-1, 0, 0, -1}));
  expect_mirrored(b);
}

TEST(PackedBatch, PrefixGroupsWithoutPrefixesHaveNoPrefixOf) {
  const model::PackedBatch b = model::pack_prefix_groups({{{}, {{1, 2}, {3}}}});
  EXPECT_EQ(b.host.cu_seqlens, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_TRUE(b.host.prefix_of.empty());
  expect_mirrored(b);
}
