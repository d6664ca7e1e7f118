// Reward manager with the semantics of verl's reward managers
// (reward_model.reward_manager, or the DAPO recipe's reward.reward_manager.name):
//   naive   each response scored on its own by compute_score(data_source,
//           solution_str, ground_truth, extra_info); a dict result gives the
//           score and reward_extra_info (its keys, "score" included);
//   dapo    naive, plus DAPO's overlong penalty (overlong_buffer.*,
//           max_resp_len) added to the score; a float result is also logged
//           as reward_extra_info["acc"];
//   batch   one call of a batch function per batch:
//           compute_score(data_sources, solution_strs, ground_truths,
//           extra_infos, **reward_kwargs) -> list (custom_reward_function.path
//           through the adapter's --batch mode, or reward_model.reward_command,
//           which gets the whole batch anyway); the rules cannot serve it, as
//           in verl, where default_compute_score takes one response;
//   prime   naive scores without reward_extra_info, failures 0; a dict result
//           zeroes the whole batch (verl's PrimeRewardManager turns a dict into
//           float(result[0]), whose KeyError sets every score of the batch to 0);
//   remote  naive (verl computes it in a separate process, as Kestrel's
//           external programs always are).
// Others (rate_limited, custom classes) fail with "not supported yet".
// verl's DAPO manager also cuts the EOS token's text off a decoded response
// that ends with it; Kestrel decodes with special tokens skipped, so an EOS
// marked special never reaches the scorer in the first place.
//
// Scoring source, in verl's order of precedence:
//   1. custom_reward_function.path (a .py file): run through
//      scripts/reward_adapter.py with python3 from PATH, as an external
//      reward program (rl/reward_program.h);
//   2. reward_model.reward_command: any program speaking the JSON-lines
//      protocol (a string runs via /bin/sh -c, a list as argv);
//   3. otherwise the built-in rules by data_source (rl/reward_rules.h).
// Setting both 1 and 2 is an error. A data_source with no rule and no external
// program is an error at startup (validate_data_sources), never mid-run; if
// one appears mid-run anyway it scores 0 and counts as no_rule.
//
// The adapter is found, in order: RewardManagerOptions::adapter_path;
// $KESTREL_HOME/scripts/reward_adapter.py or $KESTREL_HOME/share/kestrel/
// reward_adapter.py; relative to the running executable (<exe dir>/../share/
// kestrel/, or a scripts/ folder in an ancestor of the executable's folder,
// which covers build/<name>/kestrel in the source tree); the source tree the
// library was compiled from (when KESTREL_SOURCE_DIR is defined for it).
#pragma once
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/config.h"
#include "rl/reward_program.h"

namespace kestrel::rl {

enum class RewardManagerKind { Naive, Dapo, Batch, Prime };
// "naive", "dapo", "batch", "prime", "remote" (= naive); else "not supported yet: reward_manager=<name>".
Result<RewardManagerKind> parse_reward_manager(const std::string& name);

// DAPO's overlong buffer (reward_model.overlong_buffer.* or
// reward.reward_kwargs.overlong_buffer_cfg.*).
struct OverlongBufferConfig {
  bool enable = false;
  int64_t len = 0;             // L_buf, tokens
  double penalty_factor = 0.0;
  bool log = false;            // reward_extra_info overlong_reward / overlong
};
// verl's DAPORewardManager: with expected = max_resp_len - len,
// min(-(length - expected) / len * penalty_factor, 0) for a response of
// `length` tokens (EOS included). 0 when not enabled.
double overlong_reward(const OverlongBufferConfig& c, int64_t max_resp_len, int64_t length);

struct RewardManagerOptions {
  std::string manager = "naive";            // reward_model.reward_manager / reward.reward_manager.name
  OverlongBufferConfig overlong;            // dapo only
  int64_t max_resp_len = -1;                // dapo: reward.reward_kwargs.max_resp_len, else data.max_response_length
  std::string config_error;                 // conflicting keys found by reward_options_from_config; create() fails with it
  std::string custom_path;                  // custom_reward_function.path ("" = none)
  std::string custom_name = "compute_score";  // custom_reward_function.name
  nlohmann::ordered_json reward_kwargs = nlohmann::ordered_json::object();  // custom_reward_function.reward_kwargs
  std::vector<std::string> command_argv;    // reward_model.reward_command as a list
  std::string command_shell;                // reward_model.reward_command as a string
  double timeout_s = 30.0;                  // custom_reward_function.timeout_s
  std::string stderr_log;                   // custom_reward_function.stderr_log ("" = our stderr)
  std::function<void(const std::string&)> stderr_sink;  // overrides stderr_log (tests, embedding)
  std::string python = "python3";
  std::string adapter_path;                 // "" = locate (see above)
  // reward_model.arith_step_credit (Kestrel): > 0 scores the built-in arith
  // task with arith_step_credit_score (acc stays exact match); 0 = exact match.
  double arith_step_credit = 0.0;
  // reward_model.num_workers (verl's reward-loop workers): this many copies
  // of the external program (or threads for the rules) score a batch's
  // responses in parallel, each a contiguous share; the background stream
  // (launch_reward_fn_async) runs as many workers. Not with
  // reward_manager=batch (its function takes the whole batch in one call).
  int64_t num_workers = 1;
};

// Reads custom_reward_function.{path,name} and, where the schema declares
// them, custom_reward_function.{timeout_s,stderr_log,reward_kwargs} and
// reward_model.reward_command. A relative path is taken as given (relative
// to the working directory), as verl does.
RewardManagerOptions reward_options_from_config(const config::Config& cfg);

// Where scripts/reward_adapter.py is; an error lists the places tried.
Result<std::string> locate_reward_adapter();

struct RewardBatchResult {
  std::vector<double> scores;                  // [B]
  std::vector<nlohmann::ordered_json> extra;   // [B] reward_extra_info of each response (object)
  RewardFailureCounts failures;                // this batch
};

class RewardManager {
 public:
  // Startup: checks the options, and for an external program starts it (for
  // custom_reward_function.path the adapter first loads the file in a check
  // run, so a syntax error or a missing function fails here with its message).
  static Result<std::unique_ptr<RewardManager>> create(RewardManagerOptions opt);

