// kestrel: the command-line entry point. Subcommands live in cli/*.cpp and
// register in the table of cli/commands.cpp; main() only sets up the process
// (MPI when launched by mpirun/srun), dispatches, and turns exceptions into a
// message and an exit code. Under MPI a failing rank aborts the whole job with
// its message, so the other ranks never hang in a collective.
#include <csignal>
#include <cstdio>
#include <exception>
#include <memory>

#include "cli/commands.h"
#include "comm/world.h"
#include "core/interrupt.h"

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) then fails the write with EFBIG, which the
  // writers report naming the file, instead of killing the process mid-write.
  std::signal(SIGXFSZ, SIG_IGN);
  // Ctrl-C is received by a watcher thread, never on a compute thread (core/interrupt.h).
  kestrel::start_interrupt_watcher();
  std::unique_ptr<kestrel::comm::World> world;
  try {
    world = std::make_unique<kestrel::comm::World>(kestrel::comm::WorldOptions{}, &argc, &argv);
    return kestrel::cli::run_main(argc, argv);
  } catch (const kestrel::Interrupted& e) {
    // Every rank stopped after the same step (rank 0's Ctrl-C is broadcast):
    // MPI is finalised normally, then the process ends as Ctrl-C's default does.
    if (*e.what()) std::fprintf(stderr, "%s\n", e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    world.reset();
    kestrel::die_of_sigint();
  } catch (const std::exception& e) {
    if (world && world->size() > 1) kestrel::comm::abort_world(e.what());
    std::fprintf(stderr, "kestrel: error: %s\n", e.what());
    return 1;
  }
}
