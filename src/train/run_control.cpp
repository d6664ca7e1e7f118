#include "train/run_control.h"

#include <cstdio>

#include "core/interrupt.h"
#include "train/checkpoint.h"

namespace kestrel::train {

void install_interrupt_handler() { arm_graceful_interrupt(true); }

bool interrupt_requested() { return kestrel::interrupt_requested(); }

void end_interrupted(int64_t step, const std::string& ckpt_root, const char* command, bool print) {
  std::string from = "no checkpoint was saved yet, so it starts over (trainer.save_freq sets how often one is)";
  if (!ckpt_root.empty()) {
    auto latest = latest_checkpoint_step(ckpt_root);
    if (latest.is_ok() && latest.value())
      from = "it continues from " + checkpoint_dir(ckpt_root, *latest.value());
  }
  char msg[64];
  std::snprintf(msg, sizeof msg, "interrupted at step %lld", static_cast<long long>(step));
  // main() prints it and ends as an unhandled SIGINT would (exit status 130).
  throw Interrupted(print ? std::string("\n") + command + ": " + msg + "; run the same command to resume (" + from + ")"
                          : std::string());
}

bool report_if_finished(int64_t step, int64_t total_steps, const std::string& resume_dir, const char* steps_key,
                        const char* dir_key) {
  if (step < total_steps) return false;
  std::fprintf(stderr,
               "checkpoint at step %lld (%s) is the final step of this run (%s=%lld); nothing to do: set %s higher "
               "or use a new %s\n",
               static_cast<long long>(step), resume_dir.c_str(), steps_key, static_cast<long long>(total_steps),
               steps_key, dir_key);
  return true;
}

}  // namespace kestrel::train
