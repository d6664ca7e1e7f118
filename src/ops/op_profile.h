// Per-op timing for finding where a step's time goes (KESTREL_OP_PROFILE=1).
//
// Every op runs through ops::detail::dispatch, which times it here when the
// variable is set: on a device the queue is drained before and after the op
// (so each op's time is its kernels' time plus its launches, and the sum over
// ops falls short of the step's wall time by the host's own work: sampling,
// copies, the optimizer's bookkeeping), on the host the op's wall time. An op
// that dispatches other ops counts once, as the outermost. Times are summed
// per op name and the shapes of its first tensors ("linear_bwd
// [16384,896] [151936,896]"), so the lm_head's GEMM is told from a layer's.
// Draining the queue per op slows the run: read the shares, not the step time.
//
// Unset (the default), the cost is one cached flag test per op.
#pragma once
#include <cstdio>
#include <initializer_list>

#include "core/tensor.h"

namespace kestrel::ops {

// Whether KESTREL_OP_PROFILE is set to something other than "" or "0" (read
// once), unless op_profile_set_enabled said otherwise.
bool op_profile_enabled();
// Turns profiling on or off from code (the tests; a tool with its own flag).
void op_profile_set_enabled(bool on);
// Forgets what was recorded (a benchmark calls it after its warm-up steps).
void op_profile_reset();
// Prints the table of recorded ops, largest total first, as "# "-prefixed
// lines: calls, total ms, mean µs, share of the profiled time; then forgets
// them. Also printed to stderr at exit if something is recorded and unreported.
void op_profile_report(std::FILE* out, const char* title);

namespace detail {

// Times one dispatched op from construction to destruction (profiling on only).
class OpTimer {
 public:
  OpTimer(const char* op, Device dev, std::initializer_list<const Tensor*> ts) {
    if (op_profile_enabled()) start(op, dev, ts);
  }
  ~OpTimer() {
    if (counted_) stop();
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  void start(const char* op, Device dev, std::initializer_list<const Tensor*> ts);
  void stop();
  bool counted_ = false;  // raised this thread's nesting depth
  bool active_ = false;   // the outermost op: timed
  int exceptions_ = 0;    // std::uncaught_exceptions() at start
  Device dev_ = Device::CPU;
  const char* op_ = nullptr;
  char shapes_[96] = {};
  double t0_ = 0;
};

}  // namespace detail
}  // namespace kestrel::ops
