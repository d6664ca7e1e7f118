// External reward program: protocol, failure handling (crash, hang, garbage,
// early exit), stderr forwarding and restarts, with bash fixtures.
#include <signal.h>
#include <sys/wait.h>

#include "common/testing.h"
#include "rl/reward_program.h"

using namespace kestrel::rl;
using kestrel::testing::source_path;

namespace {

struct Fixture {
  std::vector<std::string> stderr_lines;
  std::unique_ptr<RewardProgram> prog;

  explicit Fixture(const std::string& script, double timeout_s = 5.0) {
    RewardProgramOptions o;
    o.argv = {"bash", source_path("tests/rl/fixtures/" + script)};
    o.timeout_s = timeout_s;
    o.stderr_sink = [this](const std::string& l) { stderr_lines.push_back(l); };
    auto r = RewardProgram::start(std::move(o));
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    if (r.is_ok()) prog = std::move(r).value();
  }
};

std::vector<RewardRequest> requests(const std::vector<std::string>& truths, const std::string& ds = "test") {
  std::vector<RewardRequest> b;
  for (const auto& t : truths) b.push_back({ds, "solution text with \"quotes\" and \n newline", t, nullptr});
  return b;
}

std::vector<RewardRequest> ones(size_t n) { return requests(std::vector<std::string>(n, "1")); }

}  // namespace

TEST(RewardAnswer, ParsesNumbersObjectsAndRejectsGarbage) {
  auto a = parse_reward_answer(" 0.25 \r", 7);
  EXPECT_TRUE(a.ok);
  EXPECT_EQ(a.score, 0.25);
  a = parse_reward_answer(R"({"score": 1, "id": 7, "acc": true, "pred": "12"})", 7);
  ASSERT_TRUE(a.ok);
  EXPECT_EQ(a.score, 1.0);
  EXPECT_EQ(a.extra, nlohmann::ordered_json::parse(R"({"acc": true, "pred": "12"})"));
  a = parse_reward_answer("true", 0);
  EXPECT_TRUE(a.ok);
  EXPECT_EQ(a.score, 1.0);

  a = parse_reward_answer(R"({"score": 1, "id": 6})", 7);  // late answer
  EXPECT_TRUE(a.stale);
  EXPECT_FALSE(a.ok);
  a = parse_reward_answer(R"({"score": 1, "id": 9})", 7);
  EXPECT_TRUE(a.desync);
  a = parse_reward_answer("hello", 0);
  EXPECT_TRUE(a.desync);
  a = parse_reward_answer("NaN", 0);  // non-finite but one well-formed answer
  EXPECT_FALSE(a.ok);
  EXPECT_FALSE(a.desync);
  a = parse_reward_answer(R"({"id": 0, "score": NaN})", 0);
  EXPECT_FALSE(a.ok);
  EXPECT_FALSE(a.desync);
  a = parse_reward_answer("1e999", 0);
  EXPECT_FALSE(a.ok);
  a = parse_reward_answer(R"({"value": 1})", 0);
  EXPECT_FALSE(a.ok);
  EXPECT_NE(a.error.find("no \"score\""), std::string::npos) << a.error;
  a = parse_reward_answer(R"("0.5")", 0);
  EXPECT_FALSE(a.ok);
  EXPECT_FALSE(a.desync);
}

