#include "rl/reward_manager.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <thread>

#include "config/schema.h"
#include "rl/reward_rules.h"
#include "rl/reward_score/scorers.h"

namespace kestrel::rl {

namespace fs = std::filesystem;

namespace {

bool declared(const std::string& path) { return config::find_key(path) != nullptr; }

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string join_command(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    s += shell_quote(a);
  }
  return s;
}

OverlongBufferConfig overlong_from(const config::Config& cfg, const std::string& p) {
  OverlongBufferConfig c;
  c.enable = cfg.get_bool(p + "enable");
  c.len = cfg.get_int(p + "len");
  c.penalty_factor = cfg.get_float(p + "penalty_factor");
  c.log = cfg.get_bool(p + "log");
  return c;
}

}  // namespace

Result<RewardManagerKind> parse_reward_manager(const std::string& name) {
  if (name == "naive" || name == "remote") return RewardManagerKind::Naive;
  if (name == "dapo") return RewardManagerKind::Dapo;
  if (name == "batch") return RewardManagerKind::Batch;
  if (name == "prime") return RewardManagerKind::Prime;
  return KS_ERR("not supported yet: reward_manager=", name, " (Kestrel has naive, dapo, batch, prime and remote)");
}

double overlong_reward(const OverlongBufferConfig& c, int64_t max_resp_len, int64_t length) {
  if (!c.enable) return 0.0;
  const double expected_len = double(max_resp_len - c.len);
  const double exceed_len = double(length) - expected_len;
  return std::min(-exceed_len / double(c.len) * c.penalty_factor, 0.0);
}

RewardManagerOptions reward_options_from_config(const config::Config& cfg) {
  RewardManagerOptions o;
  // The manager: verl's reward_model.reward_manager, or the DAPO recipe's
  // newer reward.reward_manager.name (which wins; both set differently is an error).
  o.manager = cfg.get_string_or("reward_model.reward_manager", "naive");
  if (const std::string n = declared("reward.reward_manager.name") ? cfg.get_string_or("reward.reward_manager.name", "")
                                                                       : std::string();
      !n.empty()) {
    if (o.manager != "naive" && o.manager != n)
      o.config_error = "reward_model.reward_manager=" + o.manager + " and reward.reward_manager.name=" + n +
                       " disagree; set one of them";
    o.manager = n;
  }
  // The overlong buffer: reward_model.overlong_buffer.* (the recipe's run
  // scripts), reward_model.reward_kwargs.overlong_buffer_cfg.* (verl's older
  // reward-manager kwargs, added with '+') or reward.reward_kwargs.overlong_buffer_cfg.*
  // (the recipe's newer yaml). At most one of them may enable it.
  std::string enabled_by;
  for (const std::string p : {"reward_model.overlong_buffer.", "reward_model.reward_kwargs.overlong_buffer_cfg.",
                              "reward.reward_kwargs.overlong_buffer_cfg."}) {
    if (!declared(p + "enable")) continue;
    OverlongBufferConfig k = overlong_from(cfg, p);
    if (!k.enable) continue;
    if (!enabled_by.empty())
      o.config_error = "both " + enabled_by + "enable and " + p + "enable are set; configure one of them";
    o.overlong = k;
    enabled_by = p;
  }
  o.max_resp_len = cfg.get_int_or("data.max_response_length", -1);
  for (const std::string k : {"reward_model.reward_kwargs.max_resp_len", "reward.reward_kwargs.max_resp_len"})
    if (declared(k) && !cfg.is_null(k)) o.max_resp_len = cfg.get_int(k);
  o.custom_path = cfg.get_string_or("custom_reward_function.path", "");
  o.custom_name = cfg.get_string_or("custom_reward_function.name", "compute_score");
  // Keys that a later schema may add; read only when declared.
  if (declared("custom_reward_function.timeout_s"))
    o.timeout_s = cfg.get_float_or("custom_reward_function.timeout_s", o.timeout_s);
  if (declared("custom_reward_function.stderr_log"))
    o.stderr_log = cfg.get_string_or("custom_reward_function.stderr_log", "");
  if (declared("custom_reward_function.reward_kwargs") && !cfg.is_null("custom_reward_function.reward_kwargs"))
    o.reward_kwargs = cfg.get_map("custom_reward_function.reward_kwargs");
  if (declared("reward_model.num_workers")) o.num_workers = cfg.get_int_or("reward_model.num_workers", 1);
  if (declared("reward_model.arith_step_credit"))
    o.arith_step_credit = cfg.get_float_or("reward_model.arith_step_credit", 0.0);
  if (const config::KeyDecl* k = config::find_key("reward_model.reward_command");
      k && !cfg.is_null("reward_model.reward_command")) {
    if (k->type == config::Type::StringList)
      o.command_argv = cfg.get_string_list("reward_model.reward_command");
    else
      o.command_shell = cfg.get_string("reward_model.reward_command");
  }
  return o;
}

