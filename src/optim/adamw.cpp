// The update itself is ops::adamw_step (ops/optim_ops.h, whose kernels keep
// torch's exact f32 arithmetic); this file owns the flat space, the held
// masters and the state I/O, and touches tensor data only through ops and
// Tensor's copy methods.
#include "optim/adamw.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/device_hooks.h"
#include "ops/optim_ops.h"
#include "ops/reuse_fp32_ops.h"

namespace kestrel::optim {

namespace {
int64_t slot_numel(const ParamSlot& p) { return p.master.defined() ? p.master.numel() : p.model_copy.numel(); }
}  // namespace

std::string OptimizerMemory::to_string() const {
  const double n = params ? double(params) : 1.0;
  char res[64] = "";
  if (residual_bytes > 0)
    std::snprintf(res, sizeof res, ", residual %.3f; reuse_fp32_param", double(residual_bytes) / n);
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.3f B/param (m %.3f, v %.3f, master %.3f%s) over %lld params, %lld owned",
                bytes_per_param(), double(exp_avg_bytes) / n, double(exp_avg_sq_bytes) / n, double(master_bytes) / n,
                res, (long long)params, (long long)owned);
  return buf;
}

AdamW::AdamW(std::vector<ParamSlot> params, AdamWConfig cfg, int64_t state_begin, int64_t state_end,
             bool reuse_fp32, int64_t offload_pieces)
    : params_(std::move(params)), cfg_(cfg), reuse_(reuse_fp32) {
  offsets_.reserve(params_.size() + 1);
  offsets_.push_back(0);
  if (!params_.empty()) device_ = params_[0].grad.device();
  KS_CHECK(offload_pieces >= 0, "AdamW: offload_pieces must be >= 0, got ", offload_pieces);
  KS_CHECK(offload_pieces == 0 || !reuse_, "AdamW: the swap optimizer (and optimizer offload) cannot be combined "
           "with reuse_fp32_param (MindSpeed: --swap-optimizer does not support --reuse-fp32-param); turn one of "
           "them off");
  swap_chunks_ = device_ == Device::CPU ? 0 : offload_pieces;  // host memory already on the CPU
  state_device_ = swap_chunks_ > 0 ? Device::CPU : device_;
  for (auto& p : params_) {
    for (const Tensor* t : {&p.master, &p.model_copy, &p.grad})
      KS_CHECK(!t->defined() || t->device() == device_, "AdamW: '", p.name, "' has tensors on ", device_name(device_),
               " and on ", device_name(t->device()), "; one optimizer steps tensors on one device");
    if (!p.master.defined()) {
      KS_CHECK(p.model_copy.defined(), "AdamW: '", p.name, "' has neither a master nor a model copy");
      // An f32 model copy needs no separate master: step it in place.
      if (p.model_copy.dtype() == DType::F32) std::swap(p.master, p.model_copy);
    }
    const int64_t n = slot_numel(p);
    if (p.master.defined())
      KS_CHECK(p.master.dtype() == DType::F32, "AdamW: master of '", p.name, "' must be an f32 tensor, got ",
               p.master.describe());
    KS_CHECK(p.grad.defined() && p.grad.dtype() == DType::F32 && p.grad.numel() == n, "AdamW: grad of '", p.name,
             "' must be f32 with ", n, " elements, got ", p.grad.describe());
    if (p.model_copy.defined())
      KS_CHECK(p.model_copy.numel() == n &&
                   (p.model_copy.dtype() == DType::BF16 || p.model_copy.dtype() == DType::F16 ||
                    p.model_copy.dtype() == DType::F32),
               "AdamW: model copy of '", p.name, "' must be a float tensor with ", n, " elements, got ",
               p.model_copy.describe());
    if (reuse_ && !p.master.defined())
      KS_CHECK(p.model_copy.dtype() == DType::BF16, "AdamW: reuse_fp32_param needs bf16 model copies (MindSpeed: "
               "bf16 only); '", p.name, "' is ", p.model_copy.describe());
    offsets_.push_back(offsets_.back() + n);
  }
  KS_CHECK(cfg_.beta1 >= 0 && cfg_.beta1 < 1 && cfg_.beta2 >= 0 && cfg_.beta2 < 1 && cfg_.eps >= 0 &&
               cfg_.weight_decay >= 0,
           "AdamW: invalid hyperparameters beta1=", cfg_.beta1, " beta2=", cfg_.beta2, " eps=", cfg_.eps,
           " weight_decay=", cfg_.weight_decay);
  state_begin_ = state_begin;
  state_end_ = state_end < 0 ? numel() : state_end;
  KS_CHECK(0 <= state_begin_ && state_begin_ <= state_end_ && state_end_ <= numel(), "AdamW: owned range [",
           state_begin_, ", ", state_end_, ") outside the flat space of ", numel(), " elements");
  m_ = state_tensor({state_end_ - state_begin_}, DType::F32);
  v_ = state_tensor({state_end_ - state_begin_}, DType::F32);
  m_.zero_();
  v_.zero_();

  // Held masters: the owned elements of every master-less slot, end to end in
  // flat order (one contiguous buffer when all slots are held).
  held_off_.assign(params_.size(), -1);
  int64_t held_n = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].master.defined()) continue;
    held_any_ = true;
    held_off_[i] = held_n;
    auto [lo, hi] = owned_of(i);
    held_n += hi - lo;
  }
  if (!held_any_) {
    reuse_ = false;  // nothing to reuse: every slot has its own master (f32 weights, or full masters)
    return;
  }
  if (reuse_) {
    // Residual 0 and no flags: the master starts equal to the copy widened to
    // f32, exactly as a full master made with model_copy.to(F32).
    held_ = Tensor::zeros({held_n}, DType::BF16, MemCategory::OptimizerState, state_device_);
    return;
  }
  held_ = state_tensor({held_n}, DType::F32);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (held_off_[i] < 0) continue;
    auto [lo, hi] = owned_of(i);
    if (lo == hi) continue;
    // bf16/f16 -> f32 is exact: the held master starts equal to a full master
    // made with model_copy.to(F32).
    Tensor src = params_[i].model_copy.view({-1}).slice_rows(lo - offsets_[i], hi - offsets_[i]);
    held_.slice_rows(held_off_[i], held_off_[i] + (hi - lo)).copy_from(src);
  }
}

