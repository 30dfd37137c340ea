// The CUDA forward pass against the CPU one (itself golden-tested against transformers) on the
// golden checkpoints and models/tiny-next: logits within a relative L2 of 1e-4 on prompts of 1-160
// tokens, the same greedy tokens, and batch invariance on CUDA (a sequence's logits are the same
// bits alone or beside others). Skips without a CUDA device. Checkpoints are found under $TF_REPO
// (default: the source tree this was built from).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "io/config.h"
#include "model/cuda_model.h"
#include "model/model.h"

namespace tf {
namespace {

std::string repo() {
  const char* r = std::getenv("TF_REPO");
  return r ? r : TF_SOURCE_DIR;
}

double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

int32_t argmax(const float* p, int64_t n) {
  return static_cast<int32_t>(std::max_element(p, p + n) - p);
}

class CudaModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    auto m = Model::load(repo() + "/" + GetParam());
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    cpu_ = std::move(*m);
    auto g = CudaModel::create(*cpu_);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    gpu_ = std::move(*g);
  }
  std::vector<int32_t> prompt(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> d(0,
                                             static_cast<int32_t>(cpu_->config().vocab_size) - 1);
    std::vector<int32_t> p(n);
    for (auto& t : p) t = d(rng);
    return p;
  }
  std::unique_ptr<Model> cpu_;
  std::unique_ptr<CudaModel> gpu_;
};

// Every prompt position's logits, then 16 greedy tokens, CPU vs CUDA.
TEST_P(CudaModelTest, LogitsAndGreedyTokensMatchCpu) {
  const int64_t V = cpu_->config().vocab_size;
  for (int len : {1, 7, 65, 160}) {
    const auto p = prompt(len, static_cast<uint32_t>(len));
    SequenceState cs = cpu_->new_state();
    CudaSequenceState gs = gpu_->new_state();
    std::vector<float> cl, gl;
    const StepInput ci{&cs, p, true};
    const CudaStepInput gi{&gs, p, true};
    cpu_->forward(std::span(&ci, 1), &cl, nullptr);
    gpu_->forward(std::span(&gi, 1), &gl);
    ASSERT_EQ(cl.size(), gl.size());
    for (int t = 0; t < len; ++t)
      ASSERT_LT(rel_l2(&gl[t * V], &cl[t * V], V), 1e-4)
          << GetParam() << " len " << len << " pos " << t;
    int32_t ct = argmax(&cl[(len - 1) * V], V), gt = argmax(&gl[(len - 1) * V], V);
    for (int step = 0; step < 16; ++step) {
      ASSERT_EQ(gt, ct) << GetParam() << " len " << len << " step " << step;
      cl.clear(), gl.clear();
      const int32_t tok = ct;
      const StepInput cd{&cs, std::span(&tok, 1), false};
      const CudaStepInput gd{&gs, std::span(&tok, 1), false};
      cpu_->forward(std::span(&cd, 1), &cl, nullptr);
      gpu_->forward(std::span(&gd, 1), &gl);
      ASSERT_LT(rel_l2(gl.data(), cl.data(), V), 1e-4) << GetParam() << " decode step " << step;
      ct = argmax(cl.data(), V), gt = argmax(gl.data(), V);
    }
  }
}

// Three sequences in one CUDA step give the same bits as each alone.
TEST_P(CudaModelTest, BatchInvariant) {
  const int64_t V = cpu_->config().vocab_size;
  const std::vector<std::vector<int32_t>> ps = {prompt(5, 1), prompt(70, 2), prompt(1, 3)};
  std::vector<CudaSequenceState> together;
  for (size_t i = 0; i < ps.size(); ++i) together.push_back(gpu_->new_state());
  std::vector<CudaStepInput> in;
  for (size_t i = 0; i < ps.size(); ++i) in.push_back({&together[i], ps[i], false});
  std::vector<float> all;
  gpu_->forward(in, &all);
  for (size_t i = 0; i < ps.size(); ++i) {
    CudaSequenceState s = gpu_->new_state();
    std::vector<float> one;
    const CudaStepInput x{&s, ps[i], false};
    gpu_->forward(std::span(&x, 1), &one);
    EXPECT_EQ(std::memcmp(one.data(), all.data() + i * V, V * sizeof(float)), 0)
        << "sequence " << i;
  }
}

