#include "core/interrupt.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

namespace kestrel {

namespace {
std::atomic<bool> g_armed{false}, g_requested{false}, g_watching{false};

sigset_t sigint_set() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  return s;
}
}  // namespace

[[noreturn]] void die_of_sigint() {
  ::signal(SIGINT, SIG_DFL);
  const sigset_t s = sigint_set();
  pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
  ::raise(SIGINT);
  std::_Exit(130);  // SIGINT ignored by whoever started us: the same status
}

void start_interrupt_watcher() {
  if (g_watching.exchange(true)) return;
  const sigset_t s = sigint_set();
  // SIGINT ignored at exec (a background job of a non-interactive shell) stays ignored.
  struct sigaction old {};
  if (sigaction(SIGINT, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) return;
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
  std::thread([s] {
    for (;;) {
      int sig = 0;
      if (sigwait(&s, &sig) != 0) continue;
      if (g_armed.load() && !g_requested.exchange(true)) {
        static const char msg[] = "\nkestrel: interrupt: stopping after the current step (Ctrl-C again to stop now)\n";
        ssize_t ignored = ::write(2, msg, sizeof msg - 1);
        (void)ignored;
        continue;
      }
      die_of_sigint();
    }
  }).detach();
}

void arm_graceful_interrupt(bool on) {
  g_requested = false;
  g_armed = on;
}

bool interrupt_requested() { return g_requested.load(); }

}  // namespace kestrel
