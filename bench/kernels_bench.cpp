// Micro-benchmarks of the CPU backend's kernels on bench-mid's shapes (Qwen3-Next-80B-A3B widths).
// Matrices larger than the caches are used round-robin so that decode numbers measure DRAM, as a
// real decode step does.
#include <sys/mman.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include <cstring>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "backends/cpu/matmul.h"
#include "backends/cpu/moe.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/parallel.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace tf {
namespace {

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

// `bytes` of random bf16 weights, optionally on transparent huge pages.
struct Buffer {
  uint16_t* data = nullptr;
  size_t bytes = 0;
  Buffer(size_t n_bf16, bool huge) : bytes(n_bf16 * 2) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);
    data = static_cast<uint16_t*>(p);
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 0.02f);
    for (size_t i = 0; i < n_bf16; i += 1024) {
      const uint16_t v = f32_to_bf16(d(rng));
      for (size_t j = i; j < std::min(n_bf16, i + 1024); ++j) data[j] = v ^ (j & 7);
    }
  }
  ~Buffer() { munmap(data, bytes); }
};

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Decode GEMV over a [rows, cols] bf16 matrix; copies cycle through ~1 GiB so every call streams
// from DRAM. Args: rows, cols, huge pages.
void BM_Gemv(benchmark::State& st) {
  const int64_t rows = st.range(0), cols = st.range(1);
  const int64_t mat = rows * cols;
  const int64_t copies = std::max<int64_t>(1, (int64_t{1} << 29) / mat);
  Buffer buf(mat * copies, st.range(2) != 0);
  const auto x = random_floats(cols, 2);
  std::vector<float> y(rows);
  int64_t i = 0;
  for (auto _ : st) {
    const cpu::Mat w{DType::kBF16, buf.data + (i++ % copies) * mat, rows, cols};
    cpu::matmul(w, x.data(), 1, y.data(), &pool());
    benchmark::DoNotOptimize(y.data());
  }
  st.SetBytesProcessed(st.iterations() * mat * 2);
}
BENCHMARK(BM_Gemv)
    ->Args({151936, 2048, 0})
    ->Args({151936, 2048, 1})
    ->Args({12288, 2048, 0})
    ->Args({2048, 4096, 0})
    ->Args({512, 2048, 0})
    ->UseRealTime();

