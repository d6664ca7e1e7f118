// Pipeline-parallel execution of a mini-batch (Megatron's
// forward_backward_pipelining_{without,with}_interleaving): every rank of the
// model's pipeline group (CausalLM::pp()) holds its stage, a slice of blocks
// (model chunks under the interleaved schedule), and runs its op list from
// train/pipeline_schedule.h; activations go forward and their gradients back
// over the pp group, point to point.
//
// Virtual stage s = chunk * p + rank (p = pp size): chunk c of rank r feeds
// rank r + 1's chunk c, and the last rank's chunk c feeds rank 0's chunk c+1.
// The embedding is chunk 0 of rank 0, the head (and the loss) the last chunk
// of rank p - 1.
//
// Wire format (variable-length packed micro-batches, nothing padded to a
// fixed length): each transfer is a header, int64 [rows, cols] on the host,
// then the payload, [rows, D] in the compute dtype forward and f32 backward,
// on the model's device (over NCCL there, MPI on the CPU), on a tag naming
// the receiving (micro-batch, chunk) and the direction. The receiver knows
// the shape from its own copy of the micro-batch and checks the header
// against it. NCCL has no tags and a send may wait on the stream until its
// receiver posts, so every rank posts its sends and receives where
// train::plan_transfers puts them (pipeline_schedule.h): before each op, one
// group (one NCCL group) of the transfers due then, in one global order
// shared by both ends of every transfer; a pair's messages so match in
// posting order and no rank waits on a peer that waits on it. Sends are
// non-blocking (the sender computes on) and a receive is posted as soon as
// the schedule's timing says its input exists, so transfers overlap compute
// as far as the transport progresses them.
#pragma once
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "model/scoring.h"
#include "model/transformer.h"
#include "train/pipeline_schedule.h"

namespace kestrel::train {

struct MicroBatch;

// The loss of micro-batch `mb` on the head's output (logits [T, V/tp] or
// values [T, 1], compute dtype), and the f32 gradient of that output the
// backward takes. Called on the last stage only, in micro-batch order.
using HeadLossFn = std::function<std::pair<double, Tensor>(size_t mb, const Tensor& out)>;

// What one rank executed, for the schedule's measurements (bubble, memory in
// flight, bytes on the wire).
struct PipelineTrace {
  std::vector<PipeOp> ops;          // in execution order
  int64_t peak_in_flight = 0;       // (micro-batch, chunk) forwards whose backward had not run yet, at most
  int64_t bytes_sent = 0;           // headers and payloads
  int64_t bytes_received = 0;
};

// Forward and backward of every micro-batch (1F1B; interleaved 1F1B when the
// model holds several chunks, Megatron's group size `group_size`, 0 = p).
// Gradients accumulate into the stage's Param::grad. Returns the sum of the
// losses, the same value on every pp rank (sent from the last stage).
// Collective over the pp group (and each stage's tp group).
double pipeline_train(model::CausalLM& model, const std::vector<MicroBatch>& micro, const HeadLossFn& loss,
                      int64_t group_size = 0, PipelineTrace* trace = nullptr);

// Forward only (scoring): consume(i, out) on every pp rank, in micro-batch
// order, with the last stage's result for micro-batch i: f32 [T] next-token
// log-probs for a token model, values [T, 1] (compute dtype) for a value model.
void pipeline_score(const model::CausalLM& model, const std::vector<MicroBatch>& micro,
                    const std::function<void(size_t, const Tensor&)>& consume, PipelineTrace* trace = nullptr);

// model::score_tokens through the pipeline: one packed batch's next-token
// log-probs and entropies, f32 [T] each, on every pp rank (kestrel logprobs).
model::TokenScores pipeline_score_tokens(const model::CausalLM& model, const model::PackedBatch& batch);

}  // namespace kestrel::train
