#include "parallel/cp_split.h"

#include <algorithm>

#include "ops/copy.h"

namespace kestrel::parallel {

const char* cp_algo_name(CpAlgo a) {
  switch (a) {
    case CpAlgo::Ulysses: return "ulysses_cp_algo";
    case CpAlgo::Ring: return "megatron_cp_algo";
    case CpAlgo::Hybrid: return "hybrid_cp_algo";
  }
  return "?";
}

CpAlgo parse_cp_algo(const std::string& name) {
  for (CpAlgo a : {CpAlgo::Ulysses, CpAlgo::Ring, CpAlgo::Hybrid})
    if (name == cp_algo_name(a)) return a;
  KS_FAIL("context_parallel_algo '", name, "' is not one of ulysses_cp_algo, megatron_cp_algo, hybrid_cp_algo");
}

int cp_ulysses_degree(CpAlgo algo, int cp, int u) {
  KS_CHECK(cp >= 1, "context_parallel_size ", cp, " must be >= 1");
  switch (algo) {
    case CpAlgo::Ulysses: return cp;
    case CpAlgo::Ring: return 1;
    case CpAlgo::Hybrid:
      if (u <= 1 || u >= cp || cp % u != 0)
        KS_FAIL("hybrid_cp_algo: ulysses_degree_in_cp ", u, " must divide context_parallel_size ", cp,
                " and lie strictly between 1 and ", cp, " (u = ", cp, " is ulysses_cp_algo, u = 1 megatron_cp_algo)");
      return u;
  }
  return 1;
}

Status check_cp_heads(int64_t H, int64_t Hkv, int tp, int cp, int u) {
  using detail::concat;
  if (tp < 1 || cp < 1 || u < 1 || cp % u != 0)
    return Status::error(concat("context parallelism: tp ", tp, ", cp ", cp, ", Ulysses degree ", u,
                                " (each >= 1, and the Ulysses degree must divide cp)"));
  if (u == 1) return Status::ok();  // the ring keeps every head on every rank
  if (H <= 0 || Hkv <= 0 || H % Hkv != 0 || H % tp != 0)
    return Status::error(concat("context parallelism: num_attention_heads ", H, " and num_key_value_heads ", Hkv,
                                " with tensor_model_parallel_size ", tp, " do not form whole head groups per rank"));
  const int64_t h = H / tp;
  const int64_t hkv = Hkv % tp == 0 ? Hkv / tp : 1;  // tp replicates kv heads when fewer than tp
  if (h % u != 0)
    return Status::error(concat("Ulysses context parallelism splits the ", h,
                                " query heads of a tensor-parallel rank (num_attention_heads ", H, " / tp ", tp,
                                ") over Ulysses degree ", u, " (cp ", cp, "), which does not divide them; ",
                                "choose a degree dividing ", h,
                                " (hybrid_cp_algo with a smaller ulysses_degree_in_cp, or megatron_cp_algo)"));
  if (hkv % u != 0 && u % hkv != 0)
    return Status::error(concat("Ulysses context parallelism: the ", hkv, " kv heads of a tensor-parallel rank ",
                                "(num_key_value_heads ", Hkv, ", tp ", tp, ") and Ulysses degree ", u,
                                " must divide one another (kv heads are split, or replicated when fewer than the ",
                                "degree)"));
  return Status::ok();
}

namespace {

struct Geometry {
  int cp, rank, u, R, g;
  const std::vector<int32_t>& cu;
  const std::vector<int32_t>& pos;
  std::vector<int64_t> L, c, loc_start, work_start;

