// AtomicFile and the output checks (core/files.h): never replace a symlink,
// FIFO or device; the input is not an output; stale temp files of dead
// writers are removed; an export folder inside the model folder is refused.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/files.h"

namespace fs = std::filesystem;
using namespace kestrel;

namespace {

struct TempDir {
  fs::path p = fs::path(::testing::TempDir()) / ("kestrel_files_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(p); }
  ~TempDir() { fs::remove_all(p); }
  std::string operator/(const std::string& n) const { return (p / n).string(); }
};

std::string slurp(const std::string& f) {
  std::ifstream in(f);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(AtomicFile, RefusesSymlinkFifoAndFolder) {
  TempDir d;
  std::ofstream(d / "target") << "keep";
  fs::create_symlink(d / "target", d / "link");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0644), 0);
  fs::create_directory(d / "dir");
  for (const char* name : {"link", "fifo", "dir"}) {
    Status s = write_file_atomic(d / name, "new");
    ASSERT_FALSE(s.is_ok()) << name;
    EXPECT_NE(s.message().find(" is a"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("refusing to replace it"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(fs::is_symlink(d / "link"));
  EXPECT_EQ(slurp(d / "target"), "keep");
  EXPECT_TRUE(fs::is_fifo(d / "fifo"));
  EXPECT_EQ(non_regular_kind("/dev/null"), "a device node");
  EXPECT_EQ(non_regular_kind(d / "absent"), "");
}

TEST(AtomicFile, RemovesTempFilesOfDeadWritersOnly) {
  TempDir d;
  std::ofstream(d / "out.jsonl.tmp.999999999") << "partial";                            // no such process
  std::ofstream(d / ("out.jsonl.tmp." + std::to_string(::getppid()))) << "live";        // a live process
  std::ofstream(d / "other.jsonl.tmp.999999999") << "another output's";
  ASSERT_TRUE(write_file_atomic(d / "out.jsonl", "done\n").is_ok());
  EXPECT_FALSE(fs::exists(d / "out.jsonl.tmp.999999999"));
  EXPECT_TRUE(fs::exists(d / ("out.jsonl.tmp." + std::to_string(::getppid()))));
  EXPECT_TRUE(fs::exists(d / "other.jsonl.tmp.999999999"));
  EXPECT_EQ(slurp(d / "out.jsonl"), "done\n");
}

TEST(OutputChecks, InputIsNotAnOutput) {
  TempDir d;
  std::ofstream(d / "in.jsonl") << "x";
  fs::create_hard_link(d / "in.jsonl", d / "hard.jsonl");
  for (const char* out : {"in.jsonl", "hard.jsonl"}) {
    Status s = check_output_file(d / out, "--output", {{d / "in.jsonl", "--input"}});
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("is the same file as --input"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(check_output_file(d / "new.jsonl", "--output", {{d / "in.jsonl", "--input"}}).is_ok());
  Status s = check_output_file(d / "nodir/o.jsonl", "--output", {});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("does not exist (create it first)"), std::string::npos) << s.message();
}

TEST(OutputChecks, ExportNotInsideTheModel) {
  TempDir d;
  fs::create_directories(d / "model");
  EXPECT_FALSE(check_not_inside(d / "model", "trainer.export_dir", d / "model", "the model folder").is_ok());
  EXPECT_FALSE(check_not_inside(d / "model/", "trainer.export_dir", d / "model", "the model folder").is_ok());
  EXPECT_FALSE(check_not_inside(d / "model/sub/x", "trainer.export_dir", d / "model", "the model folder").is_ok());
  EXPECT_TRUE(check_not_inside(d / "model2", "trainer.export_dir", d / "model", "the model folder").is_ok());
  EXPECT_TRUE(check_not_inside(d / "out", "trainer.export_dir", d / "model", "the model folder").is_ok());
  Status s = check_not_inside(d / "model/x", "trainer.export_dir", d / "model", "the model folder");
  EXPECT_NE(s.message().find("trainer.export_dir=" + (d / "model/x") + " is inside the model folder"),
            std::string::npos)
      << s.message();
}

}  // namespace
