#include "train/pipeline.h"

#include <array>
#include <cstdio>
#include <deque>
#include <map>
#include <tuple>
#include <memory>

#include "model/scoring.h"
#include "parallel/cp_split.h"
#include "train/engine.h"

namespace kestrel::train {

namespace {

// The rows of a batch's token scores: the full batch's (a cp rank's share of a
// batch scores all of them, model/scoring.h).
int64_t full_rows(const model::PackedBatch& b) { return b.cp ? b.cp->full_tokens : b.num_tokens; }

}  // namespace

namespace {

enum Dir : int { kForward = 0, kBackward = 1 };

// Tags name the receiving (micro-batch, chunk) and the direction; MPI
// guarantees at least 32767 tags, and two messages that share a tag after
// wrapping travel between one pair in the order both sides run them.
int tag_for(int64_t mb, int chunk, int v, Dir d) { return 1 + int(((mb * v + chunk) * 2 + d) % 32000); }

// Where a chunk's forward input comes from and its output goes (virtual
// stage s = chunk * p + rank).
struct Peer {
  int rank, chunk;
};
Peer prev_stage(int r, int c, int p) { return r > 0 ? Peer{r - 1, c} : Peer{p - 1, c - 1}; }
Peer next_stage(int r, int c, int p) { return r < p - 1 ? Peer{r + 1, c} : Peer{0, c + 1}; }

// A transfer in flight with the buffers it reads or writes.
struct Transfer {
  std::unique_ptr<std::array<int64_t, 2>> header = std::make_unique<std::array<int64_t, 2>>();
  Tensor payload;
  std::unique_ptr<comm::PendingTransfer> header_tr, payload_tr;
  void wait() {
    if (header_tr) header_tr->wait();
    if (payload_tr) payload_tr->wait();
  }
  bool test() { return (!header_tr || header_tr->test()) && (!payload_tr || payload_tr->test()); }
};

class Wire {
 public:
  Wire(comm::ProcessGroup& pp, int v, PipelineTrace* trace) : pp_(pp), v_(v), trace_(trace) {}
  ~Wire() {
    for (auto& s : sends_) s.wait();
  }

  // Posts t (kept alive until the send completes) to `to`'s (mb, chunk).
  void send(const Tensor& t, Peer to, int64_t mb, Dir d) {
    Transfer s;
    (*s.header)[0] = t.size(0), (*s.header)[1] = t.size(1);
    s.payload = t;
    const int tag = tag_for(mb, to.chunk, v_, d);
    s.header_tr = pp_.isend(s.header->data(), 2, DType::I64, to.rank, tag);
    s.payload_tr = pp_.isend(t, to.rank, tag);
    if (trace_) trace_->bytes_sent += 16 + t.nbytes();
    sends_.push_back(std::move(s));
    reap();
  }

  // Frees the buffers of completed sends (Megatron's
  // deallocate_pipeline_outputs: a sent activation is not held until the
  // step ends). Called before every op.
  void reap() {
    for (auto it = sends_.begin(); it != sends_.end();) it = it->test() ? sends_.erase(it) : std::next(it);
  }

  // Posts the receive of this rank's (mb, chunk) input from `from`: [rows, D] of dt.
  void post_recv(Peer from, int64_t mb, int chunk, Dir d, int64_t rows, int64_t D, DType dt) {
    const Key k{mb, chunk, d};
    if (recvs_.count(k)) return;
    Transfer r;
    r.payload = Tensor::empty({rows, D}, dt, MemCategory::Activations);
    const int tag = tag_for(mb, chunk, v_, d);
    r.header_tr = pp_.irecv(r.header->data(), 2, DType::I64, from.rank, tag);
    r.payload_tr = pp_.irecv(r.payload, from.rank, tag);
    recvs_.emplace(k, std::move(r));
  }

  Tensor take(Peer from, int64_t mb, int chunk, Dir d, int64_t rows, int64_t D, DType dt) {
    post_recv(from, mb, chunk, d, rows, D, dt);
    auto it = recvs_.find(Key{mb, chunk, d});
    Transfer r = std::move(it->second);
    recvs_.erase(it);
    r.wait();
    const auto& h = *r.header;
    KS_CHECK(h[0] == rows && h[1] == D, "pipeline: stage ", pp_.rank(), " expected ",
             d == kForward ? "activations" : "gradients", " [", rows, ", ", D, "] for micro-batch ", mb, " chunk ",
             chunk, " from pp rank ", from.rank, ", the header says [", h[0], ", ", h[1],
             "]: the stages disagree on the micro-batches (every pp rank must form the same ones)");
    if (trace_) trace_->bytes_received += 16 + r.payload.nbytes();
    return r.payload;
  }

