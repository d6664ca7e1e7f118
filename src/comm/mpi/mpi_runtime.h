// Process-wide MPI state behind World: initialisation and finalisation, the
// checked-call helper every MPI call goes through, and the DType -> MPI
// datatype/op mapping (with the user-defined 2-byte types and ops that carry
// bf16/f16 reductions). Only compiled with -DKESTREL_MPI=ON.
#pragma once
// Only MPI's C API is used; keep its deprecated C++ bindings out.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

#include "comm/process_group.h"
#include "core/dtype.h"

namespace kestrel::comm::mpi {

// MPI's text for an error code ("MPI_ERR_RANK: invalid rank").
std::string error_string(int rc);
// Throws kestrel::Error "<call> failed[ on <where>]: <MPI's text>" unless rc == MPI_SUCCESS.
void check(int rc, const char* call, const std::string& where = "");

bool is_active();  // MPI_Init done and MPI_Finalize not yet called

// MPI_Init_thread with `required` (an MPI_THREAD_* level); fails when MPI
// provides less. Sets MPI_ERRORS_RETURN on MPI_COMM_WORLD so calls that are not
// tied to a communicator report errors instead of aborting.
void init(int* argc, char*** argv, int required);
// Frees the bf16/f16 types and ops, then MPI_Finalize. No-op when not active.
void finalize();
// MPI_Abort(MPI_COMM_WORLD, code) when active; returns otherwise.
void abort(int code);
int world_rank();  // -1 when MPI is not active

// Element datatype for DType (bf16/f16: a committed 2-byte contiguous type each).
MPI_Datatype datatype(DType dt);
// Reduction op for (dtype, op); Avg maps to the Sum op (the caller divides afterwards).
MPI_Op reduce_op(DType dt, ReduceOp op);

}  // namespace kestrel::comm::mpi
