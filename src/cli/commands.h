#pragma once
#include <functional>
#include <string>
#include <vector>

namespace kestrel::cli {

using Args = std::vector<std::string>;  // arguments after the subcommand name

struct Command {
  const char* name;
  const char* summary;
  std::function<int(const Args&)> run;
};

// Every subcommand, in --help order. Defined in cli/commands.cpp.
const std::vector<Command>& commands();
int run_main(int argc, char** argv);

// Subcommand entry points, one file each.
int cmd_logprobs(const Args& args);
int cmd_config(const Args& args);
int cmd_sft(const Args& args);
int cmd_tokenize(const Args& args);
int cmd_builtin(const Args& args);
int cmd_generate(const Args& args);
int cmd_train(const Args& args);
int cmd_data(const Args& args);

}  // namespace kestrel::cli
