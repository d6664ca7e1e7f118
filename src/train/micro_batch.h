// Splitting a mini-batch of sequences into micro-batches for gradient
// accumulation, and the per-token loss weights of an SFT micro-batch.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/process_group.h"

namespace kestrel::train {

// Sequence lengths -> groups of consecutive indices. Dynamic (max_tokens > 0):
// each group holds as many sequences as fit in max_tokens tokens (a longer
// sequence gets a group of its own), as verl's use_dynamic_bsz with
// max_token_len_per_gpu, but keeping the order so results never depend on
// the split. Otherwise groups of max_seqs sequences.
std::vector<std::vector<int64_t>> split_micro_batches(const std::vector<int64_t>& lengths, int64_t max_tokens,
                                                      int64_t max_seqs);

// Splits groups until there are `count` of them: the group with the most
// sequences (the first of equals) is cut into its first ceil(n/2) and the
// rest, keeping every sequence's order. Fails when the groups hold fewer than
// `count` sequences.
void split_to_count(std::vector<std::vector<int64_t>>& groups, size_t count);

// Expert parallelism: every MoE layer's token dispatch is collective over the
// ep group, so its ranks must run the same number of micro-batches (as verl's
// same_micro_num_in_dp). Each rank's groups are split (split_to_count) up to
// the largest count of the group; collective over ep, a no-op at size 1.
// `what` names the phase in the message when a rank has too few sequences.
void align_micro_batch_count(std::vector<std::vector<int64_t>>& groups, comm::ProcessGroup& ep, const char* what);

// Weights of the packed rows of `seqs` (row t predicts token t+1 of its
// sequence): `scale` where that next token has loss_mask 1, else 0 (and 0 on
// each sequence's last row, which predicts nothing).
std::vector<float> sft_token_weights(const std::vector<const std::vector<uint8_t>*>& masks, float scale);

}  // namespace kestrel::train
