// CUDA-graph decode: capture sizes, the padded persistent inputs, capture and
// replay (decode_graphs.h).
#include "rollout/decode_graphs.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "ops/address.h"
#include "ops/op_checks.h"
#include "rollout/block_pool.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/cuda_graph.h"
#endif

namespace kestrel::rollout {

std::vector<int64_t> default_capture_sizes(int64_t max_num_seqs, int64_t max_num_batched_tokens) {
  const int64_t top = std::min<int64_t>({512, max_num_seqs, max_num_batched_tokens});
  std::vector<int64_t> s;
  for (int64_t v : {1, 2, 4})
    if (v <= top) s.push_back(v);
  for (int64_t v = 8; v < 256 && v <= top; v += 8) s.push_back(v);
  for (int64_t v = 256; v <= top; v += 16) s.push_back(v);
  return s;
}

Result<std::vector<int64_t>> capture_sizes(const std::vector<int64_t>& requested, int64_t max_num_seqs,
                                           int64_t max_num_batched_tokens) {
  if (requested.empty()) return default_capture_sizes(max_num_seqs, max_num_batched_tokens);
  std::vector<int64_t> s;
  for (int64_t v : requested) {
    if (v < 1)
      return KS_ERR("actor_rollout_ref.rollout.cudagraph_capture_sizes: batch sizes must be >= 1, got ", v);
    if (v <= max_num_seqs) s.push_back(v);  // a decode batch never has more than max_num_seqs rows
  }
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

#if KESTREL_HAVE_CUDA
namespace {

// The host side of a padded decode step of P rows (decode_graphs.h): b's rows,
// then padding rows that write nothing and read one null-block slot.
struct HostStep {
  std::vector<int32_t> ids, positions, slots;  // [P]
  std::vector<int32_t> cu_q;                   // [P+1]
  std::vector<int32_t> seq_lens;               // [P]
  std::vector<int32_t> tables;                 // [P, W]
};

HostStep pad(const StepBatch& b, int64_t P, int64_t W) {
  const int64_t B = b.num_seqs();
  HostStep h;
  h.ids = b.input_ids;
  h.ids.resize(size_t(P), 0);
  h.positions = b.positions;
  h.positions.resize(size_t(P), 0);
  h.slots = b.slot_mapping;
  h.slots.resize(size_t(P), -1);  // PAD_SLOT_ID: the cache write skips the row
  h.cu_q.resize(size_t(P + 1));
  for (int64_t i = 0; i <= P; ++i) h.cu_q[size_t(i)] = int32_t(i);
  h.seq_lens = b.seq_lens;
  h.seq_lens.resize(size_t(P), 1);
  h.tables.assign(size_t(P * W), BlockPool::kNullBlock);
  for (int64_t i = 0; i < B; ++i)
    std::copy_n(b.block_tables.begin() + i * b.max_blocks, b.max_blocks, h.tables.begin() + i * W);
  return h;
}

}  // namespace

struct DecodeGraphs::Impl {
  struct Entry {
    int64_t size = 0;
    StepTensors in;   // persistent inputs of `size` rows (sample_rows = 0..size-1, fixed)
    cuda::Graph graph;
    Tensor logits;    // [size, V]: the graph's output, in the pool
  };
  cuda::GraphPool pool;
  std::vector<Entry> entries;  // ascending sizes; destroyed before the pool they point into
};

namespace {

Tensor dev_ints(Shape s) { return Tensor::empty(std::move(s), DType::I32, MemCategory::Activations, Device::CUDA); }

void upload(const HostStep& h, StepTensors& in) {
  const int64_t P = in.ids.numel();
  in.ids.copy_from(Tensor::from_ints(h.ids, {P}));
  in.positions.copy_from(Tensor::from_ints(h.positions, {P}));
  in.slots.copy_from(Tensor::from_ints(h.slots, {P}));
  in.cu_q.copy_from(Tensor::from_ints(h.cu_q, {P + 1}));
  in.seq_lens.copy_from(Tensor::from_ints(h.seq_lens, {P}));
  in.tables.copy_from(Tensor::from_ints(h.tables, in.tables.shape()));
}

}  // namespace

DecodeGraphs::DecodeGraphs(const model::CausalLM& m, KVCache& kv, ModelRunner& runner, std::vector<int64_t> sizes,
                           int64_t max_blocks)
    : m_(m), kv_(kv), runner_(runner), sizes_(std::move(sizes)), max_blocks_(std::max<int64_t>(max_blocks, 1)) {
  KS_CHECK(m.device() == Device::CUDA, "internal: CUDA graphs for a model on ", device_name(m.device()));
  KS_CHECK(!sizes_.empty(), "internal: DecodeGraphs without capture sizes");
}

DecodeGraphs::~DecodeGraphs() = default;

namespace {
// One new token per sequence, every sequence sampled, in order.
bool uniform_decode(const StepBatch& b) {
  const int64_t B = b.num_seqs();
  if (B == 0 || b.num_tokens() != B || int64_t(b.sample_rows.size()) != B) return false;
  for (int64_t i = 0; i < B; ++i)
    if (b.sample_rows[size_t(i)] != i) return false;
  return true;
}
}  // namespace

bool DecodeGraphs::fits(const StepBatch& b) const {
  return b.num_seqs() <= sizes_.back() && b.max_blocks <= max_blocks_ && uniform_decode(b);
}
bool DecodeGraphs::too_large(const StepBatch& b) const { return b.num_seqs() > sizes_.back() && uniform_decode(b); }

uint64_t DecodeGraphs::addresses() const {
  std::vector<const Tensor*> ts;
  for (model::Param* w : const_cast<model::CausalLM&>(m_).state_tensors()) ts.push_back(&w->weight);
  ts.push_back(&m_.rope().cos);
  ts.push_back(&m_.rope().sin);
  std::vector<Tensor> cache;  // the per-layer views the graph read
  for (int64_t l = 0; l < kv_.geometry().n_layers; ++l) {
    if (kv_.geometry().latent()) {
      cache.push_back(kv_.latent(l));
    } else {
      cache.push_back(kv_.k(l));
      cache.push_back(kv_.v(l));
    }
  }
  for (const Tensor& t : cache) ts.push_back(&t);
  return ops::address_fingerprint(ts);
}

void DecodeGraphs::capture_all() {
  const auto t0 = std::chrono::steady_clock::now();
  auto impl = std::make_unique<Impl>();
  impl->entries.resize(sizes_.size());
  // Largest first (vLLM's order): a smaller graph's buffers may reuse blocks the
  // larger one freed during its capture.
  for (size_t k = sizes_.size(); k-- > 0;) {
    Impl::Entry& e = impl->entries[k];
    const int64_t P = sizes_[k];
    e.size = P;
    e.in.ids = dev_ints({P});
    e.in.positions = dev_ints({P});
    e.in.slots = dev_ints({P});
    e.in.cu_q = dev_ints({P + 1});
    e.in.seq_lens = dev_ints({P});
    e.in.tables = dev_ints({P, max_blocks_});
    std::vector<int32_t> rows(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) rows[size_t(i)] = int32_t(i);
    e.in.sample_rows = dev_ints({P});
    e.in.sample_rows.copy_from(Tensor::from_ints(rows, {P}));
    upload(pad(StepBatch{}, P, max_blocks_), e.in);  // all padding: writes no cache slot
    (void)runner_.forward(e.in);  // warm-up, eager: lazy initialisation stays out of the graph
    e.graph.capture(impl->pool, [&] { e.logits = runner_.forward(e.in); });
  }
  impl_ = std::move(impl);
  captured_addresses_ = addresses();
  ++captures_;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string list;
  for (int64_t s : sizes_) list += (list.empty() ? "" : ", ") + std::to_string(s);
  std::fprintf(stderr, "CUDA graphs: captured decode for batch sizes [%s] in %.2f s (graph pool %.1f KiB)\n",
               list.c_str(), secs, double(impl_->pool.reserved_bytes()) / 1024.0);
}

Tensor DecodeGraphs::run(const StepBatch& b) {
  KS_CHECK(fits(b), "internal: DecodeGraphs::run on a step no graph fits");
  // Weights offloaded between phases (param_offload) come back before the addresses are compared, and never
  // inside a capture (its allocations come from the graph's private pool).
  m_.ensure_on_device(/*grads=*/false);
  if (impl_ && addresses() != captured_addresses_) {
    std::fprintf(stderr, "CUDA graphs: the weights or the KV cache moved since the capture; capturing again\n");
    release();
  }
  if (!impl_) capture_all();
  const int64_t B = b.num_seqs();
  Impl::Entry& e = *std::find_if(impl_->entries.begin(), impl_->entries.end(),
                                 [&](const Impl::Entry& x) { return x.size >= B; });
  const int64_t P = e.size, W = max_blocks_;
  const HostStep h = pad(b, P, W);
  // The index checks the ops skip inside a graph (they would read device values
  // back), on the host copies, with the ops' messages.
  const int64_t rows = m_.embedding().weight.size(0);
  const int64_t positions = m_.rope().cos.defined() ? m_.rope().cos.size(0) : INT64_MAX;
  for (int64_t i = 0; i < P; ++i) {
    if (h.ids[size_t(i)] < 0 || h.ids[size_t(i)] >= rows)
      KS_FAIL("rollout decode graph: token id ", h.ids[size_t(i)], " of row ", i, " is outside the embedding's ",
              rows, " rows");
    if (h.positions[size_t(i)] < 0 || h.positions[size_t(i)] >= positions)
      KS_FAIL("rope: position ", h.positions[size_t(i)], " of token ", i, " is outside the RoPE table [0, ", positions,
              "); build the table with max_positions > the longest sequence");
  }
  const KVGeometry& g = kv_.geometry();
  ops::detail::check_slots("paged_kv_write", h.slots.data(), P, g.num_blocks * g.block_size);
  ops::detail::check_paged_tables("paged_attention_fwd", h.cu_q.data(), h.seq_lens.data(), h.tables.data(), P, P, W,
                                  g.num_blocks, g.block_size);
  upload(h, e.in);
  e.graph.replay();
  ++replays_;
  padding_rows_ += P - B;
  return e.logits.slice_rows(0, B);  // [B, V]: the padding rows dropped
}

void DecodeGraphs::release() { impl_.reset(); }

#else  // no CUDA backend in this build: no model can be on a CUDA device

struct DecodeGraphs::Impl {};
DecodeGraphs::DecodeGraphs(const model::CausalLM& m, KVCache& kv, ModelRunner& runner, std::vector<int64_t> sizes,
                           int64_t max_blocks)
    : m_(m), kv_(kv), runner_(runner), sizes_(std::move(sizes)), max_blocks_(max_blocks) {
  KS_FAIL("CUDA graphs need the CUDA backend (this build has none)");
}
DecodeGraphs::~DecodeGraphs() = default;
bool DecodeGraphs::fits(const StepBatch&) const { return false; }
bool DecodeGraphs::too_large(const StepBatch&) const { return false; }
Tensor DecodeGraphs::run(const StepBatch&) { KS_FAIL("CUDA graphs need the CUDA backend (this build has none)"); }
void DecodeGraphs::release() {}
uint64_t DecodeGraphs::addresses() const { return 0; }
void DecodeGraphs::capture_all() {}

#endif

}  // namespace kestrel::rollout
