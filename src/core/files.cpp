#include "core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kestrel {

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return KS_ERR(path, ": cannot open (", std::strerror(errno), ")");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

Status AtomicFile::write(const void* data, size_t n) {
  if (fd_ < 0) return KS_ERR(tmp_, ": cannot create (", std::strerror(errno), ")");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return KS_ERR(tmp_, ": write failed (", std::strerror(errno), ")");
    }
    p += w;
    n -= size_t(w);
  }
  return Status::ok();
}

Status fsync_dir(const std::string& dir) {
  int d = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return KS_ERR(dir, ": cannot open folder for fsync (", std::strerror(errno), ")");
  int rc = ::fsync(d);
  ::close(d);
  if (rc != 0) return KS_ERR(dir, ": fsync failed (", std::strerror(errno), ")");
  return Status::ok();
}

Status AtomicFile::commit() {
  if (fd_ < 0) return KS_ERR(tmp_, ": cannot create (", std::strerror(errno), ")");
  if (::fsync(fd_) != 0) return KS_ERR(tmp_, ": fsync failed (", std::strerror(errno), ")");
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    return KS_ERR("cannot rename ", tmp_, " to ", path_, " (", std::strerror(errno), ")");
  committed_ = true;
  return fsync_dir(std::filesystem::path(path_).parent_path().string());
}

Status write_file_atomic(const std::string& path, const std::string& content) {
  AtomicFile f(path);
  KS_TRY(f.write(content));
  return f.commit();
}

Status for_each_jsonl(const std::string& path, const std::function<Status(const nlohmann::json&, int64_t)>& fn) {
  std::ifstream f(path);
  if (!f) return KS_ERR(path, ": cannot open (", std::strerror(errno), ")");
  std::string line;
  int64_t lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      return KS_ERR(path, ":", lineno, ": invalid JSON (", e.what(), ")");
    }
    KS_TRY(fn(j, lineno).with_context(path + ":" + std::to_string(lineno)));
  }
  return Status::ok();
}

}  // namespace kestrel
