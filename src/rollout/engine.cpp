// The rollout engine: requests in, scheduler step, packed forward, sampling,
// stop checks, outputs. See engine.h for the API and scheduler.h /
// sampler.h / block_pool.h for the policies.
//
// Under tensor parallelism (the model's tp group has size > 1) one engine runs
// on every tp rank, SPMD: each rank's KV cache holds its own kv heads, the
// runner's collectives combine the ranks, and every rank samples from the same
// gathered logits with the same (seed, sample, position) keys, so all ranks
// pick the same tokens and their schedulers make the same decisions. The
// caller adds the same requests, in the same order, on every rank; each step
// checks that the ranks agree (one 8-byte all-gather) and fails loudly if not.
//
// A model on a device (CausalLM::device()) gets its KV cache there and runs
// every step there (model_runner.h); the sampler stays on the host for now:
// each step reads its [S, V] logits and [S] log-sum-exps back and samples
// from the host copies (S rows of V values: small next to the step's forward,
// and it keeps the sampler one implementation with one keyed RNG). The swap
// area stays on the host.
#include "rollout/engine.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <cstring>
#include <map>
#include <unordered_set>

#include "ops/copy.h"
#include "ops/loss.h"
#include "rollout/decode_graphs.h"
#include "rollout/kv_cache.h"
#include "rollout/model_runner.h"
#include "rollout/sampler.h"
#include "rollout/scheduler.h"

namespace kestrel::rollout {

namespace {

class KVSwapSpace final : public SwapSpace {
 public:
  explicit KVSwapSpace(KVCache& kv) : kv_(kv) {}
  std::vector<int32_t> reserve(int64_t n) override { return kv_.swap_reserve(n); }
  void release(const std::vector<int32_t>& ids) override { kv_.swap_release(ids); }

 private:
  KVCache& kv_;
};

// Every tp rank must run the same step; a rank that diverged (different
// requests, a different config) would otherwise deadlock in or corrupt the
// runner's collectives. All ranks see the same gathered digests, so all of
// them throw together.
void check_lockstep(comm::ProcessGroup& tp, const StepBatch& b, int64_t step) {
  const uint64_t h = step_fingerprint(b);
  int64_t mine;
  std::memcpy(&mine, &h, sizeof mine);
  std::vector<int64_t> all(size_t(tp.size()));
  tp.all_gather(&mine, all.data(), 1, DType::I64);
  for (int r = 1; r < tp.size(); ++r)
    if (all[size_t(r)] != all[0])
      KS_FAIL("rollout engine: tensor-parallel ranks 0 and ", r, " of group '", tp.name(), "' scheduled different ",
              "batches at step ", step, "; every tp rank must create its engine with the same EngineConfig and add ",
              "the same requests (ids, prompts, sampling params) in the same order");
}

class EngineImpl final : public Engine {
 public:
  EngineImpl(const model::CausalLM& m, const EngineConfig& cfg, const KVGeometry& g, int64_t max_model_len)
      : model_(m), cfg_(cfg), max_model_len_(max_model_len), kv_(g, m.device()),
        pool_(g.num_blocks, cfg.enable_prefix_caching), swap_(kv_),
        sched_(SchedulerConfig{cfg.block_size, cfg.max_num_batched_tokens, cfg.max_num_seqs,
                               cfg.enable_chunked_prefill, cfg.preemption_mode == "swap"},
               pool_, &swap_),
        runner_(m, kv_) {
    for (int64_t e : m.config().eos_token_ids) eos_.insert(int32_t(e));
    const double swap_bytes = cfg.swap_space_gib * double(int64_t(1) << 30);
    kv_.set_swap_capacity(std::min<int64_t>(int64_t(swap_bytes / double(g.bytes_per_block())), g.num_blocks));
    kv_.allocate();
    if (!cfg.enforce_eager && m.device() == Device::CUDA) {
      const std::string why = graphs_unsupported(m, cfg);
      if (why.empty()) {
        std::vector<int64_t> sizes =
            capture_sizes(cfg.cudagraph_capture_sizes, cfg.max_num_seqs, cfg.max_num_batched_tokens).value();
        const int64_t max_blocks = (max_model_len + cfg.block_size - 1) / cfg.block_size;
        if (!sizes.empty())
          graphs_ = std::make_unique<DecodeGraphs>(m, kv_, runner_, std::move(sizes), max_blocks);
        else
          std::fprintf(stderr, "CUDA graphs: no cudagraph_capture_sizes entry is <= max_num_seqs (%lld); decoding "
                       "eagerly\n", (long long)cfg.max_num_seqs);
      } else {
        static bool said = false;  // once per process: every engine of the job has the same reason
        if (!said) std::fprintf(stderr, "CUDA graphs: %s\n", why.c_str());
        said = true;
      }
    }
  }
  // Why a model on the device cannot decode through graphs yet ("" when it can).
  static std::string graphs_unsupported(const model::CausalLM& m, const EngineConfig&) {
    if (m.num_moe_layers() > 0)
      return "MoE model decodes eagerly: its expert routing sizes the grouped GEMM from token counts read back to "
             "the host in every layer, which a CUDA graph cannot contain";
    if (m.tp().size() > 1 || m.ep().size() > 1)
      return "a tensor- or expert-parallel model decodes eagerly: its collectives are not captured";
    return "";
  }

