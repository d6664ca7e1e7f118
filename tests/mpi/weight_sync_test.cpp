// Weight transfer from a trainer rank to disaggregated rollout ranks
// (rollout/weight_sync.h): rank 0 trains, every other rank only receives.
// Every rank builds the trainer's model from the same seed, so a receiver
// checks its copy against a local reference without more communication.
// Run with 2 ranks (one receiver) and 3 (two receivers of one publish).
#include <cstring>
#include <list>
#include <map>
#include <numeric>

#include "rollout/tiny_model.h"
#include "rollout/weight_sync.h"
#include "tp_testing.h"

using namespace kestrel;
using namespace kestrel::testing;
using rollout::WeightSyncOptions;
using rollout::WeightSyncStats;

namespace {

constexpr uint64_t kTrainerSeed = 7;
// 20000 bytes: the tiny f32 model (~360 KB) needs a few dozen buckets; the
// embedding and lm_head (128 x 64 f32 = 32768 bytes) and the MLP weights
// exceed it and travel alone.
constexpr int64_t kBucketBytes = 20000;

std::unique_ptr<model::CausalLM> trainer_model(DType dt, bool qwen3 = false) {
  return rollout::testing::tiny_model(qwen3, dt, kTrainerSeed);
}

std::vector<const model::Param*> cstate(model::CausalLM& m) {
  auto v = m.state_tensors();
  return {v.begin(), v.end()};
}

std::vector<int64_t> sizes_of(model::CausalLM& m) {
  std::vector<int64_t> s;
  for (model::Param* p : m.state_tensors()) s.push_back(int64_t(p->weight.nbytes()));
  return s;
}

// New values for every weight, a function of (step, tensor index) only.
void perturb(model::CausalLM& m, uint64_t step) {
  uint64_t i = 0;
  for (model::Param* p : m.state_tensors())
    p->weight.copy_from(rand_full(p->weight.shape(), 1000 * step + i++, 0.1f, p->weight.dtype()));
}

// Bitwise equal (values compared as float bit patterns: exact for f32 and bf16).
void expect_same_weights(model::CausalLM& got, model::CausalLM& want) {
  auto g = got.state_tensors(), w = want.state_tensors();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i]->name, w[i]->name);
    EXPECT_EQ(g[i]->weight.dtype(), w[i]->weight.dtype());
    const auto a = g[i]->weight.to_float_vector(), b = w[i]->weight.to_float_vector();
    ASSERT_EQ(a.size(), b.size()) << g[i]->name;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << g[i]->name << " differs";
  }
}

// Rank 0's value of x on every rank.
int64_t from_rank0(int64_t x) {
  world_group().broadcast(&x, 1, DType::I64, 0);
  return x;
}

std::vector<int> receivers() {
  std::vector<int> r(size_t(world_group().size() - 1));
  std::iota(r.begin(), r.end(), 1);
  return r;
}

// The message of the Error f throws ("" and a test failure when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

// bucket_bytes: 5000 elements' worth, so the packing has the same shape in f32 and bf16.
void publish_and_receive(DType dt) {
  auto& g = world_group();
  const int64_t bucket_bytes = 5000 * int64_t(dtype_size(dt));
  const WeightSyncOptions opts{bucket_bytes};
  auto reference = trainer_model(dt);
  const std::vector<int64_t> sizes = sizes_of(*reference);
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  const auto plan = rollout::plan_weight_buckets(sizes, bucket_bytes);
  // The packing this test means to exercise: many buckets, some tensor alone
  // in an oversized one, and no bucket over its bound.
  EXPECT_GT(plan.size(), size_t(10));
  int64_t oversized = 0;
  for (const auto& b : plan) {
    if (b.bytes > bucket_bytes) {
      EXPECT_EQ(b.count, 1);
      ++oversized;
    }
  }
  EXPECT_GT(oversized, 0);
  const uint64_t want_checksum = rollout::weights_checksum(cstate(*reference));

  WeightSyncStats st;
  if (g.rank() == 0) {
    // An optional tensor the model lacks (undefined weight) in the trainer's
    // list only: skipped, so the lists still match.
    model::Param absent;
    absent.name = "model.layers.0.self_attn.o_proj.bias";
    auto ts = cstate(*reference);
    ts.insert(ts.begin() + 1, &absent);
    rollout::WeightPublisher pub(g, receivers(), opts);
    st = pub.publish(ts, 5);
    pub.wait();
  } else {
    auto mine = rollout::testing::tiny_model(false, dt, 100 + uint64_t(g.rank()));
    EXPECT_NE(rollout::weights_checksum(cstate(*mine)), want_checksum);  // starts different
    st = rollout::receive_weights(g, 0, mine->state_tensors(), opts);
    EXPECT_EQ(rollout::weights_checksum(cstate(*mine)), want_checksum);
    expect_same_weights(*mine, *reference);
  }
  EXPECT_EQ(st.version, 5);
  EXPECT_EQ(st.bytes, total);
  EXPECT_EQ(st.tensors, int64_t(sizes.size()));
  EXPECT_EQ(st.buckets, int64_t(plan.size()));
  EXPECT_EQ(st.checksum, want_checksum);
  EXPECT_EQ(int64_t(st.checksum), from_rank0(int64_t(st.checksum)));  // the trainer's own count agrees
}

