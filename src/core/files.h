// File helpers: whole-file reads with clear errors, atomic writes (temp file,
// fsync, rename, fsync of the folder) so a crash never leaves a partial file
// under the final name, and JSONL reading that reports file:line.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace kestrel {

Result<std::string> read_file(const std::string& path);

// Writes through `<path>.tmp.<pid>` (same folder) and renames over `path` only
// once complete. `path` must be a regular file or not exist: a symlink, FIFO,
// device node or folder there is refused (write/commit fail naming it), never
// replaced. Temp files `<path>.tmp.<pid>` left by a process that no longer
// runs (killed mid-write) are removed when the next writer of `path` starts.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // an uncommitted file is removed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  Status write(const void* data, size_t n);
  Status write(const std::string& s) { return write(s.data(), s.size()); }
  Status commit();  // flush, fsync, rename, fsync dir
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  std::string refused_;  // why `path` may not be written ("" = fine)
  int fd_ = -1;
  bool committed_ = false;
};

Status write_file_atomic(const std::string& path, const std::string& content);

// Empty when `path` is absent or a regular file; else what it is ("a symlink",
// "a FIFO", "a device node", "a folder", ...), for refusing to replace it.
std::string non_regular_kind(const std::string& path);
// Removes `<path>.tmp.<pid>` files of processes that no longer run; returns how many.
int remove_stale_temp_files(const std::string& path);
// Refuses an output that is one of the inputs (same device and inode, through
// any name or link): `what_out` / `what_in` name them in the message
// ("--output", "--input").
Status check_output_not_input(const std::string& out, const std::string& what_out, const std::string& in,
                              const std::string& what_in);
// Everything about an output file that can be checked before the work that
// makes it: not a symlink/FIFO/device/folder, not one of `inputs` ({path,
// flag}), its folder exists and is writable. `what` names it ("--output").
Status check_output_file(const std::string& out, const std::string& what,
                         const std::vector<std::pair<std::string, std::string>>& inputs);
// Refuses a folder `dir` (config key `key`) equal to or inside `protected_dir`
// (`what`: "the model folder actor_rollout_ref.model.path"), compared after
// resolving links, so an export can never overwrite its own input.
Status check_not_inside(const std::string& dir, const std::string& key, const std::string& protected_dir,
                        const std::string& what);
// fsync of a directory, after renames inside it.
Status fsync_dir(const std::string& dir);

// Calls fn(json, line_number) for every non-blank line; a parse error names file:line.
Status for_each_jsonl(const std::string& path, const std::function<Status(const nlohmann::json&, int64_t)>& fn);

}  // namespace kestrel
