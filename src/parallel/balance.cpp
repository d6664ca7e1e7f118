#include "parallel/balance.h"

#include <algorithm>
#include <utility>

#include "core/status.h"

namespace kestrel::parallel {

namespace {

struct Set {
  int64_t sum = 0;
  std::vector<std::pair<int64_t, int64_t>> items;  // (index, seqlen)
  void add(int64_t idx, int64_t val) {
    items.emplace_back(idx, val);
    sum += val;
  }
  void merge(const Set& o) {
    for (const auto& it : o.items) add(it.first, it.second);
  }
};
// verl's Set.__lt__: by sum, then item count, then the item lists.
bool set_less(const Set& a, const Set& b) {
  if (a.sum != b.sum) return a.sum < b.sum;
  if (a.items.size() != b.items.size()) return a.items.size() < b.items.size();
  return a.items < b.items;
}

struct State {
  std::vector<Set> sets;  // always in decreasing order
  void sort_sets() {
    std::stable_sort(sets.begin(), sets.end(), [](const Set& a, const Set& b) { return set_less(b, a); });
  }
  int64_t spread() const { return sets.front().sum - sets.back().sum; }
  void merge(const State& o) {
    const size_t k = sets.size();
    for (size_t i = 0; i < k; ++i) sets[i].merge(o.sets[k - 1 - i]);
    sort_sets();
  }
};
// verl's State.__lt__: the largest spread pops first, then the largest top set.
bool state_less(const State& a, const State& b) {
  if (a.spread() != b.spread()) return a.spread() > b.spread();
  return set_less(b.sets.front(), a.sets.front());
}

// Python's heapq over indices into a pool, with its exact sift order.
class Heap {
 public:
  explicit Heap(std::vector<State>& pool) : pool_(pool) {}
  size_t size() const { return h_.size(); }
  void push(size_t s) {
    h_.push_back(s);
    sift_down(0, h_.size() - 1);
  }
  size_t pop() {
    size_t last = h_.back();
    h_.pop_back();
    if (h_.empty()) return last;
    size_t ret = h_[0];
    h_[0] = last;
    sift_up(0);
    return ret;
  }

 private:
  bool lt(size_t a, size_t b) const { return state_less(pool_[a], pool_[b]); }
  void sift_down(size_t start, size_t pos) {
    size_t item = h_[pos];
    while (pos > start) {
      size_t parent = (pos - 1) >> 1;
      if (lt(item, h_[parent])) {
        h_[pos] = h_[parent];
        pos = parent;
        continue;
      }
      break;
    }
    h_[pos] = item;
  }
  void sift_up(size_t pos) {
    const size_t end = h_.size(), start = pos;
    size_t item = h_[pos], child = 2 * pos + 1;
    while (child < end) {
      size_t right = child + 1;
      if (right < end && !lt(h_[child], h_[right])) child = right;
      h_[pos] = h_[child];
      pos = child;
      child = 2 * pos + 1;
    }
    h_[pos] = item;
    sift_down(start, pos);
  }
  std::vector<State>& pool_;
  std::vector<size_t> h_;
};

}  // namespace

std::vector<std::vector<int64_t>> seqlen_balanced_partitions(const std::vector<int64_t>& seqlens, int k,
                                                             bool equal_size) {
  const int64_t n = int64_t(seqlens.size());
  if (k < 1) KS_FAIL("balance_batch: the number of partitions must be >= 1, got ", k);
  if (n < k) KS_FAIL("balance_batch: ", n, " sequences cannot fill ", k, " data-parallel ranks");
  if (equal_size && n % k != 0)
    KS_FAIL("balance_batch: ", n, " sequences do not divide evenly over ", k,
            " data-parallel ranks; make the batch size a multiple of the dp size");
  std::vector<std::pair<int64_t, int64_t>> sorted(static_cast<size_t>(n));  // (seqlen, index)
  for (int64_t i = 0; i < n; ++i) sorted[size_t(i)] = {seqlens[size_t(i)], i};
  std::sort(sorted.begin(), sorted.end());

  std::vector<State> pool;
  pool.reserve(size_t(n));
  Heap heap(pool);
  auto make_state = [&](int64_t from, int64_t count) {
    State s;
    s.sets.resize(size_t(k));
    for (int64_t i = 0; i < count; ++i) s.sets[size_t(i)].add(sorted[size_t(from + i)].second, sorted[size_t(from + i)].first);
    s.sort_sets();
    pool.push_back(std::move(s));
    heap.push(pool.size() - 1);
  };
  if (equal_size)
    for (int64_t off = 0; off < n; off += k) make_state(off, k);
  else
    for (int64_t i = 0; i < n; ++i) make_state(i, 1);
  while (heap.size() > 1) {
    size_t a = heap.pop(), b = heap.pop();
    pool[a].merge(pool[b]);
    pool[b] = State();
    heap.push(a);
  }
  const State& fin = pool[heap.pop()];
  std::vector<std::vector<int64_t>> parts(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) {
    for (const auto& it : fin.sets[size_t(i)].items) parts[size_t(i)].push_back(it.first);
    KS_CHECK(!parts[size_t(i)].empty(), "balance_batch: partition ", i, " is empty");
    std::sort(parts[size_t(i)].begin(), parts[size_t(i)].end());
  }
  return parts;
}

std::vector<int64_t> balance_batch_order(const std::vector<int64_t>& seqlens, int dp) {
  std::vector<int64_t> order;
  for (const auto& p : seqlen_balanced_partitions(seqlens, dp, /*equal_size=*/true))
    order.insert(order.end(), p.begin(), p.end());
  return order;
}

}  // namespace kestrel::parallel