// Decode through CUDA graphs: 3 sequences decoding together for 6 steps give the same bits as
// with launched kernels (graphs off) and as each sequence decoding alone (graph of one row); the
// greedy tokens from forward_greedy are the argmax of forward's logits.
TEST_P(CudaModelTest, GraphDecodeEqualsEagerAndAlone) {
  const int64_t V = cpu_->config().vocab_size;
  const std::vector<std::vector<int32_t>> ps = {prompt(4, 11), prompt(9, 12), prompt(1, 13)};
  const int B = static_cast<int>(ps.size());
  std::vector<CudaSequenceState> g(B), e(B), a(B);
  std::vector<int32_t> next(B);
  for (int i = 0; i < B; ++i) {
    g[i] = gpu_->new_state(), e[i] = gpu_->new_state(), a[i] = gpu_->new_state();
    std::vector<float> l;
    for (auto* st : {&g[i], &e[i], &a[i]}) {
      l.clear();
      const CudaStepInput x{st, ps[i], false};
      gpu_->forward(std::span(&x, 1), &l);
    }
    next[i] = argmax(l.data(), V);
  }
  for (int step = 0; step < 6; ++step) {
    std::vector<CudaStepInput> ig, ie;
    for (int i = 0; i < B; ++i) {
      ig.push_back({&g[i], std::span(&next[i], 1), false});
      ie.push_back({&e[i], std::span(&next[i], 1), false});
    }
    std::vector<float> lg, le;
    const int64_t captures = gpu_->graph_captures();
    gpu_->set_graphs(true);
    gpu_->forward(ig, &lg);
    // A shape's first use captures its graph; once every buffer has its size (after the first
    // round of both shapes here), the same shape replays it. The engine's drafting policy leaves
    // out the steps that captured (Model::graph_captures).
    if (step == 0) {
      EXPECT_GT(gpu_->graph_captures(), captures);
    } else if (step >= 2) {
      EXPECT_EQ(gpu_->graph_captures(), captures) << GetParam() << " step " << step;
    }
    gpu_->set_graphs(false);
    gpu_->forward(ie, &le);
    gpu_->set_graphs(true);
    ASSERT_EQ(lg, le) << GetParam() << " step " << step;
    for (int i = 0; i < B; ++i) {
      std::vector<int32_t> tok;
      const CudaStepInput x{&a[i], std::span(&next[i], 1), false};
      gpu_->forward_greedy(std::span(&x, 1), &tok);
      ASSERT_EQ(tok.size(), 1u);
      EXPECT_EQ(tok[0], argmax(&lg[i * V], V)) << GetParam() << " step " << step << " seq " << i;
      next[i] = tok[0];
    }
  }
}