// Prefill GEMM: n tokens through a [rows, cols] bf16 matrix. Reports FLOP/s as items/s. Arg 3:
// 1 = on the calling thread only (its CPU time is then meaningful on a busy machine). Arg 4: 1 =
// bf16 products (Mat::bf16_inputs, --matmul-precision bf16).
void BM_Gemm(benchmark::State& st) {
  const int64_t rows = st.range(0), cols = st.range(1), n = st.range(2);
  ThreadPool* p = st.range(3) != 0 ? nullptr : &pool();
  Buffer buf(rows * cols, false);
  const auto x = random_floats(n * cols, 3);
  std::vector<float> y(n * rows);
  const cpu::Mat w{DType::kBF16, buf.data, rows, cols, st.range(4) != 0};
  for (auto _ : st) {
    cpu::matmul(w, x.data(), n, y.data(), p);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(st.iterations() * 2 * rows * cols * n);
}
BENCHMARK(BM_Gemm)
    ->ArgsProduct({{12288}, {2048}, {128}, {0, 1}, {0, 1}})
    ->ArgsProduct({{2048}, {4096}, {128}, {0, 1}, {0, 1}})
    ->ArgsProduct({{512}, {2048}, {20}, {0, 1}, {0, 1}})
    ->ArgsProduct({{2048}, {512}, {20}, {0, 1}, {0, 1}})
    // tiny-next's lm_head on one thread, the weights in cache: a verify row of n tokens.
    ->ArgsProduct({{6144}, {320}, {1, 2, 4, 13}, {1}, {0}})
    ->UseRealTime();

// The fused MoE op with bench-mid's layer: 64 experts of [512, 2048], top 10, a shared expert.
// Two layers' copies alternate so that weights stream from DRAM. Args: rows (1 = decode), 1 = on
// the calling thread only, 1 = bf16 products. Bytes/s count one decode row's weights; FLOP/s
// (items/s) the products' multiply-adds over all rows.
void BM_Moe(benchmark::State& st) {
  const int64_t N = st.range(0), H = 2048, I = 512, E = 64, layers = 2;
  ThreadPool* p = st.range(1) != 0 ? nullptr : &pool();
  const bool bf16 = st.range(2) != 0;
  const int64_t per_expert = 3 * I * H, per_layer = (E + 1) * per_expert + E * H;
  Buffer buf(per_layer * layers, false);
  std::vector<std::vector<cpu::FfnMats>> experts(layers);
  std::vector<cpu::FfnMats> shared(layers);
  std::vector<cpu::MoeArgs> args(layers);
  const auto gate = random_floats(H, 4);
  for (int64_t l = 0; l < layers; ++l) {
    const uint16_t* base = buf.data + l * per_layer;
    auto ffn = [&](int64_t e) {
      const uint16_t* p = base + e * per_expert;
      return cpu::FfnMats{{DType::kBF16, p, I, H, bf16},
                          {DType::kBF16, p + I * H, I, H, bf16},
                          {DType::kBF16, p + 2 * I * H, H, I, bf16}};
    };
    for (int64_t e = 0; e < E; ++e) experts[l].push_back(ffn(e));
    shared[l] = ffn(E);
    args[l].router = cpu::Mat{DType::kBF16, base + (E + 1) * per_expert, E, H, bf16};
    args[l].experts = experts[l].data();
    args[l].top_k = 10;
    args[l].shared = &shared[l];
    args[l].shared_gate = gate.data();
  }
  const auto x = random_floats(N * H, 5);
  std::vector<float> y(N * H);
  int64_t i = 0;
  for (auto _ : st) {
    cpu::moe_ffn(args[i++ % layers], x.data(), N, y.data(), p);
    benchmark::DoNotOptimize(y.data());
  }
  // Bytes of one decode row: router + 10 experts + shared.
  st.SetBytesProcessed(st.iterations() * (E * H + 11 * per_expert) * 2);
  st.SetItemsProcessed(st.iterations() * N * (E * H + 11 * per_expert) * 2);
}
BENCHMARK(BM_Moe)
    ->Args({1, 0, 0})
    ->Args({4, 0, 0})
    ->Args({128, 0, 0})
    ->Args({128, 1, 0})
    ->Args({128, 0, 1})
    ->Args({128, 1, 1})
    ->UseRealTime();

// The core's arithmetic peak, the ceiling of the prefill products (docs/PERFORMANCE.md, "The
// CPU's arithmetic ceiling"): 12 independent accumulators (more than the instruction's latency
// times its issue rate) updated back to back from registers, no loads. Arg: 1 = VDPBF16PS (bf16
// products: 16 lanes x 2 multiply-adds), 0 = fp32 FMA (16 lanes x 1). FLOP/s as items/s, on the
// calling thread (run it twice at once to see both cores).
#if defined(__AVX512BF16__)
void BM_CorePeak(benchmark::State& st) {
  constexpr int kAcc = 12, kSteps = 1 << 16;
  const bool bf16 = st.range(0) != 0;
  __m512 acc[kAcc];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512 a = _mm512_set1_ps(1.0e-3f), b = _mm512_set1_ps(0.5f);
  __m512bh ah = _mm512_cvtne2ps_pbh(a, a), bh = _mm512_cvtne2ps_pbh(b, b);
  for (auto _ : st) {
    for (int n = 0; n < kSteps; ++n) {
      if (bf16) {
        for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], ah, bh);
        asm volatile("" : "+v"(ah));  // keeps the loop from being folded
      } else {
        for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
        asm volatile("" : "+v"(a));
      }
    }
    benchmark::DoNotOptimize(acc);
  }
  st.SetItemsProcessed(st.iterations() * int64_t{kSteps} * kAcc * 16 * (bf16 ? 4 : 2));
}
BENCHMARK(BM_CorePeak)->Arg(1)->Arg(0);
#endif

