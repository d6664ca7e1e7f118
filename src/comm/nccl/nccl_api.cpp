#include "comm/nccl/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "core/status.h"

namespace kestrel::comm::nccl {
namespace {

constexpr int kMinVersion = 21300;  // 2.13.0 in NCCL's version code (major*10000 + minor*100 + patch)

std::string version_text(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

#if KESTREL_NCCL_FAKE
// The emulator links its fake NCCL (tests/cuda_emu/fake_nccl.cpp): the table holds its functions.
Api load() {
  Api a{&ncclGetVersion, &ncclGetUniqueId, &ncclCommInitRank, &ncclCommDestroy, &ncclCommAbort,
        &ncclCommGetAsyncError, &ncclGetErrorString, &ncclGetLastError, &ncclAllReduce, &ncclReduceScatter,
        &ncclAllGather, &ncclBroadcast, &ncclSend, &ncclRecv, &ncclGroupStart, &ncclGroupEnd};
  return a;
}
#else
constexpr const char* kLibrary = "libnccl.so.2";

std::string where_to_look() {
  const char* lp = std::getenv("LD_LIBRARY_PATH");
  return std::string("LD_LIBRARY_PATH=") + (lp && *lp ? lp : "(unset)") +
         "; a multi-process run on GPUs needs NCCL: add its folder to LD_LIBRARY_PATH (PyTorch's wheel has it "
         "under site-packages/nvidia/nccl/lib, or install libnccl2)";
}

template <class F>
void bind(void* lib, F& slot, const char* name) {
  void* f = dlsym(lib, name);
  if (!f) KS_FAIL(kLibrary, " has no ", name, " (", dlerror(), "): NCCL too old or not NCCL; ", where_to_look());
  slot = reinterpret_cast<F>(f);
}

Api load() {
  // Never closed: communicators live until exit.
  void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (!lib) KS_FAIL("cannot load ", kLibrary, ": ", dlerror(), "; ", where_to_look());
  Api a{};
  bind(lib, a.GetVersion, "ncclGetVersion");
  bind(lib, a.GetUniqueId, "ncclGetUniqueId");
  bind(lib, a.CommInitRank, "ncclCommInitRank");
  bind(lib, a.CommDestroy, "ncclCommDestroy");
  bind(lib, a.CommAbort, "ncclCommAbort");
  bind(lib, a.CommGetAsyncError, "ncclCommGetAsyncError");
  bind(lib, a.GetErrorString, "ncclGetErrorString");
  bind(lib, a.GetLastError, "ncclGetLastError");
  bind(lib, a.AllReduce, "ncclAllReduce");
  bind(lib, a.ReduceScatter, "ncclReduceScatter");
  bind(lib, a.AllGather, "ncclAllGather");
  bind(lib, a.Broadcast, "ncclBroadcast");
  bind(lib, a.Send, "ncclSend");
  bind(lib, a.Recv, "ncclRecv");
  bind(lib, a.GroupStart, "ncclGroupStart");
  bind(lib, a.GroupEnd, "ncclGroupEnd");
  return a;
}
#endif

}  // namespace

const Api& api() {
  static std::once_flag once;
  static Api table{};
  std::call_once(once, [] {
    Api a = load();
    int v = 0;
    if (a.GetVersion(&v) != ncclSuccess) KS_FAIL("ncclGetVersion failed: NCCL is unusable here");
    if (v < kMinVersion)
      KS_FAIL("NCCL ", version_text(v), " is too old: Kestrel needs ", version_text(kMinVersion), " or newer");
    a.version = v;
    table = a;
  });
  return table;
}

}  // namespace kestrel::comm::nccl
