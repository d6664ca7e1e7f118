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

// Tags name the receiving (micro-batch, chunk) and the direction; MPI
// guarantees at least 32767 tags, and two messages that share a tag after
// wrapping travel between one pair in the order both sides run them. NCCL
// ignores tags: there the order of plan_transfers matches the messages.
int tag_for(const PipeOp& consumer, int v) {
  const int64_t d = consumer.kind == PipeOpKind::Forward ? 0 : 1;
  return 1 + int(((consumer.micro_batch * v + consumer.chunk) * 2 + d) % 32000);
}

// A transfer in flight with the buffers it reads or writes.
struct Transfer {
  std::unique_ptr<std::array<int64_t, 2>> header = std::make_unique<std::array<int64_t, 2>>();  // host [rows, cols]
  Tensor payload;  // [rows, D] on the model's device
  std::unique_ptr<comm::PendingTransfer> header_tr, payload_tr;
  void wait() {
    if (header_tr) header_tr->wait();
    if (payload_tr) payload_tr->wait();
  }
  bool test() { return (!header_tr || header_tr->test()) && (!payload_tr || payload_tr->test()); }
};

// Where each op's input comes from and its output goes, over the pp group,
// at the times plan_transfers gives: before op k the transfers of slot k
// are posted in the plan's order and issued together (the pp group's
// queued transfers go out as one NCCL group at their first test(): a send
// and a receive of one slot never wait on each other). Both ends of every
// transfer post it at the same place of one global order (the plan's
// argument), so between any two ranks the sends of one and the receives of
// the other are posted in the same order (NCCL matches them in posting
// order, without tags) and no rank waits on a peer that waits on it.
//
// The 16-byte header stays on the host (the MPI group, tagged): the
// receiver checks it against the shape it expects, which catches stages
// that formed different micro-batches.
class Wire {
 public:
  // rows(mb): micro-batch mb's hidden rows on this rank (model::CausalLM::hidden_rows).
  Wire(const model::CausalLM& m, std::vector<std::vector<PipeTransfer>> slots,
       std::function<int64_t(int64_t)> rows, PipelineTrace* trace)
      : m_(m), pp_(m.pp()), v_(int(m.num_chunks())), slots_(std::move(slots)), rows_(std::move(rows)),
        trace_(trace) {}
  ~Wire() {
    for (auto& s : sends_) s.wait();
  }

  // Posts and issues slot k (k = the number of ops: after the last op).
  // Frees the buffers of completed sends first (Megatron's
  // deallocate_pipeline_outputs: a sent activation is not held until the
  // step ends).
  void run_slot(size_t k) {
    for (auto it = sends_.begin(); it != sends_.end();) it = it->test() ? sends_.erase(it) : std::next(it);
    std::vector<comm::PendingTransfer*> posted;
    for (const PipeTransfer& t : slots_.at(k)) posted.push_back(t.from == pp_.rank() ? send(t) : post_recv(t));
    for (comm::PendingTransfer* p : posted) p->test();  // issues them (one NCCL group), progresses MPI
  }

  // Holds op's output until its slot sends it (nothing when op sends nothing).
  void output(const PipeOp& op, Tensor t) {
    const auto tr = transfer_of(op, pp_.rank(), pp_.size(), v_);
    if (tr) outbox_.emplace(Key::of(tr->to, tr->consumer), std::move(t));
  }

  // op's input, received in this or an earlier slot: [rows, D], the compute
  // dtype forward, f32 backward.
  Tensor input(const PipeOp& op) {
    auto it = recvs_.find(Key::of(-1, op));
    KS_CHECK(it != recvs_.end(), "pipeline: stage ", pp_.rank(), " runs ", to_string(op),
             " before the plan received its input");
    Transfer r = std::move(it->second);
    recvs_.erase(it);
    r.wait();
    const int64_t rows = rows_(op.micro_batch), D = m_.config().hidden_size;
    const auto& h = *r.header;
    KS_CHECK(h[0] == rows && h[1] == D, "pipeline: stage ", pp_.rank(), " expected ",
             op.kind == PipeOpKind::Forward ? "activations" : "gradients", " [", rows, ", ", D, "] for ",
             to_string(op), ", the header says [", h[0], ", ", h[1],
             "]: the stages disagree on the micro-batches (every pp rank must form the same ones)");
    if (trace_) trace_->bytes_received += 16 + int64_t(r.payload.nbytes());
    return r.payload;
  }

