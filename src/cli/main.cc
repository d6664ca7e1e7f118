// kestrel: the command-line entry point. Subcommands live in cli/*.cpp and
// register in the table of cli/commands.h; main() only dispatches and turns
// exceptions into a message and an exit code.
#include <cstdio>
#include <exception>

#include "cli/commands.h"

int main(int argc, char** argv) {
  try {
    return kestrel::cli::run_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kestrel: error: %s\n", e.what());
    return 1;
  }
}
