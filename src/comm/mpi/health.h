// Collective timeout and rank-liveness report: turns a silent hang (a rank
// stopped, deadlocked, or lost without the launcher noticing) into a message
// naming the rank and the step, then aborts the job.
//
// Every MpiGroup call is issued non-blocking (MPI_Iallreduce, MPI_Isend, ...)
// and completed by wait(), which polls the request. While a rank polls it
// also answers liveness pings on a private duplicate of MPI_COMM_WORLD. When
// a wait passes the timeout (verl's actor_rollout_ref.nccl_timeout, 600 s by
// default; World::set_collective_timeout), the waiting rank pings every rank,
// collects answers for a short grace period, and aborts with e.g.
//
//   kestrel: rank 0: MPI_Allreduce on group 'dp' (rank 0 of 2) did not
//   complete within 10 s, at step 3 (update_actor): world rank 1 did not
//   answer (stopped, hung, or busy outside Kestrel's collectives for longer
//   than the timeout); answered: rank 0 waiting in MPI_Allreduce on group 'dp'
//   (step 3 (update_actor))
//
// A rank that is merely slower than the timeout (a long rollout on one rank)
// is reported the same way, so the timeout must exceed any phase's imbalance;
// verl's default of 600 s does for CPU and GPU runs alike.
//
// Only ranks inside wait() answer: a rank computing, or inside an MPI call
// that is not issued here (MPI_Comm_split at start-up), stays silent.
#pragma once
#include <string>

#include "comm/mpi/mpi_runtime.h"  // <mpi.h> without its C++ bindings

namespace kestrel::comm::mpi {

// Where a wait happens, for the timeout's message and for ping answers.
struct WaitSite {
  const char* call;          // "MPI_Allreduce"
  const std::string* group;  // the group's name
  int rank = 0, size = 1;    // this rank in that group
};

// After MPI_Init: duplicates MPI_COMM_WORLD for the pings (collective).
void health_init();
// Before MPI_Finalize.
void health_finalize();

// Seconds a wait may take before the liveness report; <= 0 waits forever
// (MpiGroup then issues the blocking MPI calls).
void set_collective_timeout(double seconds);
double collective_timeout();

// Completes *req (MPI_Wait's contract; st may be MPI_STATUS_IGNORE). Returns
// MPI's code for the request. Past the timeout: report and MPI_Abort.
int wait(MPI_Request* req, MPI_Status* st, const WaitSite& site);

}  // namespace kestrel::comm::mpi