std::pair<int64_t, int64_t> AdamW::owned_of(size_t i) const {
  KS_CHECK(i < params_.size(), "AdamW: parameter index ", i, " out of ", params_.size());
  const int64_t lo = std::max(state_begin_, offsets_[i]), hi = std::min(state_end_, offsets_[i + 1]);
  return lo < hi ? std::make_pair(lo, hi) : std::make_pair(offsets_[i], offsets_[i]);
}

Tensor AdamW::copy_range(size_t i, int64_t lo, int64_t hi) const {
  return params_[i].model_copy.view({-1}).slice_rows(lo - offsets_[i], hi - offsets_[i]);
}

Tensor AdamW::held_range(const StateWindow& w, size_t i, int64_t lo, int64_t hi) const {
  const int64_t at = held_off_[i] + (lo - std::max(state_begin_, offsets_[i])) - w.held_begin;
  return w.held.slice_rows(at, at + (hi - lo));
}

Tensor AdamW::residual_range(size_t i, int64_t lo, int64_t hi) const { return held_range(whole(), i, lo, hi); }

Tensor AdamW::master_range(size_t i, int64_t lo, int64_t hi) const {
  KS_CHECK(!(reuse_ && held_off_[i] >= 0), "AdamW: '", params_[i].name, "' has no f32 master buffer (reuse_fp32_param)");
  if (held_off_[i] < 0) return params_[i].master.view({-1}).slice_rows(lo - offsets_[i], hi - offsets_[i]);
  return held_range(whole(), i, lo, hi);
}

