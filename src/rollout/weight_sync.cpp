#include "rollout/weight_sync.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/tensor.h"

namespace kestrel::rollout {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// "KSWSYNC1": a weight-sync header of this protocol version (a change to the
// messages below changes the last byte).
constexpr int64_t kMagic = 0x4b535753594e4331;
// Tags of their own, away from the pipeline's and the ring attention's, so a
// publish never matches another layer's point-to-point message.
enum WeightSyncTag : int { kTagHeader = 0x5750, kTagManifest, kTagPlan, kTagBucket, kTagDigest };
enum HeaderField : int {
  kFieldMagic, kFieldVersion, kFieldTensors, kFieldTotalBytes, kFieldBuckets, kFieldFingerprint, kFieldManifestBytes,
  kFieldBucketBytes
};
static_assert(kFieldBucketBytes + 1 == kWeightSyncHeaderLen);

// Sanity bounds on a received header, so a stray message is an error rather
// than a huge allocation.
constexpr int64_t kMaxTensors = int64_t(1) << 24;
constexpr int64_t kMaxManifestBytes = int64_t(1) << 30;

// The tensors that travel: an undefined weight (optional tensor absent,
// released weight) is skipped, the same way on both sides.
template <class P>
std::vector<P*> defined_of(const std::vector<P*>& tensors) {
  std::vector<P*> out;
  out.reserve(tensors.size());
  for (P* p : tensors) {
    KS_CHECK(p != nullptr, "weight sync: a null tensor in the list");
    if (p->weight.defined()) out.push_back(p);
  }
  return out;
}

std::vector<int64_t> sizes_of(const std::vector<const model::Param*>& ts) {
  std::vector<int64_t> out;
  out.reserve(ts.size());
  for (const model::Param* p : ts) out.push_back(int64_t(p->weight.nbytes()));
  return out;
}

// One line per tensor, "<name> <dtype> <shape>\n": what both sides must agree on.
std::string make_manifest(const std::vector<const model::Param*>& ts) {
  std::string m;
  for (const model::Param* p : ts) {
    m += p->name;
    m += ' ';
    m += dtype_name(p->weight.dtype());
    m += ' ';
    m += shape_str(p->weight.shape());
    m += '\n';
  }
  return m;
}

std::vector<std::string_view> manifest_lines(std::string_view m) {
  std::vector<std::string_view> out;
  while (!m.empty()) {
    const size_t nl = m.find('\n');
    out.push_back(m.substr(0, nl));
    m = nl == std::string_view::npos ? std::string_view() : m.substr(nl + 1);
  }
  return out;
}

// "" when equal, else what differs, naming the first tensor.
std::string manifest_difference(const std::string& theirs, const std::string& mine) {
  const auto a = manifest_lines(theirs), b = manifest_lines(mine);
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i])
      return detail::concat("tensor ", i, " differs: the sender has '", a[i], "', this rank has '", b[i], "'");
  if (a.size() > n)
    return detail::concat("the sender has ", a.size(), " tensors, this rank ", b.size(), "; the first one this rank lacks is '",
                          a[n], "' (tensors with an undefined weight are skipped on both sides)");
  if (b.size() > n)
    return detail::concat("the sender has ", a.size(), " tensors, this rank ", b.size(), "; the first one the sender lacks is '",
                          b[n], "' (tensors with an undefined weight are skipped on both sides)");
  return "";
}

uint64_t digest_bytes(const uint8_t* p, int64_t n) { return XXH3_64bits(p, size_t(n)); }
// The whole-model checksum from the per-tensor digests (little-endian hosts:
// the u64s hash as their in-memory bytes).
uint64_t combine(const std::vector<uint64_t>& digests) {
  return XXH3_64bits(digests.data(), digests.size() * sizeof(uint64_t));
}

// A host tensor over `p`, typed and shaped as t: the other end of the
// device-aware copies into and out of bucket buffers.
Tensor host_view(uint8_t* p, const Tensor& t) { return Tensor::from_blob(p, t.shape(), t.dtype()); }

