// The atomic checkpoint writer and the TensorBoard record format.
#include <unistd.h>

#include <filesystem>
#include <cstring>
#include <fstream>

#include "common/testing.h"
#include "core/files.h"
#include "train/checkpoint.h"
#include "train/tensorboard.h"

namespace kestrel::train {
namespace {

namespace fs = std::filesystem;

std::string scratch(const std::string& name) {
  const auto d = fs::temp_directory_path() / ("kestrel_train_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

Status write_files(const std::string& dir, const std::string& tag) {
  KS_TRY(write_file_atomic(dir + "/a.txt", tag));
  fs::create_directories(dir + "/model");
  return write_file_atomic(dir + "/model/b.txt", tag + "b");
}

TEST(Checkpoint, PointerIsWrittenOnlyAfterTheFolderIsComplete) {
  const std::string root = scratch("ckpt_order");
  ASSERT_TRUE(write_checkpoint(root, 2, [](const std::string& d) { return write_files(d, "two"); }).is_ok());
  EXPECT_EQ(latest_checkpoint_step(root).value(), std::optional<int64_t>(2));
  bool checked = false;
  ASSERT_TRUE(write_checkpoint(root, 4, [&](const std::string& d) {
                // While step 4 is being written, the pointer still names step 2
                // and the final folder does not exist yet.
                EXPECT_EQ(latest_checkpoint_step(root).value(), std::optional<int64_t>(2));
                EXPECT_FALSE(fs::exists(checkpoint_dir(root, 4)));
                EXPECT_NE(d, checkpoint_dir(root, 4));
                checked = true;
                return write_files(d, "four");
              }).is_ok());
  EXPECT_TRUE(checked);
  EXPECT_EQ(latest_checkpoint_step(root).value(), std::optional<int64_t>(4));
  EXPECT_EQ(read_file(checkpoint_dir(root, 4) + "/model/b.txt").value(), "fourb");
  EXPECT_EQ(read_file(root + "/latest_checkpointed_iteration.txt").value(), "4\n");
}

TEST(Checkpoint, FailedFillLeavesNoFolderAndKeepsPointer) {
  const std::string root = scratch("ckpt_fail");
  ASSERT_TRUE(write_checkpoint(root, 1, [](const std::string& d) { return write_files(d, "one"); }).is_ok());
  auto s = write_checkpoint(root, 2, [](const std::string& d) -> Status {
    KS_TRY(write_file_atomic(d + "/a.txt", "half"));
    return KS_ERR("disk full");
  });
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("disk full"), std::string::npos);
  EXPECT_FALSE(fs::exists(checkpoint_dir(root, 2)));
  EXPECT_EQ(latest_checkpoint_step(root).value(), std::optional<int64_t>(1));
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(root)) ++entries;
  EXPECT_EQ(entries, 2);  // global_step_1 and the pointer
}

TEST(Checkpoint, PartialTempDirIsIgnoredAndCleaned) {
  const std::string root = scratch("ckpt_partial");
  ASSERT_TRUE(write_checkpoint(root, 3, [](const std::string& d) { return write_files(d, "three"); }).is_ok());
  // A writer killed mid-way through step 6 left this behind.
  const std::string tmp = root + "/.tmp.global_step_6.12345";
  fs::create_directories(tmp + "/model");
  std::ofstream(tmp + "/a.txt") << "partial";
  EXPECT_EQ(latest_checkpoint_step(root).value(), std::optional<int64_t>(3));
  EXPECT_EQ(remove_stale_checkpoint_temps(root), 1);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(checkpoint_dir(root, 3)));
}

TEST(Checkpoint, FolderWithoutPointerUpdateIsReplacedOnRewrite) {
  // Killed after the rename but before the pointer: global_step_5 exists, the
  // pointer says 3. The resumed run redoes step 5 and writes it again.
  const std::string root = scratch("ckpt_rename");
  ASSERT_TRUE(write_checkpoint(root, 3, [](const std::string& d) { return write_files(d, "three"); }).is_ok());
  fs::create_directories(checkpoint_dir(root, 5));
  std::ofstream(checkpoint_dir(root, 5) + "/a.txt") << "stale";
  EXPECT_EQ(latest_checkpoint_step(root).value(), std::optional<int64_t>(3));
  ASSERT_TRUE(write_checkpoint(root, 5, [](const std::string& d) { return write_files(d, "five"); }).is_ok());
  EXPECT_EQ(read_file(checkpoint_dir(root, 5) + "/a.txt").value(), "five");
  EXPECT_EQ(latest_checkpoint_step(root).value(), std::optional<int64_t>(5));
}

TEST(Checkpoint, KeepLastPrunesOldest) {
  const std::string root = scratch("ckpt_keep");
  for (int64_t s : {1, 2, 3, 4})
    ASSERT_TRUE(write_checkpoint(root, s, [](const std::string& d) { return write_files(d, "x"); }, 2).is_ok());
  EXPECT_FALSE(fs::exists(checkpoint_dir(root, 1)));
  EXPECT_FALSE(fs::exists(checkpoint_dir(root, 2)));
  EXPECT_TRUE(fs::exists(checkpoint_dir(root, 3)));
  EXPECT_TRUE(fs::exists(checkpoint_dir(root, 4)));
}

TEST(Checkpoint, BadPointerAndResumePath) {
  const std::string root = scratch("ckpt_bad");
  EXPECT_EQ(latest_checkpoint_step(root).value(), std::nullopt);
  ASSERT_TRUE(write_file_atomic(root + "/latest_checkpointed_iteration.txt", "9\n").is_ok());
  auto r = latest_checkpoint_step(root);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("global_step_9 does not exist"), std::string::npos) << r.status().message();
  EXPECT_EQ(checkpoint_step_of("/x/global_step_12").value(), 12);
  EXPECT_EQ(checkpoint_step_of("/x/global_step_12/").value(), 12);
  EXPECT_FALSE(checkpoint_step_of("/x/step_12").is_ok());
}

