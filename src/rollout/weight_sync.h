// Weight transfer from trainer ranks to disaggregated rollout ranks (verl's
// fully-async / one-step-off-policy layout: under one mpirun some ranks train,
// others only generate). After each optimizer step the trainer publishes the
// whole model's state tensors to every rollout rank over the comm layer
// (point-to-point, never through files), in buckets of
// checkpoint_engine.update_weights_bucket_megabytes, and each rollout rank
// verifies it received the update intact.
//
// Wire protocol, one publish to one receiver (all on `group`, from the
// trainer's rank to the receiver's; messages on one tag between one pair
// arrive in the order they were posted, so one publish's messages match one
// receive_weights call):
//   kTagHeader    i64[kWeightSyncHeaderLen]: magic, version, n tensors, total
//                 bytes, n buckets, fingerprint, manifest bytes, bucket_bytes
//   kTagManifest  u8[manifest bytes]: one line per tensor,
//                 "<name> <dtype> <shape>\n" in order; the fingerprint is its
//                 XXH3-64 (so a different model or tensor list is named, not
//                 just detected)
//   kTagPlan      i64[2 * n buckets]: per bucket (bytes, tensor count), so a
//                 receiver that rejects the header can still drain every
//                 bucket and the sender's sends complete
//   then per bucket b, in order:
//   kTagBucket    u8[bytes_b]: whole consecutive tensors' bytes, packed with
//                 no padding
//   kTagDigest    u64[tensors in b]: each tensor's XXH3-64 (the bucket's
//                 checksum, trailing its data so packing, hashing and sending
//                 overlap; per tensor, so a corrupt bucket names its tensor)
//
// Checksum (WeightSyncStats::checksum, weights_checksum): XXH3-64 (seed 0) of
// the little-endian u64 array of every tensor's XXH3-64 (seed 0) digest of its
// bytes, in order. It covers every byte in order, does not depend on the bucket
// size, and both sides hash each byte once.
//
// Tensors whose weight is undefined (an optional tensor absent, a released
// weight) are skipped on both sides: they are neither in the manifest nor on
// the wire, so a sender and receiver that disagree about one fail on the
// manifest, naming it.
//
// Tensor data moves only through Tensor's device-aware copies (copy_from on
// views of host bucket buffers, scripts/check_data_access.sh), so device
// weights go through their backend's copy hook.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "model/param.h"

namespace kestrel::rollout {

struct WeightSyncOptions {
  // Bucket size in bytes (checkpoint_engine.update_weights_bucket_megabytes
  // << 20). Both sides must use the same value: the receiver checks it.
  int64_t bucket_bytes = int64_t(2048) << 20;
};

struct WeightSyncStats {
  int64_t version = -1;   // the trainer's weight version carried by the transfer
  int64_t bytes = 0;      // payload bytes (tensor data) moved to one receiver
  int64_t buckets = 0;
  int64_t tensors = 0;
  uint64_t checksum = 0;  // see "Checksum" above
  double seconds = 0;     // publish: snapshot and post; receive: the whole receive
};

constexpr int kWeightSyncHeaderLen = 8;

// One bucket of the packing: tensors [first, first + count) of the defined
// tensors, `bytes` their total size.
struct WeightBucket {
  int64_t first = 0;
  int64_t count = 0;
  int64_t bytes = 0;
};

// The packing both sides compute: greedy in order, whole tensors, a bucket is
// closed when the next tensor would take it past bucket_bytes; a tensor larger
// than bucket_bytes gets a bucket of its own (so no bucket exceeds
// max(bucket_bytes, largest tensor), verl's bound). bucket_bytes > 0.
std::vector<WeightBucket> plan_weight_buckets(const std::vector<int64_t>& tensor_bytes, int64_t bucket_bytes);

// The trainer side. Snapshots the tensors into bucket buffers (so training can
// go on changing the weights as soon as publish() returns) and posts
// non-blocking sends to every destination rank of `group`; the sends complete
// in the background as the receivers post their receives (with MPI, progress
// may also need this rank to enter MPI: test() or the next publish()).
// publish() first waits for the previous publish's sends (one update in flight
// at a time), so the bucket buffers are reused. Not thread-safe.
class WeightPublisher {
 public:
  // dst_ranks: ranks of `group`, distinct, none of them this rank. `group`
  // must outlive the publisher.
  WeightPublisher(comm::ProcessGroup& group, std::vector<int> dst_ranks, WeightSyncOptions opts);
  ~WeightPublisher();  // waits (an error there is printed, never thrown)
  WeightPublisher(const WeightPublisher&) = delete;
  WeightPublisher& operator=(const WeightPublisher&) = delete;

  // tensors: the model's state tensors in a fixed order both sides agree on
  // (CausalLM::state_tensors()). version: the trainer's weight version (>= 0).
  const WeightSyncStats& publish(const std::vector<const model::Param*>& tensors, int64_t version);
  // Completes every send of the last publish (blocks until every receiver has
  // received it).
  void wait();
  // True when no send is in flight; never blocks, and drives the transport's
  // progress (call it between training steps).
  bool test();
  const WeightSyncStats& last_stats() const { return stats_; }

 private:
  comm::ProcessGroup& group_;
  std::vector<int> dst_;
  WeightSyncOptions opts_;
  WeightSyncStats stats_;
  // The messages of the publish in flight; each must stay unchanged until its
  // sends complete. buckets_[b]: u8[plan b's bytes], digests_[b]: u64[plan b's count].
  std::vector<int64_t> header_;
  std::vector<uint8_t> manifest_;
  std::vector<int64_t> plan_;
  std::vector<std::vector<uint8_t>> buckets_;
  std::vector<std::vector<uint64_t>> digests_;
  std::vector<std::unique_ptr<comm::PendingTransfer>> pending_;
};

// The rollout side: a blocking receive of one publish from `src_rank` into the
// tensors (same order, names, shapes and dtypes as the sender's, checked from
// the header and manifest before any weight is written; a mismatch is an
// Error naming the first tensor that differs, thrown after the publish's
// buckets have been drained, so the sender's sends still complete). Every
// tensor's digest is checked before its bucket is unpacked; a corrupt bucket
// is an Error naming the tensor (thrown after draining the rest) and leaves
// the earlier buckets' tensors updated and the rest unchanged: do not generate
// with them. opts.bucket_bytes must equal the sender's.
WeightSyncStats receive_weights(comm::ProcessGroup& group, int src_rank, const std::vector<model::Param*>& tensors,
                                const WeightSyncOptions& opts);

// The checksum of the tensors' current bytes (the function above), so a test
// or a run can compare trainer and rollout copies.
uint64_t weights_checksum(const std::vector<const model::Param*>& tensors);
uint64_t weights_checksum(const std::vector<model::Param*>& tensors);

}  // namespace kestrel::rollout