  // Startup check that every data_source can be scored (by the external
  // program, or a rule: reward_score::rule_support says why not).
  Status validate_data_sources(const std::vector<std::string>& data_sources) const;

  // Never throws because of the reward code: failures score 0 and are counted.
  // Thread-safe: concurrent calls share the programs (each call's shares wait
  // for a free one). Scores do not depend on how a batch is split: every
  // response is scored alone (except reward_manager=batch, never split), and
  // the manager's batch-level changes (prime's zeroing) run on the whole batch.
  RewardBatchResult score(const std::vector<RewardRequest>& batch);

  bool external() const { return !programs_.empty(); }
  // Parallel scorers (num_workers).
  int64_t workers() const { return opt_.num_workers; }
  // batch and prime: a response's score depends on its batch (one call per
  // batch; prime zeroes the batch on a dict), so it is never scored alone.
  bool batch_wise() const { return kind_ == RewardManagerKind::Batch || kind_ == RewardManagerKind::Prime; }
  // For the startup log: "rules by data_source", "custom_reward_function f.py:fn (python3 ...)", ...
  const std::string& describe() const { return description_; }
  const RewardFailureCounts& total_failures() const { return total_; }
  // reward/failures/{crash,timeout,garbage,no_rule} of one batch's counts,
  // plus reward/restarts; for the step's metrics.
  static std::map<std::string, double> metrics(const RewardFailureCounts& c);

 private:
  RewardManager() = default;
  // The scorer's results for a share of a batch (dict: [B] the scorer gave a dict), on a free program.
  RewardBatchResult score_share(const std::vector<RewardRequest>& share, std::vector<uint8_t>& dict);
  // The manager's changes to the scorer's results (dapo penalty, prime's zeroing, extra keys).
  void apply_manager(const std::vector<RewardRequest>& batch, const std::vector<uint8_t>& dict, RewardBatchResult& r);
  size_t acquire_program();
  void release_program(size_t k);
  RewardManagerOptions opt_;
  RewardManagerKind kind_ = RewardManagerKind::Naive;
  bool warned_prime_dict_ = false;  // under mu_
  std::vector<std::unique_ptr<RewardProgram>> programs_;  // num_workers copies (external scorers)
  std::vector<uint8_t> busy_;                              // [programs] under mu_
  std::mutex mu_;
  std::condition_variable program_freed_;
  std::string description_;
  RewardFailureCounts total_;  // under mu_
};

// verl's reward_extra_info layout: key -> one value per response (null where a
// response lacks the key), keys in first-seen order.
std::vector<std::pair<std::string, std::vector<nlohmann::ordered_json>>> reward_extra_columns(
    const std::vector<nlohmann::ordered_json>& extra);

}  // namespace kestrel::rl