void check_peer(const comm::ProcessGroup& g, int peer, const char* what) {
  KS_CHECK(peer >= 0 && peer < g.size() && peer != g.rank(), what, ": rank ", peer, " is not another rank of group '",
           g.name(), "' (rank ", g.rank(), " of ", g.size(), ")");
}

}  // namespace

std::vector<WeightBucket> plan_weight_buckets(const std::vector<int64_t>& tensor_bytes, int64_t bucket_bytes) {
  KS_CHECK(bucket_bytes > 0, "weight sync: bucket size must be positive, got ", bucket_bytes, " bytes");
  std::vector<WeightBucket> out;
  WeightBucket cur;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    const int64_t n = tensor_bytes[i];
    KS_CHECK(n >= 0, "weight sync: tensor ", i, " has ", n, " bytes");
    // Greedy: close the bucket when this tensor would overflow it. A tensor
    // over bucket_bytes overflows any non-empty bucket, and any tensor after
    // it overflows its bucket, so it always travels alone.
    if (cur.count > 0 && cur.bytes + n > bucket_bytes) {
      out.push_back(cur);
      cur = WeightBucket{int64_t(i), 0, 0};
    }
    ++cur.count;
    cur.bytes += n;
  }
  if (cur.count > 0) out.push_back(cur);
  return out;
}

uint64_t weights_checksum(const std::vector<const model::Param*>& tensors) {
  const auto ts = defined_of(tensors);
  std::vector<uint64_t> digests;
  digests.reserve(ts.size());
  std::vector<uint8_t> host;  // u8[nbytes] of one tensor: its bytes, copied out through the device seam
  for (const model::Param* p : ts) {
    host.resize(p->weight.nbytes());
    host_view(host.data(), p->weight).copy_from(p->weight);
    digests.push_back(digest_bytes(host.data(), int64_t(host.size())));
  }
  return combine(digests);
}

uint64_t weights_checksum(const std::vector<model::Param*>& tensors) {
  return weights_checksum(std::vector<const model::Param*>(tensors.begin(), tensors.end()));
}

// ---------------------------------------------------------------- publisher

WeightPublisher::WeightPublisher(comm::ProcessGroup& group, std::vector<int> dst_ranks, WeightSyncOptions opts)
    : group_(group), dst_(std::move(dst_ranks)), opts_(opts) {
  KS_CHECK(opts_.bucket_bytes > 0, "WeightPublisher: bucket size must be positive, got ", opts_.bucket_bytes, " bytes");
  KS_CHECK(!dst_.empty(), "WeightPublisher: no destination ranks");
  for (size_t i = 0; i < dst_.size(); ++i) {
    check_peer(group_, dst_[i], "WeightPublisher");
    KS_CHECK(std::find(dst_.begin(), dst_.begin() + i, dst_[i]) == dst_.begin() + i, "WeightPublisher: rank ",
             dst_[i], " listed twice");
  }
}

WeightPublisher::~WeightPublisher() {
  try {
    wait();
  } catch (const std::exception& e) {  // never throw from a destructor; the receivers report their side
    std::fprintf(stderr, "WeightPublisher: completing the last publish failed: %s\n", e.what());
  }
}

void WeightPublisher::wait() {
  // Moved out first: on an error the rest complete in their destructors.
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& t : pending) t->wait();
}

bool WeightPublisher::test() {
  bool done = true;
  for (auto& t : pending_) done = t->test() && done;  // every transfer tested: each drives progress
  if (done) pending_.clear();
  return done;
}

