#include "rl/reward_program.h"

#include "core/json_limits.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

extern char** environ;

namespace kestrel::rl {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxStderrLine = 64 * 1024;  // a line without '\n' is cut here, so memory stays bounded
constexpr size_t kMaxAnswerLine = 64u << 20;  // a longer answer is a broken program, not a score

void warn(const std::string& msg) {
  std::fprintf(stderr, "kestrel: warning: %s\n", msg.c_str());
  std::fflush(stderr);
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

std::string clip(const std::string& s, size_t n = 80) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

// Pipe ends above fd 2 with close-on-exec: the dup2 of the spawn file actions
// is then never a no-op on a fd that would stay close-on-exec.
// The program a shell command starts, when it is plainly one word (after
// VAR=value assignments) and cannot be found; "" when found or when the
// command is shell syntax this check does not read (builtins, quotes, $).
std::string missing_program(const std::string& command) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < command.size()) {
    while (i < command.size() && std::isspace(static_cast<unsigned char>(command[i]))) ++i;
    size_t j = i;
    while (j < command.size() && !std::isspace(static_cast<unsigned char>(command[j]))) ++j;
    if (j > i) words.push_back(command.substr(i, j - i));
    i = j;
  }
  size_t w = 0;
  while (w < words.size() && words[w].find('=') != std::string::npos && words[w][0] != '=') ++w;
  if (w >= words.size()) return "";
  const std::string& prog = words[w];
  if (prog.find_first_of("\"'`$*?[]{}()<>|&;~!#") != std::string::npos) return "";
  // Shell builtins and keywords (POSIX special and regular builtins, bash's common ones).
  static const char* const kShellWords[] = {
      ".",     ":",       "[",       "alias",   "bg",     "break",    "builtin", "case",    "cd",     "command",
      "continue", "declare", "do",   "done",    "echo",   "elif",     "else",    "esac",    "eval",   "exec",
      "exit",  "export",  "false",   "fc",      "fg",     "fi",       "for",     "function", "getopts", "hash",
      "if",    "jobs",    "kill",    "let",     "local",  "printf",   "pwd",     "read",    "readonly", "return",
      "select", "set",    "shift",   "source",  "test",   "then",     "time",    "times",   "trap",   "true",
      "type",  "typeset", "ulimit",  "umask",   "unalias", "unset",   "until",   "wait",    "while"};
  for (const char* k : kShellWords)
    if (prog == k) return "";
  if (prog.find('/') != std::string::npos) return ::access(prog.c_str(), X_OK) == 0 ? "" : prog;
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  for (size_t a = 0; a <= p.size();) {
    size_t b = p.find(':', a);
    if (b == std::string::npos) b = p.size();
    const std::string dir = b > a ? p.substr(a, b - a) : ".";
    if (::access((dir + "/" + prog).c_str(), X_OK) == 0) return "";
    a = b + 1;
  }
  return prog;
}

Status make_pipe(int fds[2]) {
  int raw[2];
  if (::pipe2(raw, O_CLOEXEC) != 0) return KS_ERR("pipe2 failed: ", std::strerror(errno));
  for (int i = 0; i < 2; ++i) {
    fds[i] = ::fcntl(raw[i], F_DUPFD_CLOEXEC, 3);
    ::close(raw[i]);
  }
  if (fds[0] < 0 || fds[1] < 0) return KS_ERR("fcntl(F_DUPFD_CLOEXEC) failed: ", std::strerror(errno));
  return Status::ok();
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exited with code " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    const char* name = ::sigabbrev_np(WTERMSIG(st));
    return "was killed by signal " + std::to_string(WTERMSIG(st)) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "ended with status " + std::to_string(st);
}

// Blocks SIGPIPE in this thread while the batch is written, so a write to a
// dead child fails with EPIPE instead of killing the process; a SIGPIPE that
// this scope raised is consumed before the mask is restored.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pending;
    sigemptyset(&pipe_set_);
    sigaddset(&pipe_set_, SIGPIPE);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_set_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_set_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_set_, old_;
  bool was_pending_ = false;
};