  Status add_request(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& p) override;
  std::vector<RequestOutput> step() override;
  bool has_unfinished() const override { return sched_.has_unfinished(); }
  // Expert parallelism (the model's ep group, size > 1): whether any rank of
  // the group still has work. Collective over the group.
  bool group_unfinished() const;
  // A step of one token on the null block (its K/V land in slot 0, which no
  // sequence reads; no logits): an ep rank without work still serves its
  // experts to the others' tokens, as vLLM's dummy batch does.
  void idle_step();
  using Engine::run_to_completion;
  std::vector<RequestOutput> run_to_completion(const FinishedFn& on_finished) override;
  void update_weights_version() override;
  WeightPacks& weight_packs() override { return runner_.packs(); }
  void sleep() override;
  void wake_up() override;
  EngineStats stats() const override;
  bool is_sleeping() const override { return asleep_; }
  const EngineConfig& config() const override { return cfg_; }

 private:
  // Appends a sampled token and its logprobs; true when the sequence stops.
  bool append_token(Sequence* s, int32_t tok, float logprob, std::vector<std::pair<int32_t, float>> top);
  bool hits_stop_string(const Sequence* s) const;
  // Router replay R3: the finished sequence's routing rows, read through the
  // block table of `rows_of` (itself, or for a forked sample that never got
  // blocks, the parent holding the shared prompt), before its blocks are freed.
  void collect_routing(Sequence* s, const Sequence& rows_of);
  RequestOutput make_output(Request& r) const;

  const model::CausalLM& model_;
  EngineConfig cfg_;
  int64_t max_model_len_;
  KVCache kv_;
  BlockPool pool_;
  KVSwapSpace swap_;
  Scheduler sched_;
  ModelRunner runner_;
  std::unique_ptr<DecodeGraphs> graphs_;  // CUDA-graph decode (null: every step eager)
  std::unordered_set<int32_t> eos_;
  std::map<std::string, std::unique_ptr<Request>> requests_;  // unfinished
  int64_t next_order_ = 0, next_seq_id_ = 0;
  uint64_t weights_version_ = 0;
  bool asleep_ = false;
  EngineStats stats_;
  std::vector<SamplerScratch> scratch_;  // per OpenMP thread
  std::vector<float> logits_host_;       // [S, V] the step's logits for the sampler, reused across steps
};

Status EngineImpl::add_request(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& p) {
  const std::string where = "request '" + id + "'";
  if (requests_.count(id)) return KS_ERR(where, ": a request with this id is still running (ids must be unique)");
  if (prompt.empty()) return KS_ERR(where, ": empty prompt (give at least one token id)");
  const int64_t V = model_.config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= V)
      return KS_ERR(where, ": token id ", prompt[i], " at prompt position ", i, " is outside the vocabulary [0, ", V, ")");
  if (p.n < 1) return KS_ERR(where, ": n must be >= 1, got ", p.n);
  if (p.max_tokens < 1) return KS_ERR(where, ": max_tokens must be >= 1, got ", p.max_tokens);
  if (!(p.temperature >= 0) || std::isinf(p.temperature))
    return KS_ERR(where, ": temperature must be finite and >= 0 (0 = greedy), got ", p.temperature);
  if (!(p.top_p > 0 && p.top_p <= 1)) return KS_ERR(where, ": top_p must be in (0, 1], got ", p.top_p);
  if (!(p.min_p >= 0 && p.min_p <= 1)) return KS_ERR(where, ": min_p must be in [0, 1], got ", p.min_p);
  if (p.top_k < -1) return KS_ERR(where, ": top_k must be -1 or 0 (off) or a positive count, got ", p.top_k);
  if (p.logprobs < 0) return KS_ERR(where, ": logprobs must be >= 0, got ", p.logprobs);
  if (!p.stop.empty() && !cfg_.detokenize)
    return KS_ERR(where, ": stop strings need EngineConfig::detokenize (a tokenizer); use stop_token_ids instead");
  for (const auto& s : p.stop)
    if (s.empty()) return KS_ERR(where, ": empty stop string");
  const int64_t L = int64_t(prompt.size());
  if (L >= max_model_len_)
    return KS_ERR(where, ": prompt of ", L, " tokens leaves no room to generate within max_model_len ", max_model_len_,
                  " (shorten the prompt or raise max_model_len)");
  const int64_t longest = std::min(L + p.max_tokens, max_model_len_);
  const int64_t need = sched_.blocks_for(longest), have = pool_.num_blocks() - 1;
  if (need > have)
    return KS_ERR(where, ": a sequence of up to ", longest, " tokens needs ", need, " KV blocks of ", cfg_.block_size,
                  " tokens but the cache has ", have, " (raise kv_cache_bytes / num_blocks or lower max_tokens)");