// Wraps a group and flips the last byte of the n-th u8 message each isend
// posts to each peer (the 1st is a publish's manifest, the 2nd its bucket 0,
// ...), on a copy: a transport that corrupts one bucket in flight.
class CorruptingGroup final : public comm::ProcessGroup {
 public:
  CorruptingGroup(comm::ProcessGroup& inner, int nth_u8) : in_(inner), nth_(nth_u8) {}
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  std::string name() const override { return "corrupting"; }
  void all_reduce(void* b, int64_t n, DType dt, comm::ReduceOp op) override { in_.all_reduce(b, n, dt, op); }
  void reduce_scatter(const void* s, void* r, int64_t n, DType dt, comm::ReduceOp op) override {
    in_.reduce_scatter(s, r, n, dt, op);
  }
  void all_gather(const void* s, void* r, int64_t n, DType dt) override { in_.all_gather(s, r, n, dt); }
  void broadcast(void* b, int64_t n, DType dt, int root) override { in_.broadcast(b, n, dt, root); }
  void all_to_all(const void* s, void* r, int64_t n, DType dt) override { in_.all_to_all(s, r, n, dt); }
  void all_to_allv(const void* s, const std::vector<int64_t>& sc, void* r, const std::vector<int64_t>& rc,
                   DType dt) override {
    in_.all_to_allv(s, sc, r, rc, dt);
  }
  void send(const void* b, int64_t n, DType dt, int peer, int tag) override { in_.send(b, n, dt, peer, tag); }
  void recv(void* b, int64_t n, DType dt, int peer, int tag) override { in_.recv(b, n, dt, peer, tag); }
  std::unique_ptr<comm::PendingTransfer> isend(const void* b, int64_t n, DType dt, int peer, int tag) override {
    if (dt == DType::U8 && ++u8_sent_[peer] == nth_ && n > 0) {
      auto& copy = copies_.emplace_back(static_cast<const uint8_t*>(b), static_cast<const uint8_t*>(b) + n);
      copy.back() ^= 0x01;
      return in_.isend(copy.data(), n, dt, peer, tag);
    }
    return in_.isend(b, n, dt, peer, tag);
  }
  std::unique_ptr<comm::PendingTransfer> irecv(void* b, int64_t n, DType dt, int peer, int tag) override {
    return in_.irecv(b, n, dt, peer, tag);
  }
  void barrier() override { in_.barrier(); }

 private:
  comm::ProcessGroup& in_;
  int nth_;
  std::map<int, int> u8_sent_;
  std::list<std::vector<uint8_t>> copies_;  // alive until the group is destroyed, after the publisher's waits
};

}  // namespace