Tensor AdamW::master_view(size_t i) const {
  auto [lo, hi] = owned_of(i);
  if (reuse_ && held_off_[i] >= 0) {
    Tensor out = Tensor::empty({hi - lo}, DType::F32, MemCategory::Other, device_);
    if (lo < hi) ops::reuse_fp32_recover(copy_range(i, lo, hi), residual_range(i, lo, hi), v_range(lo, hi), out, nullptr);
    return out;
  }
  if (held_off_[i] >= 0) return held_.slice_rows(held_off_[i], held_off_[i] + (hi - lo));
  return params_[i].master.view({-1}).slice_rows(lo - offsets_[i], hi - offsets_[i]);
}

void AdamW::set_master(size_t i, const Tensor& full) {
  KS_CHECK(i < params_.size(), "AdamW: parameter index ", i, " out of ", params_.size());
  ParamSlot& p = params_[i];
  const int64_t n = offsets_[i + 1] - offsets_[i];
  KS_CHECK(full.defined() && full.dtype() == DType::F32 && full.numel() == n, "AdamW: master for '", p.name,
           "' must be f32 with ", n, " elements, got ", full.describe());
  if (held_off_[i] < 0) {
    if (!p.master.same_data(full)) p.master.copy_from(full);
    refresh_model_copies(offsets_[i], offsets_[i + 1]);
    return;
  }
  auto [lo, hi] = owned_of(i);
  if (lo == hi) return;
  const Tensor src = full.view({-1}).slice_rows(lo - offsets_[i], hi - offsets_[i]);
  if (reuse_) {
    Tensor copy = copy_range(i, lo, hi), res = residual_range(i, lo, hi), v = v_range(lo, hi);
    ops::reuse_fp32_split(src, copy, res, v);
    return;
  }
  master_range(i, lo, hi).copy_from(src);
  refresh_model_copies(lo, hi);
}

void AdamW::set_moments(size_t i, const Tensor& m, const Tensor& v) {
  auto [lo, hi] = owned_of(i);
  for (const Tensor* t : {&m, &v})
    KS_CHECK(t->defined() && t->dtype() == DType::F32 && t->numel() == hi - lo, "AdamW: moment for '",
             params_[i].name, "' must be f32 with ", hi - lo, " elements (its owned range), got ", t->describe());
  if (lo == hi) return;
  m_.slice_rows(lo - state_begin_, hi - state_begin_).copy_from(m.view({-1}));
  v_range(lo, hi).copy_from(v.view({-1}));
}

void AdamW::set_step_count(int64_t step) {
  KS_CHECK(step >= 0, "AdamW: step count must be >= 0, got ", step);
  step_ = step;
}

Tensor AdamW::recovered_masters() const {
  Tensor out = Tensor::empty({held_.numel()}, DType::F32, MemCategory::Other, device_);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (held_off_[i] < 0) continue;
    auto [lo, hi] = owned_of(i);
    if (lo == hi) continue;
    Tensor w = out.slice_rows(held_off_[i], held_off_[i] + (hi - lo));
    ops::reuse_fp32_recover(copy_range(i, lo, hi), residual_range(i, lo, hi), v_range(lo, hi), w, nullptr);
  }
  return out;
}

Tensor AdamW::exp_avg_sq_clean() const {
  if (!reuse_) return v_.clone(MemCategory::Other);
  // Flags sit only on the elements of held slots; the others' bit 31 is v's own (0).
  Tensor out = v_.clone(MemCategory::Other);
  Tensor scratch;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (held_off_[i] < 0) continue;
    auto [lo, hi] = owned_of(i);
    if (lo == hi) continue;
    if (!scratch.defined() || scratch.numel() < hi - lo) scratch = Tensor::empty({hi - lo}, DType::F32, MemCategory::Other, device_);
    Tensor w = scratch.slice_rows(0, hi - lo), vc = out.slice_rows(lo - state_begin_, hi - state_begin_);
    ops::reuse_fp32_recover(copy_range(i, lo, hi), residual_range(i, lo, hi), v_range(lo, hi), w, &vc);
  }
  return out;
}

