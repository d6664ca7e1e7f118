// Context parallelism's split of a packed batch (Megatron / MindSpeed zigzag,
// per sequence): a sequence of L tokens is padded to P = L rounded up to a
// multiple of 2*cp, cut into 2*cp chunks of c = P / (2*cp) rows, and cp rank r
// holds chunks r and 2*cp-1-r, in that order. Every rank holds 2c rows of
// every sequence, so all ranks hold the same number of rows Tl = sum(P) / cp
// and every non-attention op runs on the rank's rows alone.
//
// Pad rows (padded index >= L) carry token id -1 (the embedding gives a zero
// row), target -1 (never reaches a loss), and positions continuing the
// sequence's, so they sit after every real row of their sequence and no real
// query ever attends to them.
//
// The attention works on a "work layout" that depends on the algorithm,
// ulysses degree u (cp % u == 0), ring degree R = cp / u:
//  - Ulysses (u = cp): the whole padded batch in natural order (the rows of
//    all cp ranks, gathered by the all-to-all), sequence b padded to P_b rows.
//  - Ring (u = 1): the rank's own local rows (no gather).
//  - Hybrid: the rows of the rank's Ulysses group (cp ranks g*u .. g*u+u-1,
//    g = r / u), per sequence its "early" half (padded rows [g*u*c, (g+1)*u*c))
//    then its "late" half (rows [(2R-1-g)*u*c, (2R-g)*u*c)): the zigzag split
//    again at the ring's level, over R groups, with chunks of u*c rows.
// In every case the work layout holds, per sequence, an early half and a late
// half of equal length (for u = cp they are simply adjacent), and the ring
// attends over R such groups.
//
// Pure host arithmetic: this header needs no process group except for
// cp_gather_rows. The layer cannot see model::PackedBatch (model sits above
// parallel), so the split takes the packed batch's host mirrors; the model
// builds its local PackedBatch from CpLayout::local (PackedBatch::cp points at
// the layout).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ops/attention.h"

namespace kestrel::parallel {

// The context-parallel algorithms (MindSpeed's context_parallel_algo values).
enum class CpAlgo { Ulysses, Ring, Hybrid };
const char* cp_algo_name(CpAlgo a);  // "ulysses_cp_algo", "megatron_cp_algo", "hybrid_cp_algo"
// "ulysses_cp_algo" | "megatron_cp_algo" | "hybrid_cp_algo"; anything else fails naming the three.
CpAlgo parse_cp_algo(const std::string& name);
// The Ulysses degree of an algorithm: cp (Ulysses), 1 (ring) or the hybrid's
// ulysses_degree_in_cp, which must divide cp and lie strictly between 1 and cp.
int cp_ulysses_degree(CpAlgo algo, int cp, int ulysses_degree_in_cp);

// The head constraints of Ulysses (the all-to-all splits the heads of a
// tensor-parallel rank u ways): num_attention_heads / tp divisible by u; kv
// heads per tp rank divisible by u, or u divisible by them (then each rank
// receives a copy of the kv head of its query heads). Messages name the numbers.
Status check_cp_heads(int64_t n_heads, int64_t n_kv_heads, int tp, int cp, int ulysses_degree);

// The packed batch to split (model::PackedBatch::host, read only): full sequences
// (no prefix_of: prompt sharing is off under context parallelism).
struct CpBatchView {
  const std::vector<int32_t>* cu_seqlens = nullptr;  // [B+1]
  const std::vector<int32_t>* positions = nullptr;   // [T], increasing within each sequence
};

struct CpLayout {
  int cp = 1, rank = 0;  // the cp group's size and this rank's index in it
  int ulysses = 1;       // u, the Ulysses degree (cp: Ulysses, 1: ring)
  int ring() const { return cp / ulysses; }
  int ring_index() const { return rank / ulysses; }     // g: this rank's Ulysses group = its place on the ring
  int ulysses_index() const { return rank % ulysses; }  // j: this rank's place in its Ulysses group

  int64_t num_seqs = 0;       // B
  int64_t full_tokens = 0;    // T, the real rows of the full batch
  int64_t padded_tokens = 0;  // sum of the padded lengths P_b (= cp * local_tokens)
  int64_t local_tokens = 0;   // Tl, this (and every) rank's rows
  int64_t work_tokens = 0;    // Tg = u * Tl, the rows of the work layout
  std::vector<int64_t> seq_len;  // [B] real length L_b
  std::vector<int64_t> chunk;    // [B] chunk length c_b = P_b / (2*cp)