  int64_t owner(int64_t b, int64_t p) const {
    const int64_t k = p / c[b];
    return k < cp ? k : 2 * cp - 1 - k;
  }
  int64_t local_row(int64_t b, int64_t p) const {
    const int64_t k = p / c[b];
    return loc_start[b] + (k < cp ? 0 : c[b]) + p % c[b];
  }
  int32_t position(int64_t b, int64_t p) const {
    const int64_t base = cu[b];
    return p < L[b] ? pos[base + p] : int32_t(pos[base + L[b] - 1] + (p - L[b] + 1));
  }
  int32_t full_row(int64_t b, int64_t p) const { return p < L[b] ? int32_t(cu[b] + p) : -1; }
  // The padded index of work row i of sequence b in Ulysses group h.
  int64_t work_padded(int64_t b, int64_t h, int64_t i) const {
    const int64_t n = int64_t(u) * c[b];  // half of the group's rows of b
    return i < n ? h * n + i : (2 * R - 1 - h) * n + (i - n);
  }
};

void check_batch(const CpBatchView& v) {
  KS_CHECK(v.cu_seqlens && v.positions, "make_cp_layout: the batch's cu_seqlens and positions are required");
  const auto& cu = *v.cu_seqlens;
  const auto& pos = *v.positions;
  KS_CHECK(!cu.empty() && cu.front() == 0 && int64_t(cu.back()) == int64_t(pos.size()), "make_cp_layout: cu_seqlens (",
           cu.size(), " entries, last ", cu.empty() ? -1 : cu.back(), ") must start at 0 and end at the ", pos.size(),
           " rows of the batch");
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    KS_CHECK(cu[b] <= cu[b + 1], "make_cp_layout: cu_seqlens decreases at sequence ", b);
    for (int32_t t = cu[b] + 1; t < cu[b + 1]; ++t)
      KS_CHECK(pos[t] > pos[t - 1], "make_cp_layout: positions of sequence ", b, " do not increase at row ", t, " (",
               pos[t - 1], " then ", pos[t], "); context parallelism takes full sequences, one position per token");
  }
}

std::vector<ops::AttentionBlock> ring_blocks(const Geometry& G, const std::vector<std::vector<int32_t>>& group_pos,
                                             const std::vector<int32_t>& work_cu, const Tensor& work_cu_t) {
  const int64_t B = int64_t(G.L.size());
  const Tensor q_pos = Tensor::from_host(group_pos[G.g], {int64_t(group_pos[G.g].size())}, MemCategory::Activations);
  std::vector<ops::AttentionBlock> blocks(G.R);
  for (int h = 0; h < G.R; ++h) {
    ops::AttentionBlock& blk = blocks[h];
    blk.q_pos = q_pos;
    blk.k_pos = h == G.g ? q_pos
                         : Tensor::from_host(group_pos[h], {int64_t(group_pos[h].size())}, MemCategory::Activations);
    if (h == G.g) {
      blk.cu_q = blk.cu_k = work_cu_t;
      continue;
    }
    std::vector<int32_t> cq{0}, ck{0};
    for (int64_t b = 0; b < B; ++b) {
      const int32_t w = work_cu[b], n = int32_t(int64_t(G.u) * G.c[b]);
      if (h < G.g) {  // (all queries, h's early half), (no queries, h's late half)
        cq.insert(cq.end(), {w + 2 * n, w + 2 * n});
        ck.insert(ck.end(), {w + n, w + 2 * n});
      } else {        // (early queries, no keys), (late queries, all of h's keys)
        cq.insert(cq.end(), {w + n, w + 2 * n});
        ck.insert(ck.end(), {w, w + 2 * n});
      }
    }
    blk.cu_q = Tensor::from_host(cq, {2 * B + 1}, MemCategory::Activations);
    blk.cu_k = Tensor::from_host(ck, {2 * B + 1}, MemCategory::Activations);
  }
  return blocks;
}

}  // namespace