std::string AdamW::first_non_finite() const {
  // sum_squares is finite exactly when every element is (an f32 square is below 2^256).
  auto bad = [](const Tensor& t) { return t.numel() > 0 && !std::isfinite(ops::sum_squares(t)); };
  if (bad(m_)) return "exp_avg";
  if (bad(v_)) return "exp_avg_sq";  // squares ignore the flags in the sign bit
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamSlot& p = params_[i];
    if (!p.model_copy.defined() && held_off_[i] < 0) continue;  // an f32 weight: the model's own parameter
    if (bad(master_view(i))) return std::string("master.") + p.name;
  }
  return "";
}

void AdamW::step_range(int64_t begin, int64_t end, double lr) { step_ranges({{begin, end}}, lr); }

void AdamW::step_ranges(const std::vector<std::pair<int64_t, int64_t>>& ranges, double lr) {
  for (auto [b, e] : ranges)
    KS_CHECK(state_begin_ <= b && b <= e && e <= state_end_, "AdamW: step range [", b, ", ", e,
             ") outside the owned range [", state_begin_, ", ", state_end_, ")");
  ++step_;
  for (auto [b, e] : ranges) {
    if (swap_chunks_ > 0) step_swapped(b, e, lr);
    else step_one(b, e, lr, whole());
  }
}

std::pair<int64_t, int64_t> AdamW::held_span(int64_t lo, int64_t hi) const {
  int64_t h0 = -1, h1 = -1;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (held_off_[i] < 0) continue;
    const auto [olo, ohi] = owned_of(i);
    const int64_t a = std::max(lo, olo), b = std::min(hi, ohi);
    if (a >= b) continue;
    const int64_t base = held_off_[i] - std::max(state_begin_, offsets_[i]);
    if (h0 < 0) h0 = base + a;
    h1 = base + b;
  }
  return h0 < 0 ? std::pair<int64_t, int64_t>{0, 0} : std::pair<int64_t, int64_t>{h0, h1};
}