  auto r = std::make_unique<Request>();
  r->id = id;
  r->order = next_order_++;
  r->prompt = std::move(prompt);
  r->params = p;
  if (r->params.top_k == 0) r->params.top_k = -1;
  for (const auto& s : p.stop) r->max_stop_len = std::max(r->max_stop_len, s.size());
  auto s = std::make_unique<Sequence>();
  s->id = next_seq_id_++;
  s->req = r.get();
  s->tokens = r->prompt;
  s->prompt_len = L;
  s->hash_key = weights_version_;
  s->pending_fork = p.n > 1;
  sched_.add(s.get());
  r->seqs.push_back(std::move(s));
  stats_.prompt_tokens += L;
  requests_.emplace(id, std::move(r));
  return Status::ok();
}

bool EngineImpl::hits_stop_string(const Sequence* s) const {
  const Request& r = *s->req;
  if (r.params.stop.empty()) return false;
  // A stop string of k bytes spans at most k tokens (+ a few for split UTF-8);
  // it counts only if it was not already in the text before this token.
  const int64_t gen = s->num_generated();
  const int64_t window = std::min<int64_t>(gen, int64_t(r.max_stop_len) + 4);
  const std::vector<int32_t> now(s->tokens.end() - window, s->tokens.end());
  const std::vector<int32_t> before(now.begin(), now.end() - 1);
  const std::string t_now = cfg_.detokenize(now), t_before = before.empty() ? "" : cfg_.detokenize(before);
  for (const auto& st : r.params.stop)
    if (t_now.find(st) != std::string::npos && t_before.find(st) == std::string::npos) return true;
  return false;
}

bool EngineImpl::append_token(Sequence* s, int32_t tok, float logprob, std::vector<std::pair<int32_t, float>> top) {
  s->tokens.push_back(tok);
  s->logprobs.push_back(logprob);
  if (s->req->params.logprobs > 0) s->top_logprobs.push_back(std::move(top));
  ++stats_.generated_tokens;
  const SamplingParams& p = s->req->params;
  const auto& st = p.stop_token_ids;
  if (!p.ignore_eos && eos_.count(tok)) s->finish_reason = "stop";
  else if (std::find(st.begin(), st.end(), tok) != st.end()) s->finish_reason = "stop";
  else if (hits_stop_string(s)) s->finish_reason = "stop";
  else if (s->num_generated() >= p.max_tokens || s->num_tokens() >= max_model_len_) s->finish_reason = "length";
  return !s->finish_reason.empty();
}

void EngineImpl::collect_routing(Sequence* s, const Sequence& rows_of) {
  const int64_t bs = cfg_.block_size, L = s->num_tokens(), W = kv_.geometry().routing_width;
  // Positions 0..L-2 were computed (the last sampled token never is): their
  // cache slots through the block table; the last row stays -1.
  const int64_t n = L - 1;
  KS_CHECK(n >= 1 && int64_t(rows_of.blocks.size()) * bs >= n, "internal: routing of sequence ", s->id, " with ", L,
           " tokens read through ", rows_of.blocks.size(), " blocks");
  std::vector<int32_t> slots(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) slots[size_t(p)] = int32_t(rows_of.blocks[size_t(p / bs)] * bs + p % bs);
  const Device dev = kv_.device();  // the routing cache's (the model's)
  Tensor rows = Tensor::empty({n, W}, DType::I32, MemCategory::Activations, dev);  // [L-1, n_moe_layers * k]
  const Tensor idx = Tensor::from_host(slots, {n}, MemCategory::Activations, dev);  // [L-1] cache slots
  ops::gather_rows(kv_.routing_rows(), idx, rows);
  s->routed_experts = rows.to_host<int32_t>();
  s->routed_experts.resize(size_t(L * W), -1);
}

RequestOutput EngineImpl::make_output(Request& r) const {
  RequestOutput o;
  o.request_id = r.id;
  o.prompt_token_ids = r.prompt;
  o.num_cached_prompt_tokens = r.num_cached_prompt_tokens;
  for (auto& s : r.seqs) {
    CompletionOutput c;
    c.index = s->sample;
    c.token_ids.assign(s->tokens.begin() + s->prompt_len, s->tokens.end());
    c.logprobs = std::move(s->logprobs);
    c.finish_reason = s->finish_reason;
    c.top_logprobs = std::move(s->top_logprobs);
    c.routed_experts = std::move(s->routed_experts);
    o.outputs.push_back(std::move(c));
  }
  return o;
}

bool EngineImpl::group_unfinished() const {
  int32_t any = sched_.has_unfinished() ? 1 : 0;
  if (model_.ep().size() > 1) model_.ep().all_reduce(&any, 1, DType::I32, comm::ReduceOp::Max);
  return any != 0;
}

void EngineImpl::idle_step() {
  StepBatch b;
  b.input_ids = {0};
  b.positions = {0};
  b.slot_mapping = {int32_t(BlockPool::kNullBlock) * int32_t(cfg_.block_size)};
  b.cu_q = {0, 1};
  b.seq_lens = {1};
  b.block_tables = {int32_t(BlockPool::kNullBlock)};
  b.max_blocks = 1;
  ++stats_.idle_steps;
  (void)runner_.execute(b);  // no sample rows: no logits
}

std::vector<RequestOutput> EngineImpl::step() {
  if (asleep_) KS_FAIL("rollout engine: step() while asleep; call wake_up() first");
  std::vector<RequestOutput> finished;
  if (!sched_.has_unfinished()) {
    if (model_.ep().size() > 1) idle_step();  // run_to_completion calls it only while another ep rank has work
    return finished;
  }
  SchedulerOutput so = sched_.schedule();
  KS_CHECK(!so.empty(), "the scheduler made no progress with ", sched_.running().size(), " running, ",
           sched_.waiting().size(), " waiting and ", sched_.swapped().size(), " swapped sequences");
  ++stats_.steps;
  stats_.computed_tokens += so.num_tokens;
  kv_.swap_out(so.swap_out);
  kv_.swap_in(so.swap_in);

  const StepBatch batch = build_step_batch(so, cfg_.block_size);
  if (model_.tp().size() > 1) check_lockstep(model_.tp(), batch, stats_.steps);
  // [S, V], model dtype, identical on every tp rank; a uniform decode step may replay a CUDA graph.
  const bool graphed = graphs_ && graphs_->fits(batch);
  if (graphs_ && !graphed && graphs_->too_large(batch)) ++stats_.cuda_graph_too_large;
  const Tensor logits = graphed ? graphs_->run(batch) : runner_.execute(batch);
  const int64_t S = int64_t(batch.sample_rows.size()), V = model_.config().vocab_size;
  if (S == 0) return finished;

  // log-sum-exp of every sampled row with the trainer's own op, so
  // logprob = logit - lse is computed exactly as in scoring; on the logits'
  // device (the model's).
  const Device dev = logits.device();
  Tensor lse = Tensor::empty({S}, DType::F32, MemCategory::Activations, dev);  // [S]
  {
    // [S] no target: lse only
    const Tensor none = Tensor::from_host(std::vector<int32_t>(size_t(S), -1), {S}, MemCategory::Activations, dev);
    Tensor lp = Tensor::empty({S}, DType::F32, MemCategory::Activations, dev);  // [S]
    ops::logprob_entropy_fwd(logits, none, lp, nullptr, lse);
  }
  // Host copies for the sampler, which runs on the host whatever the model's
  // device (see the file comment): [S, V] logits (bf16/f16 widen exactly) and [S] lse.
  // bf16 logits widen to f32 where they are (exactly) and cross in one copy
  // into the reused host buffer: on a device, converting [S, V] element by
  // element on the host took longer than the decode step's kernels (an H200,
  // 64 rows of a 152k vocabulary); on the CPU, a fresh vector per step was
  // faulted in anew every step.
  if (logits.dtype() == DType::F32)
    logits.to_host(logits_host_);
  else  // an Activations buffer: the allocator's cache hands the same one back every step
    logits.to(DType::F32, MemCategory::Activations).to_host(logits_host_);
  const std::vector<float>& lf = logits_host_;
  const std::vector<float> lse_h = lse.to_host<float>();
  const float* L = lf.data();
  const float* lse_p = lse_h.data();

  // Which scheduled sequences sample, and how many samples each row feeds.
  std::vector<Sequence*> row_seq;
  for (const auto& ss : so.seqs)
    if (ss.samples) row_seq.push_back(ss.seq);
  struct Draw {
    int32_t token;
    float logprob;
    std::vector<std::pair<int32_t, float>> top;
  };
  std::vector<std::vector<Draw>> draws(static_cast<size_t>(S));
  const int nt = omp_get_max_threads();
  if (int64_t(scratch_.size()) < nt) scratch_.resize(size_t(nt));
  // Rows are independent and every draw is keyed by (seed, sample, position):
  // the split over threads cannot change any token.
#pragma omp parallel for schedule(dynamic, 4) if (S > 4)
  for (int64_t r = 0; r < S; ++r) {
    Sequence* s = row_seq[size_t(r)];
    const SamplingParams& p = s->req->params;
    const float* z = L + r * V;
    const int64_t n_draw = s->pending_fork ? p.n : 1;
    const int64_t position = s->num_tokens();  // where the new token goes
    SamplerScratch& sc = scratch_[size_t(omp_get_thread_num())];
    std::vector<std::pair<int32_t, float>> top;
    if (p.logprobs > 0) top = top_logprobs(z, V, lse_p[r], p.logprobs);
    for (int64_t k = 0; k < n_draw; ++k) {
      const uint64_t sample = p.sample_offset + uint64_t(s->pending_fork ? k : s->sample);
      const int32_t tok = sample_token(z, V, p, sample, position, sc);
      draws[size_t(r)].push_back({tok, z[tok] - lse_p[r], top});
    }
  }

  std::vector<Request*> done;
  std::vector<std::pair<int32_t, int32_t>> fork_copies;
  for (int64_t r = 0; r < S; ++r) {
    Sequence* s = row_seq[size_t(r)];
    Request& req = *s->req;
    std::vector<Sequence*> stopped;
    if (s->pending_fork) {
      std::vector<Sequence*> children;
      for (int64_t k = 1; k < req.params.n; ++k) {
        auto c = std::make_unique<Sequence>();
        c->id = next_seq_id_++;
        c->req = &req;
        c->sample = k;
        c->tokens = req.prompt;
        c->prompt_len = s->prompt_len;
        c->hash_key = s->hash_key;
        children.push_back(c.get());
        req.seqs.push_back(std::move(c));
      }
      // The children reference the prompt's blocks before anything can finish and free them.
      auto copies = sched_.fork(s, children);
      fork_copies.insert(fork_copies.end(), copies.begin(), copies.end());
      for (int64_t k = 1; k < req.params.n; ++k) {
        Draw& d = draws[size_t(r)][size_t(k)];
        Sequence* c = children[size_t(k - 1)];
        if (append_token(c, d.token, d.logprob, std::move(d.top))) stopped.push_back(c);
      }
    }
    Draw& d = draws[size_t(r)][0];
    if (append_token(s, d.token, d.logprob, std::move(d.top))) stopped.push_back(s);
    // Copy the forked tail blocks before a finishing parent frees its own.
    kv_.copy_blocks(fork_copies);
    fork_copies.clear();
    for (Sequence* f : stopped) {
      // Children first, then the parent: a child without blocks reads the
      // prompt's rows through the parent's table while the parent still holds it.
      if (kv_.has_routing()) collect_routing(f, f->blocks.empty() ? *s : *f);
      sched_.finish(f);
      if (++req.num_finished == int64_t(req.params.n)) done.push_back(&req);
    }
  }
  for (Request* rq : done) {
    finished.push_back(make_output(*rq));
    requests_.erase(rq->id);
  }
  return finished;
}

std::vector<RequestOutput> EngineImpl::run_to_completion(const FinishedFn& on_finished) {
  std::vector<std::pair<int64_t, RequestOutput>> all;
  std::map<std::string, int64_t> order;
  for (const auto& [id, r] : requests_) order[id] = r->order;
  // Under expert parallelism every step is collective over the ep group: the
  // ranks step together until the last one's requests finish.
  const bool ep = model_.ep().size() > 1;
  while (ep ? group_unfinished() : has_unfinished())
    for (auto& o : step()) {
      if (on_finished) on_finished(o);
      all.emplace_back(order.count(o.request_id) ? order[o.request_id] : 0, std::move(o));
    }
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<RequestOutput> out;
  for (auto& [k, o] : all) out.push_back(std::move(o));
  return out;
}

void EngineImpl::update_weights_version() {
  ++weights_version_;
  // New sequences hash under the new version, so stale blocks can never hit;
  // dropping the map also frees the memory of the index. In-flight sequences
  // keep their version (their K/V predates the update: a partial rollout).
  pool_.reset_prefix_cache();
  runner_.packs().clear();  // packed from the old weights
}

void EngineImpl::sleep() {
  if (asleep_) return;
  runner_.packs().clear();  // their memory goes back to training too
  // The graphs point into the KV cache freed below: dropped with their pool,
  // captured again at the first decode step after wake_up().
  if (graphs_) graphs_->release();
  // In-flight sequences lose their K/V and recompute after wake_up().
  sched_.preempt_all();
  KS_CHECK(pool_.reset_prefix_cache(), "blocks still referenced after preempting everything");
  kv_.release();
  asleep_ = true;
}

void EngineImpl::wake_up() {
  if (!asleep_) return;
  kv_.allocate();
  asleep_ = false;
}

EngineStats EngineImpl::stats() const {
  EngineStats s = stats_;
  const auto& c = sched_.counters();
  s.prefix_cache_queries = c.prefix_queries;
  s.prefix_cache_hits = c.prefix_hits;
  s.preemptions = c.preemptions;
  s.swapped_out_blocks = c.swapped_out_blocks;
  s.swapped_in_blocks = c.swapped_in_blocks;
  s.num_blocks = pool_.num_blocks();
  s.free_blocks = pool_.num_free();
  s.weights_version = int64_t(weights_version_);
  s.packed_weights = runner_.packs().count();
  s.packed_weight_bytes = runner_.packs().bytes();
  s.stale_weight_repacks = runner_.packs().stale_repacks();
  if (graphs_) {
    s.cuda_graph_captures = graphs_->captures();
    s.cuda_graph_replays = graphs_->replays();
    s.cuda_graph_padding_rows = graphs_->padding_rows();
  }
  return s;
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const model::CausalLM& model, const EngineConfig& cfg) {
  const auto& c = model.config();
  const char* w = "rollout engine config";
  if (cfg.block_size <= 0) return KS_ERR(w, ": block_size must be > 0, got ", cfg.block_size);
  if (cfg.max_num_batched_tokens <= 0)
    return KS_ERR(w, ": max_num_batched_tokens must be > 0, got ", cfg.max_num_batched_tokens);
  if (cfg.max_num_seqs <= 0) return KS_ERR(w, ": max_num_seqs must be > 0, got ", cfg.max_num_seqs);
  if (cfg.preemption_mode != "recompute" && cfg.preemption_mode != "swap")
    return KS_ERR(w, ": preemption_mode must be 'recompute' or 'swap', got '", cfg.preemption_mode, "'");
  if (!(cfg.swap_space_gib >= 0)) return KS_ERR(w, ": swap_space must be >= 0 GiB, got ", cfg.swap_space_gib);
  if (cfg.num_blocks < 0 || (cfg.num_blocks == 0 && cfg.kv_cache_bytes <= 0))
    return KS_ERR(w, ": give num_blocks > 0 or kv_cache_bytes > 0");
  if (c.sliding_window > 0) return KS_ERR("not supported yet: sliding-window attention in the rollout engine");
  if (!cfg.enforce_eager) {
    auto sizes = capture_sizes(cfg.cudagraph_capture_sizes, cfg.max_num_seqs, cfg.max_num_batched_tokens);
    if (!sizes.is_ok()) return sizes.status();
  }
  if (cfg.record_routing && model.num_moe_layers() == 0)
    return KS_ERR(w, ": record_routing (actor_rollout_ref.rollout.enable_rollout_routing_replay) needs a "
                  "mixture-of-experts model; ", io::arch_name(c.arch), " has no MoE layer (turn it off)");
  KVGeometry g = kv_geometry(model, cfg.block_size, cfg.record_routing);
  g.num_blocks = cfg.num_blocks > 0 ? cfg.num_blocks : cfg.kv_cache_bytes / g.bytes_per_block();
  if (g.num_blocks < 2)
    return KS_ERR(w, ": kv_cache_bytes ", cfg.kv_cache_bytes, " holds fewer than 2 blocks of ", g.bytes_per_block(),
                  " bytes (raise kv_cache_bytes or lower block_size)");
  int64_t max_len = cfg.max_model_len > 0 ? cfg.max_model_len : c.max_position_embeddings;
  const int64_t rope_len = model.rope().cos.defined() ? model.rope().cos.size(0) : max_len;
  if (max_len <= 0) max_len = rope_len;
  if (max_len > rope_len)
    return KS_ERR(w, ": max_model_len ", max_len, " exceeds the model's RoPE table (", rope_len,
                  " positions; raise ModelOptions::max_positions or lower max_model_len)");
  return std::unique_ptr<Engine>(new EngineImpl(model, cfg, g, max_len));
}

Result<int64_t> kv_cache_bytes_for(double utilization, int64_t memory_bytes, int64_t weight_bytes) {
  constexpr const char* kKey = "actor_rollout_ref.rollout.gpu_memory_utilization";
  if (!(utilization > 0 && utilization <= 1))
    return KS_ERR(kKey, " must be in (0, 1], got ", utilization);
  const double budget = utilization * double(memory_bytes);
  const double kv = budget - double(weight_bytes);
  if (kv <= 0)
    return KS_ERR(kKey, "=", utilization, " of ", memory_bytes, " bytes of memory (", int64_t(budget),
                  " bytes) does not hold the rollout weights (", weight_bytes,
                  " bytes) and a KV cache; raise it, or set KESTREL_DEVICE_MEMORY (bytes) when the memory is wrong");
  return int64_t(kv);
}

Result<int64_t> parse_meminfo_total(const std::string& text) {
  const size_t at = text.find("MemTotal:");
  if (at == std::string::npos) return KS_ERR("/proc/meminfo has no MemTotal line");
  size_t pos = at + 9;
  while (pos < text.size() && text[pos] == ' ') ++pos;
  size_t end = pos;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  if (end == pos) return KS_ERR("/proc/meminfo: cannot read the MemTotal value");
  const int64_t kib = std::stoll(text.substr(pos, end - pos));
  return kib * 1024;  // the kernel writes "kB", meaning KiB
}

Result<int64_t> device_memory_bytes(int64_t ranks_sharing) {
  if (const char* e = std::getenv("KESTREL_DEVICE_MEMORY"); e && *e) {
    char* endp = nullptr;
    const long long v = std::strtoll(e, &endp, 10);
    if (*endp != '\0' || v <= 0) return KS_ERR("KESTREL_DEVICE_MEMORY must be a positive number of bytes, got '", e, "'");
    return int64_t(v);
  }
  std::ifstream f("/proc/meminfo");
  if (!f) return KS_ERR("cannot read /proc/meminfo; set KESTREL_DEVICE_MEMORY to the memory in bytes");
  std::stringstream ss;
  ss << f.rdbuf();
  KS_ASSIGN(const int64_t total, parse_meminfo_total(ss.str()));
  return total / std::max<int64_t>(1, ranks_sharing);
}

int64_t weight_bytes(const model::CausalLM& model) {
  int64_t buffers = 0;
  for (model::Param* p : const_cast<model::CausalLM&>(model).buffers()) buffers += int64_t(p->weight.nbytes());
  return model.num_parameters() * int64_t(dtype_size(model.dtype())) + buffers;
}

int64_t buffer_bytes(const io::ModelConfig& cfg) {
  if (!cfg.moe.score_correction_bias) return 0;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) moe_layers += cfg.is_moe_layer(l) ? 1 : 0;
  return moe_layers * cfg.moe.num_experts * int64_t(sizeof(float));
}

int64_t kv_bytes_per_token(const model::CausalLM& model) {
  return kv_geometry(model, 1, false).kv_bytes_per_token();
}

}  // namespace kestrel::rollout
