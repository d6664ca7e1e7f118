#include "core/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

std::string non_regular_kind(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return "";
  if (S_ISLNK(st.st_mode)) return "a symlink";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device node";
  if (S_ISDIR(st.st_mode)) return "a folder";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

int remove_stale_temp_files(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
  const std::string prefix = p.filename().string() + ".tmp.";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() || name.size() > prefix.size() + 9) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    // kill(pid, 0) fails with ESRCH only when no such process exists; a live
    // writer (or a reused pid) keeps its file.
    if (pid == ::getpid() || pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    const std::string full = dir + "/" + name;
    if (non_regular_kind(full).empty() && ::unlink(full.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  if (const std::string kind = non_regular_kind(path_); !kind.empty()) {
    refused_ = path_ + " is " + kind + "; refusing to replace it with a regular file (give the path of a regular "
               "file or a new name)";
    return;
  }
  remove_stale_temp_files(path_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

Status AtomicFile::write(const void* data, size_t n) {
  if (!refused_.empty()) return KS_ERR(refused_);
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
  if (!refused_.empty()) return KS_ERR(refused_);
  if (fd_ < 0) return KS_ERR(tmp_, ": cannot create (", std::strerror(errno), ")");
  if (::fsync(fd_) != 0) return KS_ERR(tmp_, ": fsync failed (", std::strerror(errno), ")");
  ::close(fd_);
  fd_ = -1;
  // Checked again at the rename: something may have appeared under the name meanwhile.
  if (const std::string kind = non_regular_kind(path_); !kind.empty())
    return KS_ERR(path_, " is ", kind, "; refusing to replace it with a regular file (give the path of a regular "
                  "file or a new name)");
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

Status check_output_not_input(const std::string& out, const std::string& what_out, const std::string& in,
                              const std::string& what_in) {
  struct stat so {}, si {};
  if (::stat(out.c_str(), &so) != 0 || ::stat(in.c_str(), &si) != 0) return Status::ok();
  if (so.st_dev != si.st_dev || so.st_ino != si.st_ino) return Status::ok();
  return KS_ERR(what_out, " ", out, " is the same file as ", what_in, " ", in,
                "; writing it would destroy the input: give another output path");
}

Status check_output_file(const std::string& out, const std::string& what,
                         const std::vector<std::pair<std::string, std::string>>& inputs) {
  if (out.empty()) return KS_ERR(what, " is empty: give the path of the file to write");
  if (const std::string kind = non_regular_kind(out); !kind.empty())
    return KS_ERR(what, " ", out, " is ", kind, "; refusing to replace it with a regular file (give the path of a "
                  "regular file or a new name)");
  for (const auto& [in, flag] : inputs) KS_TRY(check_output_not_input(out, what, in, flag));
  const std::filesystem::path parent = std::filesystem::path(out).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return KS_ERR(what, " ", out, ": folder ", dir, " does not exist (create it first)");
  if (::access(dir.c_str(), W_OK) != 0)
    return KS_ERR(what, " ", out, ": folder ", dir, " is not writable (", std::strerror(errno),
                  "); choose a writable folder");
  return Status::ok();
}

Status check_not_inside(const std::string& dir, const std::string& key, const std::string& protected_dir,
                        const std::string& what) {
  namespace fs = std::filesystem;
  if (dir.empty() || protected_dir.empty()) return Status::ok();
  std::error_code e1, e2;
  const fs::path d = fs::weakly_canonical(fs::absolute(dir), e1);
  const fs::path p = fs::weakly_canonical(fs::absolute(protected_dir), e2);
  if (e1 || e2) return Status::ok();
  auto strip = [](fs::path x) { return x.filename().empty() && x.has_parent_path() ? x.parent_path() : x; };
  const fs::path dn = strip(d), pn = strip(p);
  auto [pe, de] = std::mismatch(pn.begin(), pn.end(), dn.begin(), dn.end());
  if (pe != pn.end()) return Status::ok();  // the protected folder is not a prefix of dir
  return KS_ERR(key, "=", dir, " is ", de == dn.end() ? "" : "inside ", what, " (", protected_dir,
                "): writing there would overwrite the input; give a folder outside it");
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
    } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number that overflows
      return KS_ERR(path, ":", lineno, ": invalid JSON (", e.what(), ")");
    }
    KS_TRY(fn(j, lineno).with_context(path + ":" + std::to_string(lineno)));
  }
  return Status::ok();
}

}  // namespace kestrel