TEST(RewardProgram, HappyPathNumbersDictsOrderAndExtra) {
  Fixture f("echo_scores.sh");
  ASSERT_TRUE(f.prog);
  auto r = f.prog->score(requests({"0.5", "dict:0.75", "-1", "dict:2"}, "ds_a"));
  EXPECT_EQ(r.scores, (std::vector<double>{0.5, 0.75, -1, 2}));
  EXPECT_EQ(r.failed, (std::vector<uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(r.extra[0], nlohmann::ordered_json::object());
  EXPECT_EQ(r.extra[1], nlohmann::ordered_json::parse(R"({"acc": true, "ds": "ds_a"})"));
  EXPECT_EQ(r.failures.total(), 0);
  // Ids continue across batches (the dict answers carry and check them).
  r = f.prog->score(requests({"dict:3", "4"}));
  EXPECT_EQ(r.scores, (std::vector<double>{3, 4}));
  EXPECT_EQ(r.failures.total(), 0);
  EXPECT_TRUE(f.prog->score({}).scores.empty());
  f.prog->stop();  // flushes the rest of its stderr
  ASSERT_EQ(f.stderr_lines.size(), 6u);
  EXPECT_EQ(f.stderr_lines[0], "scoring id 0");
  EXPECT_EQ(f.stderr_lines[5], "scoring id 5");
  EXPECT_EQ(f.prog->total_failures().restarts, 0);
}

TEST(RewardProgram, CrashOnThirdRequestScoresZeroAndRestarts) {
  Fixture f("crash_third.sh");
  ASSERT_TRUE(f.prog);
  auto r = f.prog->score(ones(5));
  EXPECT_EQ(r.scores, (std::vector<double>{1, 1, 0, 0, 0}));
  EXPECT_EQ(r.failed, (std::vector<uint8_t>{0, 0, 1, 1, 1}));
  EXPECT_EQ(r.failures.crash, 3);
  EXPECT_EQ(r.failures.timeout + r.failures.garbage, 0);
  EXPECT_EQ(f.prog->pid(), -1);
  ASSERT_FALSE(f.stderr_lines.empty());
  EXPECT_EQ(f.stderr_lines.back(), "crash_third: giving up on request 3");
  // Restarted for the next batch: a fresh life answers two more.
  r = f.prog->score(ones(2));
  EXPECT_EQ(r.scores, (std::vector<double>{1, 1}));
  EXPECT_EQ(r.failures.total(), 0);
  EXPECT_EQ(r.failures.restarts, 1);
  EXPECT_EQ(f.prog->total_failures().crash, 3);
  EXPECT_EQ(f.prog->total_failures().restarts, 1);
}

TEST(RewardProgram, HangIsKilledAfterTimeoutAndRestarts) {
  Fixture f("hang_second.sh", 0.5);
  ASSERT_TRUE(f.prog);
  const pid_t first = f.prog->pid();
  auto r = f.prog->score(ones(4));
  EXPECT_EQ(r.scores, (std::vector<double>{1, 0, 0, 0}));
  EXPECT_EQ(r.failures.timeout, 3);
  EXPECT_EQ(r.failures.crash + r.failures.garbage, 0);
  // The child was SIGKILLed and reaped: no zombie left with its pid.
  EXPECT_EQ(::waitpid(first, nullptr, WNOHANG), -1);
  r = f.prog->score(ones(1));
  EXPECT_EQ(r.scores, (std::vector<double>{1}));
  EXPECT_EQ(r.failures.total(), 0);
  EXPECT_EQ(f.prog->total_failures().timeout, 3);
  EXPECT_EQ(f.prog->total_failures().restarts, 1);
}

TEST(RewardProgram, GarbageAnswersScoreZeroAndResync) {
  Fixture f("garbage.sh");
  ASSERT_TRUE(f.prog);
  auto r = f.prog->score(ones(8));
  EXPECT_EQ(r.scores, (std::vector<double>{1, 0, 0, 0, 0, 0.5, 0, 1}));
  EXPECT_EQ(r.failed, (std::vector<uint8_t>{0, 1, 1, 1, 1, 0, 1, 0}));
  EXPECT_EQ(r.failures.garbage, 5);
  EXPECT_EQ(r.failures.crash + r.failures.timeout, 0);
  EXPECT_EQ(r.extra[5], nlohmann::ordered_json::parse(R"({"note": "ok"})"));
  // "hello" and the wrong id broke the stream: the next batch gets a fresh child.
  r = f.prog->score(ones(1));
  EXPECT_EQ(r.scores, (std::vector<double>{1}));
  EXPECT_EQ(r.failures.restarts, 1);
}

TEST(RewardProgram, ProgramThatExitsAtOnce) {
  Fixture f("exit_now.sh");
  ASSERT_TRUE(f.prog);
  for (int batch = 0; batch < 2; ++batch) {
    auto r = f.prog->score(ones(3));
    EXPECT_EQ(r.scores, (std::vector<double>{0, 0, 0}));
    EXPECT_EQ(r.failures.crash, 3);
  }
  EXPECT_EQ(f.prog->total_failures().crash, 6);
  // One restart per batch at least (one more when the death is seen before a batch is sent).
  EXPECT_GE(f.prog->total_failures().restarts, 1);
  EXPECT_GE(std::count(f.stderr_lines.begin(), f.stderr_lines.end(), "exit_now: bye"), 2);
}

TEST(RewardProgram, DeathBetweenBatchesRestartsBeforeSending) {
  RewardProgramOptions o;
  o.shell_command = "read -r line; echo 1";  // answers once, then exits
  auto p = RewardProgram::start(std::move(o));
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ((*p)->score(ones(1)).scores, (std::vector<double>{1}));
  siginfo_t si{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>((*p)->pid()), &si, WEXITED | WNOWAIT), 0);  // until it has exited
  auto r = (*p)->score(ones(1));
  EXPECT_EQ(r.scores, (std::vector<double>{1}));
  EXPECT_EQ(r.failures.total(), 0);
  EXPECT_EQ(r.failures.restarts, 1);
}

TEST(RewardProgram, ShellCommandStringAndSigpipeDoNotKillUs) {
  // A big batch to a program that exits without reading: the writes hit EPIPE.
  RewardProgramOptions o;
  o.shell_command = "exit 7";
  o.timeout_s = 5;
  o.stderr_sink = [](const std::string&) {};
  auto p = RewardProgram::start(std::move(o));
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  std::vector<RewardRequest> big(2000, RewardRequest{"d", std::string(4096, 'x'), "1", nullptr});
  auto r = (*p)->score(big);
  EXPECT_EQ(r.failures.crash, 2000);
  sigset_t pending;
  sigpending(&pending);
  EXPECT_EQ(sigismember(&pending, SIGPIPE), 0);  // consumed, not left pending
}

TEST(RewardProgram, LargeBatchBothPipesFullNoDeadlock) {
  // 8 MB of requests in, ~240 KB of answers out: both exceed a pipe buffer,
  // so writing everything before reading would deadlock.
  RewardProgramOptions o;
  // perl (in Debian's essential set) answers each line as soon as it is read.
  o.shell_command =
      "perl -ne 'BEGIN { $| = 1; $pad = \"p\" x 100 } "
      "printf(\"{\\\"score\\\": %d, \\\"pad\\\": \\\"%s\\\"}\\n\", $. % 3, $pad)'";
  o.timeout_s = 5;
  auto p = RewardProgram::start(std::move(o));
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  std::vector<RewardRequest> big(2000, RewardRequest{"d", std::string(4096, 'y'), "1", nullptr});
  big[5].solution_str = "broken utf-8 \xff\xfe end";  // replaced, not thrown
  auto r = (*p)->score(big);
  ASSERT_EQ(r.failures.total(), 0);
  for (size_t i = 0; i < big.size(); ++i) ASSERT_EQ(r.scores[i], static_cast<double>((i + 1) % 3)) << i;
  EXPECT_EQ(r.extra[0]["pad"].get<std::string>(), std::string(100, 'p'));
}

TEST(RewardProgram, LotsOfStderrIsForwardedWhileAnswering) {
  Fixture f("stderr_flood.sh");
  ASSERT_TRUE(f.prog);
  auto r = f.prog->score(ones(3));
  EXPECT_EQ(r.scores, (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(r.failures.total(), 0);
  f.prog->stop();
  ASSERT_EQ(f.stderr_lines.size(), 6000u);
  EXPECT_EQ(f.stderr_lines[0], "log 0 " + std::string(90, '0'));
  EXPECT_EQ(f.stderr_lines[5999].substr(0, 9), "log 1999 ");
}

TEST(RewardProgram, StderrLogFile) {
  const std::string log = std::string(KESTREL_BINARY_DIR) + "/reward_program_test_stderr.log";
  std::remove(log.c_str());
  RewardProgramOptions o;
  o.argv = {"bash", source_path("tests/rl/fixtures/echo_scores.sh")};
  o.stderr_log = log;
  {
    auto p = RewardProgram::start(std::move(o));
    ASSERT_TRUE(p.is_ok()) << p.status().message();
    EXPECT_EQ((*p)->score(requests({"1", "2"})).scores, (std::vector<double>{1, 2}));
  }
  std::FILE* f = std::fopen(log.c_str(), "r");
  ASSERT_TRUE(f);
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  EXPECT_EQ(std::string(buf, n), "scoring id 0\nscoring id 1\n");
}

TEST(RewardProgram, StartupErrors) {
  RewardProgramOptions o;
  o.argv = {"kestrel-no-such-reward-program"};
  auto p = RewardProgram::start(o);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("not found"), std::string::npos) << p.status().message();
  o.argv.clear();
  EXPECT_FALSE(RewardProgram::start(o).is_ok());  // neither argv nor shell command
  o.shell_command = "true";
  o.timeout_s = 0;
  EXPECT_FALSE(RewardProgram::start(o).is_ok());
}

TEST(RunCommand, CapturesOutputAndExitCode) {
  auto r = run_command({"sh", "-c", "echo out; echo err >&2; exit 4"}, 5);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->exit_code, 4);
  EXPECT_FALSE(r->timed_out);
  EXPECT_EQ(r->output, "out\nerr\n");
  r = run_command({"sh", "-c", "sleep 30"}, 0.2);
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->timed_out);
}
