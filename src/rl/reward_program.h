// An external reward program: a long-lived child process that scores
// responses over a JSON-lines protocol on its stdin/stdout.
//
// Request (one line each, keys in this order):
//   {"id": 17, "data_source": "...", "solution_str": "...", "ground_truth": "...", "extra_info": {...}}
// Response (one line per request, in request order):
//   0.5                                   a bare number, or
//   {"score": 0.5, "id": 17, "acc": 1}    an object; "id" is optional but checked when present,
//                                         every other key goes to reward_extra_info.
// Ids grow across batches and restarts, so a late answer to an earlier batch
// (id below the one expected) is recognised and skipped.
//
// A whole batch is written and answers are read with one poll() loop over the
// child's stdin, stdout and stderr (non-blocking), so a large batch cannot
// deadlock on full pipe buffers in either direction, and stderr is drained
// while the child works. Each answer must arrive within timeout_s of the
// previous progress (the batch start or the previous answer), so a hang is
// detected after timeout_s whatever the batch size.
//
// A child found dead before a batch is sent is restarted first.
// Failures never throw: the affected requests score 0 and are counted by
// reason: crash (EOF, EPIPE, exit, or a failed restart), timeout (the child's
// process group is SIGKILLed and reaped), garbage (unparseable line, wrong
// id, missing/non-numeric/non-finite score). After a crash, timeout or a
// protocol desync (unparseable line or wrong id) the child is restarted
// lazily for the next batch. SIGPIPE is blocked in the calling thread while
// writing and any pending one is consumed, so a dead child cannot kill
// Kestrel and no process-wide signal disposition is changed.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kestrel::rl {

struct RewardRequest {
  std::string data_source;
  std::string solution_str;  // decoded response text
  std::string ground_truth;
  nlohmann::ordered_json extra_info;  // null when the row has none
  // Response tokens (EOS included when generated; verl's valid_response_length),
  // for the DAPO overlong penalty; -1 = unknown. Not sent to programs.
  int64_t response_length = -1;
};

struct RewardFailureCounts {
  // Requests that scored 0 because of each kind of failure (one reason each).
  int64_t crash = 0;
  int64_t timeout = 0;
  int64_t garbage = 0;
  int64_t no_rule = 0;   // data_source without a rule and no external program (RewardManager only)
  int64_t restarts = 0;  // child processes started after the first
  int64_t total() const { return crash + timeout + garbage + no_rule; }
  void add(const RewardFailureCounts& o);
};

struct RewardProgramOptions {
  // Exactly one of argv (run directly, PATH lookup for argv[0]) or
  // shell_command (run as /bin/sh -c "<shell_command>").
  std::vector<std::string> argv;
  std::string shell_command;
  double timeout_s = 30.0;  // per answer, see above; > 0
  // Where the child's stderr goes, one call per line (without '\n'). Unset:
  // written to our stderr as "[reward <pid>] <line>", or appended to
  // stderr_log when that is set.
  std::function<void(const std::string&)> stderr_sink;
  std::string stderr_log;
  // Caps on the child's stderr: what one score() call passes on (the rest is
  // counted and dropped, with a warning), and how large stderr_log may grow
  // (counting what it held before; a notice is written at the cap).
  size_t max_stderr_per_call = size_t(1) << 20;
  uint64_t max_stderr_log = uint64_t(256) << 20;
  std::string name = "reward program";  // for messages ("custom_reward_function my.py:fn")
  // Extra environment for the child (KEY=VALUE), on top of ours.
  std::vector<std::string> extra_env;
  // Precede each batch's requests with a line {"batch": B} (the adapter's
  // --batch mode: one call of a batch function per batch, verl's
  // BatchRewardManager). The answers are the same B lines.
  bool batch_header = false;
};

struct RewardProgramBatch {
  std::vector<double> scores;                  // [B]; 0 on failure
  std::vector<nlohmann::ordered_json> extra;   // [B]; object of the extra keys (empty object if none)
  std::vector<uint8_t> failed;                 // [B]; 1 where the score is 0 because of a failure
  std::vector<uint8_t> dict;                   // [B]; 1 where the answer was an object (verl: a dict result)
  RewardFailureCounts failures;                // of this batch
};

// Not thread-safe: one caller at a time.
class RewardProgram {
 public:
  // Starts the child. An error (bad options, program not found or not
  // executable) is returned here, at startup; later restarts never throw.
  static Result<std::unique_ptr<RewardProgram>> start(RewardProgramOptions opt);
  ~RewardProgram();
  RewardProgram(const RewardProgram&) = delete;
  RewardProgram& operator=(const RewardProgram&) = delete;

  // Scores a batch. Never throws for anything the child does.
  RewardProgramBatch score(const std::vector<RewardRequest>& batch);

  const RewardFailureCounts& total_failures() const { return total_; }
  pid_t pid() const { return pid_; }  // -1 while no child is running
  const RewardProgramOptions& options() const { return opt_; }
  // Kills (SIGKILL to its process group) and reaps the child; the next
  // score() starts a new one.
  void stop();

 private:
  explicit RewardProgram(RewardProgramOptions opt);
  Status spawn();
  void close_fds();
  void drain_stderr(bool final);
  void emit_stderr_line(const std::string& line);
  std::string reap_description(bool kill_first);  // "exited with code 1", "killed by signal 9", ...
  // One batch's conversation (reward_program.cpp): the requests written, the
  // answers read into r until all B are in, the child stops, or it is silent
  // for timeout_s; then the shortfall scored 0 and reported.
  struct Exchange;
  void converse(const std::string& payload, int64_t base_id, RewardProgramBatch& r, Exchange& ex);
  void settle(const Exchange& ex, size_t payload_bytes, RewardProgramBatch& r);

  RewardProgramOptions opt_;
  pid_t pid_ = -1;
  int in_fd_ = -1, out_fd_ = -1, err_fd_ = -1;  // child's stdin (we write), stdout, stderr (we read)
  std::string out_buf_, err_buf_;                // partial lines
  int64_t next_id_ = 0;
  int64_t spawned_ = 0;
  std::FILE* log_ = nullptr;
  uint64_t log_bytes_ = 0;           // size of stderr_log, to cap it
  bool log_full_ = false;            // the cap notice was written
  size_t call_err_bytes_ = 0;        // stderr passed on during this score() call
  uint64_t call_err_dropped_ = 0;    // and dropped over the per-call cap
  RewardFailureCounts total_;
};

// Runs argv to completion (stdin from /dev/null) and returns its exit code
// and its stdout and stderr together; killed (with its process group) after
// timeout_s. For short checks at startup, not for scoring.
struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal or the timeout
  bool timed_out = false;
  std::string output;
};
Result<CommandResult> run_command(const std::vector<std::string>& argv, double timeout_s);

// Splits one answer line; exposed for tests. Returns the score, or an error
// message saying what is wrong; extra gets the keys other than score/id. The
// id check: a present "id" must equal expected_id.
struct ParsedAnswer {
  bool ok = false;
  bool stale = false;   // id < expected_id: a late answer to an earlier request
  bool desync = false;  // unparseable or wrong id: the stream can no longer be trusted
  bool dict = false;    // the answer was an object (a dict result), not a bare number
  double score = 0;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  std::string error;
};
ParsedAnswer parse_reward_answer(const std::string& line, int64_t expected_id);

}  // namespace kestrel::rl
