// File helpers: whole-file reads with clear errors, atomic writes (temp file,
// fsync, rename, fsync of the folder) so a crash never leaves a partial file
// under the final name, and JSONL reading that reports file:line.
#pragma once
#include <functional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace kestrel {

Result<std::string> read_file(const std::string& path);

// Writes through `<path>.tmp.<pid>` and renames over `path` only once complete.
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
  int fd_ = -1;
  bool committed_ = false;
};

Status write_file_atomic(const std::string& path, const std::string& content);
// fsync of a directory, after renames inside it.
Status fsync_dir(const std::string& dir);

// Calls fn(json, line_number) for every non-blank line; a parse error names file:line.
Status for_each_jsonl(const std::string& path, const std::function<Status(const nlohmann::json&, int64_t)>& fn);

}  // namespace kestrel
