// The process grid: how world ranks are arranged into tensor-, context-,
// data-, pipeline- and expert-parallel groups. The layout is Megatron-Core's
// (parallel_state.py RankGenerator): ranks are numbered along the order string
// "tp-cp-ep-dp-pp" with the leftmost dimension fastest, so the ranks of a TP
// group are adjacent (they share the fastest links). A group of kind "a-b"
// varies dims a and b and fixes all others. Experts use a second grid over the
// same ranks, "etp-ep-edp-pp" (MoE parallel folding), with expert DP derived.
//
// GridLayout is pure rank arithmetic (unit-testable on one process);
// ProcessGrid turns it into communicators by splitting a comm::World.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "comm/world.h"
#include "core/status.h"

namespace kestrel::parallel {

struct ParallelDims {
  int tp = 1;  // tensor_model_parallel_size
  int cp = 1;  // context_parallel_size
  int ep = 1;  // expert_model_parallel_size
  int etp = 0; // expert_tensor_parallel_size; 0 = same as tp (Megatron's default)
  int dp = 0;  // data_parallel_size; 0 = derived as world / (tp*cp*pp), else must equal that
  int pp = 1;  // pipeline_model_parallel_size
  bool sequence_parallel = false;
  // Megatron's order; "tp-cp-ep-pp-dp" is its --use-tp-pp-dp-mapping.
  std::string order = "tp-cp-ep-dp-pp";

  int expert_tp() const { return etp > 0 ? etp : tp; }
};

// What the model contributes to the divisibility rules; 0 means "not known, skip the check".
struct ModelFacts {
  int64_t n_heads = 0;     // num_attention_heads
  int64_t n_kv_heads = 0;  // num_key_value_heads (GQA query groups)
  int64_t n_layers = 0;    // num_hidden_layers
  int64_t vocab = 0;       // vocab_size as the embedding is allocated
  bool vocab_padded = false;  // the model pads vocab for tp itself (no divisibility rule)
  int64_t ffn = 0;         // intermediate_size
  int64_t n_experts = 0;   // num_experts (MoE); 0 = dense model
};

// Checks the grid against the world size and the model. All problems are
// reported in one message, "; "-separated, each naming the factors involved.
Status validate(const ParallelDims& dims, int world_size, const ModelFacts& model = {});
// Rejects parallelism the engine cannot run yet (the grid still computes it):
// "not supported yet: <key> > 1".
Status check_supported(const ParallelDims& dims);

enum class GroupKind {
  // dense grid
  Tp, Cp, Dp, DpCp, Pp, TpCp,
  Mp,  // tp-pp: the model-parallel group (non-distributed-optimizer grad norm)
  TpDp, TpDpCp,
  Embedding,          // first and last stage of each pp group (tied embedding grads)
  PositionEmbedding,  // first stage of each pp group
  // expert grid
  Ep, Etp, EtpEp, EtpEpPp, Edp,
};
inline constexpr GroupKind kAllGroupKinds[] = {
    GroupKind::Tp, GroupKind::Cp, GroupKind::Dp, GroupKind::DpCp, GroupKind::Pp, GroupKind::TpCp,
    GroupKind::Mp, GroupKind::TpDp, GroupKind::TpDpCp, GroupKind::Embedding, GroupKind::PositionEmbedding,
    GroupKind::Ep, GroupKind::Etp, GroupKind::EtpEp, GroupKind::EtpEpPp, GroupKind::Edp};
const char* group_kind_name(GroupKind k);  // "tp", "dp_cp", "etp_ep", ... (also the group's name())

class GridLayout {
 public:
  // Throws kestrel::Error with validate()'s message when the sizes do not fit.
  GridLayout(const ParallelDims& dims, int world_size);

  const ParallelDims& dims() const { return dims_; }
  int world_size() const { return world_; }
  int dp() const { return dp_; }    // derived data-parallel size
  int edp() const { return edp_; }  // derived expert data-parallel size

  // Every group of a kind, each listed in group-rank order. Partition kinds
  // cover each rank once; the embedding kinds leave middle pipeline stages out.
  std::vector<std::vector<int>> ranks_of(GroupKind k) const;

  struct Member { int group = -1, index = -1; };  // -1: the rank is in no group of that kind
  Member locate(GroupKind k, int rank) const;

  // The rank's coordinate along every dimension of both grids.
  struct Coords { int tp, cp, dp, pp, etp, ep, edp; };
  Coords coords(int rank) const;

 private:
  ParallelDims dims_;
  int world_ = 1, dp_ = 1, edp_ = 1;
};

// Communicators for every group kind, for this process. Construction is
// collective over the world (all ranks build the same grid in the same order).
// `device` is where the models' tensors live: on Device::CUDA every group of
// more than one process (and world()) also moves device buffers, over NCCL
// (comm/device_group.h), while host buffers still go over MPI; on the CPU the
// groups are the world's MPI splits. Size-1 groups are LocalGroups either way.
class ProcessGrid {
 public:
  ProcessGrid(const comm::World& world, const ParallelDims& dims, Device device = Device::CPU);

  const GridLayout& layout() const { return layout_; }
  std::vector<std::vector<int>> ranks_of(GroupKind k) const { return layout_.ranks_of(k); }
  int world_rank() const { return rank_; }
  const GridLayout::Coords& coords() const { return coords_; }

  // This rank's group of a kind; nullptr only for the embedding kinds on ranks
  // outside them. Size-1 groups are LocalGroups and cost no communicator.
  const std::shared_ptr<comm::ProcessGroup>& group(GroupKind k) const;
  comm::ProcessGroup& tp() const { return *group(GroupKind::Tp); }
  comm::ProcessGroup& cp() const { return *group(GroupKind::Cp); }
  comm::ProcessGroup& dp() const { return *group(GroupKind::Dp); }
  comm::ProcessGroup& dp_cp() const { return *group(GroupKind::DpCp); }
  comm::ProcessGroup& pp() const { return *group(GroupKind::Pp); }
  comm::ProcessGroup& mp() const { return *group(GroupKind::Mp); }
  // All ranks ("world"), able to carry the grid's device's buffers.
  const std::shared_ptr<comm::ProcessGroup>& world() const { return world_; }
  Device device() const { return device_; }
  // A group split from the world outside the grid (context parallelism's
  // hybrid groups, the rollout's tp), made able to carry the grid's device's
  // buffers as the grid's own are; nullptr and size-1 groups pass unchanged.
  std::shared_ptr<comm::ProcessGroup> adopt(std::shared_ptr<comm::ProcessGroup> g) const;
  bool is_first_stage() const { return coords_.pp == 0; }
  bool is_last_stage() const { return coords_.pp == layout_.dims().pp - 1; }

 private:
  GridLayout layout_;
  int rank_ = 0;
  GridLayout::Coords coords_{};
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups_;  // indexed by GroupKind
  Device device_ = Device::CPU;
  std::shared_ptr<comm::ProcessGroup> world_;
};

}  // namespace kestrel::parallel
