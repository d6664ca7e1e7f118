// Ctrl-C (SIGINT) without a signal handler on the compute threads. SIGINT is
// blocked in every thread and received by one watcher thread (sigwait), so no
// signal frame is ever pushed onto a thread running JIT-compiled GEMM code
// (oneDNN's kernels corrupted the heap when SIGINT landed on them). Until a
// trainer arms the graceful mode, a SIGINT ends the process as it always did;
// once armed, the first one only sets interrupt_requested() (the loop stops
// after its step, train/run_control.h) and a second one ends the process.
#pragma once
#include "core/status.h"

namespace kestrel {

// Thrown by a trainer that stopped after a Ctrl-C (train/run_control.h);
// main() prints what() (when not empty) and ends with die_of_sigint(), so
// the library itself never ends the process.
class Interrupted : public Error {
 public:
  using Error::Error;
};

// From main(), before any other thread starts (threads inherit the mask).
void start_interrupt_watcher();
// Arms (or disarms) the graceful mode; `notice` is printed on the first SIGINT.
void arm_graceful_interrupt(bool on);
bool interrupt_requested();
// Ends the process as an unhandled SIGINT does (exit status 130 in a shell).
[[noreturn]] void die_of_sigint();

}  // namespace kestrel