  // After the last slot: every output was sent and every input taken.
  void check_done() const {
    KS_CHECK(outbox_.empty() && recvs_.empty(), "pipeline: stage ", pp_.rank(), " ends the step with ",
             outbox_.size(), " outputs unsent and ", recvs_.size(), " inputs unused (the transfer plan is wrong)");
  }

 private:
  // A transfer by its consumer op, and the peer for an output (-1: this rank's input).
  struct Key {
    int peer, kind;
    int64_t mb;
    int chunk;
    static Key of(int peer, const PipeOp& op) { return {peer, int(op.kind), op.micro_batch, op.chunk}; }
    bool operator<(const Key& o) const {
      return std::tie(peer, kind, mb, chunk) < std::tie(o.peer, o.kind, o.mb, o.chunk);
    }
  };

  comm::PendingTransfer* send(const PipeTransfer& t) {
    auto it = outbox_.find(Key::of(t.to, t.consumer));
    KS_CHECK(it != outbox_.end(), "pipeline: stage ", pp_.rank(), " must send ", to_string(t.consumer),
             "'s input to pp rank ", t.to, " before computing it (the transfer plan is wrong)");
    Transfer s;
    s.payload = std::move(it->second);  // kept alive until the send completes
    outbox_.erase(it);
    (*s.header)[0] = s.payload.size(0), (*s.header)[1] = s.payload.size(1);
    const int tag = tag_for(t.consumer, v_);
    s.header_tr = pp_.isend(s.header->data(), 2, DType::I64, t.to, tag);
    s.payload_tr = pp_.isend(s.payload, t.to, tag);
    if (trace_) trace_->bytes_sent += 16 + int64_t(s.payload.nbytes());
    sends_.push_back(std::move(s));
    return sends_.back().payload_tr.get();
  }

  comm::PendingTransfer* post_recv(const PipeTransfer& t) {
    const PipeOp& op = t.consumer;
    const DType dt = op.kind == PipeOpKind::Forward ? m_.dtype() : DType::F32;
    Transfer r;
    r.payload = Tensor::empty({rows_(op.micro_batch), m_.config().hidden_size}, dt, MemCategory::Activations,
                              m_.device());
    const int tag = tag_for(op, v_);
    r.header_tr = pp_.irecv(r.header->data(), 2, DType::I64, t.from, tag);
    r.payload_tr = pp_.irecv(r.payload, t.from, tag);
    auto [it, fresh] = recvs_.emplace(Key::of(-1, op), std::move(r));
    KS_CHECK(fresh, "pipeline: stage ", pp_.rank(), " receives ", to_string(op), "'s input twice");
    return it->second.payload_tr.get();
  }

  const model::CausalLM& m_;
  comm::ProcessGroup& pp_;
  int v_;
  std::vector<std::vector<PipeTransfer>> slots_;
  std::function<int64_t(int64_t)> rows_;
  PipelineTrace* trace_;
  std::deque<Transfer> sends_;
  std::map<Key, Transfer> recvs_;
  std::map<Key, Tensor> outbox_;  // outputs computed, not yet sent
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

// This rank's slots of plan_transfers over every pp rank's op list.
std::vector<std::vector<PipeTransfer>> plan_for(const Geometry& g, const std::vector<std::vector<PipeOp>>& all) {
  auto plan = plan_transfers(all, g.v, g.r);
  KS_CHECK(plan.is_ok(), "pipeline: ", plan.status().message());
  return std::move(plan).value();
}

// Every pp rank's op list of a training step ([pp rank][op]): 1F1B, or
// interleaved 1F1B with several chunks. Each rank makes them all (they are
// arithmetic), so all agree on the transfer plan.
std::vector<std::vector<PipeOp>> train_schedules(const model::CausalLM& m, const Geometry& g, int64_t M,
                                                 int64_t group_size) {
  std::vector<std::vector<PipeOp>> all(size_t(g.p));
  if (g.v == 1) {
    for (int r = 0; r < g.p; ++r) all[size_t(r)] = schedule_1f1b(g.p, r, M);
    return all;
  }
  for (int r = 0; r < g.p; ++r) {
    auto s = schedule_interleaved_1f1b(g.p, r, M, g.v, group_size);
    if (s) {
      all[size_t(r)] = std::move(s).value();
      continue;
    }
    // Megatron refuses such a step (the same answer for every rank). A
    // dynamic micro-batch split (token budgets) can produce one mid-run, so
    // the step runs all forwards then all backwards instead: the same
    // gradients, more activations in flight. Said once per process.
    static bool warned = false;
    if (!warned && m.pp().rank() == 0 && m.tp().rank() == 0)
      std::fprintf(stderr, "warning: %s; this mini-batch (and any other such) runs all forwards, then all "
                           "backwards (same result, more activation memory)\n", s.status().message().c_str());
    warned = true;
    for (int q = 0; q < g.p; ++q) all[size_t(q)] = schedule_all_forward_all_backward(g.p, q, M, g.v, group_size);
    return all;
  }
  return all;
}

double broadcast_from_last(comm::ProcessGroup& pp, double v) {
  pp.broadcast(&v, int64_t(sizeof v), DType::U8, pp.size() - 1);  // the double's bytes, exactly
  return v;
}

}  // namespace

