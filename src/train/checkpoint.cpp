#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/files.h"
#include "io/safetensors.h"
#include "parallel/sharding.h"

namespace kestrel::train {

namespace fs = std::filesystem;

namespace {

const std::string kStepPrefix = "global_step_";
const std::string kTempPrefix = ".tmp.global_step_";

std::optional<int64_t> parse_step(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0) return std::nullopt;
  const std::string num = name.substr(kStepPrefix.size());
  if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(num);
}

Status fsync_path(const std::string& p, bool dir) {
  const int fd = ::open(p.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return KS_ERR(p, ": cannot open for fsync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return KS_ERR(p, ": fsync failed");
  return Status::ok();
}

}  // namespace

void maybe_crash(const char* point, int64_t step) {
  static const char* spec = std::getenv("KESTREL_CRASH_AT");
  if (!spec) return;
  if (std::string(spec) == std::string(point) + ":" + std::to_string(step)) ::raise(SIGKILL);
}

std::string checkpoint_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / (kStepPrefix + std::to_string(step))).string();
}

Status fsync_tree(const std::string& dir) {
  std::vector<std::string> dirs{dir};
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_directory()) dirs.push_back(it->path().string());
    else if (it->is_regular_file()) KS_TRY(fsync_path(it->path().string(), false));
  }
  if (ec) return KS_ERR(dir, ": cannot list: ", ec.message());
  for (auto d = dirs.rbegin(); d != dirs.rend(); ++d) KS_TRY(fsync_path(*d, true));
  return Status::ok();
}

int64_t remove_stale_checkpoint_temps(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return 0;
  int64_t n = 0;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.path().filename().string().rfind(kTempPrefix, 0) == 0) {
      fs::remove_all(e.path(), ec);
      ++n;
    }
  }
  return n;
}

namespace {

// Publishes a filled temp folder: fsync, rename into place, pointer, pruning.
Status publish_checkpoint(const std::string& root, int64_t step, const std::string& tmp, int64_t keep_last) {
  std::error_code ec;
  maybe_crash("ckpt_files", step);
  KS_TRY(fsync_tree(tmp));
  const std::string final_dir = checkpoint_dir(root, step);
  if (fs::exists(final_dir)) {
    // A complete folder of an earlier attempt at this step (the pointer never
    // reached it): replace it by this one, which is equally complete.
    fs::remove_all(final_dir, ec);
    if (ec) return KS_ERR(final_dir, ": cannot replace: ", ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) return KS_ERR(tmp, ": cannot rename to ", final_dir, ": ", ec.message());
  KS_TRY(fsync_dir(root));
  maybe_crash("ckpt_pointer", step);
  KS_TRY(write_file_atomic((fs::path(root) / kLatestCheckpointFile).string(), std::to_string(step) + "\n"));
  if (keep_last > 0) {
    std::vector<int64_t> steps;
    for (const auto& e : fs::directory_iterator(root, ec))
      if (auto n = parse_step(e.path().filename().string()); n && e.is_directory()) steps.push_back(*n);
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + size_t(keep_last) < steps.size(); ++i)
      if (steps[i] != step) fs::remove_all(checkpoint_dir(root, steps[i]), ec);
  }
  return Status::ok();
}

// 1 on every rank when `ok` holds on all of them.
bool all_ok(comm::ProcessGroup& g, bool ok) {
  int32_t v = ok ? 1 : 0;
  g.all_reduce(&v, 1, DType::I32, comm::ReduceOp::Min);
  return v == 1;
}

}  // namespace