const WeightSyncStats& WeightPublisher::publish(const std::vector<const model::Param*>& tensors, int64_t version) {
  KS_CHECK(version >= 0, "WeightPublisher::publish: version must be >= 0, got ", version);
  wait();  // one update in flight: the buffers below are reused
  const auto t0 = Clock::now();
  const auto ts = defined_of(tensors);
  const std::vector<WeightBucket> plan = plan_weight_buckets(sizes_of(ts), opts_.bucket_bytes);

  const std::string manifest = make_manifest(ts);
  manifest_.assign(manifest.begin(), manifest.end());
  plan_.clear();
  int64_t total = 0;
  for (const WeightBucket& b : plan) {
    plan_.push_back(b.bytes);
    plan_.push_back(b.count);
    total += b.bytes;
  }
  header_.assign(kWeightSyncHeaderLen, 0);
  header_[kFieldMagic] = kMagic;
  header_[kFieldVersion] = version;
  header_[kFieldTensors] = int64_t(ts.size());
  header_[kFieldTotalBytes] = total;
  header_[kFieldBuckets] = int64_t(plan.size());
  header_[kFieldFingerprint] = int64_t(XXH3_64bits(manifest.data(), manifest.size()));
  header_[kFieldManifestBytes] = int64_t(manifest.size());
  header_[kFieldBucketBytes] = opts_.bucket_bytes;
  for (int dst : dst_) {
    pending_.push_back(group_.isend(header_.data(), kWeightSyncHeaderLen, DType::I64, dst, kTagHeader));
    pending_.push_back(group_.isend(manifest_.data(), int64_t(manifest_.size()), DType::U8, dst, kTagManifest));
    pending_.push_back(group_.isend(plan_.data(), int64_t(plan_.size()), DType::I64, dst, kTagPlan));
  }

  // Pack, hash and post bucket by bucket, so the first buckets travel while
  // the later ones are packed.
  buckets_.resize(plan.size());
  digests_.resize(plan.size());
  std::vector<uint64_t> all_digests;
  all_digests.reserve(ts.size());
  for (size_t b = 0; b < plan.size(); ++b) {
    std::vector<uint8_t>& buf = buckets_[b];
    std::vector<uint64_t>& dig = digests_[b];
    buf.resize(size_t(plan[b].bytes));
    dig.resize(size_t(plan[b].count));
    int64_t off = 0;
    for (int64_t k = 0; k < plan[b].count; ++k) {
      const Tensor& w = ts[size_t(plan[b].first + k)]->weight;
      host_view(buf.data() + off, w).copy_from(w);
      dig[size_t(k)] = digest_bytes(buf.data() + off, int64_t(w.nbytes()));
      all_digests.push_back(dig[size_t(k)]);
      off += int64_t(w.nbytes());
    }
    for (int dst : dst_) {
      pending_.push_back(group_.isend(buf.data(), int64_t(buf.size()), DType::U8, dst, kTagBucket));
      pending_.push_back(group_.isend(dig.data(), int64_t(dig.size()), DType::I64, dst, kTagDigest));
    }
  }

  stats_ = WeightSyncStats{};
  stats_.version = version;
  stats_.bytes = total;
  stats_.buckets = int64_t(plan.size());
  stats_.tensors = int64_t(ts.size());
  stats_.checksum = combine(all_digests);
  stats_.seconds = since(t0);
  return stats_;
}

// ---------------------------------------------------------------- receiver