  // This rank's rows, per sequence chunk r then chunk 2cp-1-r.
  struct Local {
    std::vector<int32_t> cu_seqlens;  // [B+1], 2*c_b rows per sequence (NOT contiguous positions)
    std::vector<int32_t> positions;   // [Tl] position in the sequence, pads continuing it
    std::vector<int32_t> full_row;    // [Tl] row of the full batch, -1 for a pad row
    int64_t max_seqlen = 0;           // the largest local position + 1 (pads count)
  } local;
  // The per-row values (ids, targets, ...) of the full batch [T] taken to the
  // local rows [Tl], `pad` on pad rows.
  std::vector<int32_t> take_local(const std::vector<int32_t>& full, int32_t pad) const;
  // i32 [Tl]: full row of each local row, T for a pad row (a gather_rows index
  // into the full tensor with one fill row appended; cp_local_rows).
  Tensor local_rows_in_full;
  // i32 [T]: for each full row, its row in the rank-major all-gather of every
  // rank's local rows ([cp * Tl]; cp_gather_rows).
  Tensor full_rows_in_gathered;

  // The attention's work layout (see the top of the file).
  struct Work {
    Tensor cu_seqlens;                // i32 [B+1], 2*u*c_b rows per sequence; u = cp: the full padded batch's
    std::vector<int32_t> cu_host;     // the same on the host
    std::vector<int32_t> positions;   // [Tg] of this rank's Ulysses group
    std::vector<int32_t> full_row;    // [Tg] row of the full batch, -1 for a pad row
    // u > 1, gather_rows indices between the rank-major rows the Ulysses
    // all-to-all delivers (block j: rank g*u+j's local rows) and the work rows:
    Tensor rows_in_gathered;  // i32 [Tg]: work row w = gathered row [w]
    Tensor gathered_in_work;  // i32 [Tg]: gathered row i = work row [i]
    // R > 1: the block pairing of this group's queries with the k/v of ring
    // group h, [R] indexed by h. h == g: causal within the group's rows; h < g:
    // every query row against h's early half only; h > g: only the late half's
    // queries, against all of h's rows. Every pairing outside a block is fully
    // masked by position, so each step computes half a block (for h != g)
    // instead of a masked whole one. The h != g blocks describe 2B sequences
    // (each real one followed or preceded by an empty-q or empty-k partner).
    std::vector<ops::AttentionBlock> ring_blocks;
  } work;
};

// The split of a packed batch for cp rank `rank` with Ulysses degree u
// (cp % u == 0). Fails on prefix sharing, inconsistent host arrays, or
// positions that do not increase within a sequence. The layout's tensors (row
// indices, cu_seqlens, positions of the ring's blocks) are computed on the
// host and uploaded to `dev`, where the kernels that read them run; the host
// vectors stay for bookkeeping.
CpLayout make_cp_layout(const CpBatchView& batch, int cp, int rank, int ulysses_degree, Device dev = Device::CPU);
std::shared_ptr<const CpLayout> make_cp_layout_ptr(const CpBatchView& batch, int cp, int rank, int ulysses_degree,
                                                   Device dev = Device::CPU);
// The same layout with its tensors copied to `dev` (model::to_device of a cp
// rank's batch); the host vectors are shared as they are.
CpLayout cp_layout_on(const CpLayout& layout, Device dev);

// The full batch's rows [T, ...] of a per-row tensor of every rank's local rows
// [Tl, ...] (log-probs, entropies, values for scoring), pad rows dropped; every
// rank gets all of them, on local's device (the layout's tensors must be
// there too). Collective over the cp group (one all-gather).
Tensor cp_gather_rows(comm::ProcessGroup& cp_group, const CpLayout& layout, const Tensor& local,
                      MemCategory cat = MemCategory::Activations);
// This rank's rows [Tl, ...] of a per-row tensor of the full batch [T, ...]
// (advantages, old log-probs, masks of the loss), `pad_fill` on pad rows; on full's device.
Tensor cp_local_rows(const CpLayout& layout, const Tensor& full, float pad_fill,
                     MemCategory cat = MemCategory::Activations);

}  // namespace kestrel::parallel
