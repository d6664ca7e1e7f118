#include "comm/mpi/health.h"

#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "comm/mpi/mpi_runtime.h"
#include "comm/world.h"
#include "core/progress.h"

namespace kestrel::comm::mpi {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPingTag = 7001, kPongTag = 7002;
constexpr int kReplyLen = 256;

MPI_Comm g_health = MPI_COMM_NULL;
std::atomic<double> g_timeout{600.0};
// The wait this rank is in (nullptr: not waiting), for ping answers. MPI is
// called from one thread at a time (MPI_THREAD_SERIALIZED), so one slot.
const WaitSite* g_waiting = nullptr;
Clock::time_point g_wait_start;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string site_text(const WaitSite& s) {
  return std::string(s.call) + " on group '" + *s.group + "' (rank " + std::to_string(s.rank) + " of " +
         std::to_string(s.size) + ")";
}

// "waiting in MPI_Allreduce on group 'dp' (rank 1 of 2) for 12 s at step 3 (update_actor)"
std::string status_text() {
  std::string s = g_waiting ? "waiting in " + site_text(*g_waiting) + " for " +
                                  std::to_string(int64_t(seconds_since(g_wait_start))) + " s"
                            : std::string("not in a collective");
  return s + " " + progress_text();
}

// Answers every pending ping with this rank's status. The reply is small, so
// MPI_Send completes eagerly even if the pinger has already moved on.
void answer_pings() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kPingTag, g_health, &flag, &st) != MPI_SUCCESS || !flag) return;
    int32_t token = 0;
    if (MPI_Recv(&token, 1, MPI_INT32_T, st.MPI_SOURCE, kPingTag, g_health, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
    std::array<char, kReplyLen> reply{};
    const std::string s = status_text();
    std::memcpy(reply.data(), s.data(), std::min(s.size(), size_t(kReplyLen - 1)));
    MPI_Send(reply.data(), kReplyLen, MPI_CHAR, st.MPI_SOURCE, kPongTag, g_health);
  }
}

// Pings every rank, waits a grace period for the answers, and aborts the job
// with what it learnt. Does not return.
[[noreturn]] void report_and_abort(const WaitSite& site, double waited) {
  int wsize = 1, wrank = 0;
  MPI_Comm_size(g_health, &wsize);
  MPI_Comm_rank(g_health, &wrank);
  std::vector<MPI_Request> sends(size_t(wsize), MPI_REQUEST_NULL), recvs(size_t(wsize), MPI_REQUEST_NULL);
  std::vector<std::array<char, kReplyLen>> replies(size_t(wsize), std::array<char, kReplyLen>{});
  std::vector<bool> answered(size_t(wsize), false);
  int32_t token = 1;
  for (int r = 0; r < wsize; ++r) {
    if (r == wrank) continue;
    replies[size_t(r)].fill('\0');
    MPI_Irecv(replies[size_t(r)].data(), kReplyLen, MPI_CHAR, r, kPongTag, g_health, &recvs[size_t(r)]);
    MPI_Isend(&token, 1, MPI_INT32_T, r, kPingTag, g_health, &sends[size_t(r)]);
  }
  // Long enough for a busy but live rank to reach its next poll; short next
  // to the timeout itself.
  const double grace = std::clamp(collective_timeout() * 0.25, 3.0, 20.0);
  const auto t0 = Clock::now();
  int pending = wsize - 1;
  while (pending > 0 && seconds_since(t0) < grace) {
    for (int r = 0; r < wsize; ++r) {
      if (r == wrank || answered[size_t(r)]) continue;
      int done = 0;
      if (MPI_Test(&recvs[size_t(r)], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        answered[size_t(r)] = true;
        --pending;
      }
    }
    answer_pings();  // a rank timing out at the same moment asks us too
    sched_yield();
  }
  std::string lost, live = "rank " + std::to_string(wrank) + " (this one) " + status_text();
  int n_lost = 0;
  for (int r = 0; r < wsize; ++r) {
    if (r == wrank) continue;
    if (answered[size_t(r)]) {
      replies[size_t(r)][kReplyLen - 1] = '\0';
      live += "; rank " + std::to_string(r) + " " + replies[size_t(r)].data();
    } else {
      lost += (n_lost++ ? ", " : "") + std::to_string(r);
    }
  }
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.0f", waited);
  std::string msg = site_text(site) + " did not complete within " + secs + " s (collective timeout " +
                    "actor_rollout_ref.nccl_timeout=" + std::to_string(int64_t(collective_timeout())) + "), " +
                    progress_text() + ": ";
  if (n_lost)
    msg += std::string(n_lost == 1 ? "world rank " : "world ranks ") + lost +
           " did not answer (stopped, hung, or busy outside Kestrel's collectives for longer than the timeout; "
           "raise actor_rollout_ref.nccl_timeout if a phase is legitimately that uneven)";
  else
    msg += "every rank answered, so the ranks are waiting in different collectives (a mismatched call order)";
  msg += ". Status: " + live;
  abort_world(msg);
  std::abort();  // abort_world returns only without MPI, which cannot be the case here
}

}  // namespace

void health_init() {
  if (g_health != MPI_COMM_NULL) return;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &g_health), "MPI_Comm_dup", "MPI_COMM_WORLD (liveness pings)");
  check(MPI_Comm_set_errhandler(g_health, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "liveness communicator");
}

void health_finalize() {
  if (g_health != MPI_COMM_NULL && is_active()) MPI_Comm_free(&g_health);
  g_health = MPI_COMM_NULL;
}

void set_collective_timeout(double seconds) { g_timeout.store(seconds, std::memory_order_relaxed); }
double collective_timeout() { return g_timeout.load(std::memory_order_relaxed); }

int wait(MPI_Request* req, MPI_Status* st, const WaitSite& site) {
  const double timeout = collective_timeout();
  if (timeout <= 0 || g_health == MPI_COMM_NULL) return MPI_Wait(req, st);
  int done = 0;
  int rc = MPI_Test(req, &done, st);
  if (rc != MPI_SUCCESS || done) return rc;
  const WaitSite* outer = g_waiting;
  const Clock::time_point outer_start = g_wait_start;
  g_waiting = &site;
  g_wait_start = Clock::now();
  for (uint64_t i = 1;; ++i) {
    rc = MPI_Test(req, &done, st);
    if (rc != MPI_SUCCESS || done) break;
    if ((i & 63) == 0) {
      answer_pings();
      const double waited = seconds_since(g_wait_start);
      if (waited > timeout) report_and_abort(site, waited);
    }
    // Spin first (a collective usually completes within microseconds), then
    // give the core to the other ranks and threads sharing it.
    if (i > 1024) sched_yield();
  }
  g_waiting = outer;
  g_wait_start = outer_start;
  return rc;
}

}  // namespace kestrel::comm::mpi