void AdamW::step_swapped(int64_t begin, int64_t end, double lr) {
  const int64_t n = state_end_ - state_begin_, piece = (n + swap_chunks_ - 1) / swap_chunks_;
  struct Piece {
    int64_t lo, hi, h0, h1;  // flat range, and its held_ span
  };
  std::vector<Piece> pieces;
  int64_t most = 0, most_held = 0;
  for (int64_t c0 = state_begin_; n > 0 && c0 < state_end_; c0 += piece) {
    const int64_t lo = std::max(begin, c0), hi = std::min(end, std::min(state_end_, c0 + piece));
    if (lo >= hi) continue;
    const auto [h0, h1] = held_span(lo, hi);
    pieces.push_back({lo, hi, h0, h1});
    most = std::max(most, hi - lo);
    most_held = std::max(most_held, h1 - h0);
  }
  if (pieces.empty()) return;
  // MindSpeed's in-flight window of two pieces: piece k steps in slot k % 2
  // while piece k + 1 comes into the other slot and piece k - 1 leaves it.
  struct Slot {
    Tensor m, v, held;  // [most], [most], [most_held]
  };
  std::array<Slot, 2> slots;
  for (size_t k = 0; k < std::min<size_t>(2, pieces.size()); ++k) {  // one piece needs one slot
    Slot& s = slots[k];
    s.m = Tensor::empty({most}, DType::F32, MemCategory::OptimizerState, device_);
    s.v = Tensor::empty({most}, DType::F32, MemCategory::OptimizerState, device_);
    if (most_held > 0) s.held = Tensor::empty({most_held}, DType::F32, MemCategory::OptimizerState, device_);
  }
  const auto host = [&](const Piece& p) {
    return StateWindow{m_.slice_rows(p.lo - state_begin_, p.hi - state_begin_),
                       v_.slice_rows(p.lo - state_begin_, p.hi - state_begin_),
                       p.h1 > p.h0 ? held_.slice_rows(p.h0, p.h1) : Tensor(), p.lo, p.h0};
  };
  const auto dev = [&](size_t k) {
    const Piece& p = pieces[k];
    const Slot& s = slots[k % 2];
    return StateWindow{s.m.slice_rows(0, p.hi - p.lo), s.v.slice_rows(0, p.hi - p.lo),
                       p.h1 > p.h0 ? s.held.slice_rows(0, p.h1 - p.h0) : Tensor(), p.lo, p.h0};
  };
  TransferQueue& q = transfer_queue(device_);
  // Copies `from` into `to` window; the ticket of the last copy covers all three.
  const auto move = [&q](StateWindow to, const StateWindow& from) {
    q.copy(to.m, from.m);
    int64_t t = q.copy(to.v, from.v);
    if (to.held.defined()) t = q.copy(to.held, from.held);
    return t;
  };
  std::vector<int64_t> arrived(pieces.size());
  for (size_t k = 0; k < std::min<size_t>(2, pieces.size()); ++k) arrived[k] = move(dev(k), host(pieces[k]));
  int64_t left = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    q.compute_after(arrived[k]);
    step_one(pieces[k].lo, pieces[k].hi, lr, dev(k));
    left = move(host(pieces[k]), dev(k));  // queued behind the step, so it carries the update
    // Into the slot piece k has just left: queued behind piece k's step and copy out.
    if (k + 2 < pieces.size()) arrived[k + 2] = move(dev(k + 2), host(pieces[k + 2]));
  }
  // The host state is whole again before anyone reads it (a checkpoint), and
  // the slots go back to the allocator with no copy reading them.
  q.wait(left);
}

void AdamW::step_one(int64_t begin, int64_t end, double lr, const StateWindow& st) {
  // Parameters overlapping [begin, end): offsets_ is sorted.
  size_t i = size_t(std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin()) - 1;
  for (; i < params_.size() && offsets_[i] < end; ++i) {
    const int64_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i + 1]);
    if (lo >= hi) continue;
    ParamSlot& p = params_[i];
    const AdamWScalars s =
        AdamWScalars::make(lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay, step_, p.decay);
    const bool held = held_off_[i] >= 0;
    Tensor w = reuse_ && held ? Tensor()
               : held     ? held_range(st, i, lo, hi)
                          : p.master.view({-1}).slice_rows(lo - offsets_[i], hi - offsets_[i]);
    Tensor g = p.grad.view({-1}).slice_rows(lo - offsets_[i], hi - offsets_[i]);
    Tensor m = st.m.slice_rows(lo - st.begin, hi - st.begin);
    Tensor v = st.v.slice_rows(lo - st.begin, hi - st.begin);
    // The stepped range lies in the owned range, so a held slot refreshes exactly it.
    Tensor copy = p.model_copy.defined() ? p.model_copy.view({-1}).slice_rows(lo - offsets_[i], hi - offsets_[i])
                                         : Tensor();
    if (reuse_ && held) {  // recover, step and split in one pass; the copy is the high half
      Tensor res = held_range(st, i, lo, hi);
      ops::adamw_step_reuse_fp32(s, copy, res, m, v, g);
      continue;
    }
    ops::adamw_step(s, w, m, v, g, copy.defined() ? &copy : nullptr);
  }
}

