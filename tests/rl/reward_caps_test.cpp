// The reward program's limits (issue 20): a shell command naming a program
// that does not exist fails at start, not as a whole run of zero rewards; a
// program flooding stderr is capped per batch and in its log file.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/testing.h"
#include "rl/reward_program.h"

using namespace kestrel::rl;

namespace {

// Answers 1 to every request after writing ~200 KB of 100-byte lines on stderr.
constexpr const char* kFlood =
    "while read -r l; do i=0; while [ $i -lt 2000 ]; do printf '%099d\\n' $i >&2; i=$((i+1)); done; echo 1; done";

std::vector<RewardRequest> ones(size_t n) {
  std::vector<RewardRequest> b;
  for (size_t i = 0; i < n; ++i) b.push_back({"test", "x", "1", nullptr});
  return b;
}

TEST(RewardProgramCaps, MissingProgramOfAShellCommandFailsAtStart) {
  RewardProgramOptions o;
  o.name = "reward_model.reward_command";
  o.shell_command = "kestrel-no-such-reward-program --flag";
  auto p = RewardProgram::start(o);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().message(),
            "reward_model.reward_command: program 'kestrel-no-such-reward-program' of the command "
            "'kestrel-no-such-reward-program --flag' is not on PATH (give an executable program, e.g. an absolute path)");
  o.shell_command = "FOO=1 /nonexistent/score.sh";
  p = RewardProgram::start(o);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("'/nonexistent/score.sh' of the command 'FOO=1 /nonexistent/score.sh' does not "
                                      "exist or is not executable"),
            std::string::npos)
      << p.status().message();
  // Shell syntax the check does not read starts as before.
  for (const char* ok : {"exec cat", "cd /tmp && cat", "$SHELL -c cat", "FOO=1 cat"}) {
    o.shell_command = ok;
    EXPECT_TRUE(RewardProgram::start(o).is_ok()) << ok;
  }
}

TEST(RewardProgramCaps, StderrIsCappedPerBatch) {
  std::vector<std::string> lines;
  RewardProgramOptions o;
  o.shell_command = kFlood;
  o.max_stderr_per_call = 10000;
  o.stderr_sink = [&](const std::string& l) { lines.push_back(l); };
  auto p = RewardProgram::start(o);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  for (int batch = 0; batch < 2; ++batch) {
    lines.clear();
    auto r = (*p)->score(ones(2));
    EXPECT_EQ(r.scores, (std::vector<double>{1, 1}));
    EXPECT_EQ(r.failures.total(), 0);
    size_t bytes = 0;
    for (const auto& l : lines) bytes += l.size() + 1;
    EXPECT_LE(bytes, 10000u) << "batch " << batch;
    EXPECT_GE(bytes, 9900u) << "batch " << batch;  // the cap is per batch: each batch passes its first 10 kB
  }
}

TEST(RewardProgramCaps, StderrLogFileIsCapped) {
  std::string log = KESTREL_BINARY_DIR;  // appended, not one `+` chain: GCC 12's false -Wstringop-overflow
  log += "/reward_caps_test_stderr.log";
  std::filesystem::remove(log);
  {
    RewardProgramOptions o;
    o.shell_command = kFlood;
    o.stderr_log = log;
    o.max_stderr_log = 50000;
    auto p = RewardProgram::start(o);
    ASSERT_TRUE(p.is_ok()) << p.status().message();
    for (int batch = 0; batch < 3; ++batch) EXPECT_EQ((*p)->score(ones(1)).scores, (std::vector<double>{1}));
  }
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  EXPECT_LE(text.size(), 50000u + 200u);
  EXPECT_NE(text.find("[kestrel: this log reached its cap of 50000 bytes"), std::string::npos);
  std::filesystem::remove(log);
}

}  // namespace
