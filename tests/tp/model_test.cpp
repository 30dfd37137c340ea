// Tensor parallelism on a real checkpoint, run as `mpirun -np N tp_model_test DIR TOL` (ctest
// label tp). Rank 0 runs the tests against two models: the TP=N one (this rank's shard, leading
// the followers) and a whole TP=1 one in the same process; the other ranks follow (tp_follow).
//
// What must hold:
//  - run to run: TP=N greedy decoding gives the same logits bits every time (fixed reduction
//    order, communicator.h);
//  - TP=N vs TP=1: the same greedy tokens, and every logit within TOL * max|logit| of TP=1's. The
//    two differ only in where partial sums are rounded (each rank's row-parallel partial sum is
//    rounded before the rank-order sum). Tokens may differ only where TP=1's top-2 margin is below
//    that tolerance; the test reports such a position and stops comparing there;
//  - batch invariance, state copies (kept states), MTP drafting (verify + rollback) all work
//    under TP exactly as they do in one process.
//
// Determinism broken on purpose (once, not kept): with all_reduce_sum replaced by a sum in
// arrival order (each rank adds the others' addends to its own as MPI_Recv(MPI_ANY_SOURCE) hands
// them over), this test failed at -np 4 in 3 runs of 3: RunToRunBitwise failed, and
// MatchesOneProcessWithinTolerance saw tokens differ where TP=1's top-2 margin was up to 0.94,
// since the ranks then hold different bits of the residual stream and drift apart. At -np 2 it
// passed 3 of 3: with two addends each rank computes mine + other, and a + b == b + a exactly.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/mpi_comm.h"
#include "model/model.h"
#include "model/mtp.h"

namespace tf {
namespace {

std::string g_dir;
double g_tol = 1e-3;
const Model* g_tp = nullptr;   // TP=N (leads the followers)
const Model* g_one = nullptr;  // TP=1, this process only
ThreadPool* g_pool = nullptr;

// Prompts over the vocabulary: short, one decode-sized, one that crosses a 64-token chunk.
std::vector<std::vector<int32_t>> prompts(int64_t V) {
  std::vector<std::vector<int32_t>> ps = {
      {1, 2, 3}, {7}, {42, 17, 99, 5, static_cast<int32_t>(300 % V), 11}};
  std::vector<int32_t> long_p;
  for (int i = 0; i < 80; ++i) long_p.push_back(static_cast<int32_t>((i * 37 + 5) % V));
  ps.push_back(long_p);
  return ps;
}

// Greedy decoding of `n` tokens after the prompt; every logits row fed (prompt's last, then each
// decode row) appended to *rows. If `force` is given, those tokens are fed instead of the argmax.
std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& prompt, int n,
                            std::vector<float>* rows, const std::vector<int32_t>* force = nullptr) {
  const int64_t V = m.config().vocab_size;
  SequenceState s = m.new_state();
  std::vector<float> lg;
  m.forward(std::vector<StepInput>{{.state = &s, .tokens = prompt, .form = DeltaForm::kChunked}},
            &lg, g_pool);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    rows->insert(rows->end(), lg.end() - V, lg.end());
    const int32_t t = argmax_row(std::span<const float>(lg).last(V));
    out.push_back(t);
    const int32_t feed = force != nullptr ? (*force)[i] : t;
    lg.clear();
    m.forward(std::vector<StepInput>{{.state = &s, .tokens = std::span(&feed, 1)}}, &lg, g_pool);
  }
  return out;
}

TEST(TensorParallel, RunToRunBitwise) {
  for (const auto& p : prompts(g_tp->config().vocab_size)) {
    std::vector<float> a, b;
    const auto ta = greedy(*g_tp, p, 16, &a);
    const auto tb = greedy(*g_tp, p, 16, &b);
    EXPECT_EQ(ta, tb);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
}

TEST(TensorParallel, MatchesOneProcessWithinTolerance) {
  const int64_t V = g_tp->config().vocab_size;
  double worst = 0;
  for (const auto& p : prompts(V)) {
    std::vector<float> one, tp;
    const auto t1 = greedy(*g_one, p, 24, &one);
    // Teacher-forced on TP=1's tokens, so that every row lines up even past a divergence.
    const auto tn = greedy(*g_tp, p, 24, &tp, &t1);
    ASSERT_EQ(one.size(), tp.size());
    for (size_t r = 0; r < t1.size(); ++r) {
      const float* a = &one[r * V];
      const float* b = &tp[r * V];
      float scale = 0, diff = 0;
      for (int64_t v = 0; v < V; ++v) {
        scale = std::max(scale, std::fabs(a[v]));
        diff = std::max(diff, std::fabs(a[v] - b[v]));
      }
      worst = std::max(worst, double(diff) / scale);
      EXPECT_LE(diff, g_tol * scale) << "row " << r;
      if (tn[r] != t1[r]) {
        // Allowed only where TP=1 itself hesitates: its top-2 margin below the tolerance.
        std::vector<float> s(a, a + V);
        std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<>());
        EXPECT_LT(s[0] - s[1], 2 * g_tol * scale) << "token " << r << " differs with margin";
        std::printf("note: token %zu differs (%d vs %d), TP=1 top-2 margin %g\n", r, tn[r], t1[r],
                    double(s[0] - s[1]));
        break;
      }
    }
  }
  std::printf("TP=%d vs TP=1: max |logit diff| / max |logit| = %.3g (tolerance %.3g)\n",
              g_tp->tp_layout().shard.size, worst, g_tol);
}

