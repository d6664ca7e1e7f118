// The zigzag split of context parallelism (parallel/cp_split.h), on one
// process: every token lands on exactly one rank, rank r holds chunks r and
// 2cp-1-r, pads only up to the multiple of 2cp, the gather indices invert the
// split, the work layouts of Ulysses / ring / hybrid hold the right rows, and
// the ring's block pairings cover every causal (query, key) pair exactly once.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "ops/copy.h"
#include "parallel/cp_split.h"

using namespace kestrel;
using namespace kestrel::parallel;

namespace {

// cu_seqlens and positions (0..L-1) of sequences of the given lengths.
struct Batch {
  std::vector<int32_t> cu{0}, pos;
  explicit Batch(const std::vector<int>& lens) {
    for (int L : lens) {
      for (int i = 0; i < L; ++i) pos.push_back(i);
      cu.push_back(int32_t(pos.size()));
    }
  }
  CpBatchView view() const { return {&cu, &pos}; }
  int64_t T() const { return int64_t(pos.size()); }
};

const std::vector<int> kLens = {1, 3, 7, 8, 9, 16, 37, 100};

std::vector<std::pair<int, int>> layouts() {  // (cp, u)
  return {{1, 1}, {2, 1}, {2, 2}, {3, 1}, {3, 3}, {4, 1}, {4, 2}, {4, 4}, {6, 2}, {6, 3}};
}

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

}  // namespace

TEST(CpSplit, EveryTokenOnExactlyOneRankPaddedOnlyToTheMultiple) {
  const Batch b(kLens);
  for (auto [cp, u] : layouts()) {
    SCOPED_TRACE(::testing::Message() << "cp " << cp << " u " << u);
    std::vector<int> seen(size_t(b.T()), 0);
    int64_t padded = 0;
    for (int L : kLens) padded += round_up(L, 2 * cp);
    for (int r = 0; r < cp; ++r) {
      const CpLayout lay = make_cp_layout(b.view(), cp, r, u);
      EXPECT_EQ(lay.padded_tokens, padded);
      EXPECT_EQ(lay.local_tokens * cp, padded);
      EXPECT_EQ(int64_t(lay.local.full_row.size()), lay.local_tokens);
      EXPECT_EQ(lay.work_tokens, lay.local_tokens * u);
      for (int32_t f : lay.local.full_row)
        if (f >= 0) ++seen[size_t(f)];
      // Pads: fewer than 2cp per sequence, all of them at the sequence's end.
      for (size_t s = 0; s < kLens.size(); ++s) {
        EXPECT_EQ(lay.chunk[s] * 2 * cp, round_up(kLens[s], 2 * cp));
        EXPECT_LT(lay.chunk[s] * 2 * cp - kLens[s], 2 * cp);
      }
    }
    for (int64_t t = 0; t < b.T(); ++t) EXPECT_EQ(seen[size_t(t)], 1) << "token " << t;
  }
}

TEST(CpSplit, RankHoldsChunksRAndMirrorInOrder) {
  const Batch b(kLens);
  for (int cp : {1, 2, 3, 4}) {
    for (int r = 0; r < cp; ++r) {
      const CpLayout lay = make_cp_layout(b.view(), cp, r, 1);
      ASSERT_EQ(lay.local.cu_seqlens.size(), kLens.size() + 1);
      for (size_t s = 0; s < kLens.size(); ++s) {
        const int64_t c = lay.chunk[s], L = kLens[s];
        const int32_t start = lay.local.cu_seqlens[s];
        ASSERT_EQ(lay.local.cu_seqlens[s + 1] - start, 2 * c);
        for (int64_t o = 0; o < 2 * c; ++o) {
          const int64_t chunk = o < c ? r : 2 * cp - 1 - r, p = chunk * c + o % c;
          EXPECT_EQ(lay.local.positions[size_t(start + o)], p) << "cp " << cp << " rank " << r << " seq " << s;
          EXPECT_EQ(lay.local.full_row[size_t(start + o)], p < L ? b.cu[s] + p : -1);
        }
      }
    }
  }
}