CpLayout make_cp_layout(const CpBatchView& batch, int cp, int rank, int u, Device dev) {
  KS_CHECK(cp >= 1 && rank >= 0 && rank < cp, "make_cp_layout: rank ", rank, " of a cp group of ", cp);
  KS_CHECK(u >= 1 && cp % u == 0, "make_cp_layout: Ulysses degree ", u, " must divide context_parallel_size ", cp);
  check_batch(batch);
  const auto& cu = *batch.cu_seqlens;
  const auto& pos = *batch.positions;
  const int64_t B = int64_t(cu.size()) - 1, T = int64_t(pos.size());
  Geometry G{cp, rank, u, cp / u, rank / u, cu, pos, {}, {}, {}, {}};

  CpLayout L;
  L.cp = cp;
  L.rank = rank;
  L.ulysses = u;
  L.num_seqs = B;
  L.full_tokens = T;
  G.L.resize(B);
  G.c.resize(B);
  G.loc_start.resize(B);
  G.work_start.resize(B);
  int64_t Tl = 0;
  for (int64_t b = 0; b < B; ++b) {
    G.L[b] = cu[b + 1] - cu[b];
    const int64_t P = (G.L[b] + 2 * cp - 1) / (2 * cp) * (2 * cp);
    G.c[b] = P / (2 * cp);
    G.loc_start[b] = Tl;
    G.work_start[b] = Tl * u;
    Tl += 2 * G.c[b];
    L.padded_tokens += P;
  }
  KS_CHECK(Tl <= INT32_MAX / cp, "make_cp_layout: ", Tl * cp, " padded rows do not fit i32 row indices");
  L.seq_len = G.L;
  L.chunk = G.c;
  L.local_tokens = Tl;
  L.work_tokens = Tl * u;

  // This rank's rows: chunk r then chunk 2cp-1-r of each sequence.
  L.local.cu_seqlens.push_back(0);
  std::vector<int32_t> local_in_full;
  local_in_full.reserve(size_t(Tl));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t k : {int64_t(rank), int64_t(2 * cp - 1 - rank)})
      for (int64_t o = 0; o < G.c[b]; ++o) {
        const int64_t p = k * G.c[b] + o;
        const int32_t f = G.full_row(b, p);
        L.local.positions.push_back(G.position(b, p));
        L.local.full_row.push_back(f);
        local_in_full.push_back(f < 0 ? int32_t(T) : f);
        L.local.max_seqlen = std::max<int64_t>(L.local.max_seqlen, int64_t(L.local.positions.back()) + 1);
      }
    L.local.cu_seqlens.push_back(int32_t(G.loc_start[b] + 2 * G.c[b]));
  }
  L.local_rows_in_full = Tensor::from_host(local_in_full, {Tl}, MemCategory::Activations);

  std::vector<int32_t> full_in_gathered(size_t(T), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p = 0; p < G.L[b]; ++p) full_in_gathered[cu[b] + p] = int32_t(G.owner(b, p) * Tl + G.local_row(b, p));
  L.full_rows_in_gathered = Tensor::from_host(full_in_gathered, {T}, MemCategory::Activations);

  // The work layout of every Ulysses group's rows (positions of all R groups
  // for the ring's key blocks; the gather indices of this rank's group).
  CpLayout::Work& W = L.work;
  W.cu_host.push_back(0);
  for (int64_t b = 0; b < B; ++b) W.cu_host.push_back(int32_t(G.work_start[b] + 2 * u * G.c[b]));
  W.cu_seqlens = Tensor::from_host(W.cu_host, {B + 1}, MemCategory::Activations);
  std::vector<std::vector<int32_t>> group_pos(G.R);
  std::vector<int32_t> in_gathered, gathered_in(size_t(Tl * u), 0);
  for (int h = 0; h < G.R; ++h) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < 2 * u * G.c[b]; ++i) {
        const int64_t p = G.work_padded(b, h, i);
        group_pos[h].push_back(G.position(b, p));
        if (h != G.g) continue;
        W.full_row.push_back(G.full_row(b, p));
        const int64_t j = G.owner(b, p) - int64_t(G.g) * u;
        KS_CHECK(j >= 0 && j < u, "make_cp_layout: internal: row of sequence ", b, " outside Ulysses group ", G.g);
        const int32_t gathered = int32_t(j * Tl + G.local_row(b, p));
        gathered_in[gathered] = int32_t(in_gathered.size());
        in_gathered.push_back(gathered);
      }
  }
  W.positions = group_pos[G.g];
  if (u > 1) {
    W.rows_in_gathered = Tensor::from_host(in_gathered, {Tl * u}, MemCategory::Activations);
    W.gathered_in_work = Tensor::from_host(gathered_in, {Tl * u}, MemCategory::Activations);
  }
  if (G.R > 1) W.ring_blocks = ring_blocks(G, group_pos, W.cu_host, W.cu_seqlens);
  return dev == Device::CPU ? L : cp_layout_on(L, dev);
}

