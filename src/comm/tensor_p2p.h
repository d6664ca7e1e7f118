// Point-to-point transfers of whole tensors over a ProcessGroup (the
// transport reads and writes the tensors' buffers, as the collectives'
// tensor conveniences in process_group.h do). Kept beside them in comm/, the
// layer allowed to hand tensor memory to a transport.
#pragma once
#include "comm/process_group.h"

namespace kestrel::comm {

// Sends all numel() elements of t (contiguous) to `peer` of g.
inline void send_tensor(ProcessGroup& g, const Tensor& t, int peer, int tag) {
  g.send(t.raw(), t.numel(), t.dtype(), peer, tag);
}
// Receives exactly numel() elements of t's dtype from `peer` into t.
inline void recv_tensor(ProcessGroup& g, Tensor& t, int peer, int tag) {
  g.recv(t.raw(), t.numel(), t.dtype(), peer, tag);
}

}  // namespace kestrel::comm