// Gated delta rule of one GDN layer (32 heads of 128 x 128). Args: tokens (1 = decode step,
// else a chunked prefill), 1 = on the calling thread only.
void BM_DeltaRule(benchmark::State& st) {
  const int64_t T = st.range(0), Hk = 16, Hv = 32, D = 128;
  ThreadPool* p = st.range(1) != 0 ? nullptr : &pool();
  auto q = random_floats(T * Hk * D, 1), k = random_floats(T * Hk * D, 2);
  cpu::l2norm_scale(q.data(), T * Hk, D, 1e-6f, 0.088f);
  cpu::l2norm_scale(k.data(), T * Hk, D, 1e-6f, 1.0f);
  const auto v = random_floats(T * Hv * D, 3);
  std::vector<float> g(T * Hv, -0.1f), beta(T * Hv, 0.5f), S(Hv * D * D, 0.01f), out(T * Hv * D);
  const cpu::DeltaArgs a{q.data(), k.data(), v.data(), g.data(), beta.data(), T,
                         Hk,       Hv,       D,        D,        S.data(),    out.data()};
  for (auto _ : st) {
    if (T == 1)
      cpu::delta_rule_recurrent(a, p);
    else
      cpu::delta_rule_chunked(a, 0, 64, p);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(st.iterations() * T);
}
BENCHMARK(BM_DeltaRule)->Args({1, 0})->Args({128, 0})->Args({1, 1})->Args({128, 1})->UseRealTime();

// Attention of T queries over a cache of L keys (16 heads, 2 kv heads, D 256).
void BM_Attention(benchmark::State& st) {
  const int64_t T = st.range(0), L = st.range(1), nh = 16, nkv = 2, D = 256;
  const auto q = random_floats(T * nh * D, 1), k = random_floats(L * nkv * D, 2),
             v = random_floats(L * nkv * D, 3);
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = L - T + t;
  std::vector<float> out(T * nh * D);
  for (auto _ : st) {
    cpu::attention(q.data(), T, pos.data(), k.data(), v.data(), nh, nkv, D, 0.0625f, out.data(),
                   &pool());
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(st.iterations() * T);
}
BENCHMARK(BM_Attention)->Args({1, 256})->Args({128, 128})->UseRealTime();

// Greedy sampling's argmax over a logits row (warm in cache): cpu::argmax (Arg 1) against the plain
// scan it replaces (Arg 0). Args: vocabulary (tiny-next 6144, Qwen3-Next 151936), which.
void BM_Argmax(benchmark::State& st) {
  const auto x = random_floats(static_cast<size_t>(st.range(0)), 5);
  const int64_t n = st.range(0);
  for (auto _ : st) {
    int64_t best = 0;
    if (st.range(1) == 1) {
      best = cpu::argmax(x.data(), n);
    } else {
      for (int64_t i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    }
    benchmark::DoNotOptimize(best);
  }
  st.SetBytesProcessed(st.iterations() * n * 4);
}
BENCHMARK(BM_Argmax)->Args({6144, 0})->Args({6144, 1})->Args({151936, 0})->Args({151936, 1});

// The cost of one pool dispatch, and of one barrier inside a region.
void BM_PoolDispatch(benchmark::State& st) {
  std::vector<int64_t> sink(64);
  for (auto _ : st) {
    pool().parallel_for(64, 16, [&](int64_t b, int64_t) { sink[b]++; });
  }
}
BENCHMARK(BM_PoolDispatch)->UseRealTime();

void BM_RegionBarrier(benchmark::State& st) {
  const int64_t per_region = 64;
  for (auto _ : st) {
    cpu::parallel_region(&pool(), [&](const cpu::Worker& w) {
      for (int64_t i = 0; i < per_region; ++i) w.sync();
    });
  }
  st.SetItemsProcessed(st.iterations() * per_region);
}
BENCHMARK(BM_RegionBarrier)->UseRealTime();

}  // namespace
}  // namespace tf

BENCHMARK_MAIN();