// Children get their own process group, so a timeout kills the whole group
// (a shell and the interpreter it started), default signal handling and an
// empty mask: we may ignore or block SIGPIPE, and both would be inherited.
void isolate_child(posix_spawnattr_t& attr) {
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
}

}  // namespace

void RewardFailureCounts::add(const RewardFailureCounts& o) {
  crash += o.crash;
  timeout += o.timeout;
  garbage += o.garbage;
  no_rule += o.no_rule;
  restarts += o.restarts;
}

ParsedAnswer parse_reward_answer(const std::string& raw, int64_t expected_id) {
  ParsedAnswer a;
  const std::string line = trim(raw);
  // The extra keys are copied and dumped (recursive per level): a reply nested
  // deeper than any JSON reader here accepts is garbage, not a score.
  if (json_nesting_depth(line) > kMaxJsonDepth) {
    a.desync = true;
    a.error = "answer nested deeper than " + std::to_string(kMaxJsonDepth) + " levels: '" + clip(line) + "'";
    return a;
  }
  auto j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Python's json.dumps writes NaN/Infinity, which JSON lacks: such a line
    // is one well-formed (but non-finite) answer, not a broken stream.
    std::string fixed = line;
    for (const char* tok : {"-Infinity", "Infinity", "NaN", "nan", "-inf", "inf"}) {
      for (size_t p = fixed.find(tok); p != std::string::npos; p = fixed.find(tok, p + 4))
        fixed.replace(p, std::strlen(tok), "null");
    }
    auto j2 = nlohmann::ordered_json::parse(fixed, nullptr, false);
    if (!j2.is_discarded() && (j2.is_null() || (j2.is_object() && j2.contains("score") && j2["score"].is_null()))) {
      a.error = "score is not a finite number: " + clip(line);
      return a;
    }
    a.desync = true;
    a.error = "not a JSON number or object: '" + clip(line) + "'";
    return a;
  }
  const nlohmann::ordered_json* score = &j;
  if (j.is_object()) {
    if (j.contains("id")) {
      const auto& id = j["id"];
      if (!id.is_number_integer()) {
        a.desync = true;
        a.error = "\"id\" is not an integer: " + clip(id.dump());
        return a;
      }
      const int64_t got = id.get<int64_t>();
      if (got < expected_id) {
        a.stale = true;
        a.error = "late answer for id " + std::to_string(got) + " (expected " + std::to_string(expected_id) + ")";
        return a;
      }
      if (got != expected_id) {
        a.desync = true;
        a.error = "answer has id " + std::to_string(got) + ", expected " + std::to_string(expected_id) +
                  " (answers must come in request order)";
        return a;
      }
    }
    if (!j.contains("score")) {
      a.error = "answer object has no \"score\" key: " + clip(line);
      return a;
    }
    score = &j["score"];
    if (score->is_null() && j.contains("error")) {  // the adapter's report of an exception
      a.error = "the reward function failed: " + clip(j["error"].is_string() ? j["error"].get<std::string>()
                                                                             : j["error"].dump(), 200);
      return a;
    }
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "score" && it.key() != "id") a.extra[it.key()] = it.value();
    a.dict = true;
  }
  if (score->is_boolean()) {
    a.score = score->get<bool>() ? 1.0 : 0.0;
  } else if (score->is_number()) {
    a.score = score->get<double>();
  } else {
    a.error = "expected a number or an object with a numeric \"score\", got: " + clip(line);
    return a;
  }
  if (!std::isfinite(a.score)) {
    a.score = 0;
    a.error = "score is not a finite number: " + clip(line);
    return a;
  }
  a.ok = true;
  return a;
}

RewardProgram::RewardProgram(RewardProgramOptions opt) : opt_(std::move(opt)) {}

