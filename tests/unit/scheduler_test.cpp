// Scheduler simulations: no model, tables of what each step runs.
#include <gtest/gtest.h>

#include "runtime/scheduler.h"

namespace tf {
namespace {

// Row shorthand: {seq, begin, count, decode}.
struct R {
  uint64_t seq;
  int64_t begin, count;
  bool decode;
};

void expect_rows(const StepPlan& p, const std::vector<R>& want, int step) {
  ASSERT_EQ(p.rows.size(), want.size()) << "step " << step;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(p.rows[i].seq, want[i].seq) << "step " << step << " row " << i;
    EXPECT_EQ(p.rows[i].begin, want[i].begin) << "step " << step << " row " << i;
    EXPECT_EQ(p.rows[i].count, want[i].count) << "step " << step << " row " << i;
    EXPECT_EQ(p.rows[i].decode, want[i].decode) << "step " << step << " row " << i;
  }
}

// Two slots, budget 100: seq 1 (200-token prompt) is cut at 64 and 128 (the last aligned boundary
// in the budget), seq 2 (10 tokens) shares the steps; seq 3 waits for a slot until 2 finishes.
TEST(Scheduler, ChunkedPrefillAdmissionAndDecode) {
  Scheduler s({.max_running = 2, .batch_tokens = 100, .max_queue = 8, .prefill_align = 64});
  ASSERT_TRUE(s.enqueue(1, 0, 200));
  ASSERT_TRUE(s.enqueue(2, 0, 10));
  ASSERT_TRUE(s.enqueue(3, 0, 5));
  const std::vector<std::vector<R>> table = {
      {{1, 0, 64, false}, {2, 0, 10, false}},   // 1 cut at 64 (100 would cut mid-chunk); 2 whole
      {{2, 10, 1, true}, {1, 64, 64, false}},   // 2 decodes first; 1 continues to 128
      {{2, 11, 1, true}, {1, 128, 72, false}},  // 1's prompt ends (at its end, not a boundary)
      {{1, 200, 1, true}, {2, 12, 1, true}},    // both decode, in admission order
  };
  for (size_t i = 0; i < table.size(); ++i) {
    const StepPlan p = s.schedule();
    expect_rows(p, table[i], static_cast<int>(i));
    s.commit(p);
    EXPECT_EQ(s.waiting(), 1u);
  }
  s.finish(2);
  const StepPlan p = s.schedule();  // 3 admitted: decode row of 1 first, then 3's prompt
  expect_rows(p, {{1, 201, 1, true}, {3, 0, 5, false}}, 4);
  EXPECT_EQ(s.waiting(), 0u);
}

TEST(Scheduler, QueueOverflowIsRefusedWithoutSideEffects) {
  Scheduler s({.max_running = 1, .batch_tokens = 64, .max_queue = 1, .prefill_align = 64});
  EXPECT_TRUE(s.enqueue(1, 0, 3));   // takes the free slot at the next schedule()
  EXPECT_TRUE(s.enqueue(2, 0, 3));   // waits
  EXPECT_FALSE(s.enqueue(3, 0, 3));  // the slot and the queue are full
  EXPECT_EQ(s.waiting(), 2u);
  s.schedule();  // 1 admitted, 2 waits
  EXPECT_FALSE(s.enqueue(3, 0, 3));
  s.finish(1);
  EXPECT_TRUE(s.enqueue(3, 0, 3));
  // With no queue at all, a request still gets a free slot.
  Scheduler z({.max_running = 1, .batch_tokens = 64, .max_queue = 0, .prefill_align = 64});
  EXPECT_TRUE(z.enqueue(1, 0, 3));
  EXPECT_FALSE(z.enqueue(2, 0, 3));
}

TEST(Scheduler, CancelAnywhere) {
  Scheduler s({.max_running = 2, .batch_tokens = 64, .max_queue = 8, .prefill_align = 64});
  s.enqueue(1, 0, 3);
  s.enqueue(2, 0, 3);
  s.enqueue(3, 0, 3);
  s.cancel(3);  // waiting
  StepPlan p = s.schedule();
  s.commit(p);
  s.cancel(1);   // running
  s.cancel(42);  // unknown: ignored
  p = s.schedule();
  expect_rows(p, {{2, 3, 1, true}}, 1);
  EXPECT_EQ(s.running(), 1u);
  EXPECT_EQ(s.waiting(), 0u);
}

// A budget smaller than the distance to the next boundary still makes progress when nothing else
// runs, and never splits a chunk mid-way when other rows fill the step.
TEST(Scheduler, TinyBudget) {
  Scheduler s({.max_running = 2, .batch_tokens = 16, .max_queue = 8, .prefill_align = 64});
  s.enqueue(1, 0, 100);
  StepPlan p = s.schedule();
  expect_rows(p, {{1, 0, 64, false}}, 0);  // over budget, but the only way to make progress
  s.commit(p);
  p = s.schedule();
  expect_rows(p, {{1, 64, 36, false}}, 1);  // over budget again: rest of the prompt (<= 64)
}

// Keep points: prefill chunks end at each cut (where the engine keeps a state) even when the
// budget would run past it; a resumed sequence starts at its kept position.
TEST(Scheduler, CutsAndResume) {
  Scheduler s({.max_running = 2, .batch_tokens = 512, .max_queue = 8, .prefill_align = 64});
  ASSERT_TRUE(s.enqueue(1, 0, 200, {192, 64}));
  ASSERT_TRUE(s.enqueue(2, 0, 150, {128}));
  EXPECT_EQ(s.admit(), (std::vector<uint64_t>{1, 2}));
  s.resume(2, 128);  // 2 found a kept state of its first 128 tokens
  const std::vector<std::vector<R>> table = {
      {{1, 0, 64, false}, {2, 128, 22, false}},  // 1 stops at its cut; 2 prefills only the rest
      {{2, 150, 1, true}, {1, 64, 128, false}},  // 1 runs to its next cut
      {{2, 151, 1, true}, {1, 192, 8, false}},   // and then to the prompt's end
      {{1, 200, 1, true}, {2, 152, 1, true}},
  };
  for (size_t i = 0; i < table.size(); ++i) {
    const StepPlan p = s.plan();
    expect_rows(p, table[i], static_cast<int>(i));
    for (const StepRow& r : p.rows)  // only prompt ends and decodes sample
      EXPECT_EQ(r.samples, r.decode || r.begin + r.count == (r.seq == 1 ? 200 : 150)) << i;
    s.commit(p);
  }
}

// Internal sequences (the engine's keep jobs) take no queue capacity: requests are admitted or
// refused as if they were not there.
TEST(Scheduler, InternalSequencesTakeNoCapacity) {
  Scheduler s({.max_running = 1, .batch_tokens = 64, .max_queue = 1, .prefill_align = 64});
  EXPECT_TRUE(s.enqueue(7, 0, 64, {64}, /*internal=*/true));
  EXPECT_TRUE(s.enqueue(1, 0, 3));
  EXPECT_TRUE(s.enqueue(2, 0, 3));
  EXPECT_FALSE(s.enqueue(3, 0, 3));
  EXPECT_EQ(s.waiting(), 3u);
}

// Drafts take budget after every decoding sequence has its own token, in admission order; a
// prefill chunk gets what is left; commit advances a drafting sequence by the count the engine
// writes back (1 + drafts accepted), not by the planned 1 + k. (Checked to fail by granting
// drafts inside the first loop, before the second sequence's decode row.)
TEST(Scheduler, DraftsCountInTheBudget) {
  Scheduler s({.max_running = 3, .batch_tokens = 3, .max_queue = 8, .prefill_align = 64});
  ASSERT_TRUE(s.enqueue(1, 0, 1));
  ASSERT_TRUE(s.enqueue(2, 0, 2));
  StepPlan p = s.schedule();  // both prompts whole: 3 tokens
  s.commit(p);
  ASSERT_TRUE(s.enqueue(3, 0, 64));
  s.admit();
  s.set_draft(1, 3);
  s.set_draft(2, 3);
  p = s.plan();
  // 3 tokens: two decode rows, then the one token left is a draft for 1; nothing for 2 or 3.
  expect_rows(p, {{1, 1, 2, true}, {2, 2, 1, true}}, 0);
  EXPECT_EQ(p.rows[0].draft, 1);
  EXPECT_EQ(p.rows[1].draft, 0);
  EXPECT_EQ(p.tokens(), 3);
  p.rows[0].count = 1;  // 1's draft was rejected: it advances by its own token only
  s.commit(p);
  s.set_draft(1, 0);
  s.set_draft(2, 0);
  p = s.plan();  // no drafts; 3's prompt gets 1 token, no aligned cut inside it: it waits
  expect_rows(p, {{1, 2, 1, true}, {2, 3, 1, true}}, 1);
  EXPECT_EQ(p.rows[0].draft, 0);
}

}  // namespace
}  // namespace tf
