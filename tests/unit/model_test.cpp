#include <cstring>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "model/model.h"
#include "unit/test_util.h"

namespace tf {
namespace {

using testing::rel_l2;

// The small bf16 model, its products with fp32 inputs (false) or bf16 inputs (true:
// LoadOptions::bf16_products): the contract below holds for both.
class ModelTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    testing::write_small_checkpoint(dir_.path("m"));
    auto m = Model::load(dir_.path("m"), {}, LoadOptions{.bf16_products = GetParam()});
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = std::move(*m);
  }
  std::vector<int32_t> tokens(int n, int seed) const {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = (i * 37 + seed * 11 + 5) % model_->config().vocab_size;
    return t;
  }
  // All logits rows of `toks` fed in pieces of the given sizes.
  std::vector<float> run_pieces(const std::vector<int32_t>& toks, const std::vector<int>& pieces,
                                ThreadPool* pool) const {
    SequenceState st = model_->new_state();
    std::vector<float> logits;
    size_t at = 0;
    for (int n : pieces) {
      StepInput in{&st, std::span<const int32_t>(toks).subspan(at, n), true};
      model_->forward({&in, 1}, &logits, pool);
      at += n;
    }
    EXPECT_EQ(at, toks.size());
    return logits;
  }

  testing::TempDir dir_;
  std::unique_ptr<Model> model_;
};

// prefill(N) then decode one token at a time == prefill(N + k), row by row, up to rounding (the
// chunked and recurrent delta rules differ in rounding only).
TEST_P(ModelTest, PrefillThenDecodeMatchesLongerPrefill) {
  const auto toks = tokens(70, 1);
  const int64_t V = model_->config().vocab_size;
  const auto whole = run_pieces(toks, {70}, nullptr);
  const auto split = run_pieces(toks, {66, 1, 1, 1, 1}, nullptr);
  ASSERT_EQ(whole.size(), split.size());
  for (size_t r = 0; r < toks.size(); ++r) {
    EXPECT_LT(rel_l2(&split[r * V], &whole[r * V], V), 1e-5) << "row " << r;
  }
  // Pieces split at chunk multiples (64) are bit-identical to the whole prefill.
  const auto aligned = run_pieces(toks, {64, 6}, nullptr);
  EXPECT_EQ(0, std::memcmp(aligned.data(), whole.data(), whole.size() * sizeof(float)));
}

// A sequence's logits are bit-identical alone, beside other sequences in any order, and with any
// thread count. (Checked to fail by making the MoE accumulate in top-k order instead of expert
// order, which depends on the router's ranking only, so that alone passes; the thread count and
// batch neighbours changed nothing there. Instead it was checked by summing the MoE output of all
// rows of an expert before scaling: the batched rows then differ.)
TEST_P(ModelTest, BatchAndThreadInvariant) {
  const int64_t V = model_->config().vocab_size;
  const auto a = tokens(30, 2), b = tokens(5, 3), c = tokens(1, 4);
  auto alone = [&](const std::vector<int32_t>& t) {
    return run_pieces(t, {int(t.size())}, nullptr);
  };
  const auto ra = alone(a), rb = alone(b), rc = alone(c);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    SequenceState sa = model_->new_state(), sb = model_->new_state(), sc = model_->new_state();
    const StepInput in[] = {{&sc, c, true}, {&sa, a, true}, {&sb, b, true}};
    std::vector<float> logits;
    model_->forward(in, &logits, &pool);
    ASSERT_EQ(logits.size(), (a.size() + b.size() + c.size()) * V);
    EXPECT_EQ(0, std::memcmp(&logits[0], rc.data(), rc.size() * 4)) << threads;
    EXPECT_EQ(0, std::memcmp(&logits[c.size() * V], ra.data(), ra.size() * 4)) << threads;
    EXPECT_EQ(0, std::memcmp(&logits[(c.size() + a.size()) * V], rb.data(), rb.size() * 4))
        << threads;
    // Then one decode row each, batched, equals decoding each alone.
    const int32_t next[] = {7, 8, 9};
    std::vector<float> batched;
    const StepInput dec[] = {
        {&sc, {&next[0], 1}, false}, {&sa, {&next[1], 1}, false}, {&sb, {&next[2], 1}, false}};
    model_->forward(dec, &batched, &pool);
    SequenceState sa2 = model_->new_state();
    std::vector<float> tmp;
    StepInput pa{&sa2, a, false};
    model_->forward({&pa, 1}, &tmp, nullptr);
    tmp.clear();
    StepInput da{&sa2, {&next[1], 1}, false};
    model_->forward({&da, 1}, &tmp, nullptr);
    EXPECT_EQ(0, std::memcmp(&batched[V], tmp.data(), V * 4)) << threads;
  }
}

