// Where a model's weights and gradients live between phases (param_offload,
// grad_offload): verl's offload_megatron_model_to_cpu / load_megatron_model_to_gpu
// in function. Each distinct storage moves once (a parameter may be a view of
// a shared buffer), to the backend's pinned host memory and back to the
// model's device allocator.
#include <set>

#include "core/device_hooks.h"
#include "model/transformer.h"

namespace kestrel::model {

namespace {

// The distinct storages behind the weights (or the gradients) of ps.
std::vector<Storage*> storages_of(const std::vector<Param*>& ps, bool grads) {
  std::vector<Storage*> out;
  std::set<Storage*> seen;
  for (Param* p : ps) {
    const Tensor& t = grads ? p->grad : p->weight;
    if (!t.defined()) continue;
    Storage* s = t.storage().get();
    if (s->owned() && seen.insert(s).second) out.push_back(s);
  }
  return out;
}

void move_all(const std::vector<Storage*>& ss, Allocator* target) {
  for (Storage* s : ss) s->relocate(target);
}

}  // namespace

void CausalLM::offload_to_host(bool weights, bool grads) {
  if (device() == Device::CPU) return;  // host memory already
  Allocator* host = pinned_host_allocator();
  if (weights && !weights_offloaded_) {
    move_all(storages_of(state_tensors(), false), host);
    weights_offloaded_ = true;
  }
  if (grads && !grads_offloaded_) {
    move_all(storages_of(params(), true), host);
    grads_offloaded_ = true;
  }
}

void CausalLM::ensure_on_device(bool grads) const {
  if (!weights_offloaded_ && !(grads && grads_offloaded_)) return;
  auto* self = const_cast<CausalLM*>(this);  // moving bytes back does not change the model's values
  Allocator* dev = device_allocator(device());
  KS_CHECK(dev != nullptr, "CausalLM::ensure_on_device: no allocator for ", device_name(device()));
  if (weights_offloaded_) {
    move_all(storages_of(self->state_tensors(), false), dev);
    weights_offloaded_ = false;
  }
  if (grads && grads_offloaded_) {
    move_all(storages_of(self->params(), true), dev);
    grads_offloaded_ = false;
  }
}

}  // namespace kestrel::model
