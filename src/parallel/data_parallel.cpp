#include "parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/copy.h"
#include "ops/optim_ops.h"

namespace kestrel::parallel {

double sum_over(comm::ProcessGroup& g, double local) {
  if (g.size() == 1) return local;
  int64_t bits;
  std::memcpy(&bits, &local, 8);
  std::vector<int64_t> all(static_cast<size_t>(g.size()));
  g.all_gather(&bits, all.data(), 1, DType::I64);
  double s = 0;
  for (int64_t b : all) {
    double v;
    std::memcpy(&v, &b, 8);
    s += v;
  }
  return s;
}

namespace {
Tensor flat_view(const Tensor& flat, int64_t off, const Shape& shape) {
  return flat.slice_rows(off, off + shape_numel(shape)).view(shape);
}
}  // namespace

DataParallel::DataParallel(std::vector<DpParam> params, comm::ProcessGroup& dp, DpOptions opts)
    : dp_(&dp), opts_(opts), flat_(params.rbegin(), params.rend()) {
  KS_CHECK(!flat_.empty(), "DataParallel: no parameters");
  KS_CHECK(opts_.bucket_bytes > 0, "DataParallel: bucket_bytes must be positive, got ", opts_.bucket_bytes);
  offsets_.push_back(0);
  for (const auto& p : flat_) {
    KS_CHECK(p.weight && p.weight->defined() && p.grad, "DataParallel: parameter '", p.name, "' has no weight");
    offsets_.push_back(offsets_.back() + p.weight->numel());
  }
  const int64_t n = dp.size(), N = offsets_.back();
  padded_ = (N + n - 1) / n * n;
  shard_ = padded_ / n;
  // The flat buffers live with the parameters (a device model's on the device; its groups move device buffers).
  const Device dev = flat_[0].weight->device();
  grads_ = Tensor::zeros({padded_}, DType::F32, MemCategory::Grads, dev);
  for (size_t i = 0; i < flat_.size(); ++i) {
    DpParam& p = flat_[i];
    KS_CHECK(p.weight->device() == dev, "DataParallel: parameter '", p.name, "' is on ",
             device_name(p.weight->device()), ", '", flat_[0].name, "' on ", device_name(dev),
             "; one flat buffer holds parameters of one device");
    Tensor view = flat_view(grads_, offsets_[i], p.weight->shape());
    if (p.grad->defined()) {
      KS_CHECK(p.grad->numel() == view.numel(), "DataParallel: grad of '", p.name, "' is ", p.grad->describe());
      view.copy_from(*p.grad);
    }
    *p.grad = view;
  }
  if (opts_.distributed_optimizer) {
    const DType dt = flat_[0].weight->dtype();
    params_ = Tensor::zeros({padded_}, dt, MemCategory::Params, dev);
    for (size_t i = 0; i < flat_.size(); ++i) {
      DpParam& p = flat_[i];
      KS_CHECK(p.weight->dtype() == dt, "DataParallel: distributed optimizer needs one parameter dtype; '", p.name,
               "' is ", p.weight->describe(), ", '", flat_[0].name, "' ", dtype_name(dt));
      Tensor view = flat_view(params_, offsets_[i], p.weight->shape());
      view.copy_from(*p.weight);
      *p.weight = view;
    }
  }
  // Buckets in flat order; the last one also covers the padding.
  Bucket cur;
  for (size_t i = 0; i < flat_.size(); ++i) {
    if (cur.last == cur.first) cur.begin = offsets_[i], cur.first = i;
    cur.last = i + 1;
    cur.end = offsets_[i + 1];
    if ((cur.end - cur.begin) * 4 >= opts_.bucket_bytes) {
      buckets_.push_back(cur);
      cur = Bucket();
      cur.first = cur.last = i + 1;
    }
  }
  if (cur.last > cur.first) buckets_.push_back(cur);
  buckets_.back().end = padded_;
}

std::pair<int64_t, int64_t> DataParallel::owned_range() const {
  if (!opts_.distributed_optimizer) return {0, numel()};
  const int64_t r = dp_->rank();
  return {std::min(r * shard_, numel()), std::min((r + 1) * shard_, numel())};
}

void DataParallel::zero_grads() { grads_.zero_(); }

void DataParallel::start_grad_sync() {
  for (auto& b : buckets_) b.launched = false;
  done_stages_.clear();
  syncing_ = true;
}

void DataParallel::grads_ready(int64_t stage) {
  if (!syncing_) return;  // an earlier micro-batch: gradients still accumulate
  done_stages_.push_back(stage);
  auto done = [&](int64_t s) { return std::find(done_stages_.begin(), done_stages_.end(), s) != done_stages_.end(); };
  // In bucket order, so every rank issues the same collectives in the same order.
  for (auto& b : buckets_) {
    if (b.launched) continue;
    for (size_t i = b.first; i < b.last; ++i)
      if (!done(flat_[i].ready_stage)) return;
    launch(b);
  }
}

void DataParallel::finish_grad_sync() {
  if (!syncing_)  // no hook this step: everything is reduced now
    for (auto& b : buckets_) b.launched = false;
  for (auto& b : buckets_)
    if (!b.launched) launch(b);
  syncing_ = false;
}

void DataParallel::launch(Bucket& b) {
  b.launched = true;
  const int n = dp_->size();
  if (n == 1) return;
  Tensor bucket = grads_.slice_rows(b.begin, b.end);
  if (opts_.average) ops::scale_(bucket, 1.0f / float(n));
  if (opts_.distributed_optimizer)
    reduce_to_owners(b.begin, b.end);
  else
    dp_->all_reduce(bucket, comm::ReduceOp::Sum);
}

void DataParallel::reduce_to_owners(int64_t b0, int64_t b1) {
  const int n = dp_->size(), r = dp_->rank();
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) send[size_t(q)] = std::max<int64_t>(0, std::min(b1, (q + 1) * shard_) - std::max(b0, q * shard_));
  const int64_t mine = send[size_t(r)];
  std::fill(recv.begin(), recv.end(), mine);
  // [n, mine]: every rank's piece of my range, on the gradients' device.
  Tensor got = Tensor::empty({n, mine}, DType::F32, MemCategory::Other, grads_.device());
  dp_->all_to_allv(grads_.slice_rows(b0, b1), send, got, recv);
  if (mine == 0) return;
  const int64_t at = std::max(b0, r * shard_);
  Tensor dst = grads_.slice_rows(at, at + mine);
  ops::sum_rows(got, dst);  // in rank order
}

