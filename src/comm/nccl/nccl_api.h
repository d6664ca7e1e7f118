// NCCL's functions as a table of pointers, loaded at run time with
// dlopen("libnccl.so.2"): the CUDA build links no NCCL, so a single-process
// run never needs the library, and a GPU machine's only NCCL (PyTorch's wheel,
// site-packages/nvidia/nccl/lib) is found through LD_LIBRARY_PATH instead of
// travelling with the binary. The emulator build (tests/cuda_emu) fills the
// table with its fake NCCL's functions instead (KESTREL_NCCL_FAKE).
// Only src/comm/nccl includes this header (and with it nccl.h).
#pragma once
#include <nccl.h>

namespace kestrel::comm::nccl {

struct Api {
  decltype(&ncclGetVersion) GetVersion;
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRank) CommInitRank;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclCommAbort) CommAbort;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclGetLastError) GetLastError;
  decltype(&ncclAllReduce) AllReduce;
  decltype(&ncclReduceScatter) ReduceScatter;
  decltype(&ncclAllGather) AllGather;
  decltype(&ncclBroadcast) Broadcast;
  decltype(&ncclSend) Send;
  decltype(&ncclRecv) Recv;
  decltype(&ncclGroupStart) GroupStart;
  decltype(&ncclGroupEnd) GroupEnd;
  int version = 0;  // ncclGetVersion's code, e.g. 22803 for 2.28.3
};

// The table, loaded on the first call (thread-safe). Throws kestrel::Error
// naming libnccl.so.2, dlopen's message and LD_LIBRARY_PATH when the library
// or one of its functions is missing, or when it is older than 2.13 (the
// first with ncclGetLastError; ncclAvg and bf16 came in 2.10).
const Api& api();

}  // namespace kestrel::comm::nccl
