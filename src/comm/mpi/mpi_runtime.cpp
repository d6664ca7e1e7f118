#include "comm/mpi/mpi_runtime.h"

#include <mutex>

#include "comm/mpi/reduce_kernels.h"
#include "core/status.h"

namespace kestrel::comm::mpi {

std::string error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(rc);
  return std::string(buf, size_t(len));
}

void check(int rc, const char* call, const std::string& where) {
  if (rc == MPI_SUCCESS) [[likely]]
    return;
  KS_FAIL(call, " failed", where.empty() ? "" : " on ", where, ": ", error_string(rc));
}

bool is_active() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

namespace {

// MPI has no bf16/f16: each gets its own 2-byte contiguous type (so a wrong op
// pairing shows up as an MPI type error, not silent garbage) and three user
// ops. They are created on first use and freed before MPI_Finalize.
struct HalfRegistry {
  std::mutex mu;
  MPI_Datatype types[2] = {MPI_DATATYPE_NULL, MPI_DATATYPE_NULL};  // [bf16, f16]
  MPI_Op ops[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
  bool ready = false;
};
HalfRegistry& registry() {
  static HalfRegistry r;
  return r;
}

template <DType DT, ReduceOp OP>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_half_into(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len, DT, OP);
}

void ensure_half_registry() {
  HalfRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.ready) return;
  KS_CHECK(is_active(), "MPI datatypes requested while MPI is not initialised (construct a comm::World first)");
  for (auto& t : r.types) {
    check(MPI_Type_contiguous(2, MPI_BYTE, &t), "MPI_Type_contiguous");
    check(MPI_Type_commit(&t), "MPI_Type_commit");
  }
  // Commutative: a+b and b+a round identically; MPI already assumes associativity.
  MPI_User_function* fns[2][3] = {
      {half_op<DType::BF16, ReduceOp::Sum>, half_op<DType::BF16, ReduceOp::Max>, half_op<DType::BF16, ReduceOp::Min>},
      {half_op<DType::F16, ReduceOp::Sum>, half_op<DType::F16, ReduceOp::Max>, half_op<DType::F16, ReduceOp::Min>}};
  for (int t = 0; t < 2; ++t)
    for (int o = 0; o < 3; ++o) check(MPI_Op_create(fns[t][o], 1, &r.ops[t][o]), "MPI_Op_create");
  r.ready = true;
}

void release_half_registry() {
  HalfRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.ready) return;
  for (auto& row : r.ops)
    for (auto& op : row)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
  for (auto& t : r.types)
    if (t != MPI_DATATYPE_NULL) MPI_Type_free(&t);
  r.ready = false;
}

int op_index(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return 0;
    case ReduceOp::Max: return 1;
    case ReduceOp::Min: return 2;
  }
  return 0;
}

}  // namespace

void init(int* argc, char*** argv, int required) {
  int fin = 0;
  MPI_Finalized(&fin);
  KS_CHECK(!fin, "MPI was already finalised in this process; create one comm::World per process");
  int provided = 0;
  const int rc = MPI_Init_thread(argc, argv, required, &provided);
  if (rc != MPI_SUCCESS) KS_FAIL("MPI_Init_thread failed with code ", rc);
  check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "MPI_COMM_WORLD");
  if (provided < required) {
    MPI_Finalize();
    KS_FAIL("MPI provides thread level ", provided, " but ", required,
            " was requested (rebuild MPI with thread support or lower WorldOptions::threads)");
  }
}

void finalize() {
  if (!is_active()) return;
  release_half_registry();
  MPI_Finalize();
}

void abort(int code) {
  if (is_active()) MPI_Abort(MPI_COMM_WORLD, code);
}

int world_rank() {
  if (!is_active()) return -1;
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

MPI_Datatype datatype(DType dt) {
  switch (dt) {
    case DType::F32: return MPI_FLOAT;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::BF16: ensure_half_registry(); return registry().types[0];
    case DType::F16: ensure_half_registry(); return registry().types[1];
  }
  KS_FAIL("no MPI datatype for dtype ", int(dt));
}

MPI_Op reduce_op(DType dt, ReduceOp op) {
  if (dt == DType::BF16 || dt == DType::F16) {
    ensure_half_registry();
    return registry().ops[dt == DType::BF16 ? 0 : 1][op_index(op)];
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace kestrel::comm::mpi
