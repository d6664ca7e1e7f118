#include "comm/hierarchical_a2a.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "comm/nodes.h"
#include "core/status.h"

namespace kestrel::comm {

HierarchicalA2a::HierarchicalA2a(const World& world, std::shared_ptr<ProcessGroup> group)
    : group_(std::move(group)) {
  const std::vector<int> world_node = node_ids(world);  // collective over the world
  int node_color = World::kNoGroup, node_key = 0, leader_color = World::kNoGroup, leader_key = 0;
  if (group_) {
    const int n = group_->size(), me = group_->rank();
    std::vector<int32_t> wr(size_t(n), 0);  // world rank of each group rank
    const int32_t mine = int32_t(world.rank());
    group_->all_gather(&mine, wr.data(), 1, DType::I32);
    // Nodes numbered in the order of their first group rank.
    std::vector<int> seen;
    node_of_.assign(size_t(n), 0);
    for (int r = 0; r < n; ++r) {
      const int wn = world_node[size_t(wr[size_t(r)])];
      auto it = std::find(seen.begin(), seen.end(), wn);
      if (it == seen.end()) {
        seen.push_back(wn);
        it = seen.end() - 1;
      }
      node_of_[size_t(r)] = int(it - seen.begin());
    }
    num_nodes_ = int(seen.size());
    members_.assign(size_t(num_nodes_), {});
    for (int r = 0; r < n; ++r) members_[size_t(node_of_[size_t(r)])].push_back(r);
    // Colors unique over the world: the lowest world rank of this group's
    // ranks on my node (the groups of one kind partition the world), and the
    // group's lowest world rank for its leaders.
    const std::vector<int>& mates = members_[size_t(node_of_[size_t(me)])];
    int lowest_on_node = wr[size_t(mates.front())];
    for (int r : mates) lowest_on_node = std::min<int>(lowest_on_node, wr[size_t(r)]);
    node_color = lowest_on_node;
    node_key = me;
    if (mates.front() == me) {
      leader_color = *std::min_element(wr.begin(), wr.end());
      leader_key = node_of_[size_t(me)];
    }
  }
  node_ = world.split(node_color, node_key, "a2a_node");
  leaders_ = world.split(leader_color, leader_key, "a2a_leaders");
}

void HierarchicalA2a::all_to_allv(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                                  const std::vector<int64_t>& recv_counts, A2aTraffic* traffic) const {
  int64_t ns = 0, nr = 0;
  for (int64_t x : send_counts) ns += x;
  for (int64_t x : recv_counts) nr += x;
  KS_CHECK(send.dtype() == recv.dtype() && send.numel() >= ns && recv.numel() >= nr, "hierarchical all-to-all-v: ",
           send.describe(), " -> ", recv.describe(), " for ", ns, " / ", nr, " elements");
  all_to_allv(send.raw(), send_counts, recv.raw(), recv_counts, send.dtype(), traffic);
}

A2aTraffic flat_a2a_traffic(const std::vector<int>& node_of, int rank, const std::vector<int64_t>& send_counts,
                            DType dtype) {
  A2aTraffic t;
  const double es = double(dtype_size(dtype));
  for (size_t d = 0; d < send_counts.size(); ++d) {
    if (int(d) == rank || send_counts[d] == 0) continue;
    if (node_of[d] != node_of[size_t(rank)]) {
      ++t.inter_node_messages;
      t.inter_node_bytes += es * double(send_counts[d]);
    } else {
      ++t.intra_node_messages;
      t.intra_node_bytes += es * double(send_counts[d]);
    }
  }
  return t;
}

void HierarchicalA2a::all_to_allv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                  const std::vector<int64_t>& recv_counts, DType dtype, A2aTraffic* traffic) const {
  KS_CHECK(group_, "HierarchicalA2a::all_to_allv on a rank outside the group");
  const int n = group_->size(), me = group_->rank(), a = node_of_[size_t(me)];
  KS_CHECK(int(send_counts.size()) == n && int(recv_counts.size()) == n, "hierarchical all-to-all-v over '",
           group_->name(), "': ", send_counts.size(), " send and ", recv_counts.size(), " receive counts for ", n,
           " ranks");
  const size_t es = dtype_size(dtype);
  // C[s * n + d]: elements group rank s sends group rank d.
  std::vector<int64_t> C(size_t(n) * size_t(n), 0);
  group_->all_gather(send_counts.data(), C.data(), n, DType::I64);
  auto c = [&](int s, int d) { return C[size_t(s) * size_t(n) + size_t(d)]; };
  for (int s = 0; s < n; ++s)
    KS_CHECK(recv_counts[size_t(s)] == c(s, me), "hierarchical all-to-all-v over '", group_->name(), "': rank ", me,
             " expects ", recv_counts[size_t(s)], " elements from rank ", s, ", which sends ", c(s, me));
  auto total_from = [&](int s) {
    int64_t t = 0;
    for (int d = 0; d < n; ++d) t += c(s, d);
    return t;
  };
  // Element offset of block (s -> d) within s's send buffer.
  auto block_off = [&](int s, int d) {
    int64_t o = 0;
    for (int x = 0; x < d; ++x) o += c(s, x);
    return o;
  };
  const std::vector<int>& mates = members_[size_t(a)];
  const int m = int(mates.size());
  const bool leader = mates.front() == me;
  A2aTraffic t;

  // 1. Gather within the node: every rank's whole buffer to the leader (node rank 0).
  std::vector<int64_t> g_send(size_t(m), 0), g_recv(size_t(m), 0);
  g_send[0] = total_from(me);
  std::vector<int64_t> member_off(size_t(m) + 1, 0);  // offset of each member's buffer in the gathered one
  for (int j = 0; j < m; ++j) member_off[size_t(j) + 1] = member_off[size_t(j)] + total_from(mates[size_t(j)]);
  if (leader)
    for (int j = 0; j < m; ++j) g_recv[size_t(j)] = total_from(mates[size_t(j)]);
  std::vector<char> gathered(leader ? size_t(member_off[size_t(m)]) * es : 0);
  node_->all_to_allv(send, g_send, gathered.data(), g_recv, dtype);
  if (!leader && g_send[0] > 0) {
    ++t.intra_node_messages;
    t.intra_node_bytes += double(es) * double(g_send[0]);
  }

  if (leader) {
    // 2. Leaders exchange: to node b, for each of its ranks d (ascending), the
    // blocks of this node's ranks s (ascending) for d.
    const int N = num_nodes_;
    std::vector<int64_t> x_send(size_t(N), 0), x_recv(size_t(N), 0);
    for (int b = 0; b < N; ++b)
      for (int d : members_[size_t(b)])
        for (int s : mates) x_send[size_t(b)] += c(s, d);
    for (int b = 0; b < N; ++b)
      for (int s : members_[size_t(b)])
        for (int d : mates) x_recv[size_t(b)] += c(s, d);
    std::vector<char> out(size_t(std::accumulate(x_send.begin(), x_send.end(), int64_t(0))) * es);
    size_t pos = 0;
    for (int b = 0; b < N; ++b)
      for (int d : members_[size_t(b)])
        for (int j = 0; j < m; ++j) {
          const int s = mates[size_t(j)];
          const size_t bytes = size_t(c(s, d)) * es;
          std::memcpy(out.data() + pos, gathered.data() + size_t(member_off[size_t(j)] + block_off(s, d)) * es, bytes);
          pos += bytes;
        }
    std::vector<char> in(size_t(std::accumulate(x_recv.begin(), x_recv.end(), int64_t(0))) * es);
    leaders_->all_to_allv(out.data(), x_send, in.data(), x_recv, dtype);
    for (int b = 0; b < N; ++b)
      if (b != a && x_send[size_t(b)] > 0) {
        ++t.inter_node_messages;
        t.inter_node_bytes += double(es) * double(x_send[size_t(b)]);
      }

    // 3. Scatter within the node: for each of its ranks d, every source's block
    // in source order (the flat call's receive layout). Node b's segment of
    // `in` holds, per d of this node (ascending), the blocks of b's ranks.
    // in_off[s * m + j]: element offset in `in` of block (s -> mates[j]).
    std::vector<int64_t> in_off(size_t(n) * size_t(m), 0);
    int64_t o = 0;
    for (int b = 0; b < N; ++b)
      for (int j = 0; j < m; ++j)
        for (int s : members_[size_t(b)]) {
          in_off[size_t(s) * size_t(m) + size_t(j)] = o;
          o += c(s, mates[size_t(j)]);
        }
    std::vector<int64_t> s_send(size_t(m), 0), s_recv(size_t(m), 0);
    size_t total = 0;
    for (int j = 0; j < m; ++j) {
      for (int s = 0; s < n; ++s) s_send[size_t(j)] += c(s, mates[size_t(j)]);
      total += size_t(s_send[size_t(j)]);
    }
    std::vector<char> scatter(total * es);
    pos = 0;
    for (int j = 0; j < m; ++j)
      for (int s = 0; s < n; ++s) {
        const size_t bytes = size_t(c(s, mates[size_t(j)])) * es;
        std::memcpy(scatter.data() + pos, in.data() + size_t(in_off[size_t(s) * size_t(m) + size_t(j)]) * es, bytes);
        pos += bytes;
      }
    for (int j = 1; j < m; ++j)
      if (s_send[size_t(j)] > 0) {
        ++t.intra_node_messages;
        t.intra_node_bytes += double(es) * double(s_send[size_t(j)]);
      }
    s_recv[0] = s_send[0];
    node_->all_to_allv(scatter.data(), s_send, recv, s_recv, dtype);
  } else {
    std::vector<int64_t> s_send(size_t(m), 0), s_recv(size_t(m), 0);
    s_recv[0] = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t(0));
    const char nothing = 0;  // sends nothing (a distinct buffer: MPI forbids aliasing send and receive)
    node_->all_to_allv(&nothing, s_send, recv, s_recv, dtype);
  }
  if (traffic) *traffic = t;
}

}  // namespace kestrel::comm
