// verl's trainer.balance_batch: before the update, the sequences of a batch are
// reordered so that data-parallel rank i's contiguous chunk holds partition i
// of a Karmarkar–Karp (largest differencing) split with equal item counts and
// balanced token sums (verl/utils/seqlen_balancing.py:
// get_seqlen_balanced_partitions, karmarkar_karp). The heap is a replica of
// Python's heapq, so ties resolve as in verl and the partitions are identical.
#pragma once
#include <cstdint>
#include <vector>

namespace kestrel::parallel {

// k partitions of item indices, each sorted ascending. equal_size: every
// partition gets n/k items (n % k == 0 required); else only the sums are
// balanced. Errors (kestrel::Error) for n < k or n % k != 0 with equal_size.
std::vector<std::vector<int64_t>> seqlen_balanced_partitions(const std::vector<int64_t>& seqlens, int k,
                                                             bool equal_size);

// The reordering verl applies: partition 0's indices, then partition 1's, ...
// Rank i of dp takes positions [i*n/dp, (i+1)*n/dp) of the reordered batch.
std::vector<int64_t> balance_batch_order(const std::vector<int64_t>& seqlens, int dp);

}  // namespace kestrel::parallel