void AdamW::refresh_model_copies(int64_t begin, int64_t end) {
  KS_CHECK(0 <= begin && begin <= end && end <= numel(), "AdamW: refresh range [", begin, ", ", end,
           ") outside the flat space of ", numel(), " elements");
  if (begin == end) return;
  size_t i = size_t(std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin()) - 1;
  for (; i < params_.size() && offsets_[i] < end; ++i) {
    ParamSlot& p = params_[i];
    if (!p.model_copy.defined()) continue;
    if (reuse_ && held_off_[i] >= 0) continue;  // the copy is the master's high half: always current
    int64_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i + 1]);
    if (held_off_[i] >= 0) {  // only the owned elements have a master here
      auto [olo, ohi] = owned_of(i);
      lo = std::max(lo, olo), hi = std::min(hi, ohi);
    }
    if (lo >= hi) continue;
    const DType dt = p.model_copy.dtype();
    if (dt != DType::BF16 && dt != DType::F16 && dt != DType::F32)
      KS_FAIL("AdamW: model copy of '", p.name, "' has non-float dtype ", dtype_name(dt));
    // Round to nearest even (bf16/f16) or copy (f32), unless the copy is the master itself.
    const Tensor src = master_range(i, lo, hi);
    Tensor dst = p.model_copy.view({-1}).slice_rows(lo - offsets_[i], hi - offsets_[i]);
    if (!dst.same_data(src)) dst.copy_from(src);
  }
}

OptimizerMemory AdamW::memory() const {
  OptimizerMemory mem;
  mem.params = numel();
  mem.owned = state_end_ - state_begin_;
  mem.exp_avg_bytes = int64_t(m_.nbytes());
  mem.exp_avg_sq_bytes = int64_t(v_.nbytes());
  mem.master_bytes = held_any_ && !reuse_ ? int64_t(held_.nbytes()) : 0;
  mem.residual_bytes = reuse_ ? int64_t(held_.nbytes()) : 0;
  for (const auto& p : params_)
    if (p.master.defined() && p.model_copy.defined() && !p.master.same_data(p.model_copy))
      mem.master_bytes += int64_t(p.master.nbytes());
  return mem;
}

std::string AdamW::layout_string() const {
  std::ostringstream os;
  for (size_t i = 0; i < params_.size(); ++i)
    os << (i ? ";" : "") << params_[i].name << ":" << offsets_[i + 1] - offsets_[i]
       << (params_[i].decay ? "" : ":nodecay");
  return os.str();
}

std::string AdamW::held_string() const {
  if (std::all_of(held_off_.begin(), held_off_.end(), [](int64_t o) { return o >= 0; })) return "all";
  std::ostringstream os;
  bool first = true;
  for (size_t i = 0; i < params_.size(); ++i)
    if (held_off_[i] >= 0) {
      os << (first ? "" : ";") << params_[i].name;
      first = false;
    }
  return os.str();
}

OptimizerState AdamW::state() const {
  OptimizerState s;
  Tensor step = Tensor::from_host(std::vector<int64_t>{step_}, {1});
  s.tensors = {{"exp_avg", m_}, {"exp_avg_sq", v_}, {"step", step}};
  auto num = [](double v) {
    std::ostringstream os;
    os.precision(17);
    os << v;
    return os.str();
  };
  s.metadata = {{"optimizer", "adamw"},
                {"layout", layout_string()},
                {"state_begin", std::to_string(state_begin_)},
                {"state_end", std::to_string(state_end_)},
                {"beta1", num(cfg_.beta1)},
                {"beta2", num(cfg_.beta2)},
                {"eps", num(cfg_.eps)},
                {"weight_decay", num(cfg_.weight_decay)}};
  if (held_any_) {
    s.tensors.push_back({"master", reuse_ ? recovered_masters() : held_});
    s.metadata["master"] = "held";
    s.metadata["held_params"] = held_string();
  }
  if (reuse_) {
    s.tensors[1].second = exp_avg_sq_clean();
    s.metadata["reuse_fp32_param"] = "true";  // informational: the file is the plain held format
  }
  return s;
}