// read_trainer_state, which the SFT and RL trainers' resume share: the state
// back with its step, and each way the file can be wrong named by its path.
TEST(Checkpoint, TrainerStateIsReadAndEachDefectNamesTheFile) {
  const std::string dir = scratch("trainer_state");
  const std::string path = dir + "/trainer_state.json";
  ASSERT_TRUE(write_file_atomic(path, R"({"global_step": 7, "data_loader": {"epoch": 1}})").is_ok());
  Result<TrainerState> ok = read_trainer_state(dir);
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(ok->global_step, 7);
  EXPECT_EQ(ok->path, path);
  EXPECT_EQ(ok->json["data_loader"]["epoch"], 1);

  const std::pair<const char*, const char*> bad[] = {
      {"{\"global_step\": 7", "parse"},                           // cut short
      {R"({"data_loader": {}})", "global_step"},                    // no step
      {R"({"global_step": "seven", "data_loader": {}})", "type"},   // not a number
      {R"({"global_step": 7})", "data_loader state missing"},       // no loader state
  };
  for (const auto& [text, says] : bad) {
    ASSERT_TRUE(write_file_atomic(path, text).is_ok());
    Result<TrainerState> r = read_trainer_state(dir);
    ASSERT_FALSE(r.is_ok()) << text;
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
  }
  fs::remove(path);
  Result<TrainerState> missing = read_trainer_state(dir);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find(path), std::string::npos) << missing.status().message();
}

TEST(TensorBoard, Crc32cKnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(crc32c("", 0), 0u);
  const uint32_t c = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, ScalarEventBytes) {
  // Event{wall_time: 1.5, step: 300, summary{value{tag: "a", simple_value: 2}}}, encoded by hand:
  // 09 <1.5 as f64 LE> 10 ac 02 2a 0a 0a 08 0a 01 61 15 <2.0f LE>
  const std::string e = encode_scalar_event(1.5, 300, "a", 2.0f);
  const std::string want("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f\x10\xac\x02\x2a\x0a\x0a\x08\x0a\x01\x61\x15\x00\x00\x00\x40",
                         24);
  EXPECT_EQ(e, want);
  const std::string rec = tfrecord(e);
  ASSERT_EQ(rec.size(), 8 + 4 + e.size() + 4);
  uint64_t len;
  std::memcpy(&len, rec.data(), 8);
  EXPECT_EQ(len, e.size());
  uint32_t c1, c2;
  std::memcpy(&c1, rec.data() + 8, 4);
  std::memcpy(&c2, rec.data() + 12 + e.size(), 4);
  EXPECT_EQ(c1, masked_crc32c(rec.data(), 8));
  EXPECT_EQ(c2, masked_crc32c(e.data(), e.size()));
}

}  // namespace
}  // namespace kestrel::train
