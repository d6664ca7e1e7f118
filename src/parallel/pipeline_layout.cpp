// Pipeline-parallel layer layout (pipeline_layout.h): Megatron-Core's
// get_num_layers_to_build / get_transformer_layer_offset and
// TransformerConfig's checks on the uneven split, in slots (real + noop).
#include "parallel/pipeline_layout.h"

#include <algorithm>
#include <tuple>

namespace kestrel::parallel {
namespace {

constexpr const char* kPP = "pipeline_model_parallel_size";
constexpr const char* kVPP = "virtual_pipeline_model_parallel_size";
constexpr const char* kFirst = "override_transformer_config.num_layers_in_first_pipeline_stage";
constexpr const char* kLast = "override_transformer_config.num_layers_in_last_pipeline_stage";
constexpr const char* kNoop = "override_transformer_config.noop_layers";
constexpr const char* kGroup = "override_transformer_config.microbatch_group_size_per_vp_stage";

// "32 slots (num_hidden_layers 30 + 2 noop_layers)": what the numbers in a
// message count.
std::string slots_text(int64_t slots, int64_t real, size_t noop) {
  if (noop == 0) return detail::concat(slots, " layers (num_hidden_layers)");
  return detail::concat(slots, " slots (num_hidden_layers ", real, " + ", noop, " noop_layers)");
}

Status check_sizes(const PipelineSpec& s, int64_t num_hidden_layers) {
  if (s.pp < 1) return KS_ERR(kPP, "=", s.pp, " must be >= 1 (1 = no pipeline parallelism)");
  if (s.vpp < 1)
    return KS_ERR(kVPP, "=", s.vpp, " must be >= 1 (null or 1 = no interleaving)");
  // Megatron parallel_state.initialize_model_parallel's RuntimeError.
  if (s.vpp > 1 && s.pp < 2)
    return KS_ERR(kVPP, "=", s.vpp, " with ", kPP, "=", s.pp,
                  ": pipeline-model-parallel size should be greater than 1 with interleaved schedule; set ", kPP,
                  " >= 2 or ", kVPP, " to null");
  if (num_hidden_layers < 1)
    return KS_ERR("num_hidden_layers=", num_hidden_layers, " (config.json): a pipeline needs at least one layer");
  if (s.microbatch_group_size < 0)
    return KS_ERR(kGroup, "=", s.microbatch_group_size, " must be >= 0 (0 or null = ", kPP, ")");
  return Status::ok();
}

Status check_noop(const PipelineSpec& s, int64_t slots, int64_t real) {
  std::vector<int64_t> ids = s.noop_layers;
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids)
    if (id < 0 || id >= slots)
      return KS_ERR(kNoop, " holds ", id, ", outside [0, ", slots, "): the ids are 0-based slots of the ",
                    slots_text(slots, real, ids.size()), "; use ids below ", slots);
  for (size_t i = 1; i < ids.size(); ++i)
    if (ids[i] == ids[i - 1])
      return KS_ERR(kNoop, " lists ", ids[i], " twice; list each noop slot once");
  return Status::ok();
}

// Megatron TransformerConfig.__post_init__'s uneven-PP checks, then the
// split of get_num_layers_to_build: first/last ranks their sizes, the middle
// ranks the rest evenly.
Result<std::vector<int64_t>> uneven_split(const PipelineSpec& s, int64_t slots, const std::string& what) {
  const bool has_first = s.first_stage_layers != -1, has_last = s.last_stage_layers != -1;
  for (auto [set, v, key] : {std::tuple{has_first, s.first_stage_layers, kFirst},
                             std::tuple{has_last, s.last_stage_layers, kLast}}) {
    if (!set) continue;
    if (v <= 0) return KS_ERR(key, "=", v, " must be larger than 0 (null = no uneven split)");
    if (v % s.vpp != 0)
      return KS_ERR(key, "=", v, " must be divisible by ", kVPP, "=", s.vpp,
                    " (the stage's slots are split evenly over its ", s.vpp, " model chunks); use a multiple of ",
                    s.vpp);
  }
  if (s.pp == 1 && has_first && has_last)
    return KS_ERR(kFirst, "=", s.first_stage_layers, " and ", kLast, "=", s.last_stage_layers, " with ", kPP,
                  "=1: the only stage is both first and last and holds all ", what, "; unset both");
  const int64_t first = has_first ? s.first_stage_layers : 0, last = has_last ? s.last_stage_layers : 0;
  const int64_t middle_ranks = s.pp - int64_t(has_first) - int64_t(has_last);
  const int64_t middle = slots - first - last;
  const std::string keys = detail::concat(has_first ? detail::concat(kFirst, "=", first) : std::string(),
                                          has_first && has_last ? " + " : "",
                                          has_last ? detail::concat(kLast, "=", last) : std::string());
  if (middle < 0)
    return KS_ERR(keys, " is more than the ", what, "; together they may hold at most ", slots);
  if ((middle != 0) != (middle_ranks != 0))
    return KS_ERR(keys, " leaves ", middle, " of the ", what, " for ", middle_ranks, " middle stage(s) of ", kPP,
                  "=", s.pp, " (Megatron: \"Mismatch\"); ",
                  middle_ranks == 0 ? "the first and last stages must hold every slot: make them sum to "
                                    : "each middle stage needs slots: make them sum to less than ",
                  slots);
  int64_t per_middle = 0;
  if (middle_ranks > 0) {
    if (middle % middle_ranks != 0)
      return KS_ERR(keys, " leaves ", middle, " of the ", what, ", which do not divide evenly over the ",
                    middle_ranks, " middle stages of ", kPP, "=", s.pp, "; change the first/last sizes so ", slots,
                    " - first - last is a multiple of ", middle_ranks);
    per_middle = middle / middle_ranks;
    if (per_middle % s.vpp != 0)
      return KS_ERR(keys, " leaves ", per_middle, " slots on each middle stage, not divisible by ", kVPP, "=", s.vpp,
                    "; make ", slots, " - first - last a multiple of ", middle_ranks * s.vpp);
  }
  std::vector<int64_t> sizes(size_t(s.pp), per_middle);
  if (has_first) sizes.front() = first;
  if (has_last) sizes.back() = last;
  return sizes;
}

}  // namespace

