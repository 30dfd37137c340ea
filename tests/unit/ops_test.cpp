#include <cstring>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "backends/cpu/matmul.h"
#include "backends/cpu/ops.h"
#include "unit/test_util.h"

namespace tf {
namespace {

using testing::random_vector;
using testing::rel_l2;

struct DeltaCase {
  int64_t T, Hk, Hv, Dk, Dv;
  std::vector<float> q, k, v, g, beta, S0;
};

DeltaCase make_delta_case(int64_t T, uint32_t seed) {
  DeltaCase c{T, 2, 4, 16, 8, {}, {}, {}, {}, {}, {}};
  c.q = random_vector(T * c.Hk * c.Dk, seed);
  c.k = random_vector(T * c.Hk * c.Dk, seed + 1);
  cpu::l2norm_scale(c.q.data(), T * c.Hk, c.Dk, 1e-6f, 0.25f);
  cpu::l2norm_scale(c.k.data(), T * c.Hk, c.Dk, 1e-6f, 1.0f);
  c.v = random_vector(T * c.Hv * c.Dv, seed + 2);
  c.g = random_vector(T * c.Hv, seed + 3, 0.3f);
  c.beta = random_vector(T * c.Hv, seed + 4);
  for (auto& x : c.g) x = -std::abs(x);
  for (auto& x : c.beta) x = cpu::sigmoid(x);
  c.S0 = random_vector(c.Hv * c.Dk * c.Dv, seed + 5, 0.5f);
  return c;
}

cpu::DeltaArgs args(DeltaCase& c, int64_t t0, int64_t T, float* S, float* out) {
  return {c.q.data() + t0 * c.Hk * c.Dk,
          c.k.data() + t0 * c.Hk * c.Dk,
          c.v.data() + t0 * c.Hv * c.Dv,
          c.g.data() + t0 * c.Hv,
          c.beta.data() + t0 * c.Hv,
          T,
          c.Hk,
          c.Hv,
          c.Dk,
          c.Dv,
          S,
          out};
}

// The chunked form (prompts) equals the token recurrence (decode) up to rounding, with a non-zero
// initial state, a ragged last chunk and a start that is not chunk-aligned.
// cpu::argmax is the plain scan's result (lowest index of the largest value, NaN never chosen, 0
// when x[0] is NaN) on rows of every length around the 16 lanes and vocabulary sizes, with values
// drawn from a few levels so that the maximum repeats, and with NaN, +-inf and -0.0 among them.
// (Checked to fail with the lanes joined by value alone, ties to the higher index, and with >= in
// the lanes.)
TEST(Ops, ArgmaxEqualsTheScan) {
  auto scan = [](const std::vector<float>& x) {
    int64_t best = 0;
    for (size_t i = 1; i < x.size(); ++i)
      if (x[i] > x[best]) best = static_cast<int64_t>(i);
    return best;
  };
  std::mt19937 rng(7);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.0f, 0.0f};
  int checked = 0;
  for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 100, 6144, 151936}) {
    for (int rep = 0; rep < 40; ++rep) {
      std::vector<float> x(n);
      const int levels = 1 + rep % 5;  // few distinct values: the maximum repeats
      for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % levels)) - 2.0f;
      if (rep % 4 == 1) x[rng() % n] = specials[rng() % 5];
      if (rep % 4 == 2)
        for (int k = 0; k < 3; ++k) x[rng() % n] = specials[rng() % 5];
      if (rep % 8 == 3) x[0] = specials[0];
      ASSERT_EQ(cpu::argmax(x.data(), n), scan(x)) << "n " << n << " rep " << rep;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 11 * 40);
}

TEST(DeltaRule, ChunkedMatchesRecurrent) {
  for (int64_t T : {1, 7, 64, 65, 150}) {
    DeltaCase c = make_delta_case(T, 11 + T);
    std::vector<float> S1 = c.S0, S2 = c.S0, o1(T * c.Hv * c.Dv), o2(o1.size());
    cpu::delta_rule_recurrent(args(c, 0, T, S1.data(), o1.data()), nullptr);
    cpu::delta_rule_chunked(args(c, 0, T, S2.data(), o2.data()), /*pos0=*/10, 64, nullptr);
    EXPECT_LT(rel_l2(o2.data(), o1.data(), o1.size()), 1e-5) << "T=" << T;
    EXPECT_LT(rel_l2(S2.data(), S1.data(), S1.size()), 1e-5) << "T=" << T;
  }
}