namespace {

// What the sender announced before any bucket: header, manifest, bucket plan.
struct Announcement {
  std::vector<int64_t> header;
  std::string manifest;
  std::vector<WeightBucket> plan;
};

Announcement receive_announcement(comm::ProcessGroup& group, int src) {
  Announcement a;
  a.header.assign(kWeightSyncHeaderLen, 0);
  group.recv(a.header.data(), kWeightSyncHeaderLen, DType::I64, src, kTagHeader);
  const auto& h = a.header;
  // A header that fails these cannot be trusted to size the drain, so the
  // error is immediate (a protocol error, not a model mismatch).
  if (h[kFieldMagic] != kMagic)
    KS_FAIL("receive_weights from rank ", src, " of group '", group.name(),
            "': the first message is not a weight-sync header of this version (magic ", h[kFieldMagic], ")");
  const int64_t nt = h[kFieldTensors], nb = h[kFieldBuckets], mb = h[kFieldManifestBytes];
  if (nt < 0 || nt > kMaxTensors || nb < 0 || nb > nt || mb < 0 || mb > kMaxManifestBytes ||
      h[kFieldTotalBytes] < 0 || h[kFieldVersion] < 0)
    KS_FAIL("receive_weights from rank ", src, ": malformed header (version ", h[kFieldVersion], ", ", nt, " tensors, ",
            nb, " buckets, ", h[kFieldTotalBytes], " bytes, manifest of ", mb, " bytes)");
  a.manifest.resize(size_t(mb));
  group.recv(a.manifest.data(), mb, DType::U8, src, kTagManifest);
  std::vector<int64_t> flat(size_t(2 * nb));  // per bucket (bytes, tensor count)
  group.recv(flat.data(), 2 * nb, DType::I64, src, kTagPlan);
  int64_t bytes = 0, count = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const WeightBucket wb{count, flat[size_t(2 * b + 1)], flat[size_t(2 * b)]};
    if (wb.bytes < 0 || wb.count <= 0 || wb.count > nt - count)
      KS_FAIL("receive_weights from rank ", src, ": malformed bucket plan (bucket ", b, ": ", wb.bytes, " bytes, ",
              wb.count, " tensors)");
    a.plan.push_back(wb);
    bytes += wb.bytes;
    count += wb.count;
  }
  if (bytes != h[kFieldTotalBytes] || count != nt)
    KS_FAIL("receive_weights from rank ", src, ": the bucket plan holds ", count, " tensors and ", bytes,
            " bytes, the header says ", nt, " and ", h[kFieldTotalBytes]);
  return a;
}

// What makes this receiver unable to take the announced publish ("" if
// nothing): the tensor list first (the likeliest cause), then the bucket size.
std::string announcement_difference(const Announcement& a, const std::vector<const model::Param*>& ts,
                                    const WeightSyncOptions& opts) {
  const std::string mine = make_manifest(ts);
  std::string d = manifest_difference(a.manifest, mine);
  if (!d.empty()) return d;
  if (uint64_t(a.header[kFieldFingerprint]) != XXH3_64bits(a.manifest.data(), a.manifest.size()))
    return "the header's fingerprint does not match its manifest";
  if (a.header[kFieldBucketBytes] != opts.bucket_bytes)
    return detail::concat("the sender packs buckets of ", a.header[kFieldBucketBytes], " bytes, this rank expects ",
                          opts.bucket_bytes,
                          " (checkpoint_engine.update_weights_bucket_megabytes must be the same on both sides)");
  const std::vector<WeightBucket> plan = plan_weight_buckets(sizes_of(ts), opts.bucket_bytes);
  for (size_t b = 0; b < std::max(plan.size(), a.plan.size()); ++b) {
    const bool same = b < plan.size() && b < a.plan.size() && plan[b].first == a.plan[b].first &&
                      plan[b].count == a.plan[b].count && plan[b].bytes == a.plan[b].bytes;
    if (!same)
      return detail::concat("the sender's bucket plan (", a.plan.size(), " buckets) differs from this rank's (",
                            plan.size(), ") at bucket ", b);
  }
  return "";
}

// Receives and discards buckets [from, end) of the plan, so the sender's
// sends complete although this rank rejected the publish.
void drain(comm::ProcessGroup& group, int src, const std::vector<WeightBucket>& plan, size_t from) {
  int64_t max_bytes = 0, max_count = 0;
  for (size_t b = from; b < plan.size(); ++b) {
    max_bytes = std::max(max_bytes, plan[b].bytes);
    max_count = std::max(max_count, plan[b].count);
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(max_bytes)); // u8[largest bucket]
  std::vector<uint64_t> digests(static_cast<size_t>(max_count)); // u64[most tensors in a bucket]
  for (size_t b = from; b < plan.size(); ++b) {
    group.recv(bytes.data(), plan[b].bytes, DType::U8, src, kTagBucket);
    group.recv(digests.data(), plan[b].count, DType::I64, src, kTagDigest);
  }
}

// One bucket in flight to this rank: u8[bytes] of packed tensors and their u64[count] digests.
struct Slot {
  std::vector<uint8_t> bytes;
  std::vector<uint64_t> digests;
  std::unique_ptr<comm::PendingTransfer> bytes_rx, digests_rx;
};

}  // namespace