Result<std::string> locate_reward_adapter() {
  std::vector<fs::path> tried;
  if (const char* home = std::getenv("KESTREL_HOME"); home && *home) {
    tried.push_back(fs::path(home) / "scripts" / "reward_adapter.py");
    tried.push_back(fs::path(home) / "share" / "kestrel" / "reward_adapter.py");
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    tried.push_back(exe.parent_path().parent_path() / "share" / "kestrel" / "reward_adapter.py");
    // build/<name>/kestrel (or a test binary) inside the source tree.
    for (fs::path d = exe.parent_path(); !d.empty() && d != d.root_path(); d = d.parent_path())
      tried.push_back(d / "scripts" / "reward_adapter.py");
  }
#ifdef KESTREL_SOURCE_DIR
  tried.push_back(fs::path(KESTREL_SOURCE_DIR) / "scripts" / "reward_adapter.py");
#endif
  std::string list;
  for (const auto& p : tried) {
    if (fs::is_regular_file(p, ec)) return p.string();
    list += "\n  " + p.string();
  }
  return KS_ERR("cannot find scripts/reward_adapter.py (needed for custom_reward_function.path); set KESTREL_HOME "
                "to the Kestrel source or install folder. Tried:",
                list.empty() ? std::string("\n  (nothing: KESTREL_HOME unset, no executable path)") : list);
}

Result<std::unique_ptr<RewardManager>> RewardManager::create(RewardManagerOptions opt) {
  std::unique_ptr<RewardManager> m(new RewardManager());
  if (!opt.config_error.empty()) return KS_ERR(opt.config_error);
  KS_ASSIGN(m->kind_, parse_reward_manager(opt.manager));
  const bool has_custom = !opt.custom_path.empty();
  const bool has_command = !opt.command_argv.empty() || !opt.command_shell.empty();
  if (has_custom && has_command)
    return KS_ERR("both custom_reward_function.path ('", opt.custom_path,
                  "') and reward_model.reward_command are set; set only one of them");
  if (!opt.command_argv.empty() && !opt.command_shell.empty())
    return KS_ERR("reward_model.reward_command: give a list (argv) or a string (shell command), not both");
  if (!(opt.timeout_s > 0))
    return KS_ERR("custom_reward_function.timeout_s must be > 0 seconds, got ", opt.timeout_s);
  if (opt.num_workers < 1) return KS_ERR("reward_model.num_workers must be >= 1, got ", opt.num_workers);
  if (opt.num_workers > 1 && m->kind_ == RewardManagerKind::Batch)
    return KS_ERR("not supported yet: reward_model.num_workers=", opt.num_workers, " with reward_manager=batch (its "
                  "function scores the whole batch in one call); set num_workers=1 or reward_manager=naive");
  if (m->kind_ == RewardManagerKind::Batch && !has_custom && !has_command)
    return KS_ERR("reward_model.reward_manager=batch needs a batch function: set custom_reward_function.path to a .py "
                  "file defining compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) "
                  "-> list (the built-in rules score one response at a time; use reward_manager=naive for them)");
  if (opt.overlong.enable) {
    if (m->kind_ != RewardManagerKind::Dapo)
      return KS_ERR("the overlong buffer (reward_model.overlong_buffer.enable) needs reward_model.reward_manager=dapo, "
                    "got ", opt.manager);
    if (opt.overlong.len <= 0)
      return KS_ERR("reward_model.overlong_buffer.len must be > 0 tokens when the overlong buffer is enabled, got ",
                    opt.overlong.len);
    if (opt.max_resp_len < opt.overlong.len)
      return KS_ERR("max_resp_len (reward.reward_kwargs.max_resp_len, else data.max_response_length) = ",
                    opt.max_resp_len, " must be >= overlong_buffer.len = ", opt.overlong.len);
  }

  RewardProgramOptions po;
  po.timeout_s = opt.timeout_s;
  po.stderr_log = opt.stderr_log;
  po.stderr_sink = opt.stderr_sink;
  if (has_custom) {
    std::error_code ec;
    if (!fs::is_regular_file(opt.custom_path, ec))
      return KS_ERR("custom_reward_function.path: no such file '", opt.custom_path,
                    "' (give the path of a .py file defining ", opt.custom_name, ")");
    if (fs::path(opt.custom_path).extension() != ".py")
      return KS_ERR("custom_reward_function.path: '", opt.custom_path,
                    "' is not a .py file (for another language set reward_model.reward_command to a program that "
                    "speaks the JSON-lines reward protocol)");
    std::string adapter = opt.adapter_path;
    if (adapter.empty()) {
      KS_ASSIGN(adapter, locate_reward_adapter());
    }
    po.argv = {opt.python, adapter, "--path", opt.custom_path, "--name", opt.custom_name};
    if (!opt.reward_kwargs.empty()) {
      po.argv.push_back("--kwargs");
      po.argv.push_back(opt.reward_kwargs.dump());
    }
    if (m->kind_ == RewardManagerKind::Batch) {
      po.argv.push_back("--batch");
      po.batch_header = true;
    }
    // A check run loads the file first, so that an import error or a missing
    // function stops the run here with Python's message, not mid-run as zeros.
    std::vector<std::string> check = po.argv;
    check.push_back("--check");
    KS_ASSIGN(CommandResult cr, run_command(check, std::max(opt.timeout_s, 60.0)));
    if (cr.exit_code != 0)
      return KS_ERR("custom_reward_function: cannot load ", opt.custom_name, " from '", opt.custom_path, "' (",
                    join_command(check), cr.timed_out ? " timed out" : " failed", "):\n", cr.output);
    po.name = "custom_reward_function " + opt.custom_path + ":" + opt.custom_name;
    m->description_ = po.name + " (" + join_command(po.argv) + ")";
  } else if (has_command) {
    po.argv = opt.command_argv;
    po.shell_command = opt.command_shell;
    po.name = "reward_model.reward_command";
    m->description_ = "reward_model.reward_command (" +
                      (po.shell_command.empty() ? join_command(po.argv) : "/bin/sh -c " + shell_quote(po.shell_command)) +
                      ")";
  } else {
    m->description_ = "rule-based rewards by data_source";
  }
  m->description_ = "reward_manager=" + opt.manager + ", " + m->description_;
  if (opt.overlong.enable)
    m->description_ += ", overlong buffer " + std::to_string(opt.overlong.len) + " of " +
                       std::to_string(opt.max_resp_len) + " tokens";
  if (has_custom || has_command) {
    // num_workers copies of the program, each its own process.
    for (int64_t k = 0; k < opt.num_workers; ++k) {
      KS_ASSIGN(std::unique_ptr<RewardProgram> prog, RewardProgram::start(po));
      m->programs_.push_back(std::move(prog));
    }
    m->busy_.assign(m->programs_.size(), 0);
  }
  m->opt_ = std::move(opt);
  return m;
}

