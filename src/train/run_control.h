// What the trainers' step loops say and do around a run's edges: Ctrl-C
// (SIGINT) stops after the current step with "interrupted at step N; run the
// same command to resume" and the status a shell reads as 130; resuming a run
// whose checkpoint is already its final step says so instead of exiting 0
// after 0 steps in silence. Used by rl/trainer.cpp and train/sft_trainer.cpp.
#pragma once
#include <cstdint>
#include <string>

namespace kestrel::train {

// Arms graceful Ctrl-C (core/interrupt.h; main() starts its watcher): the
// first Ctrl-C asks the loop to stop after the step in progress (a line on
// stderr says so), a second one stops now.
void install_interrupt_handler();
// True once a SIGINT arrived since install_interrupt_handler().
bool interrupt_requested();
// After step `step`, when interrupt_requested() (under MPI: rank 0's, as the
// caller agreed): prints (when `print`) "interrupted at step N; run the same
// command to resume" with the checkpoint a resume starts from (under
// `ckpt_root`), then throws kestrel::Interrupted (core/interrupt.h): main()
// ends the process as an unhandled SIGINT does (exit status 130 in a shell,
// so a calling script stops too).
[[noreturn]] void end_interrupted(int64_t step, const std::string& ckpt_root, const char* command, bool print);
// After a resume: when `step` >= `total_steps` prints that the checkpoint is
// the final step and there is nothing to do; returns whether that is so.
bool report_if_finished(int64_t step, int64_t total_steps, const std::string& resume_dir,
                        const char* steps_key, const char* dir_key);

}  // namespace kestrel::train