// Feeding a prompt in pieces split at multiples of the chunk size is bit-identical to one call:
// chunk boundaries are absolute. (Checked to fail when boundaries are relative to the call:
// pos0 ignored -> the second piece's chunks shift and the bits differ.)
TEST(DeltaRule, ChunkBoundariesAreAbsolute) {
  const int64_t T = 200;
  DeltaCase c = make_delta_case(T, 3);
  ThreadPool pool(3);
  std::vector<float> S1 = c.S0, S2 = c.S0, o1(T * c.Hv * c.Dv), o2(o1.size());
  cpu::delta_rule_chunked(args(c, 0, T, S1.data(), o1.data()), 0, 64, &pool);
  const int64_t split[] = {0, 64, 100, 128, 200};  // 100 is mid-chunk: [64,100) + [100,128) differ
  for (int i = 0; i + 1 < 5; ++i) {
    const int64_t a = split[i], n = split[i + 1] - a;
    cpu::delta_rule_chunked(args(c, a, n, S2.data(), o2.data() + a * c.Hv * c.Dv), a, 64, nullptr);
  }
  // Rows before 64 and from 128 on must match bitwise only if the pieces align with chunks; the
  // [64,128) chunk was cut at 100, so compare the aligned prefix exactly and the rest loosely.
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), 64 * c.Hv * c.Dv * sizeof(float)));
  EXPECT_LT(rel_l2(o2.data(), o1.data(), o1.size()), 1e-5);
  std::vector<float> S3 = c.S0, o3(o1.size());
  for (int64_t a : {0, 64, 128}) {
    const int64_t n = std::min<int64_t>(64, T - a);
    cpu::delta_rule_chunked(args(c, a, n, S3.data(), o3.data() + a * c.Hv * c.Dv), a, 64, nullptr);
  }
  cpu::delta_rule_chunked(args(c, 192, 8, S3.data(), o3.data() + 192 * c.Hv * c.Dv), 192, 64,
                          nullptr);
  EXPECT_EQ(0, std::memcmp(o1.data(), o3.data(), o1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(S1.data(), S3.data(), S1.size() * sizeof(float)));
}

// Every element of a product is computed the same way whatever the batch size, the row's place in
// it, or the threads: bit-identical. (Checked to fail by giving the 4-token tile a different
// accumulation order.)
TEST(Matmul, BatchAndThreadInvariant) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t rows = 37, cols = 75, n = 11;
    const auto wf = random_vector(rows * cols, 5);
    std::vector<uint16_t> w16(rows * cols);
    for (size_t i = 0; i < w16.size(); ++i) {
      w16[i] = dt == DType::kBF16 ? f32_to_bf16(wf[i])
                                  : std::bit_cast<uint16_t>(static_cast<_Float16>(wf[i]));
    }
    const cpu::Mat w{dt, dt == DType::kF32 ? static_cast<const void*>(wf.data()) : w16.data(), rows,
                     cols};
    const auto x = random_vector(n * cols, 6);
    std::vector<float> batched(n * rows), threaded(n * rows);
    cpu::matmul(w, x.data(), n, batched.data(), nullptr);
    ThreadPool pool(3);
    cpu::matmul(w, x.data(), n, threaded.data(), &pool);
    EXPECT_EQ(0, std::memcmp(batched.data(), threaded.data(), batched.size() * sizeof(float)));
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> alone(rows);
      cpu::matmul(w, x.data() + t * cols, 1, alone.data(), nullptr);
      EXPECT_EQ(0, std::memcmp(alone.data(), &batched[t * rows], rows * sizeof(float)))
          << "token " << t;
      // And it is the right number.
      for (int64_t r = 0; r < rows; ++r) {
        double ref = 0;
        std::vector<float> wr(cols);
        cpu::row_to_f32(w, r, wr.data());
        for (int64_t k = 0; k < cols; ++k) ref += double(wr[k]) * x[t * cols + k];
        EXPECT_NEAR(alone[r], ref, 1e-4 * (1 + std::abs(ref)));
      }
    }
  }
}

TEST(Attention, SingleKeyReturnsItsValue) {
  // One key: softmax weight 1, the output is the value row of the query's kv head.
  const int64_t nh = 4, nkv = 2, D = 8;
  const auto q = random_vector(nh * D, 1), k = random_vector(nkv * D, 2),
             v = random_vector(nkv * D, 3);
  std::vector<float> o(nh * D);
  const int64_t pos = 0;
  cpu::attention(q.data(), 1, &pos, k.data(), v.data(), nh, nkv, D, 0.3f, o.data(), nullptr);
  for (int64_t h = 0; h < nh; ++h)
    for (int64_t d = 0; d < D; ++d) EXPECT_FLOAT_EQ(o[h * D + d], v[(h / 2) * D + d]);
}

}  // namespace
}  // namespace tf