double DataParallel::grad_norm(comm::ProcessGroup* tp, comm::ProcessGroup* pp) const {
  return std::sqrt(grad_sq(tp, pp));
}

double DataParallel::grad_sq(comm::ProcessGroup* tp, comm::ProcessGroup* pp) const {
  auto [lo, hi] = owned_range();
  double sq = 0;
  for (size_t i = 0; i < flat_.size(); ++i) {
    if (!flat_[i].count_in_norm) continue;
    const int64_t a = std::max(lo, offsets_[i]), b = std::min(hi, offsets_[i + 1]);
    if (a < b) sq += ops::sum_squares(grads_.slice_rows(a, b));
  }
  if (opts_.distributed_optimizer) sq = sum_over(*dp_, sq);
  if (tp) sq = sum_over(*tp, sq);
  if (pp) sq = sum_over(*pp, sq);  // each stage's parameters (a tied embedding's last-stage copy is not counted)
  return sq;
}

void DataParallel::scale_grads(float coef) {
  auto [lo, hi] = owned_range();
  Tensor owned = grads_.slice_rows(lo, hi);
  ops::scale_(owned, coef);
}

double DataParallel::clip_grad_norm(double max_norm, comm::ProcessGroup* tp, comm::ProcessGroup* pp) {
  const double norm = grad_norm(tp, pp);
  if (!std::isfinite(norm) || max_norm <= 0) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) scale_grads(float(coef));
  return norm;
}

void DataParallel::gather_params() {
  if (!opts_.distributed_optimizer || dp_->size() == 1) return;
  // A copy of the owned shard: the all-gather writes every block of params_, this one included.
  const Tensor mine = params_.slice_rows(dp_->rank() * shard_, (dp_->rank() + 1) * shard_).clone(MemCategory::Other);
  dp_->all_gather(mine, params_);
}

void DataParallel::gather_grads() {
  if (!opts_.distributed_optimizer || dp_->size() == 1) return;
  const Tensor mine = grads_.slice_rows(dp_->rank() * shard_, (dp_->rank() + 1) * shard_).clone(MemCategory::Other);
  dp_->all_gather(mine, grads_);
}

}  // namespace kestrel::parallel
