// core/progress.h: the step/phase text used by the collective timeout and
// the launcher-termination notice, formatted without allocation.
#include <gtest/gtest.h>

#include <cstring>

#include "core/progress.h"

using namespace kestrel;

TEST(Progress, TextNamesStepAndPhase) {
  set_progress(0, nullptr);
  EXPECT_EQ(progress_text(), "before the first training step");
  set_progress(12, "update_actor");
  EXPECT_EQ(progress_step(), 12);
  EXPECT_STREQ(progress_phase(), "update_actor");
  EXPECT_EQ(progress_text(), "at step 12 (update_actor)");
  set_progress(3, "");
  EXPECT_EQ(progress_text(), "at step 3");
}

TEST(Progress, SignalSafeTextTruncatesIntoSmallBuffers) {
  set_progress(123456, "save_checkpoint");
  char buf[64];
  const size_t n = progress_text_signal_safe(buf, sizeof buf);
  EXPECT_STREQ(buf, "at step 123456 (save_checkpoint)");
  EXPECT_EQ(n, std::strlen(buf));
  char small[8];
  const size_t m = progress_text_signal_safe(small, sizeof small);
  EXPECT_EQ(m, 7u);
  EXPECT_STREQ(small, "at step");
  EXPECT_EQ(progress_text_signal_safe(small, 0), 0u);
  set_progress(0, nullptr);
}
