#include "cli/args.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "core/status.h"

namespace kestrel::cli {

ParsedArgs::ParsedArgs(const std::string& command, const std::vector<FlagSpec>& specs,
                       const std::vector<std::string>& args)
    : command_(command), specs_(specs) {
  auto find = [&](const std::string& n) -> const FlagSpec* {
    for (const auto& s : specs_)
      if (s.name == n) return &s;
    return nullptr;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const FlagSpec* s = find(name);
    if (!s) {
      std::ostringstream os;
      for (const auto& sp : specs_) os << " --" << sp.name;
      KS_FAIL("kestrel ", command_, ": unknown option '--", name, "'; valid options:", os.str());
    }
    if (s->takes_value && !inline_value) {
      if (i + 1 >= args.size()) KS_FAIL("kestrel ", command_, ": option --", name, " needs a value");
      value = args[++i];
    } else if (!s->takes_value && !inline_value) {
      value = "true";
    }
    values_[name] = value;
  }
  check_omp_num_threads(command_);
}

// libgomp reads OMP_NUM_THREADS itself and starts that many threads at the
// first parallel region: the same crash as --threads 65536, so the same bound
// (checked before any parallel region runs). "4,2" (nested levels): the first.
void check_omp_num_threads(const std::string& command) {
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && *env) {
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(env, &end, 10);
    if (end != env && errno == 0) check_thread_count(command, n, "OMP_NUM_THREADS=");
  }
}

std::string ParsedArgs::get(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  for (const auto& s : specs_)
    if (s.name == name) return s.default_value;
  return "";
}

std::string ParsedArgs::require(const std::string& name) const {
  std::string v = get(name);
  if (v.empty()) KS_FAIL("kestrel ", command_, ": missing required option --", name, "\n", usage());
  return v;
}

int64_t ParsedArgs::get_int(const std::string& name) const {
  std::string v = get(name);
  try {
    size_t pos = 0;
    int64_t x = std::stoll(v, &pos);
    if (pos != v.size()) throw std::invalid_argument(v);
    if (name == "threads") check_threads(x, "--threads ");
    return x;
  } catch (const std::invalid_argument&) {
    KS_FAIL("kestrel ", command_, ": option --", name, " must be an integer, got '", v, "'");
  } catch (const std::out_of_range&) {
    KS_FAIL("kestrel ", command_, ": option --", name, " must be an integer, got '", v, "'");
  }
}

// OpenMP starts one OS thread per requested thread at the first parallel
// region: --threads 65536 crashed inside libgomp (thread creation failed).
// More threads than 4x the hardware's only time-slice the same cores.
void ParsedArgs::check_threads(int64_t n, const char* what) const { check_thread_count(command_, n, what); }

void check_thread_count(const std::string& command, int64_t n, const char* what) {
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t limit = std::min<int64_t>(1024, std::max<int64_t>(4, 4 * hw));
  if (n < 0 || n > limit)
    KS_FAIL("kestrel ", command, ": ", what, n, " is out of range: use 0 (all ", hw, " hardware threads) or 1..",
            limit, " (at most 4x the hardware threads, and 1024)");
}

std::string ParsedArgs::usage() const {
  std::ostringstream os;
  os << "usage: kestrel " << command_ << " [options]\n";
  for (const auto& s : specs_) {
    os << "  --" << s.name << (s.takes_value ? " VALUE" : "") << "\n      " << s.help;
    if (!s.default_value.empty() && s.takes_value) os << " (default: " << s.default_value << ")";
    os << "\n";
  }
  return os.str();
}

}  // namespace kestrel::cli