Status write_checkpoint(const std::string& root, int64_t step, const std::function<Status(const std::string&)>& fill,
                        int64_t keep_last, comm::ProcessGroup* group) {
  const bool multi = group && group->size() > 1;
  const bool lead = !multi || group->rank() == 0;
  std::error_code ec;
  // The temp folder is named after rank 0's pid, which every rank learns.
  int64_t pid = ::getpid();
  if (multi) group->broadcast(&pid, 1, DType::I64, 0);
  const std::string tmp = (fs::path(root) / (kTempPrefix + std::to_string(step) + "." + std::to_string(pid))).string();
  Status made = Status::ok();
  if (lead) {
    fs::create_directories(root, ec);
    if (ec) made = KS_ERR(root, ": cannot create the checkpoint folder: ", ec.message());
    if (made) {
      fs::remove_all(tmp, ec);
      fs::create_directories(tmp, ec);
      if (ec) made = KS_ERR(tmp, ": cannot create: ", ec.message());
    }
  }
  if (multi && !all_ok(*group, made.is_ok()))
    return made.is_ok() ? KS_ERR("writing checkpoint ", checkpoint_dir(root, step), ": rank 0 could not create ", tmp)
                        : made;
  KS_TRY(made);
  Status s = fill(tmp);
  if (multi && !all_ok(*group, s.is_ok()) && s.is_ok())
    s = KS_ERR("another rank failed to write its part (its message is in its log)");
  if (!s) {
    if (lead) fs::remove_all(tmp, ec);
    return s.with_context("writing checkpoint " + checkpoint_dir(root, step));
  }
  Status pub = lead ? publish_checkpoint(root, step, tmp, keep_last) : Status::ok();
  if (multi && !all_ok(*group, pub.is_ok()) && pub.is_ok())
    pub = KS_ERR("rank 0 could not publish checkpoint ", checkpoint_dir(root, step));
  return pub;
}

Result<std::optional<int64_t>> latest_checkpoint_step(const std::string& root) {
  const std::string p = (fs::path(root) / kLatestCheckpointFile).string();
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::optional<int64_t>();
  KS_ASSIGN(std::string text, read_file(p));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    return KS_ERR(p, ": expected a step number, got '", text, "' (delete the file to start fresh)");
  const int64_t step = std::stoll(text);
  if (!fs::is_directory(checkpoint_dir(root, step)))
    return KS_ERR(p, ": names step ", step, " but ", checkpoint_dir(root, step),
                  " does not exist (restore it, or delete the pointer to start fresh)");
  return std::optional<int64_t>(step);
}

Result<int64_t> checkpoint_step_of(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  if (name.empty()) name = fs::path(path).parent_path().filename().string();
  if (auto n = parse_step(name)) return *n;
  return KS_ERR("trainer.resume_from_path: '", path, "' must be a global_step_N folder");
}

Status load_weights_into(model::CausalLM& model, const std::string& dir) {
  KS_ASSIGN(auto src, io::WeightSource::open_dir(dir));
  for (model::Param* p : model.state_tensors()) {  // the params and the f32 buffers (MoE correction biases)
    const comm::ProcessGroup& g = model.shard_group(*p);  // a routed expert's shard is over etp
    const int tp = g.size(), rank = g.rank();
    if (tp == 1) {
      KS_ASSIGN(Tensor t, src.load(p->name, p->weight.shape(), p->weight.dtype(), MemCategory::Other));
      p->weight.copy_from(t);
    } else {
      KS_ASSIGN(Tensor full, src.load(p->name, p->full_shape, p->weight.dtype(), MemCategory::Other));
      p->weight.copy_from(parallel::shard_tensor(full, p->shard, rank, tp, p->name, MemCategory::Other));
    }
  }
  return Status::ok();
}

Result<TrainerState> read_trainer_state(const std::string& dir) {
  TrainerState st;
  st.path = dir + "/trainer_state.json";
  KS_ASSIGN(std::string text, read_file(st.path));
  try {
    st.json = nlohmann::json::parse(text);
    st.global_step = st.json.at("global_step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return KS_ERR(st.path, ": ", e.what());
  }
  if (!st.json.contains("data_loader")) return KS_ERR(st.path, ": data_loader state missing");
  return st;
}

}  // namespace kestrel::train