Result<std::unique_ptr<RewardProgram>> RewardProgram::start(RewardProgramOptions opt) {
  if (opt.argv.empty() == opt.shell_command.empty())
    return KS_ERR(opt.name, ": give exactly one of a command argv or a shell command");
  if (!(opt.timeout_s > 0) || !std::isfinite(opt.timeout_s))
    return KS_ERR(opt.name, ": timeout must be a positive number of seconds, got ", opt.timeout_s);
  if (!opt.shell_command.empty()) {
    // /bin/sh starts whatever the command names, so a missing program would
    // only show as exit 127 and zero rewards for the whole run: checked here.
    if (const std::string miss = missing_program(opt.shell_command); !miss.empty())
      return KS_ERR(opt.name, ": program '", miss, "' of the command '", clip(opt.shell_command, 200), "' ",
                    miss.find('/') == std::string::npos ? "is not on PATH" : "does not exist or is not executable",
                    " (give an executable program, e.g. an absolute path)");
  }
  std::unique_ptr<RewardProgram> p(new RewardProgram(std::move(opt)));
  if (!p->opt_.stderr_log.empty() && !p->opt_.stderr_sink) {
    p->log_ = std::fopen(p->opt_.stderr_log.c_str(), "a");
    if (!p->log_)
      return KS_ERR(p->opt_.name, ": cannot open the stderr log '", p->opt_.stderr_log, "' for appending: ",
                    std::strerror(errno));
    std::fseek(p->log_, 0, SEEK_END);
    const long size = std::ftell(p->log_);
    p->log_bytes_ = size > 0 ? static_cast<uint64_t>(size) : 0;
  }
  KS_TRY(p->spawn());
  return p;
}

RewardProgram::~RewardProgram() {
  stop();
  if (log_) std::fclose(log_);
}

Status RewardProgram::spawn() {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  auto fail = [&](Status st) {
    for (int* p : {in, out, err}) close_fd(p[0]), close_fd(p[1]);
    return st;
  };
  for (int* p : {in, out, err}) {
    Status st = make_pipe(p);
    if (!st.is_ok()) return fail(st.with_context(opt_.name));
  }
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  isolate_child(attr);

  std::vector<std::string> args = opt_.argv;
  if (!opt_.shell_command.empty()) args = {"/bin/sh", "-c", opt_.shell_command};
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; e && *e; ++e) env_store.emplace_back(*e);
  for (const auto& kv : opt_.extra_env) {
    const std::string key = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env_store, [&](const std::string& e) { return e.rfind(key, 0) == 0; });
    env_store.push_back(kv);
  }
  std::vector<char*> cenv;
  for (auto& e : env_store) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  pid_t pid = -1;
  const int rc = opt_.shell_command.empty() ? ::posix_spawnp(&pid, cargv[0], &fa, &attr, cargv.data(), cenv.data())
                                            : ::posix_spawn(&pid, cargv[0], &fa, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return fail(KS_ERR(opt_.name, ": cannot start '", args[0], "': ", std::strerror(rc),
                       rc == ENOENT ? " (not found; check the command and PATH)" : ""));
  }
  close_fd(in[0]);
  close_fd(out[1]);
  close_fd(err[1]);
  in_fd_ = in[1];
  out_fd_ = out[0];
  err_fd_ = err[0];
  for (int fd : {in_fd_, out_fd_, err_fd_}) set_nonblocking(fd);
  pid_ = pid;
  out_buf_.clear();
  err_buf_.clear();
  if (spawned_++ > 0) ++total_.restarts;
  return Status::ok();
}

void RewardProgram::close_fds() {
  close_fd(in_fd_);
  close_fd(out_fd_);
  close_fd(err_fd_);
}

void RewardProgram::emit_stderr_line(const std::string& line) {
  // A program printing without end (1 GiB per call) must not fill the disk
  // or the console: past the per-call cap lines are only counted.
  if (call_err_bytes_ + line.size() + 1 > opt_.max_stderr_per_call) {
    call_err_dropped_ += line.size() + 1;
    return;
  }
  call_err_bytes_ += line.size() + 1;
  if (log_ && !opt_.stderr_sink) {
    if (log_full_) return;
    if (log_bytes_ + line.size() + 1 > opt_.max_stderr_log) {
      log_full_ = true;
      std::fprintf(log_, "[kestrel: this log reached its cap of %llu bytes; further reward-program stderr is dropped "
                   "(rotate or remove the file)]\n", static_cast<unsigned long long>(opt_.max_stderr_log));
      std::fflush(log_);
      warn(opt_.name + ": stderr log '" + opt_.stderr_log + "' reached its cap of " +
           std::to_string(opt_.max_stderr_log) + " bytes; further stderr of the program is dropped");
      return;
    }
    log_bytes_ += line.size() + 1;
  }
  if (opt_.stderr_sink) {
    opt_.stderr_sink(line);
  } else if (log_) {
    std::fprintf(log_, "%s\n", line.c_str());
    std::fflush(log_);
  } else {
    std::fprintf(stderr, "[reward %d] %s\n", static_cast<int>(pid_), line.c_str());
  }
}

