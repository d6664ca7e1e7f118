// Helpers shared by the libFuzzer targets (fuzz/README in docs/reliability.md).
// Readers that take a path get the input through one scratch file per process
// (rewritten each run), so the harness exercises the same code a user's file
// reaches, open() and mmap() included.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace kestrel::fuzz {

// A scratch path in $TMPDIR (or /tmp) unique to this process; `name` keeps
// the file name the reader expects (".parquet", "config.json", ...).
inline std::string scratch_path(const std::string& name) {
  const char* t = std::getenv("TMPDIR");
  return std::string(t && *t ? t : "/tmp") + "/kestrel_fuzz_" + std::to_string(::getpid()) + "_" + name;
}

// Writes `n` bytes to `path` (truncating); aborts on failure, which is the
// harness's fault, not the reader's.
inline void write_file(const std::string& path, const uint8_t* data, size_t n) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (n && std::fwrite(data, 1, n, f) != n) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
}

inline std::string as_string(const uint8_t* data, size_t n) { return std::string(reinterpret_cast<const char*>(data), n); }

}  // namespace kestrel::fuzz