TEST(CpSplit, PadRowsTakeTheirValuesAndPositionsContinue) {
  const Batch b({5});  // cp 2: padded to 8 in chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
  const std::vector<int32_t> ids = {10, 11, 12, 13, 14}, targets = {11, 12, 13, 14, -1};
  const CpLayout r0 = make_cp_layout(b.view(), 2, 0, 1), r1 = make_cp_layout(b.view(), 2, 1, 1);
  EXPECT_EQ(r0.take_local(ids, -1), (std::vector<int32_t>{10, 11, -1, -1}));
  EXPECT_EQ(r0.local.positions, (std::vector<int32_t>{0, 1, 6, 7}));
  EXPECT_EQ(r1.take_local(ids, -1), (std::vector<int32_t>{12, 13, 14, -1}));
  EXPECT_EQ(r1.take_local(targets, -1), (std::vector<int32_t>{13, 14, -1, -1}));
  EXPECT_EQ(r1.local.positions, (std::vector<int32_t>{2, 3, 4, 5}));
  EXPECT_EQ(r0.local.max_seqlen, 8);
  // Positions that start elsewhere (a sequence's positions, whatever they are) continue from the last one.
  const std::vector<int32_t> cu{0, 3}, pos{4, 5, 6};
  const CpLayout shifted = make_cp_layout({&cu, &pos}, 1, 0, 1);
  EXPECT_EQ(shifted.local.positions, (std::vector<int32_t>{4, 5, 6, 7}));
}

TEST(CpSplit, GatherAndLocalRowsInvertTheSplit) {
  const Batch b(kLens);
  const int64_t T = b.T();
  Tensor full = Tensor::empty({T, 3}, DType::F32);
  for (int64_t i = 0; i < full.numel(); ++i) full.set(i, float(i) * 0.5f - 7.f);
  for (auto [cp, u] : layouts()) {
    SCOPED_TRACE(::testing::Message() << "cp " << cp << " u " << u);
    std::vector<CpLayout> lay;
    for (int r = 0; r < cp; ++r) lay.push_back(make_cp_layout(b.view(), cp, r, u));
    const int64_t Tl = lay[0].local_tokens;
    // What the all-gather of cp_gather_rows delivers: every rank's local rows, rank-major.
    Tensor gathered = Tensor::empty({cp * Tl, 3}, DType::F32);
    for (int r = 0; r < cp; ++r) {
      Tensor local = cp_local_rows(lay[size_t(r)], full, 99.f);
      for (int64_t i = 0; i < Tl; ++i)
        for (int64_t c = 0; c < 3; ++c) {
          const int32_t f = lay[size_t(r)].local.full_row[size_t(i)];
          EXPECT_EQ(local.get(i * 3 + c), f < 0 ? 99.f : full.get(f * 3 + c));
        }
      Tensor block = gathered.slice_rows(r * Tl, (r + 1) * Tl);
      block.copy_from(local);
    }
    for (int r = 0; r < cp; ++r) {
      Tensor back = Tensor::empty({T, 3}, DType::F32);
      ops::gather_rows(gathered, lay[size_t(r)].full_rows_in_gathered, back);
      EXPECT_EQ(back.to_float_vector(), full.to_float_vector());
    }
  }
  // The collective form on a size-1 group.
  const CpLayout one = make_cp_layout(b.view(), 1, 0, 1);
  comm::LocalGroup g;
  Tensor back = cp_gather_rows(g, one, cp_local_rows(one, full, 0.f));
  EXPECT_EQ(back.to_float_vector(), full.to_float_vector());
}

