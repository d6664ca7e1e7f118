#include "parallel/grid.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "comm/device_group.h"

namespace kestrel::parallel {

namespace {

const char* const kTokens[] = {"tp", "cp", "ep", "dp", "pp"};

// Splits "tp-cp-ep-dp-pp"; empty result when it is not a permutation of the five tokens.
std::vector<std::string> parse_order(const std::string& order) {
  std::vector<std::string> out;
  std::stringstream ss(order);
  for (std::string t; std::getline(ss, t, '-');) out.push_back(t);
  if (out.size() != 5) return {};
  for (const char* t : kTokens)
    if (std::count(out.begin(), out.end(), t) != 1) return {};
  return out;
}

// Megatron's RankGenerator + generate_masked_orthogonal_rank_groups: rank =
// sum_i idx_i * prod_{j<i} size_j along the order. A group varies the masked
// dims (ranks inside listed with the earlier order dim fastest); groups are
// listed with the unmasked dims' index, earlier dim fastest.
struct Generator {
  std::vector<std::string> order;
  std::vector<int> sizes;  // along order

  Generator(const std::vector<std::string>& ord, const std::map<std::string, int>& size_of) : order(ord) {
    for (auto& t : order) sizes.push_back(size_of.at(t));
  }

  std::vector<std::vector<int>> groups(std::initializer_list<const char*> masked) const {
    std::vector<int> mshape, mstride, ushape, ustride;
    int stride = 1;
    for (size_t i = 0; i < order.size(); ++i) {
      const bool m = std::any_of(masked.begin(), masked.end(), [&](const char* t) { return order[i] == t; });
      (m ? mshape : ushape).push_back(sizes[i]);
      (m ? mstride : ustride).push_back(stride);
      stride *= sizes[i];
    }
    auto product = [](const std::vector<int>& v) {
      int p = 1;
      for (int x : v) p *= x;
      return p;
    };
    // Index -> sum over dims of (digit in mixed radix `shape`) * stride.
    auto place = [](int index, const std::vector<int>& shape, const std::vector<int>& strides) {
      int r = 0;
      for (size_t d = 0; d < shape.size(); ++d) {
        r += (index % shape[d]) * strides[d];
        index /= shape[d];
      }
      return r;
    };
    const int gsize = product(mshape), ngroups = product(ushape);
    std::vector<std::vector<int>> out(ngroups, std::vector<int>(gsize));
    for (int g = 0; g < ngroups; ++g)
      for (int i = 0; i < gsize; ++i) out[g][i] = place(i, mshape, mstride) + place(g, ushape, ustride);
    return out;
  }
};

Generator dense_generator(const ParallelDims& d, const std::vector<std::string>& order, int dp) {
  return Generator(order, {{"tp", d.tp}, {"cp", d.cp}, {"ep", 1}, {"dp", dp}, {"pp", d.pp}});
}
Generator expert_generator(const ParallelDims& d, const std::vector<std::string>& order, int edp) {
  return Generator(order, {{"tp", d.expert_tp()}, {"cp", 1}, {"ep", d.ep}, {"dp", edp}, {"pp", d.pp}});
}

// One problem per entry; joined at the end so the user sees every one at once.
struct Problems {
  std::vector<std::string> list;
  template <class... A>
  void add(A&&... parts) { list.push_back(detail::concat(std::forward<A>(parts)...)); }
  Status status() const {
    if (list.empty()) return Status::ok();
    std::string msg = "parallel config: ";
    for (size_t i = 0; i < list.size(); ++i) msg += (i ? "; " : "") + list[i];
    return Status::error(msg);
  }
};

}  // namespace

const char* group_kind_name(GroupKind k) {
  switch (k) {
    case GroupKind::Tp: return "tp";
    case GroupKind::Cp: return "cp";
    case GroupKind::Dp: return "dp";
    case GroupKind::DpCp: return "dp_cp";
    case GroupKind::Pp: return "pp";
    case GroupKind::TpCp: return "tp_cp";
    case GroupKind::Mp: return "mp";
    case GroupKind::TpDp: return "tp_dp";
    case GroupKind::TpDpCp: return "tp_dp_cp";
    case GroupKind::Embedding: return "embedding";
    case GroupKind::PositionEmbedding: return "position_embedding";
    case GroupKind::Ep: return "ep";
    case GroupKind::Etp: return "etp";
    case GroupKind::EtpEp: return "etp_ep";
    case GroupKind::EtpEpPp: return "etp_ep_pp";
    case GroupKind::Edp: return "edp";
  }
  return "?";
}

Status validate(const ParallelDims& d, int world, const ModelFacts& m) {
  Problems p;
  if (world < 1) p.add("world size ", world, " must be >= 1");
  const struct { const char* key; int v; int min; } sizes[] = {
      {"tensor_model_parallel_size", d.tp, 1}, {"context_parallel_size", d.cp, 1},
      {"expert_model_parallel_size", d.ep, 1}, {"pipeline_model_parallel_size", d.pp, 1},
      {"expert_tensor_parallel_size", d.etp, 0}, {"data_parallel_size", d.dp, 0}};
  for (auto& s : sizes)
    if (s.v < s.min) p.add(s.key, "=", s.v, " must be >= ", s.min, s.min == 0 ? " (0 = derive it)" : "");
  const auto order = parse_order(d.order);
  if (order.empty()) p.add("order '", d.order, "' must list each of tp, cp, ep, dp, pp exactly once, '-'-separated");
  if (!p.list.empty() || world < 1) return p.status();

  const int tcp = d.tp * d.cp * d.pp;
  if (world % tcp != 0) {
    p.add("world size ", world, " is not divisible by tp*cp*pp = ", tcp, " (tp=", d.tp, ", cp=", d.cp, ", pp=", d.pp, ")");
  } else if (d.dp > 0 && d.dp != world / tcp) {
    p.add("data_parallel_size=", d.dp, " does not match world size ", world, " / (tp*cp*pp = ", tcp, ") = ", world / tcp,
          " (set it to ", world / tcp, " or 0 to derive it)");
  }
  const int etp = d.expert_tp(), eep = etp * d.ep * d.pp;
  if (world % eep != 0) {
    p.add("world size ", world, " is not divisible by etp*ep*pp = ", eep, " (etp=", etp, ", ep=", d.ep, ", pp=", d.pp, ")");
  } else if (world % tcp == 0) {
    const int dp = world / tcp, edp = world / eep;
    // Megatron: with pp not outermost, the two grids only share pp groups when their dp sizes agree.
    if (order.back() != "pp" && d.pp > 1 && edp != dp)
      p.add("expert data-parallel size ", edp, " (world / etp*ep*pp) must equal data-parallel size ", dp,
            " when the order '", d.order, "' does not end in pp and pp=", d.pp, " > 1");
    else if (dense_generator(d, order, dp).groups({"pp"}) != expert_generator(d, order, edp).groups({"pp"}))
      p.add("the dense and expert grids give different pipeline groups for order '", d.order, "'");
  }
  if (d.sequence_parallel && d.tp <= 1) p.add("sequence_parallel requires tensor_model_parallel_size > 1");

  if (m.n_heads > 0 && m.n_heads % d.tp != 0)
    p.add("num_attention_heads=", m.n_heads, " is not divisible by tensor_model_parallel_size=", d.tp);
  if (m.n_kv_heads > 0 && m.n_kv_heads % d.tp != 0 && d.tp % m.n_kv_heads != 0)
    p.add("num_key_value_heads=", m.n_kv_heads, " and tensor_model_parallel_size=", d.tp,
          ": kv heads must be divisible by tp or tp by kv heads");
  if (m.ffn > 0 && m.ffn % d.tp != 0)
    p.add("intermediate_size=", m.ffn, " is not divisible by tensor_model_parallel_size=", d.tp);
  if (m.vocab > 0 && !m.vocab_padded && m.vocab % d.tp != 0)
    p.add("vocab_size=", m.vocab, " is not divisible by tensor_model_parallel_size=", d.tp,
          " (the vocab-parallel embedding splits rows evenly; pad the vocabulary to a multiple of ", d.tp, ")");
  if (m.n_layers > 0 && m.n_layers % d.pp != 0)
    p.add("num_hidden_layers=", m.n_layers, " is not divisible by pipeline_model_parallel_size=", d.pp);
  if (m.n_experts > 0 && m.n_experts % d.ep != 0)
    p.add("num_experts=", m.n_experts, " is not divisible by expert_model_parallel_size=", d.ep);
  if (m.n_experts > 0 && m.ffn > 0 && m.ffn % etp != 0)
    p.add("intermediate_size=", m.ffn, " is not divisible by expert_tensor_parallel_size=", etp);
  if (m.n_experts > 0 && d.tp > 1 && !d.sequence_parallel)
    p.add("MoE with tensor_model_parallel_size=", d.tp, " > 1 requires sequence_parallel (as in Megatron)");
  return p.status();
}

Status check_supported(const ParallelDims& d) {
  Problems p;
  if (d.ep > 1 && d.cp > 1)
    p.add("not supported yet: expert_model_parallel_size=", d.ep, " with context_parallel_size=", d.cp,
          " (expert parallelism runs with tensor, data and pipeline parallelism: set context_parallel_size=1)");
  return p.status();
}

GridLayout::GridLayout(const ParallelDims& dims, int world_size) : dims_(dims), world_(world_size) {
  validate(dims, world_size).throw_if_error();
  dp_ = world_ / (dims.tp * dims.cp * dims.pp);
  edp_ = world_ / (dims.expert_tp() * dims.ep * dims.pp);
  dims_.dp = dp_;
}

std::vector<std::vector<int>> GridLayout::ranks_of(GroupKind k) const {
  const auto order = parse_order(dims_.order);
  const Generator dense = dense_generator(dims_, order, dp_);
  const Generator expert = expert_generator(dims_, order, edp_);
  switch (k) {
    case GroupKind::Tp: return dense.groups({"tp"});
    case GroupKind::Cp: return dense.groups({"cp"});
    case GroupKind::Dp: return dense.groups({"dp"});
    case GroupKind::DpCp: return dense.groups({"dp", "cp"});
    case GroupKind::Pp: return dense.groups({"pp"});
    case GroupKind::TpCp: return dense.groups({"tp", "cp"});
    case GroupKind::Mp: return dense.groups({"tp", "pp"});
    case GroupKind::TpDp: return dense.groups({"tp", "dp"});
    case GroupKind::TpDpCp: return dense.groups({"tp", "dp", "cp"});
    case GroupKind::Embedding:
    case GroupKind::PositionEmbedding: {
      // Megatron's default_embedding_ranks / default_position_embedding_ranks.
      std::vector<std::vector<int>> out;
      for (const auto& pp : dense.groups({"pp"})) {
        if (k == GroupKind::PositionEmbedding || pp.size() == 1)
          out.push_back({pp.front()});
        else
          out.push_back({pp.front(), pp.back()});
      }
      return out;
    }
    case GroupKind::Ep: return expert.groups({"ep"});
    case GroupKind::Etp: return expert.groups({"tp"});
    case GroupKind::EtpEp: return expert.groups({"tp", "ep"});
    case GroupKind::EtpEpPp: return expert.groups({"tp", "ep", "pp"});
    case GroupKind::Edp: return expert.groups({"dp"});
  }
  KS_FAIL("unknown group kind ", int(k));
}

GridLayout::Member GridLayout::locate(GroupKind k, int rank) const {
  const auto groups = ranks_of(k);
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].size(); ++i)
      if (groups[g][i] == rank) return {int(g), int(i)};
  return {};
}

