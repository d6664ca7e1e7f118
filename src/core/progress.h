// Where the process is: the training step and phase a trainer is in, kept
// for messages written when something goes wrong outside the trainer's own
// code — a collective that times out (comm/mpi), a rank terminated by the
// launcher because another died (comm/world.cpp's SIGTERM notice), a crash
// report. It is diagnostic state only: nothing computes with it.
//
// set_progress() stores the step and a pointer to a string literal, so
// progress_text_signal_safe() can format it inside a signal handler.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kestrel {

// step: the number of the step being computed, 1-based as the metrics'
// training/global_step (0: before the first).
// phase: a string literal ("generate", "reward", "update_actor", ...).
void set_progress(int64_t step, const char* phase);
int64_t progress_step();
const char* progress_phase();  // "" before the first set_progress
// "at step 3 (update_actor)", or "before the first training step".
std::string progress_text();
// The same text into buf (NUL-terminated, truncated to n); async-signal-safe.
size_t progress_text_signal_safe(char* buf, size_t n);

}  // namespace kestrel
