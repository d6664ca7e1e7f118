#include "parallel/sharding.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/copy.h"

namespace kestrel::parallel {

const char* shard_kind_name(ShardKind k) {
  switch (k) {
    case ShardKind::Replicated: return "replicated";
    case ShardKind::Column: return "column";
    case ShardKind::Row: return "row";
    case ShardKind::Vocab: return "vocab";
    case ShardKind::KvHeads: return "kv-heads";
  }
  return "?";
}

TpHeads tp_heads(int64_t H, int64_t Hkv, int rank, int n) {
  KS_CHECK(n >= 1 && rank >= 0 && rank < n, "tp_heads: rank ", rank, " of ", n);
  if (H % n != 0)
    KS_FAIL("num_attention_heads ", H, " does not divide by tensor_model_parallel_size ", n,
            "; choose a tp size dividing ", H);
  if (Hkv <= 0 || H % Hkv != 0) KS_FAIL("num_attention_heads ", H, " is not a multiple of num_key_value_heads ", Hkv);
  if (Hkv % n != 0 && n % Hkv != 0)
    KS_FAIL("num_key_value_heads ", Hkv, " and tensor_model_parallel_size ", n,
            " must divide one another (kv heads are split, or replicated when fewer than the tp ranks)");
  TpHeads h;
  h.n_heads = H / n;
  h.head_begin = rank * h.n_heads;
  if (Hkv % n == 0) {
    h.n_kv_heads = Hkv / n;
    h.kv_head_begin = rank * h.n_kv_heads;
  } else {
    h.n_kv_heads = 1;
    h.kv_replicas = n / Hkv;
    h.kv_head_begin = rank / h.kv_replicas;
    h.kv_owner = rank % h.kv_replicas == 0;
  }
  return h;
}

int64_t padded_vocab_size(int64_t vocab, int64_t multiple, int n) {
  if (n <= 1 || multiple <= 0 || vocab % n == 0) return vocab;
  const int64_t m = multiple * n;
  return (vocab + m - 1) / m * m;
}

namespace {

// Dim-0 length a sharded tensor is split over (its padded vocabulary for Vocab).
int64_t split_len(const Shape& full, const ShardSpec& spec, int n) {
  if (spec.kind == ShardKind::Vocab && !full.empty()) return padded_vocab_size(full[0], spec.pad_multiple, n);
  return full.empty() ? 0 : full[spec.kind == ShardKind::Row ? 1 : 0];
}

// Block of dim `d` owned by `rank` for kind (Column/Vocab/Row/KvHeads): [begin, end).
std::pair<int64_t, int64_t> block_of(const Shape& full, const ShardSpec& spec, int rank, int n,
                                     const std::string& name) {
  const int dim = spec.kind == ShardKind::Row ? 1 : 0;
  KS_CHECK(int64_t(full.size()) > dim, "tensor '", name, "' of shape ", shape_str(full), " cannot be split ",
           shard_kind_name(spec.kind), "-wise");
  const int64_t len = spec.kind == ShardKind::Vocab ? split_len(full, spec, n) : full[size_t(dim)];
  if (spec.kind == ShardKind::KvHeads) {
    KS_CHECK(spec.n_kv_heads > 0 && len % spec.n_kv_heads == 0, "tensor '", name, "' dim 0 of ", len,
             " is not a multiple of num_key_value_heads ", spec.n_kv_heads);
    const int64_t hd = len / spec.n_kv_heads, Hkv = spec.n_kv_heads;
    if (Hkv % n == 0) return {rank * (Hkv / n) * hd, (rank + 1) * (Hkv / n) * hd};
    if (n % Hkv != 0)
      KS_FAIL("tensor '", name, "': num_key_value_heads ", Hkv, " and tensor_model_parallel_size ", n,
              " must divide one another");
    const int64_t head = rank / (n / Hkv);
    return {head * hd, (head + 1) * hd};
  }
  if (len % n != 0)
    KS_FAIL("tensor '", name, "' of shape ", shape_str(full), ": dim ", dim, " (", len,
            ") does not divide by tensor_model_parallel_size ", n, " for a ", shard_kind_name(spec.kind), " split");
  const int64_t b = len / n;
  return {rank * b, (rank + 1) * b};
}

int64_t inner_of(const Shape& s, int from) {
  int64_t k = 1;
  for (size_t i = size_t(from); i < s.size(); ++i) k *= s[i];
  return k;
}

}  // namespace

Shape shard_shape(const Shape& full, const ShardSpec& spec, int n, const std::string& name) {
  if (spec.kind == ShardKind::Replicated || n == 1) return full;
  auto [b, e] = block_of(full, spec, 0, n, name);
  Shape s = full;
  s[spec.kind == ShardKind::Row ? 1 : 0] = e - b;
  return s;
}

Tensor shard_tensor(const Tensor& full, const ShardSpec& spec, int rank, int n, const std::string& name,
                    MemCategory cat) {
  if (spec.kind == ShardKind::Replicated || n == 1) return full.clone(cat);
  const Shape& fs = full.shape();
  auto [b, e] = block_of(fs, spec, rank, n, name);
  // Rows past the full tensor's (vocabulary padding) stay zero.
  const int64_t real_end = spec.kind == ShardKind::Row ? e : std::min(e, fs[0]);
  const Shape ss = shard_shape(fs, spec, n, name);
  Tensor out = real_end < e ? Tensor::zeros(ss, full.dtype(), cat) : Tensor::empty(ss, full.dtype(), cat);
  if (spec.kind != ShardKind::Row) {
    // Rows [b, real_end) of the full tensor, viewed as [rows, inner], are the top of the shard.
    const int64_t inner = inner_of(fs, 1);
    if (real_end > b) {
      Tensor top = out.view({e - b, inner}).slice_rows(0, real_end - b);
      top.copy_from(full.view({fs[0], inner}).slice_rows(b, real_end));
    }
  } else {
    // Columns [b, e) of every row: [rows, cols*inner] -> [rows, w].
    const int64_t rows = fs[0], cols = fs[1], inner = inner_of(fs, 2), w = (e - b) * inner;
    Tensor o = out.view({rows, w});
    ops::copy_cols(full.view({rows, cols * inner}), b * inner, o, 0, w);
  }
  return out;
}

Tensor gather_tensor(comm::ProcessGroup& tp, const Tensor& shard, const ShardSpec& spec, const Shape& full_shape,
                     MemCategory cat) {
  const int n = tp.size();
  if (spec.kind == ShardKind::Replicated || n == 1) return shard.clone(cat);
  KS_CHECK(shard.shape() == shard_shape(full_shape, spec, n), "gather_tensor: shard ", shard.describe(),
           " does not match full shape ", shape_str(full_shape), " split ", shard_kind_name(spec.kind), " ", n, " ways");
  // A device shard is gathered and reassembled on the host (saving, resharding:
  // not hot), and the full tensor goes back to the shard's device.
  if (shard.device() != Device::CPU)
    return gather_tensor(tp, shard.copy_to(Device::CPU), spec, full_shape, MemCategory::Other)
        .copy_to(shard.device(), cat);
  // [n, shard numel]: every rank's shard, in rank order.
  Tensor all = Tensor::empty({int64_t(n), shard.numel()}, shard.dtype(), MemCategory::Other);
  tp.all_gather(shard, all);
  Tensor out = Tensor::empty(full_shape, shard.dtype(), cat);
  for (int r = 0; r < n; ++r) {
    auto [b, e] = block_of(full_shape, spec, r, n, "");
    const Tensor piece = all.slice_rows(r, r + 1);  // [1, shard numel]
    if (spec.kind != ShardKind::Row) {
      // Replicated kv heads arrive from every replica; each copy is identical.
      // Vocabulary padding rows (past the full tensor's) are dropped.
      const int64_t inner = inner_of(full_shape, 1), real_end = std::min(e, full_shape[0]);
      if (real_end > b) {
        Tensor rows = out.view({full_shape[0], inner}).slice_rows(b, real_end);
        rows.copy_from(piece.view({e - b, inner}).slice_rows(0, real_end - b));
      }
    } else {
      // Columns [b, e) of every row: [rows, w] -> [rows, cols*inner].
      const int64_t rows = full_shape[0], cols = full_shape[1], inner = inner_of(full_shape, 2), w = (e - b) * inner;
      Tensor o = out.view({rows, cols * inner});
      ops::copy_cols(piece.view({rows, w}), 0, o, b * inner, w);
    }
  }
  return out;
}

ShardSpec hf_shard_spec(const std::string& name, int64_t n_kv_heads) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  auto ends = [&](const char* s) {
    const size_t k = std::strlen(s);
    return name.size() >= k && name.compare(name.size() - k, k, s) == 0;
  };
  if (has("embed_tokens") || has("lm_head")) return {ShardKind::Vocab, 0};
  // MLA (DeepSeek): the per-head up projections q_b_proj and kv_b_proj split
  // by heads like q_proj; q_a_proj and kv_a_proj_with_mqa stay replicated.
  if (has("q_proj") || has("q_b_proj") || has("kv_b_proj") || has("gate_proj") || has("up_proj"))
    return {ShardKind::Column, 0};
  if (has("k_proj") || has("v_proj")) return {ShardKind::KvHeads, n_kv_heads};
  if ((has("o_proj") || has("down_proj")) && ends(".weight")) return {ShardKind::Row, 0};
  return {ShardKind::Replicated, 0};
}

}  // namespace kestrel::parallel