// A snapshot (a copy of the state) resumes exactly where the original would have continued.
TEST_P(ModelTest, SnapshotResumesBitExact) {
  const auto toks = tokens(20, 5);
  SequenceState st = model_->new_state();
  std::vector<float> logits;
  StepInput in{&st, std::span<const int32_t>(toks).first(12), false};
  model_->forward({&in, 1}, &logits, nullptr);
  SequenceState snap = st;
  std::vector<float> l1, l2;
  StepInput a{&st, std::span<const int32_t>(toks).subspan(12), true};
  StepInput b{&snap, std::span<const int32_t>(toks).subspan(12), true};
  model_->forward({&a, 1}, &l1, nullptr);
  model_->forward({&b, 1}, &l2, nullptr);
  EXPECT_EQ(0, std::memcmp(l1.data(), l2.data(), l1.size() * 4));
}

// A small checkpoint with packed experts, an MTP head and f16 weights.
RandomCheckpointOptions packed_mtp_f16() {
  RandomCheckpointOptions o;
  o.packed_experts = true;
  o.mtp = true;
  o.dtype = DType::kF16;
  return o;
}

INSTANTIATE_TEST_SUITE_P(Products, ModelTest, ::testing::Values(false, true), [](const auto& info) {
  return info.param ? "bf16_inputs" : "f32_inputs";
});

TEST(ModelLoad, PackedExpertsAndMtpLoad) {
  testing::TempDir dir;
  testing::write_small_checkpoint(dir.path("p"), packed_mtp_f16());
  auto m = Model::load(dir.path("p"));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_NE((*m)->weights().mtp, nullptr);
  EXPECT_EQ((*m)->weights().layers[0].experts.size(), 4u);
  SequenceState st = (*m)->new_state();
  const int32_t toks[] = {1, 2, 3};
  std::vector<float> logits;
  StepInput in{&st, toks, false};
  (*m)->forward({&in, 1}, &logits, nullptr);
  ASSERT_EQ(logits.size(), 96u);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

// Every logits row of `toks` fed to a fresh state of `m` as one prompt.
std::vector<float> prompt_logits(const Model& m, std::span<const int32_t> toks) {
  SequenceState st = m.new_state();
  StepInput in{&st, toks, true};
  std::vector<float> logits;
  m.forward({&in, 1}, &logits, nullptr);
  return logits;
}

// Every matrix of `w` (with the mats of the MTP layer), in a fixed order.
std::vector<Mat> all_mats(const Weights& w) {
  std::vector<Mat> out{w.embed, w.lm_head};
  auto ffn = [&](const FfnWeights& f) { out.insert(out.end(), {f.gate, f.up, f.down}); };
  auto layer = [&](const LayerWeights& L) {
    out.insert(out.end(),
               {L.q_proj, L.k_proj, L.v_proj, L.o_proj, L.in_qkvz, L.in_ba, L.out_proj, L.router});
    for (const FfnWeights& e : L.experts) ffn(e);
    ffn(L.shared);
    ffn(L.mlp);
  };
  for (const LayerWeights& L : w.layers) layer(L);
  if (w.mtp) {
    out.push_back(w.mtp->fc);
    layer(w.mtp->layer);
  }
  return out;
}

// LoadOptions::copy: every matrix is a copy, byte for byte what the mapping holds, for the whole
// model and for each rank's share under TP (the one-range, several-range, column and packed-expert
// paths); Model::load then drops the mapping, so the residency set holds the copies only, and the
// logits are the same bits. Checked to fail with the copy flag ignored by Loader::mat (the
// pointers stay inside the mapping).
TEST(ModelLoad, CopiedWeightsEqualTheMappedOnes) {
  testing::TempDir dir;
  for (const auto& [name, opts] :
       {std::pair{"s", RandomCheckpointOptions{}}, {"p", packed_mtp_f16()}}) {
    testing::write_small_checkpoint(dir.path(name), opts);
    auto ckpt = Checkpoint::open(dir.path(name));
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    const auto* map = static_cast<const char*>((*ckpt)->files()[0]->mapping());
    const size_t map_size = (*ckpt)->files()[0]->mapping_size();
    for (int ranks : {1, 2}) {
      for (int rank = 0; rank < ranks; ++rank) {
        auto layout = make_tp_layout((*ckpt)->config(), Shard{rank, ranks});
        ASSERT_TRUE(layout.is_ok()) << layout.status().to_string();
        auto mapped = load_weights(**ckpt, {}, &*layout);
        auto copied = load_weights(**ckpt, {}, &*layout, LoadOptions{.copy = true});
        ASSERT_TRUE(mapped.is_ok() && copied.is_ok());
        const std::vector<Mat> a = all_mats(**mapped), b = all_mats(**copied);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) {
          SCOPED_TRACE(::testing::Message()
                       << name << " rank " << rank << "/" << ranks << " mat " << i);
          ASSERT_EQ(a[i].rows, b[i].rows);
          ASSERT_EQ(a[i].cols, b[i].cols);
          ASSERT_EQ(a[i].dtype, b[i].dtype);
          const size_t bytes = a[i].rows * a[i].cols * dtype_size(a[i].dtype);
          if (bytes == 0) continue;
          const auto* p = static_cast<const char*>(b[i].data);
          EXPECT_TRUE(p + bytes <= map || p >= map + map_size) << "a view of the mapping";
          EXPECT_EQ(0, std::memcmp(a[i].data, b[i].data, bytes));
        }
        EXPECT_EQ((*copied)->bytes_mapped, 0u);
      }
    }
    auto m = Model::load(dir.path(name));
    auto c = Model::load(dir.path(name), {}, LoadOptions{.copy = true});
    ASSERT_TRUE(m.is_ok() && c.is_ok());
    for (const residency::Range& r : (*c)->residency_ranges())
      EXPECT_NE(std::string(r.what), "weights") << "the mapping is still held";
    const int32_t toks[] = {1, 2, 3, 4, 5};
    const std::vector<float> la = prompt_logits(**m, toks), lb = prompt_logits(**c, toks);
    ASSERT_EQ(la.size(), lb.size());
    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
  }
}

