#include "model/ep_state.h"


namespace kestrel::model {

int64_t routed_expert_index(const std::string& name) {
  static const std::string kExperts = ".mlp.experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return -1;
  const size_t b = at + kExperts.size(), e = name.find('.', b);
  if (e == std::string::npos || e == b) return -1;
  int64_t v = 0;
  for (size_t i = b; i < e; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::vector<RoutedExpertTensor> routed_expert_tensors(const CausalLM& m) {
  std::vector<RoutedExpertTensor> out;
  const int64_t E = m.config().moe.num_experts;
  if (E <= 0) return out;
  const int ep = m.ep().size(), me = m.ep().rank();
  const int64_t per_rank = E / ep;  // MoeMlp checked E % ep == 0
  for (Param* p : const_cast<CausalLM&>(m).params()) {
    const int64_t e = routed_expert_index(p->name);
    if (e < 0) continue;
    KS_CHECK(e / per_rank == me, "expert parallelism: rank ", me, " holds '", p->name, "', expert ", e,
             " of rank ", e / per_rank);
    const int64_t j = e % per_rank;  // its index within the rank's block, the same on every rank
    const size_t at = p->name.find(".mlp.experts.") + 13;
    const std::string head = p->name.substr(0, at), tail = p->name.substr(p->name.find('.', at));
    for (int r = 0; r < ep; ++r) {
      const int64_t g = int64_t(r) * per_rank + j;
      out.push_back({head + std::to_string(g) + tail, p->full_shape, r, r == me ? p : nullptr});
    }
  }
  return out;
}

Tensor broadcast_expert_tensor(const CausalLM& m, const RoutedExpertTensor& t, const Tensor& value_on_owner,
                               DType wire, MemCategory cat) {
  comm::ProcessGroup& ep = m.ep();
  // Every rank's buffer on the model's device: the broadcast moves one kind
  // of memory (a device group sends device buffers over NCCL, host ones over
  // MPI), so the owner's value goes there first when it is elsewhere.
  const Device dev = m.device();
  Tensor buf;
  if (t.owner == ep.rank()) {
    KS_CHECK(value_on_owner.shape() == t.full_shape, "expert tensor '", t.name, "': the owner holds ",
             value_on_owner.describe(), ", expected the full shape ", shape_str(t.full_shape));
    buf = value_on_owner.device() == dev ? value_on_owner : value_on_owner.copy_to(dev, cat);
    if (buf.dtype() != wire) buf = buf.to(wire, cat);  // the root only sends
  } else {
    buf = Tensor::empty(t.full_shape, wire, cat, dev);
  }
  if (ep.size() > 1) ep.broadcast(buf, t.owner);
  return buf;
}

}  // namespace kestrel::model