int64_t microbatch_group_size(const PipelineSpec& spec) {
  return spec.microbatch_group_size > 0 ? spec.microbatch_group_size : spec.pp;
}

Result<std::vector<int64_t>> pipeline_stage_slots(const PipelineSpec& spec, int64_t num_hidden_layers) {
  KS_TRY(check_sizes(spec, num_hidden_layers));
  const int64_t slots = num_hidden_layers + int64_t(spec.noop_layers.size());
  KS_TRY(check_noop(spec, slots, num_hidden_layers));
  const std::string what = slots_text(slots, num_hidden_layers, spec.noop_layers.size());
  if (spec.first_stage_layers != -1 || spec.last_stage_layers != -1) return uneven_split(spec, slots, what);
  const int64_t stages = int64_t(spec.pp) * spec.vpp;
  if (slots % stages != 0) {
    const int64_t pad = stages - slots % stages;
    return KS_ERR("the ", what, " do not divide evenly over ", kPP, "=", spec.pp, " x ", kVPP, "=", spec.vpp, " = ",
                  stages, " pipeline stages; choose pp x vpp dividing ", slots, ", add ", pad,
                  " noop layers (", kNoop, ") to reach ", slots + pad, ", or set ", kFirst, " / ", kLast);
  }
  return std::vector<int64_t>(size_t(spec.pp), slots / spec.pp);
}

Result<std::vector<std::vector<StageChunk>>> pipeline_chunks(const PipelineSpec& spec, int64_t num_hidden_layers) {
  KS_ASSIGN(const std::vector<int64_t> per_rank, pipeline_stage_slots(spec, num_hidden_layers));
  const int64_t slots = num_hidden_layers + int64_t(spec.noop_layers.size());
  std::vector<char> noop(size_t(slots), 0);
  for (int64_t id : spec.noop_layers) noop[size_t(id)] = 1;
  // real_before[i]: real layers in slots [0, i), so slot range [a, b) holds
  // real layers [real_before[a], real_before[b]).
  std::vector<int64_t> real_before(size_t(slots) + 1, 0);
  for (int64_t i = 0; i < slots; ++i) real_before[size_t(i) + 1] = real_before[size_t(i)] + (noop[size_t(i)] ? 0 : 1);

  std::vector<std::vector<StageChunk>> out(size_t(spec.pp), std::vector<StageChunk>(size_t(spec.vpp)));
  int64_t next = 0;  // first slot of the next virtual stage
  for (int c = 0; c < spec.vpp; ++c) {
    for (int r = 0; r < spec.pp; ++r) {  // virtual stage c * pp + r
      StageChunk& ch = out[size_t(r)][size_t(c)];
      ch.first_slot = next;
      ch.num_slots = per_rank[size_t(r)] / spec.vpp;
      ch.first_layer = real_before[size_t(next)];
      ch.num_layers = real_before[size_t(next + ch.num_slots)] - ch.first_layer;
      ch.has_embedding = c == 0 && r == 0;
      ch.has_head = c == spec.vpp - 1 && r == spec.pp - 1;
      next += ch.num_slots;
    }
  }
  KS_CHECK(next == slots, "pipeline layout covers ", next, " of ", slots, " slots");
  return out;
}

Status check_interleaved_microbatches(const PipelineSpec& spec, int64_t num_micro_batches) {
  if (spec.vpp <= 1) return Status::ok();
  if (spec.pp < 2 || spec.microbatch_group_size < 0) return check_sizes(spec, 1);
  const int64_t p = spec.pp, m = num_micro_batches, n = microbatch_group_size(spec);
  const std::string group = spec.microbatch_group_size > 0
                                ? detail::concat(kGroup, "=", n)
                                : detail::concat(kGroup, " (null: ", kPP, "=", p, ")");
  // Megatron's ValueError: "The number of contiguous micro-batches in a
  // virtual pipeline stage should range in [PP, M]".
  if (n > m || n < p)
    return KS_ERR("interleaved pipeline (", kVPP, "=", spec.vpp, "): the number of contiguous micro-batches in a ",
                  "virtual pipeline stage, ", group, ", should range in [PP=", p, ", M=", m,
                  "] (M = micro-batches per step); ",
                  m < p ? detail::concat("use at least ", p, " micro-batches per step (a multiple of ", p, ")")
                        : detail::concat("set ", kGroup, " between ", p, " and ", m));
  // Megatron's RuntimeError: a last group smaller than p leaves dependency bubbles.
  const int64_t rest = m % n;
  if (rest > 0 && rest < p)
    return KS_ERR("interleaved pipeline (", kVPP, "=", spec.vpp, "): the remainder of M=", m,
                  " micro-batches divided by N=", n, " (", group, ") should be 0, or larger than or equal to the ",
                  "pipeline-parallel size ", kPP, "=", p, ", but it is ", rest,
                  "; otherwise it introduces dependency bubbles in the pipeline. Use a multiple of ", n,
                  " micro-batches per step or a group size N with M % N == 0 or M % N >= ", p);
  return Status::ok();
}

}  // namespace kestrel::parallel