TEST(WeightSync, F32ReceiversEqualTheTrainer) {
  if (world_group().size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  publish_and_receive(DType::F32);
}

TEST(WeightSync, Bf16ReceiversEqualTheTrainer) {
  if (world_group().size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  publish_and_receive(DType::BF16);
}

// publish() snapshots: the trainer changes its weights right after each
// publish returns, before any receiver has posted a receive (the barrier), and
// each receive still gets the values of its publish.
TEST(WeightSync, ConsecutivePublishesCarryTheirSnapshots) {
  auto& g = world_group();
  if (g.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const WeightSyncOptions opts{kBucketBytes};
  auto model = trainer_model(DType::F32);
  if (g.rank() == 0) {
    rollout::WeightPublisher pub(g, receivers(), opts);
    const uint64_t c1 = pub.publish(cstate(*model), 1).checksum;
    EXPECT_EQ(c1, rollout::weights_checksum(cstate(*model)));
    perturb(*model, 1);  // the optimizer step after the publish
    g.barrier();
    const uint64_t c2 = pub.publish(cstate(*model), 2).checksum;  // waits for publish 1 first
    EXPECT_NE(c2, c1);
    perturb(*model, 2);  // never published
    pub.wait();
    EXPECT_FALSE(pub.last_stats().checksum == rollout::weights_checksum(cstate(*model)));
  } else {
    auto mine = rollout::testing::tiny_model(false, DType::F32, 100 + uint64_t(g.rank()));
    g.barrier();  // the trainer has already changed the weights of publish 1
    const WeightSyncStats s1 = rollout::receive_weights(g, 0, mine->state_tensors(), opts);
    EXPECT_EQ(s1.version, 1);
    expect_same_weights(*mine, *model);  // model: the trainer's initial weights, built here
    perturb(*model, 1);
    const WeightSyncStats s2 = rollout::receive_weights(g, 0, mine->state_tensors(), opts);
    EXPECT_EQ(s2.version, 2);
    expect_same_weights(*mine, *model);
    EXPECT_EQ(s2.checksum, rollout::weights_checksum(cstate(*model)));
  }
}

// A receiver whose tensors do not match the sender's fails from the header
// and manifest, naming the tensor, writes nothing, and drains the publish: the
// trainer's wait() returns and the next publish is received normally.
TEST(WeightSync, MismatchedReceiverFailsAndTheSenderFinishes) {
  auto& g = world_group();
  if (g.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const WeightSyncOptions opts{kBucketBytes};
  auto model = trainer_model(DType::F32);
  if (g.rank() == 0) {
    rollout::WeightPublisher pub(g, receivers(), opts);
    for (int64_t v = 0; v < 5; ++v) {
      pub.publish(cstate(*model), v);
      pub.wait();
    }
    return;
  }
  // 0: another dtype (bf16 copy of the same model).
  auto bf16 = trainer_model(DType::BF16);
  const uint64_t bf16_before = rollout::weights_checksum(cstate(*bf16));
  std::string msg = error_of([&] { rollout::receive_weights(g, 0, bf16->state_tensors(), opts); });
  EXPECT_NE(msg.find("do not match the sender's"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 0 differs: the sender has 'model.embed_tokens.weight f32 [128, 64]', this rank has "
                     "'model.embed_tokens.weight bf16 [128, 64]'"),
            std::string::npos)
      << msg;
  EXPECT_EQ(rollout::weights_checksum(cstate(*bf16)), bf16_before);  // nothing written

  // 1: the tensor list without its last tensor.
  auto mine = rollout::testing::tiny_model(false, DType::F32, 100 + uint64_t(g.rank()));
  auto fewer = mine->state_tensors();
  fewer.pop_back();
  msg = error_of([&] { rollout::receive_weights(g, 0, fewer, opts); });
  EXPECT_NE(msg.find("this rank lacks is 'lm_head.weight f32 [128, 64]'"), std::string::npos) << msg;

  // 2: another architecture (qwen3: q/k norms, tied embeddings).
  auto qwen3 = rollout::testing::tiny_model(true, DType::F32, 9);
  msg = error_of([&] { rollout::receive_weights(g, 0, qwen3->state_tensors(), opts); });
  EXPECT_NE(msg.find("differs: the sender has"), std::string::npos) << msg;

  // 3: the right tensors, another bucket size.
  msg = error_of([&] { rollout::receive_weights(g, 0, mine->state_tensors(), WeightSyncOptions{kBucketBytes * 2}); });
  EXPECT_NE(msg.find("the sender packs buckets of 20000 bytes, this rank expects 40000"), std::string::npos) << msg;

  // 4: the stream is still in step: publish 4 arrives intact.
  const WeightSyncStats st = rollout::receive_weights(g, 0, mine->state_tensors(), opts);
  EXPECT_EQ(st.version, 4);
  expect_same_weights(*mine, *model);
}

// A bucket corrupted in flight is caught by its digests before it is
// unpacked, the error names the tensor, and the rest of the publish is
// drained so the next one is received normally.
TEST(WeightSync, CorruptBucketNamesItsTensor) {
  auto& g = world_group();
  if (g.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const WeightSyncOptions opts{kBucketBytes};
  auto model = trainer_model(DType::F32);
  const auto plan = rollout::plan_weight_buckets(sizes_of(*model), kBucketBytes);
  if (g.rank() == 0) {
    CorruptingGroup bad(g, 3);  // u8 messages: manifest, bucket 0, bucket 1 <- flipped
    rollout::WeightPublisher pub(bad, receivers(), opts);
    pub.publish(cstate(*model), 1);
    perturb(*model, 1);
    pub.publish(cstate(*model), 2);  // the 3rd u8 message to each peer was publish 1's: this one is clean
    pub.wait();
    return;
  }
  auto mine = rollout::testing::tiny_model(false, DType::F32, 100 + uint64_t(g.rank()));
  auto untouched = rollout::testing::tiny_model(false, DType::F32, 100 + uint64_t(g.rank()));
  const auto ts = mine->state_tensors();
  const model::Param* last_of_bucket1 = ts[size_t(plan[1].first + plan[1].count - 1)];
  const std::string msg = error_of([&] { rollout::receive_weights(g, 0, ts, opts); });
  EXPECT_NE(msg.find(detail::concat("bucket 1 of ", plan.size(), ": tensor ", plan[1].first + plan[1].count - 1, " '",
                                    last_of_bucket1->name, "' arrived with different bytes")),
            std::string::npos)
      << msg;
  // Bucket 0 was written, bucket 1 and later were not.
  const auto u = untouched->state_tensors(), want = model->state_tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    const bool in_bucket0 = int64_t(i) < plan[0].count;
    const auto& other = in_bucket0 ? want[i]->weight : u[i]->weight;
    EXPECT_EQ(ts[i]->weight.to_float_vector(), other.to_float_vector()) << ts[i]->name;
  }
  perturb(*model, 1);
  const WeightSyncStats st = rollout::receive_weights(g, 0, ts, opts);
  EXPECT_EQ(st.version, 2);
  expect_same_weights(*mine, *model);
}