 private:
  struct Key {
    int64_t mb;
    int chunk;
    int d;
    bool operator<(const Key& o) const { return std::tie(mb, chunk, d) < std::tie(o.mb, o.chunk, o.d); }
  };
  comm::ProcessGroup& pp_;
  int v_;
  PipelineTrace* trace_;
  std::deque<Transfer> sends_;
  std::map<Key, Transfer> recvs_;
};

// The pipeline's geometry on this rank.
struct Geometry {
  int p, r, v;
  bool first_virtual(int c) const { return r == 0 && c == 0; }
  bool last_virtual(int c) const { return r == p - 1 && c == v - 1; }
};

Geometry geometry_of(const model::CausalLM& m) {
  return Geometry{m.pp().size(), m.pp().rank(), int(m.num_chunks())};
}

// Posts the receive op `op` will need, if any.
// (`batch`: op's micro-batch.)
void prefetch(Wire& w, const Geometry& g, const model::CausalLM& m, const model::PackedBatch& batch,
              const PipeOp& op) {
  const int c = op.chunk;
  const int64_t rows = m.hidden_rows(batch), D = m.config().hidden_size;
  if (op.kind == PipeOpKind::Forward && !g.first_virtual(c))
    w.post_recv(prev_stage(g.r, c, g.p), op.micro_batch, c, kForward, rows, D, m.dtype());
  if (op.kind == PipeOpKind::Backward && !g.last_virtual(c))
    w.post_recv(next_stage(g.r, c, g.p), op.micro_batch, c, kBackward, rows, D, DType::F32);
}

double broadcast_from_last(comm::ProcessGroup& pp, double v) {
  pp.broadcast(&v, int64_t(sizeof v), DType::U8, pp.size() - 1);  // the double's bytes, exactly
  return v;
}

}  // namespace

double pipeline_train(model::CausalLM& m, const std::vector<MicroBatch>& micro, const HeadLossFn& loss,
                      int64_t group_size, PipelineTrace* trace) {
  const Geometry g = geometry_of(m);
  const int64_t M = int64_t(micro.size()), D = m.config().hidden_size;
  std::vector<PipeOp> ops;
  if (g.v == 1) {
    ops = schedule_1f1b(g.p, g.r, M);
  } else {
    auto s = schedule_interleaved_1f1b(g.p, g.r, M, g.v, group_size);
    if (s) {
      ops = std::move(s).value();
    } else {
      // Megatron refuses such a step. A dynamic micro-batch split (token
      // budgets) can produce one mid-run, so the step runs all forwards then
      // all backwards instead: the same gradients, more activations in
      // flight. Said once per process.
      static bool warned = false;
      if (!warned && m.pp().rank() == 0 && m.tp().rank() == 0)
        std::fprintf(stderr, "warning: %s; this mini-batch (and any other such) runs all forwards, then all "
                             "backwards (same result, more activation memory)\n", s.status().message().c_str());
      warned = true;
      ops = schedule_all_forward_all_backward(g.p, g.r, M, g.v, group_size);
    }
  }
  Wire wire(m.pp(), g.v, trace);
  std::vector<model::Activations> acts(size_t(M * g.v));  // [mb * v + chunk]
  std::vector<Tensor> head_grad(static_cast<size_t>(M));                // the last stage's dout per micro-batch
  double total = 0;
  int64_t in_flight = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    const PipeOp& op = ops[k];
    wire.reap();
    if (k + 1 < ops.size()) prefetch(wire, g, m, micro[size_t(ops[k + 1].micro_batch)].batch, ops[k + 1]);
    const int c = op.chunk;
    const model::PackedBatch& b = micro[size_t(op.micro_batch)].batch;
    const int64_t rows = m.hidden_rows(b);
    model::Activations& A = acts[size_t(op.micro_batch * g.v + c)];
    if (op.kind == PipeOpKind::Forward) {
      Tensor in;
      if (!g.first_virtual(c)) in = wire.take(prev_stage(g.r, c, g.p), op.micro_batch, c, kForward, rows, D, m.dtype());
      Tensor out = m.forward_hidden(b, in, A, c);
      if (g.last_virtual(c)) {
        auto [l, dout] = loss(size_t(op.micro_batch), out);
        total += l;
        head_grad[size_t(op.micro_batch)] = std::move(dout);
      } else {
        wire.send(out, next_stage(g.r, c, g.p), op.micro_batch, kForward);
      }
      in_flight += 1;
    } else {
      Tensor dout = g.last_virtual(c) ? std::move(head_grad[size_t(op.micro_batch)])
                                      : wire.take(next_stage(g.r, c, g.p), op.micro_batch, c, kBackward, rows, D,
                                                  DType::F32);
      Tensor din = m.backward_hidden(b, A, dout, c);
      A = model::Activations();  // spent
      if (!g.first_virtual(c)) wire.send(din, prev_stage(g.r, c, g.p), op.micro_batch, kBackward);
      in_flight -= 1;
    }
    if (trace) {
      trace->ops.push_back(op);
      trace->peak_in_flight = std::max(trace->peak_in_flight, in_flight);
    }
  }
  return broadcast_from_last(m.pp(), total);
}