Status RewardManager::validate_data_sources(const std::vector<std::string>& data_sources) const {
  if (!programs_.empty()) return Status::ok();
  for (const auto& ds : data_sources) KS_TRY(reward_score::rule_support(ds));
  return Status::ok();
}

size_t RewardManager::acquire_program() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    for (size_t k = 0; k < busy_.size(); ++k)
      if (!busy_[k]) {
        busy_[k] = 1;
        return k;
      }
    program_freed_.wait(lock);
  }
}

void RewardManager::release_program(size_t k) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_[k] = 0;
  }
  program_freed_.notify_one();
}

RewardBatchResult RewardManager::score_share(const std::vector<RewardRequest>& batch, std::vector<uint8_t>& dict) {
  RewardBatchResult r;
  if (!programs_.empty()) {
    const size_t k = acquire_program();
    RewardProgramBatch b;
    try {
      b = programs_[k]->score(batch);
    } catch (...) {
      release_program(k);
      throw;
    }
    release_program(k);
    r.scores = std::move(b.scores);
    r.extra = std::move(b.extra);
    r.failures = b.failures;
    dict = std::move(b.dict);
    return r;
  }
  r.scores.assign(batch.size(), 0.0);
  r.extra.assign(batch.size(), nlohmann::ordered_json::object());
  dict.assign(batch.size(), 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    // A rule never sees user code, but stay inside the no-throw promise.
    std::optional<reward_score::RuleResult> s;
    const bool arith = batch[i].data_source == "arith" || batch[i].data_source == "kestrel/arith";
    try {
      s = reward_score::default_compute_score(batch[i].data_source, batch[i].solution_str, batch[i].ground_truth);
      if (s && arith && opt_.arith_step_credit > 0) {
        s->extra["acc"] = s->score;  // validation accuracy: exact match
        s->score = arith_step_credit_score(batch[i].solution_str, batch[i].ground_truth, opt_.arith_step_credit);
      }
    } catch (const std::exception&) {
      s = std::nullopt;
    }
    if (s) {
      r.scores[i] = s->score;
      dict[i] = s->is_dict ? 1 : 0;
      r.extra[i] = std::move(s->extra);
      if (s->is_dict) r.extra[i].erase("score");  // put back first by apply_manager
    } else {
      ++r.failures.no_rule;
    }
  }
  return r;
}