// LoadOptions::bf16_products marks every bf16 matrix (this test's own list of them, the MTP
// layer's included) and no other, for the whole model and each rank's share; the logits then move
// by bf16 input rounding, not more; the CUDA backend refuses such a model. Checked to fail with
// the MTP layer left out of Weights::for_each_mat.
TEST(ModelLoad, Bf16ProductsReachEveryBf16Matrix) {
  testing::TempDir dir;
  RandomCheckpointOptions o;
  o.mtp = true;
  testing::write_small_checkpoint(dir.path("m"), o);
  auto ckpt = Checkpoint::open(dir.path("m"));
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  for (int ranks : {1, 2}) {
    for (int rank = 0; rank < ranks; ++rank) {
      auto layout = make_tp_layout((*ckpt)->config(), Shard{rank, ranks});
      ASSERT_TRUE(layout.is_ok());
      auto w = load_weights(**ckpt, {}, &*layout, LoadOptions{.bf16_products = true});
      ASSERT_TRUE(w.is_ok());
      const std::vector<Mat> mats = all_mats(**w);
      for (size_t i = 0; i < mats.size(); ++i) {
        if (mats[i].rows * mats[i].cols == 0) continue;
        EXPECT_EQ(mats[i].bf16_inputs, mats[i].dtype == DType::kBF16) << "mat " << i;
      }
      EXPECT_TRUE((*w)->mtp != nullptr);
    }
  }
  auto f32 = Model::load(dir.path("m"));
  auto bf16 = Model::load(dir.path("m"), {}, LoadOptions{.bf16_products = true});
  ASSERT_TRUE(f32.is_ok() && bf16.is_ok());
  const int32_t toks[] = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> la = prompt_logits(**f32, toks), lb = prompt_logits(**bf16, toks);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_NE(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
  EXPECT_LT(rel_l2(lb.data(), la.data(), la.size()), 0.05);
  const Status s = (*bf16)->use_cuda();
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
}

}  // namespace
}  // namespace tf