namespace {

// Forward only through the pipeline; head(i, out) on the last stage turns
// micro-batch i's head output into its results, which every pp rank then
// receives (shapes from like(i) on the other stages) and hands to consume.
using HeadResults = std::function<std::vector<Tensor>(size_t, const Tensor&)>;
using LikeResults = std::function<std::vector<Tensor>(size_t)>;
void forward_only(const model::CausalLM& m, const std::vector<const model::PackedBatch*>& batches,
                  const HeadResults& head, const LikeResults& like,
                  const std::function<void(size_t, std::vector<Tensor>&)>& consume, PipelineTrace* trace) {
  const Geometry g = geometry_of(m);
  const int64_t M = int64_t(batches.size()), D = m.config().hidden_size;
  const std::vector<PipeOp> ops = schedule_forward_only(g.p, g.r, M, g.v);
  std::vector<std::vector<Tensor>> results(static_cast<size_t>(M));
  {
    Wire wire(m.pp(), g.v, trace);
    for (size_t k = 0; k < ops.size(); ++k) {
      const PipeOp& op = ops[k];
      wire.reap();
      if (k + 1 < ops.size()) prefetch(wire, g, m, *batches[size_t(ops[k + 1].micro_batch)], ops[k + 1]);
      const int c = op.chunk;
      const model::PackedBatch& b = *batches[size_t(op.micro_batch)];
      Tensor in;
      if (!g.first_virtual(c))
        in = wire.take(prev_stage(g.r, c, g.p), op.micro_batch, c, kForward, m.hidden_rows(b), D, m.dtype());
      Tensor out = m.forward_hidden_inference(b, in, c);
      if (!g.last_virtual(c)) {
        wire.send(out, next_stage(g.r, c, g.p), op.micro_batch, kForward);
      } else {
        results[size_t(op.micro_batch)] = head(size_t(op.micro_batch), out);
      }
      if (trace) trace->ops.push_back(op);
    }
  }
  // Every pp rank gets the last stage's results, so callers see one process's data.
  for (int64_t i = 0; i < M; ++i) {
    std::vector<Tensor>& r = results[size_t(i)];
    if (g.r != g.p - 1) r = like(size_t(i));
    for (Tensor& t : r) m.pp().broadcast(t, g.p - 1);
    consume(size_t(i), r);
  }
}

}  // namespace

void pipeline_score(const model::CausalLM& m, const std::vector<MicroBatch>& micro,
                    const std::function<void(size_t, const Tensor&)>& consume, PipelineTrace* trace) {
  std::vector<const model::PackedBatch*> batches;
  for (const MicroBatch& mb : micro) batches.push_back(&mb.batch);
  forward_only(
      m, batches,
      [&](size_t i, const Tensor& out) -> std::vector<Tensor> {
        if (m.is_value_model()) return {out};  // [T, 1]
        return {model::score_logits(m, *batches[i], out).logprob};  // f32 [T]
      },
      [&](size_t i) -> std::vector<Tensor> {
        // Values: this rank's rows (the caller gathers them under cp); token
        // scores: the full batch's rows (score_logits gathers them).
        const int64_t T = batches[i]->num_tokens;
        if (m.is_value_model()) return {Tensor::empty({T, 1}, m.dtype(), MemCategory::Activations)};
        return {Tensor::empty({full_rows(*batches[i])}, DType::F32, MemCategory::Activations)};
      },
      [&](size_t i, std::vector<Tensor>& r) { consume(i, r[0]); }, trace);
}

model::TokenScores pipeline_score_tokens(const model::CausalLM& m, const model::PackedBatch& b) {
  KS_CHECK(!m.is_value_model(), "pipeline_score_tokens: a value model scores states, not tokens");
  model::TokenScores s;
  forward_only(
      m, {&b},
      [&](size_t, const Tensor& out) -> std::vector<Tensor> {
        model::TokenScores t = model::score_logits(m, b, out);
        return {t.logprob, t.entropy};
      },
      [&](size_t) -> std::vector<Tensor> {
        return {Tensor::empty({full_rows(b)}, DType::F32, MemCategory::Activations),
                Tensor::empty({full_rows(b)}, DType::F32, MemCategory::Activations)};
      },
      [&](size_t, std::vector<Tensor>& r) { s.logprob = r[0], s.entropy = r[1]; }, nullptr);
  return s;
}

}  // namespace kestrel::train
