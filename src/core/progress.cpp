#include "core/progress.h"

#include <atomic>

namespace kestrel {

namespace {

std::atomic<int64_t> g_step{0};
std::atomic<const char*> g_phase{""};

// Writes v in decimal at buf (at most n-1 digits kept); returns the count.
size_t put_int(char* buf, size_t n, int64_t v) {
  char tmp[24];
  size_t k = 0;
  const bool neg = v < 0;
  uint64_t u = neg ? uint64_t(-(v + 1)) + 1 : uint64_t(v);
  do {
    tmp[k++] = char('0' + u % 10);
    u /= 10;
  } while (u && k < sizeof tmp);
  size_t w = 0;
  if (neg && w + 1 < n) buf[w++] = '-';
  while (k && w + 1 < n) buf[w++] = tmp[--k];
  return w;
}

size_t put_str(char* buf, size_t n, const char* s) {
  size_t w = 0;
  while (*s && w + 1 < n) buf[w++] = *s++;
  return w;
}

}  // namespace

void set_progress(int64_t step, const char* phase) {
  g_step.store(step, std::memory_order_relaxed);
  g_phase.store(phase ? phase : "", std::memory_order_relaxed);
}

int64_t progress_step() { return g_step.load(std::memory_order_relaxed); }
const char* progress_phase() { return g_phase.load(std::memory_order_relaxed); }

size_t progress_text_signal_safe(char* buf, size_t n) {
  if (n == 0) return 0;
  const int64_t step = progress_step();
  const char* phase = progress_phase();
  size_t w = 0;
  if (step <= 0 && !*phase) {
    w += put_str(buf + w, n - w, "before the first training step");
  } else {
    w += put_str(buf + w, n - w, "at step ");
    w += put_int(buf + w, n - w, step);
    if (*phase) {
      w += put_str(buf + w, n - w, " (");
      w += put_str(buf + w, n - w, phase);
      w += put_str(buf + w, n - w, ")");
    }
  }
  buf[w] = '\0';
  return w;
}

std::string progress_text() {
  char buf[128];
  const size_t n = progress_text_signal_safe(buf, sizeof buf);
  return std::string(buf, n);
}

}  // namespace kestrel