TEST(TensorParallel, BatchedRowsEqualAlone) {
  const int64_t V = g_tp->config().vocab_size;
  const auto ps = prompts(V);
  // Alone: each prompt in its own step.
  std::vector<float> alone;
  for (const auto& p : ps) {
    SequenceState s = g_tp->new_state();
    g_tp->forward(std::vector<StepInput>{{.state = &s, .tokens = p, .form = DeltaForm::kChunked}},
                  &alone, g_pool);
  }
  // Together: one step.
  std::vector<SequenceState> ss;
  for (size_t i = 0; i < ps.size(); ++i) ss.push_back(g_tp->new_state());
  std::vector<StepInput> in;
  for (size_t i = 0; i < ps.size(); ++i)
    in.push_back({.state = &ss[i], .tokens = ps[i], .form = DeltaForm::kChunked});
  std::vector<float> batch;
  g_tp->forward(in, &batch, g_pool);
  ASSERT_EQ(alone.size(), batch.size());
  EXPECT_EQ(std::memcmp(alone.data(), batch.data(), alone.size() * sizeof(float)), 0);
}

// A copy of a state (what the kept-state pool stores and resumes from) continues exactly as the
// original; the followers mirror the copy, the overwrite and the frees.
TEST(TensorParallel, StateCopiesContinueBitwise) {
  const auto p = prompts(g_tp->config().vocab_size)[3];
  SequenceState a = g_tp->new_state();
  std::vector<float> lg;
  g_tp->forward(
      std::vector<StepInput>{
          {.state = &a, .tokens = std::span(p).first(64), .form = DeltaForm::kChunked}},
      &lg, g_pool);
  SequenceState b = a;  // snapshot
  SequenceState c = g_tp->new_state();
  c = b;  // overwrite in place
  const auto rest = std::span(p).subspan(64);
  std::vector<float> la, lc;
  g_tp->forward(std::vector<StepInput>{{.state = &a, .tokens = rest, .form = DeltaForm::kChunked}},
                &la, g_pool);
  g_tp->forward(std::vector<StepInput>{{.state = &c, .tokens = rest, .form = DeltaForm::kChunked}},
                &lc, g_pool);
  ASSERT_EQ(la.size(), lc.size());
  EXPECT_EQ(std::memcmp(la.data(), lc.data(), la.size() * sizeof(float)), 0);
}

// MTP drafting (draft, verify step, rollback) under TP gives the plain greedy tokens.
TEST(TensorParallel, DraftingEqualsPlainDecoding) {
  if (!g_tp->has_mtp()) GTEST_SKIP() << "no MTP head";
  const int64_t V = g_tp->config().vocab_size;
  for (const auto& p : prompts(V)) {
    std::vector<int32_t> out[2];
    for (int k : {0, 3}) {
      SequenceState s = g_tp->new_state(nullptr, /*mtp=*/true);
      std::vector<float> lg;
      g_tp->forward(std::vector<StepInput>{{.state = &s, .tokens = p, .form = DeltaForm::kChunked}},
                    &lg, g_pool);
      GreedyOptions o;
      o.max_tokens = 20;
      o.draft_max = k;
      o.adaptive = false;
      out[k > 0] =
          greedy_decode(*g_tp, &s, argmax_row(std::span<const float>(lg).last(V)), o, g_pool);
    }
    EXPECT_EQ(out[0], out[1]);
  }
}

}  // namespace
}  // namespace tf

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: mpirun -np N tp_model_test MODEL_DIR TOLERANCE\n");
    return 2;
  }
  tf::g_dir = argv[1];
  tf::g_tol = std::atof(argv[2]);
  auto comm = tf::make_mpi_communicator();
  if (!comm) {
    std::fprintf(stderr, "%s\n", comm.status().to_string().c_str());
    return 2;
  }
  const int rank = (*comm)->rank();
  tf::tp_install(std::move(*comm));
  tf::tp_start_watchdog();
  int rc = 0;
  if (rank != 0) {
    rc = tf::tp_follow(tf::g_dir, 1);
  } else {
    auto tp = tf::Model::load(tf::g_dir);
    auto one = tf::Model::load(tf::g_dir, {}, nullptr);
    if (!tp || !one) {
      std::fprintf(stderr, "cannot load %s\n", tf::g_dir.c_str());
      rc = 2;
    } else {
      tf::ThreadPool pool(1);
      tf::g_pool = &pool;
      tf::g_tp = tp->get();
      tf::g_one = one->get();
      rc = RUN_ALL_TESTS();
    }
    // tp's destructor (end of this scope) tells the followers to stop.
  }
  if (rank == 0) tf::tp_stop_followers();
  tf::tp_uninstall();
  return rc;
}