TEST(CpSplit, WorkLayoutHoldsTheGroupsRowsEarlyHalfThenLateHalf) {
  const Batch b(kLens);
  for (auto [cp, u] : layouts()) {
    SCOPED_TRACE(::testing::Message() << "cp " << cp << " u " << u);
    std::vector<CpLayout> lay;
    for (int r = 0; r < cp; ++r) lay.push_back(make_cp_layout(b.view(), cp, r, u));
    const int R = cp / u;
    const int64_t Tl = lay[0].local_tokens;
    for (int r = 0; r < cp; ++r) {
      const CpLayout& L = lay[size_t(r)];
      const int g = r / u;
      ASSERT_EQ(int64_t(L.work.full_row.size()), L.work_tokens);
      for (size_t s = 0; s < kLens.size(); ++s) {
        const int64_t n = u * L.chunk[s], w0 = L.work.cu_host[s];
        ASSERT_EQ(L.work.cu_host[s + 1] - w0, 2 * n);
        for (int64_t i = 0; i < 2 * n; ++i) {
          const int64_t p = i < n ? g * n + i : (2 * R - 1 - g) * n + (i - n);
          EXPECT_EQ(L.work.positions[size_t(w0 + i)], p);
          EXPECT_EQ(L.work.full_row[size_t(w0 + i)], p < kLens[s] ? b.cu[s] + p : -1);
        }
      }
      if (u == 1) {
        EXPECT_EQ(L.work.full_row, L.local.full_row);  // the ring works on the local rows as they are
        continue;
      }
      // The Ulysses all-to-all delivers the group's local rows rank-major; the
      // work order is a gather of them, and gathered_in_work its inverse.
      std::vector<int32_t> gathered_full;
      for (int j = 0; j < u; ++j)
        for (int32_t f : lay[size_t(g * u + j)].local.full_row) gathered_full.push_back(f);
      const auto in_g = L.work.rows_in_gathered.to_host<int32_t>(), g_in = L.work.gathered_in_work.to_host<int32_t>();
      ASSERT_EQ(int64_t(in_g.size()), u * Tl);
      std::set<int32_t> distinct(in_g.begin(), in_g.end());
      EXPECT_EQ(int64_t(distinct.size()), u * Tl);
      for (size_t w = 0; w < in_g.size(); ++w) {
        const int32_t f = gathered_full[size_t(in_g[w])];
        // Pad rows are told apart by position, real rows by their full row.
        if (L.work.full_row[w] >= 0) EXPECT_EQ(f, L.work.full_row[w]);
        else EXPECT_EQ(f, -1);
        EXPECT_EQ(g_in[size_t(in_g[w])], int32_t(w));
      }
    }
  }
}

TEST(CpSplit, UlyssesWorkLayoutIsTheFullPaddedBatchInNaturalOrder) {
  const Batch b(kLens);
  const CpLayout L = make_cp_layout(b.view(), 4, 2, 4);
  int64_t off = 0;
  for (size_t s = 0; s < kLens.size(); ++s) {
    const int64_t P = round_up(kLens[s], 8);
    EXPECT_EQ(L.work.cu_host[s], off);
    for (int64_t p = 0; p < P; ++p) EXPECT_EQ(L.work.positions[size_t(off + p)], p);
    off += P;
  }
  EXPECT_EQ(L.work.cu_host.back(), L.padded_tokens);
  EXPECT_TRUE(L.work.ring_blocks.empty());
}

// For every group g, the pairs (query row, key row) the R blocks make visible
// (inside a block's sequence ranges, k_pos <= q_pos) are, mapped to padded
// (sequence, position) pairs, every causal pair of the padded batch exactly once.
TEST(CpSplit, RingBlocksCoverEveryCausalPairOnce) {
  const Batch b({1, 3, 7, 9, 21});
  for (auto [cp, u] : layouts()) {
    const int R = cp / u;
    if (R == 1) continue;
    SCOPED_TRACE(::testing::Message() << "cp " << cp << " u " << u);
    std::vector<CpLayout> lay;
    for (int r = 0; r < cp; r += u) lay.push_back(make_cp_layout(b.view(), cp, r, u));  // one rank per group
    // (sequence of work row) per group
    auto seq_of = [&](const CpLayout& L, int64_t w) {
      int64_t s = 0;
      while (L.work.cu_host[size_t(s + 1)] <= w) ++s;
      return s;
    };
    for (int g = 0; g < R; ++g) {
      const CpLayout& L = lay[size_t(g)];
      std::map<std::tuple<int64_t, int32_t, int32_t>, int> seen;  // (seq, q pos, k pos) -> count
      for (int h = 0; h < R; ++h) {
        const ops::AttentionBlock& blk = L.work.ring_blocks[size_t(h)];
        const auto cq = blk.cu_q.to_host<int32_t>(), ck = blk.cu_k.to_host<int32_t>();
        const auto qp = blk.q_pos.to_host<int32_t>(), kp = blk.k_pos.to_host<int32_t>();
        EXPECT_EQ(qp, L.work.positions);
        EXPECT_EQ(kp, lay[size_t(h)].work.positions);
        ASSERT_EQ(cq.size(), ck.size());
        EXPECT_EQ(cq.back(), L.work_tokens);
        EXPECT_EQ(ck.back(), L.work_tokens);
        for (size_t e = 0; e + 1 < cq.size(); ++e) {
          EXPECT_LE(cq[e], cq[e + 1]);
          EXPECT_LE(ck[e], ck[e + 1]);
          for (int32_t i = cq[e]; i < cq[e + 1]; ++i)
            for (int32_t j = ck[e]; j < ck[e + 1]; ++j) {
              EXPECT_EQ(seq_of(L, i), seq_of(lay[size_t(h)], j)) << "block entry " << e << " of source " << h;
              if (kp[size_t(j)] <= qp[size_t(i)]) ++seen[{seq_of(L, i), qp[size_t(i)], kp[size_t(j)]}];
            }
        }
      }
      // Every causal pair of this group's queries, once.
      size_t expected = 0;
      for (int64_t w = 0; w < L.work_tokens; ++w) {
        const int64_t s = seq_of(L, w);
        const int32_t p = L.work.positions[size_t(w)];
        for (int32_t kpos = 0; kpos <= p; ++kpos) {
          ++expected;
          EXPECT_EQ((seen[{s, p, kpos}]), 1) << "group " << g << " seq " << s << " q " << p << " k " << kpos;
        }
      }
      EXPECT_EQ(seen.size(), expected);
    }
  }
}

