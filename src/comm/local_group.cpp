#include <cstring>

#include "comm/process_group.h"
#include "core/status.h"

namespace kestrel::comm {

static void copy_if_distinct(const void* src, void* dst, int64_t n, DType dt) {
  if (src != dst) std::memmove(dst, src, size_t(n) * dtype_size(dt));
}

void LocalGroup::reduce_scatter(const void* send, void* recv, int64_t n, DType dt, ReduceOp) {
  copy_if_distinct(send, recv, n, dt);
}
void LocalGroup::all_gather(const void* send, void* recv, int64_t n, DType dt) { copy_if_distinct(send, recv, n, dt); }
void LocalGroup::all_to_all(const void* send, void* recv, int64_t n, DType dt) { copy_if_distinct(send, recv, n, dt); }
void LocalGroup::all_to_allv(const void* send, const std::vector<int64_t>& sc, void* recv,
                             const std::vector<int64_t>& rc, DType dt) {
  KS_CHECK(sc.size() == 1 && rc.size() == 1 && sc[0] == rc[0], "all_to_allv on a size-1 group: counts must match");
  copy_if_distinct(send, recv, sc[0], dt);
}
void LocalGroup::send(const void*, int64_t, DType, int peer, int) {
  KS_FAIL("send to rank ", peer, " on size-1 group '", name_, "'");
}
void LocalGroup::recv(void*, int64_t, DType, int peer, int) {
  KS_FAIL("recv from rank ", peer, " on size-1 group '", name_, "'");
}

namespace {
struct DoneTransfer final : PendingTransfer {
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingTransfer> ProcessGroup::isend(const void* buf, int64_t count, DType dtype, int peer, int tag) {
  send(buf, count, dtype, peer, tag);
  return std::make_unique<DoneTransfer>();
}

std::unique_ptr<PendingTransfer> ProcessGroup::irecv(void* buf, int64_t count, DType dtype, int peer, int tag) {
  recv(buf, count, dtype, peer, tag);
  return std::make_unique<DoneTransfer>();
}

std::shared_ptr<ProcessGroup> local_group(const std::string& name) { return std::make_shared<LocalGroup>(name); }

}  // namespace kestrel::comm