std::shared_ptr<const CpLayout> make_cp_layout_ptr(const CpBatchView& batch, int cp, int rank, int u, Device dev) {
  return std::make_shared<const CpLayout>(make_cp_layout(batch, cp, rank, u, dev));
}

CpLayout cp_layout_on(const CpLayout& layout, Device dev) {
  CpLayout L = layout;
  // Explicit uploads of the host-computed tables: the kernels on `dev` read them there.
  const auto on = [dev](Tensor& t) {
    if (t.defined() && t.device() != dev) t = t.copy_to(dev, MemCategory::Activations);
  };
  on(L.local_rows_in_full);
  on(L.full_rows_in_gathered);
  on(L.work.cu_seqlens);
  on(L.work.rows_in_gathered);
  on(L.work.gathered_in_work);
  for (ops::AttentionBlock& b : L.work.ring_blocks)
    for (Tensor* t : {&b.cu_q, &b.cu_k, &b.q_pos, &b.k_pos}) on(*t);
  return L;
}

std::vector<int32_t> CpLayout::take_local(const std::vector<int32_t>& full, int32_t pad) const {
  KS_CHECK(int64_t(full.size()) == full_tokens, "CpLayout::take_local: ", full.size(), " values for a batch of ",
           full_tokens, " rows");
  std::vector<int32_t> out(local.full_row.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = local.full_row[i] < 0 ? pad : full[size_t(local.full_row[i])];
  return out;
}

namespace {
Shape with_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  KS_CHECK(!s.empty(), "context-parallel rows: a scalar tensor has no rows");
  s[0] = rows;
  return s;
}
}  // namespace

Tensor cp_gather_rows(comm::ProcessGroup& cp_group, const CpLayout& L, const Tensor& local, MemCategory cat) {
  KS_CHECK(cp_group.size() == L.cp && cp_group.rank() == L.rank, "cp_gather_rows: the layout is rank ", L.rank, " of ",
           L.cp, ", the group '", cp_group.name(), "' rank ", cp_group.rank(), " of ", cp_group.size());
  KS_CHECK(local.dim() >= 1 && local.size(0) == L.local_tokens, "cp_gather_rows: ", local.describe(), " is not ",
           L.local_tokens, " local rows");
  // [cp * Tl, ...] every rank's local rows, rank-major
  Tensor all = Tensor::empty(with_rows(local, L.local_tokens * L.cp), local.dtype(), cat, local.device());
  cp_group.all_gather(local, all);
  Tensor full = Tensor::empty(with_rows(local, L.full_tokens), local.dtype(), cat, local.device());  // [T, ...]
  ops::gather_rows(all, L.full_rows_in_gathered, full);
  return full;
}

Tensor cp_local_rows(const CpLayout& L, const Tensor& full, float pad_fill, MemCategory cat) {
  KS_CHECK(full.dim() >= 1 && full.size(0) == L.full_tokens, "cp_local_rows: ", full.describe(), " is not the ",
           L.full_tokens, " rows of the full batch");
  // [T + 1, ...]: the full rows, then the pad rows' fill row
  Tensor padded = Tensor::empty(with_rows(full, L.full_tokens + 1), full.dtype(), cat, full.device());
  ops::pad_rows(full, padded, pad_fill);
  Tensor local = Tensor::empty(with_rows(full, L.local_tokens), full.dtype(), cat, full.device());  // [Tl, ...]
  ops::gather_rows(padded, L.local_rows_in_full, local);
  return local;
}

}  // namespace kestrel::parallel