WeightSyncStats receive_weights(comm::ProcessGroup& group, int src_rank, const std::vector<model::Param*>& tensors,
                                const WeightSyncOptions& opts) {
  const auto t0 = Clock::now();
  KS_CHECK(opts.bucket_bytes > 0, "receive_weights: bucket size must be positive, got ", opts.bucket_bytes, " bytes");
  check_peer(group, src_rank, "receive_weights");
  const std::vector<model::Param*> ts = defined_of(tensors);
  const Announcement a = receive_announcement(group, src_rank);
  const int64_t version = a.header[kFieldVersion];
  const std::string diff = announcement_difference(a, std::vector<const model::Param*>(ts.begin(), ts.end()), opts);
  if (!diff.empty()) {
    drain(group, src_rank, a.plan, 0);
    KS_FAIL("receive_weights from rank ", src_rank, " of group '", group.name(), "' (weight version ", version,
            "): this rank's tensors do not match the sender's: ", diff);
  }

  // Two slots: bucket b+1 arrives while bucket b is verified and unpacked
  // (staging memory: two of the largest bucket). Receives on one tag match
  // the sends in order, so slot b % 2 gets bucket b.
  Slot slots[2];
  auto post = [&](size_t b) {
    Slot& s = slots[b % 2];
    s.bytes.resize(size_t(a.plan[b].bytes));
    s.digests.resize(size_t(a.plan[b].count));
    s.bytes_rx = group.irecv(s.bytes.data(), a.plan[b].bytes, DType::U8, src_rank, kTagBucket);
    s.digests_rx = group.irecv(s.digests.data(), a.plan[b].count, DType::I64, src_rank, kTagDigest);
  };
  std::vector<uint64_t> all_digests;
  all_digests.reserve(ts.size());
  std::string corrupt;
  size_t b = 0;
  if (!a.plan.empty()) post(0);
  for (; b < a.plan.size(); ++b) {
    if (b + 1 < a.plan.size()) post(b + 1);
    Slot& s = slots[b % 2];
    s.bytes_rx->wait();
    s.digests_rx->wait();
    // Verify the whole bucket before writing any of it.
    const WeightBucket& wb = a.plan[b];
    int64_t off = 0;
    for (int64_t k = 0; k < wb.count && corrupt.empty(); ++k) {
      const model::Param& p = *ts[size_t(wb.first + k)];
      const int64_t n = int64_t(p.weight.nbytes());
      const uint64_t d = digest_bytes(s.bytes.data() + off, n);
      if (d != s.digests[size_t(k)])
        corrupt = detail::concat("bucket ", b, " of ", a.plan.size(), ": tensor ", wb.first + k, " '", p.name,
                                 "' arrived with different bytes than were sent (digest mismatch)");
      all_digests.push_back(d);
      off += n;
    }
    if (!corrupt.empty()) break;
    off = 0;
    for (int64_t k = 0; k < wb.count; ++k) {
      model::Param& p = *ts[size_t(wb.first + k)];
      p.weight.copy_from(host_view(s.bytes.data() + off, p.weight));
      off += int64_t(p.weight.nbytes());
    }
  }
  if (!corrupt.empty()) {
    // Bucket b + 1's receive is posted (if any): complete it, then drain the rest.
    if (b + 1 < a.plan.size()) {
      slots[(b + 1) % 2].bytes_rx->wait();
      slots[(b + 1) % 2].digests_rx->wait();
    }
    drain(group, src_rank, a.plan, b + 2);
    KS_FAIL("receive_weights from rank ", src_rank, " of group '", group.name(), "' (weight version ", version,
            "): ", corrupt, "; the buckets before it were written, the rest were not: do not use these weights");
  }

  WeightSyncStats st;
  st.version = version;
  st.bytes = a.header[kFieldTotalBytes];
  st.buckets = int64_t(a.plan.size());
  st.tensors = int64_t(ts.size());
  st.checksum = combine(all_digests);
  st.seconds = since(t0);
  return st;
}

}  // namespace kestrel::rollout
