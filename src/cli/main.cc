// kestrel: the command-line entry point. Subcommands live in cli/*.cpp and
// register in the table of cli/commands.cpp; main() only sets up the process
// (MPI when launched by mpirun/srun), dispatches, and turns exceptions into a
// message and an exit code. Under MPI a failing rank aborts the whole job with
// its message, so the other ranks never hang in a collective.
#include <cstdio>
#include <exception>
#include <memory>

#include "cli/commands.h"
#include "comm/world.h"

int main(int argc, char** argv) {
  std::unique_ptr<kestrel::comm::World> world;
  try {
    world = std::make_unique<kestrel::comm::World>(kestrel::comm::WorldOptions{}, &argc, &argv);
    return kestrel::cli::run_main(argc, argv);
  } catch (const std::exception& e) {
    if (world && world->size() > 1) kestrel::comm::abort_world(e.what());
    std::fprintf(stderr, "kestrel: error: %s\n", e.what());
    return 1;
  }
}