GridLayout::Coords GridLayout::coords(int rank) const {
  KS_CHECK(rank >= 0 && rank < world_, "rank ", rank, " outside world of ", world_);
  const auto order = parse_order(dims_.order);
  auto digits = [&](const Generator& g) {
    std::map<std::string, int> at;
    int r = rank;
    for (size_t i = 0; i < g.order.size(); ++i) {
      at[g.order[i]] = r % g.sizes[i];
      r /= g.sizes[i];
    }
    return at;
  };
  auto dense = digits(dense_generator(dims_, order, dp_));
  auto expert = digits(expert_generator(dims_, order, edp_));
  return {dense["tp"], dense["cp"], dense["dp"], dense["pp"], expert["tp"], expert["ep"], expert["dp"]};
}

ProcessGrid::ProcessGrid(const comm::World& world, const ParallelDims& dims, Device device)
    : layout_(dims, world.size()), rank_(world.rank()), coords_(layout_.coords(world.rank())), device_(device) {
  groups_.resize(std::size(kAllGroupKinds));
  // Every rank walks the kinds in the same order, so the splits match up.
  for (GroupKind k : kAllGroupKinds) {
    const auto groups = layout_.ranks_of(k);
    size_t largest = 0;
    for (const auto& g : groups) largest = std::max(largest, g.size());
    const GridLayout::Member me = layout_.locate(k, rank_);
    auto& slot = groups_[size_t(k)];
    if (largest == 1)  // the same on every rank, so skipping the split is collective-safe
      slot = me.group < 0 ? nullptr : comm::local_group(group_kind_name(k));
    else
      slot = adopt(world.split(me.group < 0 ? comm::World::kNoGroup : me.group, me.index, group_kind_name(k)));
  }
  world_ = adopt(world.group());
}

std::shared_ptr<comm::ProcessGroup> ProcessGrid::adopt(std::shared_ptr<comm::ProcessGroup> g) const {
  // Wrapping makes no communicator yet (NCCL's is made at a group's first device call).
  return device_ == Device::CPU ? g : comm::device_group(std::move(g));
}

const std::shared_ptr<comm::ProcessGroup>& ProcessGrid::group(GroupKind k) const { return groups_.at(size_t(k)); }

}  // namespace kestrel::parallel
