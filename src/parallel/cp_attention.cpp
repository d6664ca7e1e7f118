#include "parallel/cp_attention.h"

#include <vector>

#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/linear.h"

namespace kestrel::parallel {

CpGroups make_cp_groups(const comm::World& world, const GridLayout& layout, std::shared_ptr<comm::ProcessGroup> cp,
                        int u) {
  const int c = layout.dims().cp;
  KS_CHECK(cp && cp->size() == c, "make_cp_groups: the cp group has ", cp ? cp->size() : 0,
           " ranks, the grid's context_parallel_size is ", c);
  KS_CHECK(u >= 1 && c % u == 0, "make_cp_groups: Ulysses degree ", u, " must divide context_parallel_size ", c);
  const GridLayout::Member me = layout.locate(GroupKind::Cp, world.rank());
  KS_CHECK(me.index == cp->rank(), "make_cp_groups: world rank ", world.rank(), " is cp rank ", me.index,
           " in the grid, ", cp->rank(), " in the group");
  CpGroups g;
  g.cp = cp;
  if (u == c) {
    g.ulysses = cp;
    g.ring = comm::local_group("cp_ring");
  } else if (u == 1) {
    g.ulysses = comm::local_group("cp_ulysses");
    g.ring = cp;
  } else {  // the same u on every rank, so both splits are called everywhere, in this order
    const int R = c / u;
    g.ulysses = world.split(me.group * R + me.index / u, me.index % u, "cp_ulysses");
    g.ring = world.split(me.group * u + me.index % u, me.index / u, "cp_ring");
  }
  return g;
}

ops::AttentionShape cp_work_shape(const ops::AttentionShape& s, int u) {
  KS_CHECK(u >= 1 && s.n_heads % u == 0,
           "context parallelism: ", s.n_heads, " query heads do not split over Ulysses degree ", u);
  KS_CHECK(s.n_kv_heads >= 1 && (s.n_kv_heads % u == 0 || u % s.n_kv_heads == 0), "context parallelism: ",
           s.n_kv_heads, " kv heads and Ulysses degree ", u, " must divide one another");
  ops::AttentionShape w = s;
  w.n_heads = s.n_heads / u;
  w.n_kv_heads = s.n_kv_heads >= u ? s.n_kv_heads / u : 1;
  return w;
}

namespace {

// Equal blocks of `per_rank` elements to and from every rank: the Tensor
// form of all_to_all (the group's Tensor conveniences offer all_to_allv).
void all_to_all(comm::ProcessGroup& g, const Tensor& send, Tensor& recv) {
  const std::vector<int64_t> counts(size_t(g.size()), send.numel() / g.size());
  g.all_to_allv(send, counts, recv, counts);
}

void check_rows(const char* what, const Tensor& t, int64_t rows, int64_t cols, DType dt) {
  KS_CHECK(t.defined() && t.dim() == 2 && t.size(0) == rows && t.size(1) == cols && t.dtype() == dt,
           "context-parallel attention: ", what, " is ", t.defined() ? t.describe() : std::string("undefined"),
           ", expected ", dtype_name(dt), "[", rows, ", ", cols, "]");
}

}  // namespace

Tensor ulysses_scatter_heads(comm::ProcessGroup& ug, const CpLayout& L, const Tensor& x, int64_t n_heads,
                             MemCategory cat) {
  const int64_t u = ug.size(), Tl = L.local_tokens;
  KS_CHECK(u == L.ulysses && ug.rank() == L.ulysses_index(), "ulysses_scatter_heads: group '", ug.name(), "' rank ",
           ug.rank(), " of ", u, ", the layout's Ulysses place ", L.ulysses_index(), " of ", L.ulysses);
  KS_CHECK(x.dim() == 2 && x.size(0) == Tl && n_heads >= 1 && x.size(1) % n_heads == 0, "ulysses_scatter_heads: ",
           x.describe(), " is not ", Tl, " local rows of ", n_heads, " heads");
  if (u == 1) return x;
  KS_CHECK(n_heads % u == 0 || u % n_heads == 0, "ulysses_scatter_heads: ", n_heads,
           " heads and Ulysses degree ", u, " must divide one another");
  const int64_t w = x.size(1) / n_heads, nw = n_heads >= u ? n_heads / u : 1;
  // [u blocks of Tl rows, nw*w]: block j holds rank j's heads of every local row.
  Tensor send = Tensor::empty({u * Tl, nw * w}, x.dtype(), cat, x.device());
  for (int64_t j = 0; j < u; ++j) {
    Tensor blk = send.slice_rows(j * Tl, (j + 1) * Tl);
    const int64_t head = n_heads >= u ? j * nw : j / (u / n_heads);
    ops::copy_cols(x, head * w, blk, 0, nw * w);
  }
  Tensor recv = Tensor::empty({u * Tl, nw * w}, x.dtype(), cat, x.device());
  all_to_all(ug, send, recv);  // block j: rank j's local rows of this rank's heads
  Tensor work = Tensor::empty({L.work_tokens, nw * w}, x.dtype(), cat, x.device());  // [Tg, nw*w]
  ops::gather_rows(recv, L.work.rows_in_gathered, work);
  return work;
}

void ulysses_gather_heads(comm::ProcessGroup& ug, const CpLayout& L, const Tensor& work, int64_t n_heads,
                          Tensor& out) {
  const int64_t u = ug.size(), Tl = L.local_tokens;
  KS_CHECK(u == L.ulysses && ug.rank() == L.ulysses_index(), "ulysses_gather_heads: group '", ug.name(), "' rank ",
           ug.rank(), " of ", u, ", the layout's Ulysses place ", L.ulysses_index(), " of ", L.ulysses);
  KS_CHECK(out.dim() == 2 && out.size(0) == Tl && n_heads >= 1 && out.size(1) % n_heads == 0 &&
               out.dtype() == work.dtype(),
           "ulysses_gather_heads: out ", out.describe(), " is not ", Tl, " local rows of ", n_heads, " heads of ",
           work.describe());
  if (u == 1) {
    if (!out.same_data(work)) out.copy_from(work);
    return;
  }
  const int64_t w = out.size(1) / n_heads, nw = n_heads >= u ? n_heads / u : 1;
  check_rows("the work tensor", work, L.work_tokens, nw * w, out.dtype());
  const MemCategory cat = MemCategory::Activations;
  const Device dev = work.device();
  Tensor send = Tensor::empty({u * Tl, nw * w}, work.dtype(), cat, dev);
  ops::gather_rows(work, L.work.gathered_in_work, send);  // block j: rank j's local rows
  Tensor recv = Tensor::empty({u * Tl, nw * w}, work.dtype(), cat, dev);
  all_to_all(ug, send, recv);  // block j: this rank's local rows of rank j's heads
  if (n_heads >= u) {
    for (int64_t j = 0; j < u; ++j) ops::copy_cols(recv.slice_rows(j * Tl, (j + 1) * Tl), 0, out, j * nw * w, nw * w);
    return;
  }
  // Each head went to rep = u / n_heads consecutive ranks: sum their copies.
  const int64_t rep = u / n_heads;
  Tensor copies = Tensor::empty({Tl, rep * w}, work.dtype(), cat, dev);  // [Tl, rep*w]
  Tensor sum = Tensor::empty({Tl, w}, DType::F32, cat, dev);              // [Tl, w]
  for (int64_t m = 0; m < n_heads; ++m) {
    for (int64_t r = 0; r < rep; ++r)
      ops::copy_cols(recv.slice_rows((m * rep + r) * Tl, (m * rep + r + 1) * Tl), 0, copies, r * w, w);
    ops::sum_head_cols(copies, rep, 0, sum, w);
    ops::copy_cols(out.dtype() == DType::F32 ? sum : sum.to(out.dtype(), cat), 0, out, m * w, w);
  }
}

namespace {

// Tags of the ring's point-to-point messages. They only label the messages:
// NCCL has none and matches a pair's messages in the order they are posted,
// so each function below posts, between one sender and its receiver, its
// sends and the peer's receives in the same order, and issues them at the
// same points (every rank waits on each step's transfers before the next
// step posts), so no send waits on a receive of a later step.
enum RingTag : int { kTagK = 0x4350, kTagV, kTagDK, kTagDV };

struct RingPeers {
  int R, g, next, prev;
};

RingPeers ring_peers(comm::ProcessGroup& ring, const CpLayout& L, const char* who) {
  KS_CHECK(ring.size() == L.ring() && ring.rank() == L.ring_index(), who, ": group '", ring.name(), "' rank ",
           ring.rank(), " of ", ring.size(), ", the layout's ring place ", L.ring_index(), " of ", L.ring());
  const int R = ring.size(), g = ring.rank();
  return {R, g, (g + 1) % R, (g + R - 1) % R};
}

void check_work(const char* who, const CpLayout& L, const ops::AttentionShape& s, const Tensor& q, const Tensor& k,
                const Tensor& v) {
  const int64_t Tg = L.work_tokens, vd = s.value_dim();
  const DType dt = q.dtype();
  KS_CHECK(dt == DType::F32 || dt == DType::BF16, who, ": q is ", q.describe(), "; f32 or bf16");
  check_rows("q", q, Tg, s.n_heads * s.head_dim, dt);
  check_rows("k", k, Tg, s.n_kv_heads * s.head_dim, dt);
  check_rows("v", v, Tg, s.n_kv_heads * vd, dt);
}

void wait_all(std::initializer_list<std::unique_ptr<comm::PendingTransfer>*> ts) {
  for (auto* t : ts)
    if (*t) (*t)->wait(), t->reset();
}

}  // namespace

void ring_attention_fwd(comm::ProcessGroup& ring, const CpLayout& L, const ops::AttentionShape& s, const Tensor& q,
                        const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse) {
  const RingPeers P = ring_peers(ring, L, "ring_attention_fwd");
  check_work("ring_attention_fwd", L, s, q, k, v);
  const int64_t Tg = L.work_tokens, H = s.n_heads, vd = s.value_dim();
  check_rows("out", out, Tg, H * vd, q.dtype());
  check_rows("lse", lse, H, Tg, DType::F32);
  if (P.R == 1) {
    ops::attention_fwd(q, k, v, L.work.cu_seqlens, s, out, lse);
    return;
  }
  const MemCategory cat = MemCategory::Activations;
  const Device dev = q.device();
  // Double buffers for the blocks in flight: step i computes on the block
  // received at step i-1 while receiving the next into the other buffer.
  Tensor kbuf[2] = {Tensor::empty(k.shape(), k.dtype(), cat, dev), Tensor::empty(k.shape(), k.dtype(), cat, dev)};
  Tensor vbuf[2] = {Tensor::empty(v.shape(), v.dtype(), cat, dev), Tensor::empty(v.shape(), v.dtype(), cat, dev)};
  Tensor acc = Tensor::empty({Tg, H * vd}, DType::F32, cat, dev);  // merged output of the blocks so far
  Tensor blk_out = Tensor::empty({Tg, H * vd}, DType::F32, cat, dev);  // [Tg, H*vd] this block's
  Tensor blk_lse = Tensor::empty({H, Tg}, DType::F32, cat, dev);       // [H, Tg] this block's
  const Tensor *kc = &k, *vc = &v;
  for (int i = 0; i < P.R; ++i) {
    const int src = (P.g - i + P.R) % P.R;  // the ring group whose k/v block this is
    std::unique_ptr<comm::PendingTransfer> rk, rv, sk, sv;
    if (i + 1 < P.R) {  // the next block's transfer overlaps this block's attention (K before V both ways)
      rk = ring.irecv(kbuf[i % 2], P.prev, kTagK);
      rv = ring.irecv(vbuf[i % 2], P.prev, kTagV);
      sk = ring.isend(*kc, P.next, kTagK);
      sv = ring.isend(*vc, P.next, kTagV);
    }
    const ops::AttentionBlock& blk = L.work.ring_blocks[size_t(src)];
    if (i == 0) {
      ops::attention_block_fwd(q, *kc, *vc, blk, s, acc, lse);
    } else {
      ops::attention_block_fwd(q, *kc, *vc, blk, s, blk_out, blk_lse);
      ops::attention_merge(acc, lse, blk_out, blk_lse);
    }
    if (i + 1 < P.R) {
      wait_all({&sk, &sv, &rk, &rv});
      kc = &kbuf[i % 2];
      vc = &vbuf[i % 2];
    }
  }
  out.copy_from(acc);
}

// Each step's messages, from a rank to the next, in posting order (the
// receiver posts its receives from the previous rank in the same order):
//   step 0:        K, V                     (the block the next rank attends at step 1)
//   step i > 0:    dK, dV of step i-1, then K, V (the last step: no K, V)
//   after the loop: dK, dV of step R-1      (the owner's block, home)
// The accumulator of step i-1 travels with step i's block transfer rather
// than right after its own step, so every send of a step meets its receive
// in the same step on the peer: a rank never waits on a step's transfers
// while its peer waits on a later one's (a deadlock on NCCL, where a step's
// sends and receives run as one group that completes only as a whole).
void ring_attention_bwd(comm::ProcessGroup& ring, const CpLayout& L, const ops::AttentionShape& s, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        Tensor& dq, Tensor& dk, Tensor& dv) {
  const RingPeers P = ring_peers(ring, L, "ring_attention_bwd");
  check_work("ring_attention_bwd", L, s, q, k, v);
  const int64_t Tg = L.work_tokens, H = s.n_heads, vd = s.value_dim();
  // Gradients in q's dtype or f32 (bf16 training keeps activation gradients in f32).
  const DType gt = dout.dtype() == DType::F32 ? DType::F32 : q.dtype();
  check_rows("out", out, Tg, H * vd, q.dtype());
  check_rows("dout", dout, Tg, H * vd, gt);
  check_rows("lse", lse, H, Tg, DType::F32);
  check_rows("dq", dq, Tg, q.size(1), gt);
  check_rows("dk", dk, Tg, k.size(1), gt);
  check_rows("dv", dv, Tg, v.size(1), gt);
  if (P.R == 1) {
    ops::attention_bwd(q, k, v, out, lse, dout, L.work.cu_seqlens, s, dq, dk, dv);
    return;
  }
  const MemCategory cat = MemCategory::Activations;
  const Device dev = q.device();
  Tensor kbuf[2] = {Tensor::empty(k.shape(), k.dtype(), cat, dev), Tensor::empty(k.shape(), k.dtype(), cat, dev)};
  Tensor vbuf[2] = {Tensor::empty(v.shape(), v.dtype(), cat, dev), Tensor::empty(v.shape(), v.dtype(), cat, dev)};
  // f32 dK/dV accumulators travelling with their block: acc[i % 2] holds the
  // block of step i ([Tg, Hkv*hd] / [Tg, Hkv*vd]); blk_dk/dv this step's contribution.
  auto f32 = [&](const Tensor& like) { return Tensor::empty(like.shape(), DType::F32, cat, dev); };
  Tensor dk_acc[2] = {f32(k), f32(k)}, dv_acc[2] = {f32(v), f32(v)};
  Tensor blk_dk = f32(k), blk_dv = f32(v);
  Tensor dq_acc = Tensor::zeros(q.shape(), DType::F32, cat, dev);  // [Tg, H*hd]
  const Tensor *kc = &k, *vc = &v;
  for (int i = 0; i < P.R; ++i) {
    const int src = (P.g - i + P.R) % P.R, a = i % 2;
    std::unique_ptr<comm::PendingTransfer> rk, rv, sk, sv, rdk, rdv, sdk, sdv;
    if (i > 0) {  // this block's accumulator from the rank that attended it last step; ours of last step on
      rdk = ring.irecv(dk_acc[a], P.prev, kTagDK);
      rdv = ring.irecv(dv_acc[a], P.prev, kTagDV);
      sdk = ring.isend(dk_acc[1 - a], P.next, kTagDK);
      sdv = ring.isend(dv_acc[1 - a], P.next, kTagDV);
    }
    if (i + 1 < P.R) {
      rk = ring.irecv(kbuf[a], P.prev, kTagK);
      rv = ring.irecv(vbuf[a], P.prev, kTagV);
      sk = ring.isend(*kc, P.next, kTagK);
      sv = ring.isend(*vc, P.next, kTagV);
    }
    const ops::AttentionBlock& blk = L.work.ring_blocks[size_t(src)];
    ops::attention_block_bwd(q, *kc, *vc, out, lse, dout, blk, s, dq_acc, i == 0 ? dk_acc[a] : blk_dk,
                             i == 0 ? dv_acc[a] : blk_dv);
    // Every transfer of the step completes before the next step reuses a buffer.
    wait_all({&sdk, &sdv, &rdk, &rdv, &sk, &sv, &rk, &rv});
    if (i > 0) {
      ops::add_inplace(dk_acc[a], blk_dk);
      ops::add_inplace(dv_acc[a], blk_dv);
    }
    if (i + 1 < P.R) {
      kc = &kbuf[a];
      vc = &vbuf[a];
    }
  }
  // The last step's accumulator on to the next rank (its block's owner); this
  // rank's own block comes home from the previous rank with every rank's share.
  const int last = (P.R - 1) % 2;
  Tensor dk_own = blk_dk, dv_own = blk_dv;
  auto rdk = ring.irecv(dk_own, P.prev, kTagDK);
  auto rdv = ring.irecv(dv_own, P.prev, kTagDV);
  auto sdk = ring.isend(dk_acc[last], P.next, kTagDK);
  auto sdv = ring.isend(dv_acc[last], P.next, kTagDV);
  wait_all({&sdk, &sdv, &rdk, &rdv});
  dq.copy_from(dq_acc);
  dk.copy_from(dk_own);
  dv.copy_from(dv_own);
}

void cp_attention_fwd(const CpGroups& G, const CpLayout& L, const ops::AttentionShape& s, const Tensor& q,
                      const Tensor& k, const Tensor& v, Tensor& out, CpAttentionSaved& saved) {
  const int u = L.ulysses;
  KS_CHECK(G.ulysses && G.ring && G.ulysses->size() == u && G.ring->size() == L.ring(),
           "cp_attention_fwd: the groups (Ulysses ", G.ulysses ? G.ulysses->size() : 0, ", ring ",
           G.ring ? G.ring->size() : 0, ") do not match the layout (Ulysses ", u, ", ring ", L.ring(), ")");
  const ops::AttentionShape w = cp_work_shape(s, u);
  const int64_t Tl = L.local_tokens, vd = s.value_dim();
  check_rows("q", q, Tl, s.n_heads * s.head_dim, q.dtype());
  check_rows("k", k, Tl, s.n_kv_heads * s.head_dim, q.dtype());
  check_rows("v", v, Tl, s.n_kv_heads * vd, q.dtype());
  check_rows("out", out, Tl, s.n_heads * vd, q.dtype());
  saved.q = ulysses_scatter_heads(*G.ulysses, L, q, s.n_heads);
  saved.k = ulysses_scatter_heads(*G.ulysses, L, k, s.n_kv_heads);
  saved.v = ulysses_scatter_heads(*G.ulysses, L, v, s.n_kv_heads);
  const Device dev = q.device();
  saved.out = u == 1 ? out
                     : Tensor::empty({L.work_tokens, w.n_heads * vd}, q.dtype(), MemCategory::Activations, dev);
  saved.lse = Tensor::empty({w.n_heads, L.work_tokens}, DType::F32, MemCategory::Activations, dev);  // [Hw, Tg]
  ring_attention_fwd(*G.ring, L, w, saved.q, saved.k, saved.v, saved.out, saved.lse);
  if (u > 1) ulysses_gather_heads(*G.ulysses, L, saved.out, s.n_heads, out);
}

void cp_attention_bwd(const CpGroups& G, const CpLayout& L, const ops::AttentionShape& s,
                      const CpAttentionSaved& saved, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int u = L.ulysses;
  KS_CHECK(G.ulysses && G.ring && G.ulysses->size() == u && G.ring->size() == L.ring(),
           "cp_attention_bwd: the groups do not match the layout (Ulysses ", u, ", ring ", L.ring(), ")");
  const ops::AttentionShape w = cp_work_shape(s, u);
  const int64_t Tl = L.local_tokens, vd = s.value_dim();
  // Gradients in q's dtype or f32 (bf16 training keeps activation gradients in f32).
  const DType dt = dout.dtype() == DType::F32 ? DType::F32 : saved.q.dtype();
  check_rows("dout", dout, Tl, s.n_heads * vd, dt);
  check_rows("dq", dq, Tl, s.n_heads * s.head_dim, dt);
  check_rows("dk", dk, Tl, s.n_kv_heads * s.head_dim, dt);
  check_rows("dv", dv, Tl, s.n_kv_heads * vd, dt);
  const Tensor dout_w = ulysses_scatter_heads(*G.ulysses, L, dout, s.n_heads);
  auto work_grad = [&](Tensor& local, const Tensor& like) {
    return u == 1 ? local : Tensor::empty(like.shape(), dt, MemCategory::Activations, dout.device());
  };
  Tensor dq_w = work_grad(dq, saved.q), dk_w = work_grad(dk, saved.k), dv_w = work_grad(dv, saved.v);
  ring_attention_bwd(*G.ring, L, w, saved.q, saved.k, saved.v, saved.out, saved.lse, dout_w, dq_w, dk_w, dv_w);
  if (u == 1) return;
  ulysses_gather_heads(*G.ulysses, L, dq_w, s.n_heads, dq);
  ulysses_gather_heads(*G.ulysses, L, dk_w, s.n_kv_heads, dk);
  ulysses_gather_heads(*G.ulysses, L, dv_w, s.n_kv_heads, dv);
}

CpAttentionBytes cp_attention_bytes(const CpLayout& L, const ops::AttentionShape& s, DType dtype) {
  const int64_t u = L.ulysses, R = L.ring();
  const ops::AttentionShape w = cp_work_shape(s, int(u));
  const double es = double(dtype_size(dtype)), hd = double(s.head_dim), vd = double(s.value_dim());
  const double Tl = double(L.local_tokens), Tg = double(L.work_tokens);
  CpAttentionBytes b;
  if (u > 1) {
    // Each all-to-all sends u blocks of Tl rows of one rank's head shard, u-1 of them to other ranks.
    const double per_col = double(u - 1) * Tl * es;
    const double q_cols = double(w.n_heads) * hd, kv_cols = double(w.n_kv_heads) * (hd + vd);
    const double o_cols = double(w.n_heads) * vd;
    b.ulysses_fwd = per_col * (q_cols + kv_cols + o_cols);
    b.ulysses_bwd = b.ulysses_fwd;  // dout, then dq, dk, dv: the same shapes
    b.ulysses_calls_fwd = b.ulysses_calls_bwd = 4;
  }
  if (R > 1) {
    const double kv = Tg * double(w.n_kv_heads) * (hd + vd);
    b.ring_fwd = double(R - 1) * kv * es;
    b.ring_bwd = double(R - 1) * kv * es + double(R) * kv * 4.0;
    b.ring_sends_fwd = 2 * (R - 1);
    b.ring_sends_bwd = 2 * (R - 1) + 2 * R;
  }
  return b;
}

}  // namespace kestrel::parallel
