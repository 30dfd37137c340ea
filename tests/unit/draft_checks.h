// Checks of Model::draft shared by the CPU tests (unit/mtp_test.cpp) and the device tests
// (cuda/draft_test.cpp): the same properties on either backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "model/model.h"
#include "model/mtp.h"

namespace tf::testing {

// A state of `m` (with the MTP head's part) fed `prompt` in one prefill; its logits appended to
// *logits when given.
inline SequenceState prefilled(const Model& m, const std::vector<int32_t>& prompt,
                               std::vector<float>* logits = nullptr, ThreadPool* pool = nullptr) {
  SequenceState st = m.new_state(nullptr, true);
  std::vector<float> l;
  StepInput in{&st, prompt, false};
  m.forward({&in, 1}, logits ? logits : &l, pool);
  return st;
}

// Feeds toks one token per step; returns each step's logits row.
inline std::vector<float> decode_each(const Model& m, SequenceState* st,
                                      std::span<const int32_t> toks) {
  std::vector<float> rows;
  for (const int32_t& t : toks) {
    StepInput in{st, {&t, 1}, false};
    m.forward({&in, 1}, &rows, nullptr);
  }
  return rows;
}

// Compares two states bit for bit (the backend's own reading of "every buffer").
using SameState = std::function<::testing::AssertionResult(SequenceState&, SequenceState&)>;

// draft() leaves each state as it was, and its tokens, probabilities and logits are the same
// whether the three sequences draft alone or batched with other depths (with each of `pools`);
// the gate drops drafts below p_min and what follows. states: three MTP states after a step.
inline void check_draft_pure_and_batch_invariant(const Model& m, std::vector<SequenceState>& states,
                                                 std::span<ThreadPool* const> pools,
                                                 const SameState& same_state) {
  const int64_t V = m.config().vocab_size;
  ASSERT_EQ(states.size(), 3u);
  std::vector<SequenceState> before = states;
  std::vector<Draft> alone(3);
  for (size_t i = 0; i < 3; ++i) {
    const DraftInput in{&states[i], static_cast<int32_t>(i + 3), 4, 0.0f, true};
    m.draft({&in, 1}, {&alone[i], 1}, nullptr);
    ASSERT_EQ(alone[i].tokens.size(), 4u);
    ASSERT_EQ(alone[i].logits.size(), 4u * V);
    for (int s = 0; s < 4; ++s) {
      const auto row = std::span<const float>(alone[i].logits).subspan(s * V, V);
      EXPECT_EQ(alone[i].tokens[s], argmax_row(row));
      EXPECT_GT(alone[i].top_prob[s], 0.0f);
      EXPECT_LE(alone[i].top_prob[s], 1.0f);
    }
    EXPECT_TRUE(same_state(states[i], before[i])) << i;
  }
  for (ThreadPool* pool : pools) {
    // Different k per sequence: rows leave the batch at different steps.
    const DraftInput in[] = {{&states[0], 3, 4, 0.0f, true},
                             {&states[1], 4, 2, 0.0f, true},
                             {&states[2], 5, 4, 0.0f, true}};
    std::vector<Draft> out(3);
    m.draft(in, out, pool);
    for (size_t i = 0; i < 3; ++i) {
      const size_t n = in[i].max_tokens;
      ASSERT_EQ(out[i].tokens.size(), n);
      EXPECT_TRUE(std::equal(out[i].tokens.begin(), out[i].tokens.end(), alone[i].tokens.begin()));
      EXPECT_EQ(0, std::memcmp(out[i].top_prob.data(), alone[i].top_prob.data(), n * 4));
      EXPECT_EQ(0, std::memcmp(out[i].logits.data(), alone[i].logits.data(), n * V * 4));
      EXPECT_TRUE(same_state(states[i], before[i])) << i;
    }
  }
  // The gate: p_min just above draft s's probability keeps exactly the drafts before s.
  for (int s = 0; s < 4; ++s) {
    const float p = alone[2].top_prob[s];
    bool earlier_below = false;
    for (int t = 0; t < s; ++t) earlier_below |= alone[2].top_prob[t] <= p;
    if (earlier_below) continue;
    const DraftInput in{&states[2], 5, 4, std::nextafter(p, 2.0f)};
    Draft d;
    m.draft({&in, 1}, {&d, 1}, nullptr);
    EXPECT_EQ(d.tokens.size(), static_cast<size_t>(s)) << s;
  }
}

}  // namespace tf::testing