RewardBatchResult RewardManager::score(const std::vector<RewardRequest>& batch) {
  // Contiguous shares, one per worker, scored concurrently (never a batch
  // function's batch: it is one call), then joined in order.
  const size_t B = batch.size();
  const size_t parts = kind_ == RewardManagerKind::Batch ? 1 : std::min(B, size_t(std::max<int64_t>(1, opt_.num_workers)));
  RewardBatchResult r;
  std::vector<uint8_t> dict;  // [B] the scorer gave a dict (its extra keys are reward_extra_info)
  if (parts <= 1) {
    r = score_share(batch, dict);
  } else {
    std::vector<RewardBatchResult> res(parts);
    std::vector<std::vector<uint8_t>> dicts(parts);
    std::vector<std::exception_ptr> errs(parts);
    std::vector<std::thread> threads;
    for (size_t p = 0; p < parts; ++p)
      threads.emplace_back([&, p] {
        try {
          const std::vector<RewardRequest> share(batch.begin() + long(B * p / parts),
                                                 batch.begin() + long(B * (p + 1) / parts));
          res[p] = score_share(share, dicts[p]);
        } catch (...) {
          errs[p] = std::current_exception();
        }
      });
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errs)
      if (e) std::rethrow_exception(e);
    for (size_t p = 0; p < parts; ++p) {
      r.scores.insert(r.scores.end(), res[p].scores.begin(), res[p].scores.end());
      for (auto& e : res[p].extra) r.extra.push_back(std::move(e));
      dict.insert(dict.end(), dicts[p].begin(), dicts[p].end());
      r.failures.add(res[p].failures);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  apply_manager(batch, dict, r);
  total_.add(r.failures);
  return r;
}

void RewardManager::apply_manager(const std::vector<RewardRequest>& batch, const std::vector<uint8_t>& dict,
                                  RewardBatchResult& r) {
  const size_t B = r.scores.size();
  if (kind_ == RewardManagerKind::Prime) {
    // verl: float(result[0]) of a dict raises, and verify() sets the whole batch to 0.
    const bool any_dict = std::any_of(dict.begin(), dict.end(), [](uint8_t d) { return d != 0; });
    if (any_dict) {
      if (!warned_prime_dict_)
        std::fprintf(stderr, "reward: reward_manager=prime got a dict result; the whole batch scores 0, as in verl "
                             "(use reward_manager=naive or dapo for dict-returning scorers)\n");
      warned_prime_dict_ = true;
      std::fill(r.scores.begin(), r.scores.end(), 0.0);
    }
    for (auto& e : r.extra) e = nlohmann::ordered_json::object();  // prime returns no reward_extra_info
    return;
  }
  for (size_t i = 0; i < B; ++i) {
    const double raw = r.scores[i];
    if (dict[i]) {  // the dict's keys, "score" first as verl's result dict has it
      nlohmann::ordered_json e = nlohmann::ordered_json::object();
      e["score"] = raw;
      for (auto it = r.extra[i].begin(); it != r.extra[i].end(); ++it) e[it.key()] = it.value();
      r.extra[i] = std::move(e);
    }
    if (kind_ != RewardManagerKind::Dapo) continue;
    if (!dict[i] && !r.extra[i].contains("acc")) r.extra[i]["acc"] = raw;
    if (opt_.overlong.enable) {
      KS_CHECK(batch[i].response_length >= 0, "reward: the overlong penalty needs each response's length");
      const double ov = overlong_reward(opt_.overlong, opt_.max_resp_len, batch[i].response_length);
      r.scores[i] = raw + ov;
      if (opt_.overlong.log) {
        r.extra[i]["overlong_reward"] = ov;
        r.extra[i]["overlong"] = ov < 0;
      }
    }
  }
}

std::map<std::string, double> RewardManager::metrics(const RewardFailureCounts& c) {
  return {{"reward/failures/crash", static_cast<double>(c.crash)},
          {"reward/failures/timeout", static_cast<double>(c.timeout)},
          {"reward/failures/garbage", static_cast<double>(c.garbage)},
          {"reward/failures/no_rule", static_cast<double>(c.no_rule)},
          {"reward/restarts", static_cast<double>(c.restarts)}};
}

std::vector<std::pair<std::string, std::vector<nlohmann::ordered_json>>> reward_extra_columns(
    const std::vector<nlohmann::ordered_json>& extra) {
  std::vector<std::pair<std::string, std::vector<nlohmann::ordered_json>>> cols;
  for (size_t i = 0; i < extra.size(); ++i) {
    if (!extra[i].is_object()) continue;
    for (auto it = extra[i].begin(); it != extra[i].end(); ++it) {
      auto c = std::find_if(cols.begin(), cols.end(), [&](const auto& p) { return p.first == it.key(); });
      if (c == cols.end()) {
        cols.emplace_back(it.key(), std::vector<nlohmann::ordered_json>(extra.size()));
        c = cols.end() - 1;
      }
      c->second[i] = it.value();
    }
  }
  return cols;
}

}  // namespace kestrel::rl