Status AdamW::load_state(const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& md,
                         const std::string& origin) {
  auto meta = [&](const std::string& k) -> std::string {
    auto it = md.find(k);
    return it == md.end() ? std::string() : it->second;
  };
  if (meta("optimizer") != "adamw")
    return KS_ERR(origin, ": not an AdamW state (metadata optimizer='", meta("optimizer"), "')");
  if (meta("layout") != layout_string())
    return KS_ERR(origin, ": optimizer state was saved for different parameters (names, sizes or decay flags differ); "
                          "resume with the same model and parameter grouping");
  if (meta("state_begin") != std::to_string(state_begin_) || meta("state_end") != std::to_string(state_end_))
    return KS_ERR(origin, ": optimizer state covers [", meta("state_begin"), ", ", meta("state_end"),
                  ") of the flat space but this rank owns [", state_begin_, ", ", state_end_,
                  "); not supported yet: resharding optimizer state across a different data-parallel size");
  const bool saved_held = meta("master") == "held";
  if (saved_held && !held_any_)
    return KS_ERR(origin, ": optimizer state holds sharded f32 masters (a distributed-optimizer or reuse_fp32_param run "
                          "in bf16/f16) but this optimizer keeps full masters; resume with the same "
                          "use_distributed_optimizer and reuse_fp32_param settings");
  if (!saved_held && held_any_)
    return KS_ERR(origin, ": optimizer state has no f32 master slice (it was saved with full masters, "
                          "\"master.<name>\") but this optimizer holds sharded masters",
                  reuse_ ? " (as bf16 copy + residual, reuse_fp32_param)" : "",
                  "; resume with the same use_distributed_optimizer and reuse_fp32_param settings");
  if (held_any_ && meta("held_params") != held_string())
    return KS_ERR(origin, ": optimizer state holds masters for parameters '", meta("held_params"),
                  "' but this optimizer holds them for '", held_string(),
                  "'; resume with the same model dtype per parameter");
  for (const char* k : {"exp_avg", "exp_avg_sq", "step"})
    if (!tensors.count(k)) return KS_ERR(origin, ": optimizer state has no tensor '", k, "'");
  if (held_any_ && !tensors.count("master")) return KS_ERR(origin, ": optimizer state has no tensor 'master'");
  const Tensor& m = tensors.at("exp_avg");
  const Tensor& v = tensors.at("exp_avg_sq");
  const Tensor& st = tensors.at("step");
  for (const Tensor* t : {&m, &v})
    if (t->dtype() != DType::F32 || t->numel() != m_.numel())
      return KS_ERR(origin, ": optimizer moment is ", t->describe(), ", expected f32[", m_.numel(), "]");
  if (st.dtype() != DType::I64 || st.numel() != 1) return KS_ERR(origin, ": 'step' must be i64[1], got ", st.describe());
  if (held_any_) {
    const Tensor& w = tensors.at("master");
    if (w.dtype() != DType::F32 || w.numel() != held_.numel())
      return KS_ERR(origin, ": master slice is ", w.describe(), ", expected f32[", held_.numel(), "]");
    if (!reuse_) held_.copy_from(w);
  }
  m_.copy_from(m);
  v_.copy_from(v);
  step_ = st.to_host<int64_t>()[0];
  for (size_t i = 0; i < params_.size(); ++i)
    if (held_off_[i] >= 0) {
      auto [lo, hi] = owned_of(i);
      if (!reuse_) {
        refresh_model_copies(lo, hi);
        continue;
      }
      if (lo == hi) continue;
      // Split the saved f32 slice into the model copy, the residual and v's flags (v is loaded first).
      const Tensor src = tensors.at("master").slice_rows(held_off_[i], held_off_[i] + (hi - lo));
      Tensor copy = copy_range(i, lo, hi), res = residual_range(i, lo, hi), vr = v_range(lo, hi);
      ops::reuse_fp32_split(src, copy, res, vr);
    }
  return Status::ok();
}

}  // namespace kestrel::optim
