// A small flag parser for subcommands: `--name value`, `--name=value` and
// boolean `--flag`; unknown flags are errors that list the valid ones, and
// everything else is a positional argument (config overrides, for instance).
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kestrel::cli {

struct FlagSpec {
  std::string name;  // without dashes
  std::string help;
  bool takes_value = true;
  std::string default_value;  // shown in help; empty = required/unset
};

class ParsedArgs {
 public:
  // Throws kestrel::Error for unknown flags and missing values.
  ParsedArgs(const std::string& command, const std::vector<FlagSpec>& specs, const std::vector<std::string>& args);
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name) const;       // value or the spec default
  std::string require(const std::string& name) const;   // error naming the flag when absent
  // An integer flag; --threads is also range-checked (0 or 1..min(4x hardware threads, 1024)).
  int64_t get_int(const std::string& name) const;
  bool help() const { return help_; }
  const std::vector<std::string>& positional() const { return positional_; }
  std::string usage() const;

 private:
  void check_threads(int64_t n, const char* what) const;  // what: "--threads " or "OMP_NUM_THREADS="
  std::string command_;
  std::vector<FlagSpec> specs_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

// The thread-count bound of --threads and OMP_NUM_THREADS (libgomp starts
// that many OS threads: 65536 crashed inside it): 0 or 1..min(1024, 4x the
// hardware threads). `what`: "--threads " or "OMP_NUM_THREADS=".
void check_thread_count(const std::string& command, int64_t n, const char* what);
// OMP_NUM_THREADS, when set, within that bound; commands without ParsedArgs
// (train, sft) call it first.
void check_omp_num_threads(const std::string& command);

}  // namespace kestrel::cli
