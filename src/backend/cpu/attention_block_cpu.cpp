// Block attention on CPU (ring context parallelism), the same flash-style
// kernels as attention_cpu.cpp on the same register tiles
// (attention_cpu_tiles.h), with the mask given by positions.
//
// Kernel order: within each sequence the kernels visit the query rows and
// the key rows sorted by position (stable; the rows as given when already
// sorted, which is how CP ranks hold them). Then the keys a query sees are a
// prefix of its sequence's keys, the first q_lim[i], and q_lim does not
// decrease over the sorted queries: a (query tile, key tile) pair is fully
// visible, partly visible (per-row limits, as the causal diagonal of the
// plain kernel) or invisible, and the invisible ones are never visited
// (neither their keys packed nor their scores computed). Rows are gathered
// through the order into the per-task f32 buffers, so nothing is copied to
// sort them.
//
// Forward: a task per (sequence, kv head, chunk of up to 256 sorted queries)
// packs the keys its last query sees, then runs the online softmax per query
// head and 64-query tile over 64-key tiles up to the tile's last limit. A
// query that sees no key gets out 0 and lse -inf (weight 0 in a merge).
//
// Backward (FlashAttention-2 from the final out and lse): a task per
// (sequence, kv head) keeps dK/dV of the sequence's keys in thread-local
// buffers over every query tile and query head of the group (fixed order),
// adds each tile's dQ into dq (rows and heads it alone owns), and writes
// dK/dV of all the sequence's keys (0 for keys no query sees). Results do not
// depend on the thread count.
#include "backend/cpu/attention_block_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {
namespace {

// The kernels' row order of one block pairing (see the top of this file).
struct BlockOrder {
  const int32_t* cu_q;
  const int32_t* cu_k;
  int64_t n_seqs;
  std::vector<int32_t> q_row;  // [Tq] q rows, per sequence by position
  std::vector<int32_t> k_row;  // [Tk] k rows, per sequence by position
  std::vector<int32_t> q_lim;  // [Tq] per entry of q_row: its sequence's keys it sees (a prefix of k_row's)
  int64_t lq(int64_t b) const { return cu_q[b + 1] - cu_q[b]; }
  int64_t lk(int64_t b) const { return cu_k[b + 1] - cu_k[b]; }
};

// rows [begin, end) ordered by pos (stable).
void sort_rows(const int32_t* pos, int32_t begin, int32_t end, int32_t* rows) {
  std::iota(rows, rows + (end - begin), begin);
  if (!std::is_sorted(pos + begin, pos + end))
    std::stable_sort(rows, rows + (end - begin), [pos](int32_t a, int32_t b) { return pos[a] < pos[b]; });
}

BlockOrder make_order(const BlockRows& r) {
  BlockOrder o{r.cu_q, r.cu_k, r.n_seqs, {}, {}, {}};
  o.q_row.resize(size_t(r.cu_q[r.n_seqs]));
  o.k_row.resize(size_t(r.cu_k[r.n_seqs]));
  o.q_lim.resize(o.q_row.size());
  for (int64_t b = 0; b < r.n_seqs; ++b) {
    int32_t* qr = o.q_row.data() + r.cu_q[b];
    int32_t* kr = o.k_row.data() + r.cu_k[b];
    sort_rows(r.q_pos, r.cu_q[b], r.cu_q[b + 1], qr);
    sort_rows(r.k_pos, r.cu_k[b], r.cu_k[b + 1], kr);
    int64_t j = 0;
    for (int64_t i = 0, Lk = o.lk(b); i < o.lq(b); ++i) {
      while (j < Lk && r.k_pos[kr[j]] <= r.q_pos[qr[i]]) ++j;
      o.q_lim[size_t(r.cu_q[b] + i)] = int32_t(j);
    }
  }
  return o;
}

// A row-major f32 or bf16 tensor as the kernels read it (dtype by a flag,
// checked once per row: q, k, v, out and dout may each be either).
struct Src {
  const void* base;
  bool bf16;
  int64_t ld;
};
struct Dst {
  void* base;
  bool bf16;
  int64_t ld;
};
Src src_of(const Tensor& t) { return {t.raw(), t.dtype() == DType::BF16, t.size(1)}; }
Dst dst_of(Tensor& t) { return {t.raw(), t.dtype() == DType::BF16, t.size(1)}; }

template <class O, class B>
void merge_rows(O* out, float* lse, const B* out_b, const float* lse_b, int64_t Tq, int64_t H, int64_t dv,
                int64_t begin, int64_t end) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t i = begin; i < end; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const float a = lse[h * Tq + i], b = lse_b[h * Tq + i];
      O* o = out + (i * H + h) * dv;
      const B* ob = out_b + (i * H + h) * dv;
      if (b == kNegInf) continue;  // block b has no visible key: out and lse stay bit-identical
      if (a == kNegInf) {          // nothing merged yet: take block b as it is
        for (int64_t c = 0; c < dv; ++c) store_f32(o, c, load_f32(ob, c));
        lse[h * Tq + i] = b;
        continue;
      }
      // The larger side has weight 1, the other w = e^-(|a - b|) <= 1.
      const bool a_max = a >= b;
      const float w = std::exp(a_max ? b - a : a - b), inv = 1.f / (1.f + w);
      const float wa = (a_max ? 1.f : w) * inv, wb = (a_max ? w : 1.f) * inv;
      for (int64_t c = 0; c < dv; ++c) store_f32(o, c, wa * load_f32(o, c) + wb * load_f32(ob, c));
      lse[h * Tq + i] = (a_max ? a : b) + std::log1p(w);
    }
}

}  // namespace
}  // namespace kestrel::cpu

#define KESTREL_ISA_BODY "backend/cpu/attention_block_cpu_isa.inc"
#include "backend/cpu/isa_each.inc"

namespace kestrel::cpu {

void attention_block_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const BlockRows& rows,
                         const AttnParams& p, Tensor& out, Tensor& lse) {
  const BlockOrder o = make_order(rows);
  KESTREL_ISA_CALL(attention_block_fwd, src_of(q), src_of(k), src_of(v), o, p, dst_of(out), lse.data<float>(),
                   q.size(0));
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const int64_t H = lse.size(0), Tq = lse.size(1), dv = Tq > 0 ? out.size(1) / H : 0;
  float* l = lse.data<float>();
  const float* lb = lse_b.data<float>();
  dispatch_float(out.dtype(), [&](auto o_tag) {
    using O = decltype(o_tag);
    dispatch_float(out_b.dtype(), [&](auto b_tag) {
      using B = decltype(b_tag);
      O* o = ptr<O>(out);
      const B* ob = ptr<B>(out_b);
      parallel_blocks(Tq, H * dv, [&](int64_t b, int64_t e) { merge_rows(o, l, ob, lb, Tq, H, dv, b, e); });
    });
  });
}

void attention_block_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         const Tensor& dout, const BlockRows& rows, const AttnParams& p, Tensor& dq, Tensor& dk,
                         Tensor& dv) {
  const BlockOrder o = make_order(rows);
  KESTREL_ISA_CALL(attention_block_bwd, src_of(q), src_of(k), src_of(v), src_of(out), lse.data<float>(),
                   src_of(dout), o, p, dq.data<float>(), dk.data<float>(), dv.data<float>(), q.size(0));
}

}  // namespace kestrel::cpu