void RewardProgram::drain_stderr(bool final) {
  char buf[8192];
  while (err_fd_ >= 0) {
    const ssize_t n = ::read(err_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) close_fd(err_fd_);  // EOF
      break;
    }
    err_buf_.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = err_buf_.find('\n', start)) != std::string::npos; start = nl + 1)
      emit_stderr_line(err_buf_.substr(start, nl - start));
    err_buf_.erase(0, start);
    while (err_buf_.size() >= kMaxStderrLine) {
      emit_stderr_line(err_buf_.substr(0, kMaxStderrLine));
      err_buf_.erase(0, kMaxStderrLine);
    }
  }
  if (final && !err_buf_.empty()) {
    emit_stderr_line(err_buf_);
    err_buf_.clear();
  }
}

std::string RewardProgram::reap_description(bool kill_first) {
  if (pid_ < 0) return "is not running";
  if (!kill_first) {
    // Closing stdout usually means it is exiting: give it a moment so the
    // report shows its own exit code rather than our SIGKILL. WNOWAIT keeps
    // it a zombie, so its pid (and group id) cannot be reused before the kill.
    const auto until = Clock::now() + std::chrono::milliseconds(200);
    while (Clock::now() < until) {
      siginfo_t si{};
      if (::waitid(P_PID, static_cast<id_t>(pid_), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ::kill(-pid_, SIGKILL);  // the whole group: also what a shell wrapper started
  int st = 0;
  pid_t r;
  while ((r = ::waitpid(pid_, &st, 0)) < 0 && errno == EINTR) {
  }
  drain_stderr(/*final=*/true);
  close_fds();
  const pid_t was = pid_;
  pid_ = -1;
  return r == was ? describe_status(st) : "could not be reaped (" + std::string(std::strerror(errno)) + ")";
}

void RewardProgram::stop() {
  if (pid_ < 0) {
    close_fds();
    return;
  }
  // Closing its stdin asks a well-behaved program to finish (and flush its logs).
  close_fd(in_fd_);
  const auto until = Clock::now() + std::chrono::milliseconds(100);
  while (Clock::now() < until) {
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid_) break;
    drain_stderr(false);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  reap_description(/*kill_first=*/true);
}

namespace {

// Responses [from, B) of r failed, counted under `counter`.
void fail_from(RewardProgramBatch& r, size_t from, int64_t RewardFailureCounts::*counter) {
  const size_t B = r.failed.size();
  for (size_t i = from; i < B; ++i) r.failed[i] = 1;
  r.failures.*counter += static_cast<int64_t>(B - from);
}

// The whole batch as one buffer of request lines, ids from base_id on.
std::string request_lines(const std::vector<RewardRequest>& batch, int64_t base_id, bool batch_header) {
  std::string payload;
  if (batch_header) payload = "{\"batch\": " + std::to_string(batch.size()) + "}\n";
  for (size_t i = 0; i < batch.size(); ++i) {
    nlohmann::ordered_json q;
    q["id"] = base_id + static_cast<int64_t>(i);
    q["data_source"] = batch[i].data_source;
    q["solution_str"] = batch[i].solution_str;
    q["ground_truth"] = batch[i].ground_truth;
    q["extra_info"] = batch[i].extra_info;
    // Decoded model text may hold broken UTF-8 (a cut multi-byte token):
    // replace it rather than throw.
    payload += q.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    payload += '\n';
  }
  return payload;
}

}  // namespace

struct RewardProgram::Exchange {
  size_t written = 0, answered = 0;  // request bytes written, answers read
  bool desync = false, eof = false;
  std::string crash_reason, first_garbage;
  int64_t stale = 0;  // late answers to earlier requests, skipped
};

RewardProgramBatch RewardProgram::score(const std::vector<RewardRequest>& batch) {
  const size_t B = batch.size();
  call_err_bytes_ = 0;
  call_err_dropped_ = 0;
  RewardProgramBatch r;
  r.scores.assign(B, 0.0);
  r.extra.assign(B, nlohmann::ordered_json::object());
  r.failed.assign(B, 0);
  r.dict.assign(B, 0);
  if (B == 0) return r;
  const int64_t restarts_before = total_.restarts;
  auto finish = [&]() {
    if (call_err_dropped_ > 0)
      warn(opt_.name + " wrote " + std::to_string(call_err_bytes_ + call_err_dropped_) +
           " bytes on stderr during one batch; the first " + std::to_string(call_err_bytes_) +
           " were kept and the rest dropped (cap " + std::to_string(opt_.max_stderr_per_call) + " bytes per batch)");
    r.failures.restarts = total_.restarts - restarts_before;
    RewardFailureCounts add = r.failures;
    add.restarts = 0;  // already in total_
    total_.add(add);
    return r;
  };

  if (pid_ >= 0) {
    // It may have died since the last batch: restart now rather than lose this batch.
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid_)
      warn(opt_.name + " " + reap_description(/*kill_first=*/false) + " between batches; restarting it");
  }
  if (pid_ < 0) {
    Status st = spawn();
    if (!st.is_ok()) {
      warn(st.message() + "; " + std::to_string(B) + " responses scored 0");
      fail_from(r, 0, &RewardFailureCounts::crash);
      return finish();
    }
  }
  // Ids continue across batches.
  const int64_t base_id = next_id_;
  next_id_ += static_cast<int64_t>(B);
  const std::string payload = request_lines(batch, base_id, opt_.batch_header);
  {
    SigpipeGuard sigpipe_guard;
    Exchange ex;
    converse(payload, base_id, r, ex);
    settle(ex, payload.size(), r);
  }
  return finish();
}

void RewardProgram::converse(const std::string& payload, int64_t base_id, RewardProgramBatch& r, Exchange& ex) {
  const size_t B = r.failed.size();
  const auto timeout = std::chrono::duration<double>(opt_.timeout_s);
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  auto take_lines = [&]() {
    size_t start = 0;
    for (size_t nl; ex.answered < B && (nl = out_buf_.find('\n', start)) != std::string::npos; start = nl + 1) {
      const std::string line = out_buf_.substr(start, nl - start);
      if (trim(line).empty()) continue;
      ParsedAnswer a = parse_reward_answer(line, base_id + static_cast<int64_t>(ex.answered));
      if (a.stale) {
        ++ex.stale;
        continue;
      }
      const size_t i = ex.answered;
      if (a.ok) {
        r.scores[i] = a.score;
        r.extra[i] = std::move(a.extra);
        r.dict[i] = a.dict ? 1 : 0;
      } else {
        r.failed[i] = 1;
        ++r.failures.garbage;
        if (ex.first_garbage.empty()) ex.first_garbage = "request " + std::to_string(i + 1) + ": " + a.error;
        ex.desync = ex.desync || a.desync;
      }
      ++ex.answered;
      deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
    }
    out_buf_.erase(0, start);
  };

  while (ex.answered < B) {
    pollfd fds[3];
    int n = 0, wi = -1, oi = -1, ei = -1;
    if (ex.written < payload.size() && in_fd_ >= 0) wi = n, fds[n++] = {in_fd_, POLLOUT, 0};
    oi = n, fds[n++] = {out_fd_, POLLIN, 0};
    if (err_fd_ >= 0) ei = n, fds[n++] = {err_fd_, POLLIN, 0};
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) break;  // timeout
    const int ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
    const int pr = ::poll(fds, static_cast<nfds_t>(n), ms);
    if (pr < 0) {
      if (errno == EINTR) continue;
      ex.crash_reason = std::string("poll failed: ") + std::strerror(errno);
      break;
    }
    if (pr == 0) continue;  // the deadline check above ends the loop
    if (ei >= 0 && fds[ei].revents) drain_stderr(false);
    if (wi >= 0 && fds[wi].revents) {
      const ssize_t w = ::write(in_fd_, payload.data() + ex.written, payload.size() - ex.written);
      if (w > 0) {
        ex.written += static_cast<size_t>(w);
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        // EPIPE: it closed its stdin or died; what it already answered still counts.
        ex.crash_reason = std::string("closed its input (") + std::strerror(errno) + ")";
        close_fd(in_fd_);
      }
    }
    if (fds[oi].revents) {
      char buf[65536];
      for (;;) {
        const ssize_t k = ::read(out_fd_, buf, sizeof buf);
        if (k > 0) {
          out_buf_.append(buf, static_cast<size_t>(k));
          continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k == 0) ex.eof = true;
        break;
      }
      take_lines();
      if (out_buf_.size() > kMaxAnswerLine) {
        ex.crash_reason = "wrote an answer line longer than " + std::to_string(kMaxAnswerLine >> 20) + " MiB";
        break;
      }
      if (ex.eof && ex.answered < B) {
        if (ex.crash_reason.empty()) ex.crash_reason = "closed its output";
        break;
      }
    }
  }
}

void RewardProgram::settle(const Exchange& ex, size_t payload_bytes, RewardProgramBatch& r) {
  const size_t B = r.failed.size(), answered = ex.answered;
  if (answered < B) {
    const bool timed_out = ex.crash_reason.empty() && !ex.eof;
    const std::string how = reap_description(/*kill_first=*/timed_out);
    if (timed_out) {
      fail_from(r, answered, &RewardFailureCounts::timeout);
      warn(opt_.name + " gave no answer within " + seconds(opt_.timeout_s) + " (request " +
           std::to_string(answered + 1) + " of " + std::to_string(B) + "); it was killed (" + how + "); " +
           std::to_string(B - answered) + " responses scored 0; it restarts for the next batch");
    } else {
      fail_from(r, answered, &RewardFailureCounts::crash);
      warn(opt_.name + " " + ex.crash_reason + " and " + how + " at request " + std::to_string(answered + 1) + " of " +
           std::to_string(B) + "; " + std::to_string(B - answered) +
           " responses scored 0; it restarts for the next batch (its stderr is above)");
    }
  } else {
    drain_stderr(false);
    if (ex.desync || ex.written < payload_bytes || !trim(out_buf_).empty()) {
      // Answers and requests no longer line up: start afresh next batch.
      reap_description(/*kill_first=*/true);
    }
  }
  if (r.failures.garbage > 0)
    warn(opt_.name + ": " + std::to_string(r.failures.garbage) + " answers of " + std::to_string(B) +
         " were unusable and scored 0; first: " + ex.first_garbage + (ex.desync ? "; it restarts for the next batch" : ""));
  if (ex.stale > 0) warn(opt_.name + ": skipped " + std::to_string(ex.stale) + " late answers to earlier requests");
}

Result<CommandResult> run_command(const std::vector<std::string>& argv, double timeout_s) {
  if (argv.empty()) return KS_ERR("run_command: empty argv");
  int out[2];
  KS_TRY(make_pipe(out));
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, out[1], 2);
  isolate_child(attr);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, cargv[0], &fa, &attr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close_fd(out[1]);
  if (rc != 0) {
    close_fd(out[0]);
    return KS_ERR("cannot start '", argv[0], "': ", std::strerror(rc),
                  rc == ENOENT ? " (not found; check the command and PATH)" : "");
  }
  set_nonblocking(out[0]);
  CommandResult res;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  char buf[8192];
  while (out[0] >= 0) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      res.timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int pr = ::poll(&p, 1, static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count()));
    if (pr < 0 && errno != EINTR) break;
    if (pr <= 0) continue;
    const ssize_t k = ::read(out[0], buf, sizeof buf);
    if (k > 0) {
      if (res.output.size() < (1u << 20)) res.output.append(buf, static_cast<size_t>(k));
    } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
      close_fd(out[0]);
    }
  }
  close_fd(out[0]);
  // It may close its output and still run: wait for its exit up to the
  // deadline (WNOWAIT keeps its pid, hence its group id, from reuse).
  while (!res.timed_out) {
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid) break;
    if (Clock::now() >= deadline) res.timed_out = true;
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (res.timed_out) ::kill(-pid, SIGKILL);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  res.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return res;
}

}  // namespace kestrel::rl