double pipeline_train(model::CausalLM& m, const std::vector<MicroBatch>& micro, const HeadLossFn& loss,
                      int64_t group_size, PipelineTrace* trace) {
  const Geometry g = geometry_of(m);
  const int64_t M = int64_t(micro.size());
  const std::vector<std::vector<PipeOp>> all = train_schedules(m, g, M, group_size);
  const std::vector<PipeOp>& ops = all[size_t(g.r)];
  Wire wire(m, plan_for(g, all), [&](int64_t mb) { return m.hidden_rows(micro[size_t(mb)].batch); }, trace);
  std::vector<model::Activations> acts(size_t(M * g.v));  // [mb * v + chunk]
  std::vector<Tensor> head_grad(static_cast<size_t>(M));  // the last stage's dout per micro-batch
  double total = 0;
  int64_t in_flight = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    const PipeOp& op = ops[k];
    wire.run_slot(k);
    const int c = op.chunk;
    const model::PackedBatch& b = micro[size_t(op.micro_batch)].batch;
    model::Activations& A = acts[size_t(op.micro_batch * g.v + c)];
    if (op.kind == PipeOpKind::Forward) {
      const Tensor in = g.first_virtual(c) ? Tensor() : wire.input(op);
      Tensor out = m.forward_hidden(b, in, A, c);
      if (g.last_virtual(c)) {
        auto [l, dout] = loss(size_t(op.micro_batch), out);
        total += l;
        head_grad[size_t(op.micro_batch)] = std::move(dout);
      } else {
        wire.output(op, std::move(out));
      }
      in_flight += 1;
    } else {
      const Tensor dout = g.last_virtual(c) ? std::move(head_grad[size_t(op.micro_batch)]) : wire.input(op);
      Tensor din = m.backward_hidden(b, A, dout, c);
      A = model::Activations();  // spent
      if (!g.first_virtual(c)) wire.output(op, std::move(din));
      in_flight -= 1;
    }
    if (trace) {
      trace->ops.push_back(op);
      trace->peak_in_flight = std::max(trace->peak_in_flight, in_flight);
    }
  }
  wire.run_slot(ops.size());
  wire.check_done();
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
  const int64_t M = int64_t(batches.size());
  std::vector<std::vector<PipeOp>> all(size_t(g.p));
  for (int r = 0; r < g.p; ++r) all[size_t(r)] = schedule_forward_only(g.p, r, M, g.v);
  const std::vector<PipeOp>& ops = all[size_t(g.r)];
  std::vector<std::vector<Tensor>> results(static_cast<size_t>(M));
  {
    Wire wire(m, plan_for(g, all), [&](int64_t mb) { return m.hidden_rows(*batches[size_t(mb)]); }, trace);
    for (size_t k = 0; k < ops.size(); ++k) {
      const PipeOp& op = ops[k];
      wire.run_slot(k);
      const int c = op.chunk;
      const model::PackedBatch& b = *batches[size_t(op.micro_batch)];
      const Tensor in = g.first_virtual(c) ? Tensor() : wire.input(op);
      Tensor out = m.forward_hidden_inference(b, in, c);
      if (!g.last_virtual(c)) {
        wire.output(op, std::move(out));
      } else {
        results[size_t(op.micro_batch)] = head(size_t(op.micro_batch), out);
      }
      if (trace) trace->ops.push_back(op);
    }
    wire.run_slot(ops.size());
    wire.check_done();
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
        if (m.is_value_model()) return {Tensor::empty({T, 1}, m.dtype(), MemCategory::Activations, m.device())};
        return {Tensor::empty({full_rows(*batches[i])}, DType::F32, MemCategory::Activations, m.device())};
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
        return {Tensor::empty({full_rows(b)}, DType::F32, MemCategory::Activations, m.device()),
                Tensor::empty({full_rows(b)}, DType::F32, MemCategory::Activations, m.device())};
      },
      [&](size_t, std::vector<Tensor>& r) { s.logprob = r[0], s.entropy = r[1]; }, nullptr);
  return s;
}

}  // namespace kestrel::train