TEST(CpSplit, AlgorithmsAndHeadConstraintsNameTheNumbers) {
  EXPECT_EQ(parse_cp_algo("ulysses_cp_algo"), CpAlgo::Ulysses);
  EXPECT_EQ(parse_cp_algo("megatron_cp_algo"), CpAlgo::Ring);
  EXPECT_EQ(parse_cp_algo("hybrid_cp_algo"), CpAlgo::Hybrid);
  EXPECT_THROW(parse_cp_algo("ring"), Error);
  EXPECT_EQ(cp_ulysses_degree(CpAlgo::Ulysses, 4, 0), 4);
  EXPECT_EQ(cp_ulysses_degree(CpAlgo::Ring, 4, 0), 1);
  EXPECT_EQ(cp_ulysses_degree(CpAlgo::Hybrid, 8, 2), 2);
  try {
    cp_ulysses_degree(CpAlgo::Hybrid, 4, 3);
    ADD_FAILURE() << "u 3 in cp 4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ulysses_degree_in_cp 3"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(check_cp_heads(8, 2, 1, 4, 4).is_ok());   // GQA, kv heads replicated 2x
  EXPECT_TRUE(check_cp_heads(8, 8, 2, 4, 4).is_ok());   // 4 heads per tp rank over 4
  EXPECT_TRUE(check_cp_heads(6, 6, 1, 4, 1).is_ok());   // the ring keeps every head
  const Status q = check_cp_heads(6, 6, 1, 4, 4);
  EXPECT_FALSE(q.is_ok());
  EXPECT_NE(q.message().find("6 query heads"), std::string::npos) << q.message();
  EXPECT_NE(q.message().find("Ulysses degree 4"), std::string::npos) << q.message();
  const Status t = check_cp_heads(8, 8, 4, 4, 4);  // 2 heads per tp rank
  EXPECT_NE(t.message().find("2 query heads"), std::string::npos) << t.message();
  EXPECT_NE(t.message().find("tp 4"), std::string::npos) << t.message();
  const Status kv = check_cp_heads(12, 3, 1, 4, 4);  // 3 kv heads vs degree 4
  EXPECT_FALSE(kv.is_ok());
  EXPECT_NE(kv.message().find("3 kv heads"), std::string::npos) << kv.message();
}

TEST(CpSplit, RefusesBadBatchesAndDegrees) {
  const Batch b({4, 5});
  EXPECT_THROW(make_cp_layout(b.view(), 4, 4, 1), Error);
  EXPECT_THROW(make_cp_layout(b.view(), 4, 0, 3), Error);
  const std::vector<int32_t> cu{0, 3}, pos{0, 2, 1};
  try {
    make_cp_layout({&cu, &pos}, 2, 0, 1);
    ADD_FAILURE() << "decreasing positions accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not increase"), std::string::npos) << e.what();
  }
}