// Chained greedy steps (CudaModel::launch_greedy: the next step launched, its tokens read on the
// device, before the host takes this one's) give forward_greedy's tokens step by step and leave the
// same states, with and (where the model has one) without the MTP head kept: a chained step's
// head token waits for set_chained_token. The chained steps' inputs carry a wrong token (0), which
// they must not read: a build that did not copy the previous step's tokens into the table on the
// device failed here; one whose set_chained_token left the placeholder must fail the MTP half.
TEST_P(CudaModelTest, ChainedGreedyEqualsStepByStep) {
  const int64_t V = cpu_->config().vocab_size;
  const std::vector<std::vector<int32_t>> ps = {prompt(5, 21), prompt(12, 22), prompt(2, 23)};
  const int B = static_cast<int>(ps.size()), steps = 10;
  for (const bool mtp : {false, true}) {
    if (mtp && !gpu_->has_mtp()) continue;
    SCOPED_TRACE(mtp ? "MTP states" : "plain states");
    std::vector<CudaSequenceState> a(B), c(B);
    for (int i = 0; i < B; ++i) a[i] = gpu_->new_state(mtp), c[i] = gpu_->new_state(mtp);
    auto prompts = [&](std::vector<CudaSequenceState>& st) {
      std::vector<CudaStepInput> in;
      for (int i = 0; i < B; ++i) in.push_back({&st[i], ps[i], false});
      return in;
    };
    // Step by step: the host reads each step's tokens and feeds them to the next.
    std::vector<std::vector<int32_t>> want(B), got(B);
    std::vector<int32_t> t;
    gpu_->forward_greedy(prompts(a), &t);
    for (int s = 0; s <= steps; ++s) {
      ASSERT_EQ(t.size(), static_cast<size_t>(B));
      for (int i = 0; i < B; ++i) want[i].push_back(t[i]);
      if (s == steps) break;
      std::vector<CudaStepInput> in;
      for (int i = 0; i < B; ++i) in.push_back({&a[i], std::span(&want[i].back(), 1), false});
      t.clear();
      gpu_->forward_greedy(in, &t);
    }
    // Chained: the prompts' step, then `steps` chained steps, two in flight while the host takes
    // the older one's tokens (and hands them to the MTP states of the step launched after it).
    const int32_t wrong = 0;
    std::vector<CudaStepInput> chained;
    for (int i = 0; i < B; ++i) chained.push_back({&c[i], std::span(&wrong, 1), false});
    gpu_->launch_greedy(prompts(c));
    for (int s = 0; s <= steps; ++s) {
      if (s < steps) gpu_->launch_greedy(chained, /*chained=*/true);
      t.clear();
      gpu_->take_greedy(&t);
      ASSERT_EQ(t.size(), static_cast<size_t>(B));
      for (int i = 0; i < B; ++i) {
        got[i].push_back(t[i]);
        if (mtp && s < steps) gpu_->set_chained_token(&c[i], t[i]);
      }
    }
    EXPECT_EQ(got, want) << GetParam();
    for (int i = 0; i < B; ++i) {
      if (mtp) {  // the head's pending tokens, then its cache rows computed from them
        EXPECT_EQ(c[i].mtp_tokens, a[i].mtp_tokens) << GetParam() << " " << i;
        CudaSequenceState* both[] = {&a[i], &c[i]};
        gpu_->mtp_sync(both);
        const size_t n = static_cast<size_t>(a[i].mtp_rows) * cpu_->config().num_key_value_heads *
                         cpu_->config().head_dim;
        ASSERT_EQ(c[i].mtp_rows, a[i].mtp_rows);
        std::vector<float> ka(n), kc(n);
        ASSERT_EQ(cudaMemcpy(ka.data(), a[i].mtp.k.data(), n * sizeof(float), cudaMemcpyDefault),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpy(kc.data(), c[i].mtp.k.data(), n * sizeof(float), cudaMemcpyDefault),
                  cudaSuccess);
        EXPECT_EQ(std::memcmp(ka.data(), kc.data(), n * sizeof(float)), 0)
            << GetParam() << " " << i;
      }
      // The same states: one more step from each gives the same logits, bit for bit.
      std::vector<float> la, lc;
      const CudaStepInput xa{&a[i], std::span(&want[i].back(), 1), false};
      const CudaStepInput xc{&c[i], std::span(&want[i].back(), 1), false};
      gpu_->forward(std::span(&xa, 1), &la);
      gpu_->forward(std::span(&xc, 1), &lc);
      ASSERT_EQ(la.size(), static_cast<size_t>(V));
      EXPECT_EQ(std::memcmp(la.data(), lc.data(), V * sizeof(float)), 0) << GetParam() << " " << i;
    }
  }
}

// Dummy weights at the config's size (here models/tiny-next's config), generated on the device:
// finite logits, the weight bytes counted, and a decode row alone == in a batch of two.
TEST(CudaDummyModel, RunsAndIsBatchInvariant) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  auto c = load_model_config(repo() + "/models/tiny-next/config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto m = CudaModel::create_dummy(*c, 1);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  CudaModel& g = **m;
  const int64_t V = c->vocab_size;
  EXPECT_GT(g.weight_bytes().total, 2 * V * c->hidden_size * 2 - 1);
  EXPECT_EQ(g.weight_bytes().moe_layers, c->num_hidden_layers);
  std::vector<int32_t> p = {1, 2, 3, 4, 5, 6, 7};
  CudaSequenceState s1 = g.new_state(), s2 = g.new_state(), s3 = g.new_state();
  std::vector<float> l;
  for (auto* st : {&s1, &s2, &s3}) {
    l.clear();
    const CudaStepInput x{st, p, false};
    g.forward(std::span(&x, 1), &l);
  }
  for (float v : l) ASSERT_TRUE(std::isfinite(v));
  int32_t t1 = 9, t2 = 10;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> both, alone;
    const CudaStepInput in[2] = {{&s1, std::span(&t1, 1), false}, {&s2, std::span(&t2, 1), false}};
    g.forward(in, &both);
    const CudaStepInput x{&s3, std::span(&t1, 1), false};
    g.forward(std::span(&x, 1), &alone);
    ASSERT_EQ(std::memcmp(alone.data(), both.data(), V * sizeof(float)), 0) << step;
    t2 = argmax(both.data() + V, V);
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, CudaModelTest,
                         ::testing::Values("tests/golden/a_bf16_per_expert",
                                           "tests/golden/b_f32_packed_sharded",
                                           "tests/golden/c_f16_tied_mtp",
                                           "tests/golden/d_bf16_per_expert_sharded",
                                           "models/tiny-next"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace tf
