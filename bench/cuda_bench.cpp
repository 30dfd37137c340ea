// The CUDA decode and prefill benchmark (issue 9): tokens/s of greedy decoding at several batch
// sizes and of one prefill, each with the bytes a step must move (weights + sequence state)
// against this device's measured device-to-device copy bandwidth (the roofline).
//
//   cuda_bench --model models/tiny-next
//   cuda_bench --config bench/qwen3-next-80b-a3b-24l.json --load-format dummy
//
// Each batch has two decode rows: "decode" (CudaModel::forward_greedy: the host reads a step's
// tokens, then launches the next) and "decode, chained" (launch_greedy, chained: the next step is
// launched, its tokens read on the device, before the host reads this one's; the same kernels).
//
// Options: --batches 1,8,32  --steps 64 (timed decode steps per batch)  --prompt 32 (prefill of
// each decode sequence)  --prefill 512 (the prefill measurement's tokens)  --no-graphs  --kernels
// (first, a table of the decode kernels one by one at the model's shapes)  --engine (with --model:
// then the same decode through the runtime Engine, as the server runs it, Model::use_cuda: steps
// unchained, then chained, EngineOptions::chain)  --chain (EngineOptions::chain on in both
// drafting engines)
// --draft K (the costs of drafting 1..4 tokens at batch 1, dummy weights with an MTP head
// included; with --model also drafting against plain decoding through the engine on the prompts
// of --draft-prompts, default bench/draft_prompts.json, at --draft-streams 1,4; --draft-fixed;
// --profile: one plain step, one verify step of K + 1 tokens and one draft(K) between
// cudaProfilerStart and Stop, for `ncu --profile-from-start off`; --draft-max-streams N, default 1:
// EngineOptions::draft_max_streams; --draft-reps N: the engine comparison's best of N, default 3;
// --draft-lookup N: EngineOptions::draft_lookup; --draft-warm: one engine per kind for every rep,
// DraftCompareOptions::warm; --draft-control: after each row the same runs with both engines
// plain, DraftCompareOptions::control)  --step-times (after each batch's timed steps, as many again
// with CudaModel::set_step_times on: where a step's wall time goes, printed after the table).
//
// Bytes per decode step: every non-expert weight of the layers once, the lm_head once, one
// embedding row per row, and per MoE layer the distinct routed experts of the step (k at batch 1;
// at batch B the expected number under uniform routing, E (1 - (1 - k/E)^B)); plus per sequence
// the Gated DeltaNet state read and written and the attention KV read (mean context of the timed
// steps). Roofline % = (bytes per step / step time) / copy bandwidth; the copy bandwidth counts
// the bytes read plus the bytes written of a cudaMemcpy between two 4 GiB device buffers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends/cuda/check.h"
#include "backends/cuda/ops.h"
#include "io/config.h"
#include "model/cuda_model.h"
#include "model/model.h"
#include "runtime/draft_compare.h"
#include "runtime/engine.h"

namespace tf {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// GB/s (1e9 bytes) of cudaMemcpy device to device, counting read + written bytes.
double copy_bandwidth() {
  const size_t bytes = size_t{4} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaMemset(a, 1, bytes);
  cudaMemset(b, 0, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);  // warm
  const int iters = 10;
  cudaEventRecord(e0);
  for (int i = 0; i < iters; ++i)
    cudaMemcpy(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(a), cudaFree(b);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return 2.0 * static_cast<double>(bytes) * iters / (ms * 1e-3) / 1e9;
}

// --kernels: the decode step's kernels one by one at the model's shapes, each captured 64 times
// into a CUDA graph (as in a decode step) over rotating weight copies (>= 512 MB in all, so the
// L2 cache does not serve them); microseconds per call and weight/state GB/s.
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) {
    if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) {
      std::fprintf(stderr, "cuda_bench: out of device memory\n");
      std::exit(1);
    }
    cuda::fill_uniform(DType::kF32, p, static_cast<int64_t>(std::max<size_t>(bytes, 16) / 4), 3,
                       0.05f, 0.0f, nullptr);
  }
  ~DevBuf() { cudaFree(p); }
  float* f() const { return static_cast<float*>(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

template <class F>
double time_graph(F&& f, int reps) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaGraph_t g;
  cudaGraphExec_t e;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  for (int r = 0; r < reps; ++r) f(r, s);
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&e, g, 0);
  cudaGraphLaunch(e, s);
  cudaStreamSynchronize(s);
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  cudaEventRecord(a, s);
  cudaGraphLaunch(e, s);
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaGraphExecDestroy(e), cudaGraphDestroy(g), cudaStreamDestroy(s);
  cudaEventDestroy(a), cudaEventDestroy(b);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) std::fprintf(stderr, "cuda_bench: %s\n", cudaGetErrorString(err));
  return ms * 1e3 / reps;
}

void kernel_table(const ModelConfig& c, int64_t ctx) {
  const int reps = 64;
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
  const int64_t I = c.moe_intermediate_size, Hk = c.linear_num_key_heads;
  const int64_t Hv = c.linear_num_value_heads, Dk = c.linear_key_head_dim;
  const int64_t Dv = c.linear_value_head_dim, r = Hv / Hk, C = c.conv_dim();
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, D = c.head_dim;
  std::printf("\n| kernel (batch 1 unless noted) | us per call | GB/s |\n|---|---|---|\n");
  auto row = [](const char* name, double us, double bytes) {
    std::printf("| %s | %.2f | %.0f |\n", name, us, bytes > 0 ? bytes / us / 1e3 : 0.0);
  };
  DevBuf x(64 * H * 4 * 8), y(64 * std::max<int64_t>(c.vocab_size, 16384) * 4);
  auto mm = [&](const char* name, int64_t rows, int64_t cols, int64_t n) {
    const size_t bytes = static_cast<size_t>(rows * cols * 2);
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{512} << 20) / bytes));
    DevBuf w(bytes * copies);
    const double us = time_graph(
        [&](int i, cudaStream_t s) {
          cuda::matmul(DType::kBF16, w.as<uint8_t>() + (i % copies) * bytes, rows, cols, x.f(), n,
                       y.f(), s);
        },
        reps);
    row(name, us, static_cast<double>(bytes));
  };
  mm("matmul in_qkvz|in_ba", Hk * (2 * Dk + 2 * r * Dv) + 2 * r * Hk, H, 1);
  mm("matmul out_proj", H, Hv * Dv, 1);
  mm("matmul q_proj", nh * 2 * D, H, 1);
  mm("matmul k_proj", nkv * D, H, 1);
  mm("matmul lm_head", c.vocab_size, H, 1);
  mm("matmul in_qkvz|in_ba, batch 8", Hk * (2 * Dk + 2 * r * Dv) + 2 * r * Hk, H, 8);
  mm("matmul in_qkvz|in_ba, batch 32", Hk * (2 * Dk + 2 * r * Dv) + 2 * r * Hk, H, 32);
  {
    const size_t eb = static_cast<size_t>(E * I * H * 2);
    DevBuf wg(eb), wu(eb), wd(eb), h(64 * k * I * 4), o(64 * k * H * 4);
    std::vector<int32_t> ids(32 * k);
    std::mt19937 rng(5);
    for (int64_t t = 0; t < 32; ++t) {  // k distinct experts per token
      std::vector<int32_t> all(E);
      for (int64_t e = 0; e < E; ++e) all[e] = static_cast<int32_t>(e);
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < k; ++j) ids[t * k + j] = all[j];
    }
    DevBuf dids(ids.size() * 4);
    cudaMemcpy(dids.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice);
    const double ebytes = 3.0 * I * H * 2;
    row("expert_gate_up (k slots)",
        time_graph(
            [&](int, cudaStream_t s) {
              cuda::expert_gate_up(DType::kBF16, wg.p, wu.p, I, H, dids.as<int32_t>(), k, x.f(), 1,
                                   h.f(), s);
            },
            reps),
        2.0 / 3.0 * ebytes * k);
    row("expert_down (k slots)",
        time_graph(
            [&](int, cudaStream_t s) {
              cuda::expert_down(DType::kBF16, wd.p, H, I, dids.as<int32_t>(), k, h.f(), 1, o.f(),
                                s);
            },
            reps),
        1.0 / 3.0 * ebytes * k);
    DevBuf dw(64 * k * 4), sh(64 * H * 4), gate(64 * 4), xn(64 * H * 4);
    row("moe_combine + residual + norm",
        time_graph(
            [&](int, cudaStream_t s) {
              cuda::moe_combine(o.f(), dids.as<int32_t>(), dw.f(), 1, k, H, sh.f(), false, gate.f(),
                                1, y.f(), sh.f(), 1e-6f, xn.f(), s);
            },
            reps),
        0);
    // Random logits (DevBuf's fill), then a row of equal ones: the ranked top-k's worst case,
    // which takes the scan.
    DevBuf logits(64 * E * 4), equal(64 * E * 4);
    cudaMemset(equal.p, 0, 64 * E * 4);
    for (const auto& [name, l] : {std::pair<const char*, const DevBuf*>{"route_topk", &logits},
                                  {"route_topk, all logits equal", &equal}}) {
      row(name,
          time_graph(
              [&](int, cudaStream_t s) {
                cuda::route_topk(l->f(), 1, E, E, k, true, dids.as<int32_t>() + 32 * k, dw.f(), s);
              },
              reps),
          0);
    }
    const int64_t mt = cuda::moe_max_tiles(32, k, E);
    DevBuf sorted(32 * k * 4), tiles((4 * mt + 1) * 4);
    row("moe_group, batch 32",
        time_graph(
            [&](int, cudaStream_t s) {
              cuda::moe_group(dids.as<int32_t>(), 32, k, E, sorted.as<int32_t>(), tiles.p,
                              tiles.as<int32_t>() + 4 * mt, s);
            },
            reps),
        0);
    cuda::moe_group(dids.as<int32_t>(), 32, k, E, sorted.as<int32_t>(), tiles.p,
                    tiles.as<int32_t>() + 4 * mt, nullptr);
    const double distinct = E * (1.0 - std::pow(1.0 - static_cast<double>(k) / E, 32));
    row("grouped_experts, batch 32",
        time_graph(
            [&](int, cudaStream_t s) {
              cuda::grouped_experts(DType::kBF16, wg.p, wu.p, wd.p, I, H, k, E, 32,
                                    sorted.as<int32_t>(), tiles.p, tiles.as<int32_t>() + 4 * mt,
                                    x.f(), h.f(), o.f(), s);
            },
            reps),
        distinct * ebytes);
  }
  {
    const size_t sb = static_cast<size_t>(Hv * Dk * Dv * 4);
    const int copies = 64;
    DevBuf S(sb * copies), q(Hk * Dk * 4), kk(Hk * Dk * 4), v(Hv * Dv * 4), g(Hv * 4), beta(Hv * 4),
        out(Hv * Dv * 4), tab(copies * 8), starts(8);
    std::vector<uint64_t> ptrs(copies);
    for (int i = 0; i < copies; ++i) ptrs[i] = reinterpret_cast<uint64_t>(S.as<uint8_t>() + i * sb);
    cudaMemcpy(tab.p, ptrs.data(), copies * 8, cudaMemcpyHostToDevice);
    const int32_t st[2] = {0, 1};
    cudaMemcpy(starts.p, st, 8, cudaMemcpyHostToDevice);
    cudaMemset(g.p, 0, Hv * 4);
    row("delta_rule_seqs (state read + written)",
        time_graph(
            [&](int i, cudaStream_t s) {
              cuda::delta_rule_seqs(q.f(), kk.f(), v.f(), g.f(), beta.f(), starts.as<int32_t>(),
                                    tab.as<float*>() + i, nullptr, 1, Hk, Hv, Dk, Dv, out.f(), s);
            },
            reps),
        2.0 * sb);
    DevBuf conv(C * 4 * 4), cw(C * 4 * 4), ctab(8);
    cudaMemset(conv.p, 0, C * 4 * 4), cudaMemset(cw.p, 0, C * 4 * 4);
    const uint64_t cp = reinterpret_cast<uint64_t>(conv.p);
    cudaMemcpy(ctab.p, &cp, 8, cudaMemcpyHostToDevice);
    const int64_t W = Hk * (2 * Dk + 2 * r * Dv) + Hk * 2 * r;
    DevBuf pb(W * 4), z(Hv * Dv * 4);
    cudaMemset(pb.p, 0, W * 4);
    row("gdn_prep (split, gates, conv, q/k norms)",
        time_graph(
            [&](int, cudaStream_t s) {
              cuda::gdn_prep(pb.f(), starts.as<int32_t>(), ctab.as<float*>(), nullptr, cw.f(), 1,
                             Hk, Dk, r, Dv, c.linear_conv_kernel_dim, g.f(), g.f(), 1.0f, q.f(),
                             kk.f(), v.f(), z.f(), beta.f(), out.f(), s);
            },
            reps),
        0);
  }
  for (const int64_t L : {ctx, int64_t{4096}}) {  // the bench's mean context, and a long one
    DevBuf kc(L * nkv * D * 4), vc(L * nkv * D * 4), q(nh * D * 4), out(nh * D * 4), tab(16),
        pos(8);
    cudaMemset(kc.p, 0, L * nkv * D * 4), cudaMemset(vc.p, 0, L * nkv * D * 4);
    cudaMemset(q.p, 0, nh * D * 4);
    const uint64_t p2[2] = {reinterpret_cast<uint64_t>(kc.p), reinterpret_cast<uint64_t>(vc.p)};
    cudaMemcpy(tab.p, p2, 16, cudaMemcpyHostToDevice);
    const int64_t ps = L - 1;
    cudaMemcpy(pos.p, &ps, 8, cudaMemcpyHostToDevice);
    char name[96];
    std::snprintf(name, sizeof name, "attention_table (context %lld)", static_cast<long long>(L));
    row(name,
        time_graph(
            [&](int, cudaStream_t s) {
              cuda::attention_table(q.f(), 1, pos.as<int64_t>(), tab.as<const float*>(),
                                    tab.as<const float*>() + 1, nh, nkv, D, 0.0625f, nullptr,
                                    out.f(), s);
            },
            reps),
        2.0 * L * nkv * D * 4);
  }
  DevBuf w(H * 4);
  row("rmsnorm_zc [1 x 2048] (a small kernel)",
      time_graph(
          [&](int, cudaStream_t s) { cuda::rmsnorm_zc(x.f(), w.f(), 1, H, 1e-6f, y.f(), s); },
          reps),
      0);
}

// Aggregate decode tokens/s of B greedy streams through the Engine (continuous batching; the
// requests want no logits, as the server's, so each step reads back its argmax tokens): B requests
// of `prompt` random tokens and `steps` reply tokens each, submitted at once; timed from the moment
// every stream has its first token to the last token. The best of 2. `chain`: EngineOptions::chain.
double engine_decode(const Model& model, int B, int prompt, int steps, bool chain,
                     std::mt19937& rng) {
  EngineOptions o;
  o.chain = chain;
  o.scheduler.max_running = B;
  o.threads = 1;
  o.state_cache_bytes = 0;
  Engine engine(model, o);
  std::uniform_int_distribution<int32_t> tok(0,
                                             static_cast<int32_t>(model.config().vocab_size) - 1);
  double best = 0;
  for (int rep = 0; rep < 2; ++rep) {
    std::mutex mu;
    std::condition_variable cv;
    int started = 0, done = 0;
    double t_started = 0, t_done = 0;
    for (int i = 0; i < B; ++i) {
      GenerationRequest r;
      r.prompt.resize(prompt);
      for (auto& t : r.prompt) t = tok(rng);
      r.max_tokens = steps;
      r.want_logits = false;  // as the server asks
      r.on_event = [&, first = true](const TokenEvent& e) mutable {
        std::lock_guard<std::mutex> lock(mu);
        if (first && ++started == B) t_started = now_s();
        first = false;
        if (e.done && ++done == B) t_done = now_s();
        cv.notify_all();
      };
      if (!engine.submit(std::move(r)).is_ok()) return 0;
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == B; });
    best = std::max(best, B * (steps - 1) / (t_done - t_started));
  }
  return best;
}

// The costs of drafting at batch 1 on the CudaModel (any model with an MTP head, dummy weights
// included): a plain decode step, a verify step of k + 1 tokens that keeps one (rollback
// included) and draft(k), each with its [vocab] logits rows to the host as the engine has them,
// the mean of `iters` after a warm-up; then the speedup those costs give at draft acceptance a
// (each draft accepted with probability a while the previous ones were: E[tokens per step] =
// (1 - a^(k+1)) / (1 - a)) and the acceptance where drafting breaks even.
void draft_cost_table(CudaModel& m, int prompt, int iters, int profile_k, std::mt19937& rng) {
  const ModelConfig& c = m.config();
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);
  SequenceState st;
  st.device = DeviceStateBox(std::make_unique<CudaSequenceState>(m.new_state(true)));
  auto* cs = static_cast<CudaSequenceState*>(st.device.get());
  m.reserve(cs, prompt + 6 * (iters + 4));
  std::vector<int32_t> ids(prompt);
  for (auto& t : ids) t = tok(rng);
  std::vector<float> logits;
  const CudaStepInput pre{cs, ids};
  m.forward({&pre, 1}, &logits);
  auto time = [&](const std::function<void()>& f) {
    for (int i = 0; i < 3; ++i) f();  // warm-up (graph capture)
    const double t0 = now_s();
    for (int i = 0; i < iters; ++i) f();
    return (now_s() - t0) / iters;
  };
  const auto plain_step = [&] {
    const int32_t t = tok(rng);
    const CudaStepInput in{cs, {&t, 1}};
    logits.clear();
    m.forward({&in, 1}, &logits);
  };
  const double plain = time(plain_step);
  std::printf(
      "\n| drafting costs, batch 1 (ms) | k | draft(k) | verify k+1, keep 1 | (draft + verify) "
      "/ plain | speedup at a = 0.5 / 0.8 / 0.9 | break-even a |\n"
      "|---|---|---|---|---|---|---|\n| plain decode step %.3f ms | 0 | | | 1.00 | 1.00 | |\n",
      plain * 1e3);
  // A verify step of k + 1 random tokens that keeps one (rollback).
  std::vector<int32_t> feed;
  const auto verify_of = [&](int k) {
    return [&, k] {
      feed.resize(k + 1);
      for (auto& t : feed) t = tok(rng);
      const CudaStepInput in{cs, feed, false, true};
      logits.clear();
      m.forward({&in, 1}, &logits);
      cs->rollback(cs->n_past - k);
    };
  };
  // Expected tokens per verify step of k drafts at per-draft acceptance a.
  const auto tokens_per_step = [](double a, int k) { return (1 - std::pow(a, k + 1)) / (1 - a); };
  for (int k = 1; k <= 4; ++k) {
    const auto verify_step = verify_of(k);
    const double verify = time(verify_step);
    Draft d;
    const auto draft_step = [&] {
      const DraftInput in{&st, tok(rng), k};
      m.draft({&in, 1}, {&d, 1});
    };
    const double draft = time(draft_step);
    if (k == profile_k) {
      // For a profiler that starts collecting at cudaProfilerStart (ncu --profile-from-start
      // off): one plain step, one verify step of k + 1 tokens and one draft(k), graphs made.
      TF_CUDA_CHECK(cudaDeviceSynchronize());
      TF_CUDA_CHECK(cudaProfilerStart());
      plain_step();
      verify_step();
      draft_step();
      TF_CUDA_CHECK(cudaDeviceSynchronize());
      TF_CUDA_CHECK(cudaProfilerStop());
    }
    const double ratio = (draft + verify) / plain;
    auto speedup = [&](double a) { return tokens_per_step(a, k) / ratio; };
    double lo = 0, hi = 1;  // E[tokens](a) = ratio, by bisection (E grows with a)
    for (int i = 0; i < 40; ++i) {
      const double mid = (lo + hi) / 2;
      (tokens_per_step(mid, k) < ratio ? lo : hi) = mid;
    }
    std::printf("| | %d | %.3f | %.3f | %.2f | %.2f / %.2f / %.2f | %s |\n", k, draft * 1e3,
                verify * 1e3, ratio, speedup(0.5), speedup(0.8), speedup(0.9),
                ratio >= k + 1 ? "never" : fmt::format("{:.2f}", lo).c_str());
  }
  // Prompt-lookup drafts (EngineOptions::draft_lookup) cost no drafting: verify only.
  std::printf(
      "\n| prompt-lookup drafts, batch 1 (ms) | k | verify k+1, keep 1 | verify / plain | speedup "
      "at a = 0.5 / 0.8 / 0.9 |\n|---|---|---|---|---|\n");
  for (int k : {2, 4, 8, 12}) {
    const double verify = time(verify_of(k));
    const double ratio = verify / plain;
    auto speedup = [&](double a) { return tokens_per_step(a, k) / ratio; };
    std::printf("| | %d | %.3f | %.2f | %.2f / %.2f / %.2f |\n", k, verify * 1e3, ratio,
                speedup(0.5), speedup(0.8), speedup(0.9));
  }
}

// MTP drafting against plain decoding through the engine on the device (as bench-engine --draft
// on the CPU), on the chat prompts of bench/draft_prompts.json (token ids written by `tensorfold
// bench-engine --draft 3 --draft-only --draft-prompts-out FILE`). 1 if the tokens differ.
// `base` carries the drafting flags; its streams are those of `streams` in turn.
int draft_table(Model& model, const DraftCompareOptions& base, const std::string& file,
                const std::vector<int>& streams, bool control) {
  if (!model.on_device())
    if (Status st = model.use_cuda(); !st.is_ok()) {
      std::fprintf(stderr, "cuda_bench: %s\n", st.to_string().c_str());
      return 1;
    }
  std::ifstream in(file);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!in || j.is_discarded() || !j.contains("prompts")) {
    std::fprintf(stderr, "cuda_bench: --draft-prompts %s: not a prompts file\n", file.c_str());
    return 2;
  }
  const auto stops = j.at("stops").get<std::vector<int32_t>>();
  std::printf(
      "\ndrafting (engine, --device cuda), up to %d drafts (%s, while at most %d requests "
      "decode; 0: any; prompt lookup up to %d), greedy, replies up to 160 tokens, best of %d%s; 8 "
      "prompts per kind, N at a time:\n",
      base.draft_max, base.adaptive ? "adaptive" : "fixed", base.max_streams, base.lookup,
      base.reps, base.warm ? " on one engine per kind (warm)" : " (a fresh engine per run)");
  bool same = true;
  for (const auto& [kind, prompts] : j.at("prompts").items()) {
    for (int n : streams) {
      DraftCompareOptions o = base;
      o.streams = n;
      const DraftComparison c =
          compare_drafting(model, prompts.get<std::vector<std::vector<int32_t>>>(), stops, o);
      same = same && c.same_tokens;
      std::printf("  %s\n    the prior's cost per token: %s\n", describe(kind, n, c).c_str(),
                  describe_costs(c).c_str());
      if (control) {  // the same runs with both engines plain: the ratio's spread
        o.control = true;
        const DraftComparison a =
            compare_drafting(model, prompts.get<std::vector<std::vector<int32_t>>>(), stops, o);
        same = same && a.same_tokens;
        std::printf("  %s\n", describe(kind, n, a).c_str());
      }
      std::fflush(stdout);
    }
  }
  return same ? 0 : 1;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

int run(int argc, char** argv) {
  std::string model, config, load_format = "auto";
  std::vector<int> batches = {1, 8, 32};
  int steps = 64, prompt = 32, prefill = 512;
  bool graphs = true, kernels = false, engine = false;
  bool chain = false;  // --chain: EngineOptions::chain on in both drafting engines
  int draft = 0;       // --draft K: plain against drafted decoding through the engine
  bool profile = false, step_times = false;
  DraftCompareOptions dopt;  // the engine comparison's --draft-* flags (draft_max = --draft)
  dopt.threads = 1;
  std::string draft_prompts = "bench/draft_prompts.json";
  std::vector<int> draft_streams = {1, 4};
  bool draft_control = false;  // --draft-control: a control row (both plain) after each row
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cuda_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model")
      model = next();
    else if (a == "--config")
      config = next();
    else if (a == "--load-format")
      load_format = next();
    else if (a == "--batches")
      batches = parse_list(next());
    else if (a == "--steps")
      steps = std::atoi(next().c_str());
    else if (a == "--prompt")
      prompt = std::atoi(next().c_str());
    else if (a == "--prefill")
      prefill = std::atoi(next().c_str());
    else if (a == "--no-graphs")
      graphs = false;
    else if (a == "--kernels")
      kernels = true;
    else if (a == "--step-times")
      step_times = true;
    else if (a == "--engine")
      engine = true;
    else if (a == "--chain")
      chain = true;
    else if (a == "--draft")
      draft = std::atoi(next().c_str());
    else if (a == "--draft-fixed")
      dopt.adaptive = false;
    else if (a == "--draft-max-streams")
      dopt.max_streams = std::atoi(next().c_str());
    else if (a == "--draft-warm")
      dopt.warm = true;
    else if (a == "--draft-control")
      draft_control = true;
    else if (a == "--draft-lookup")
      dopt.lookup = std::max(0, std::atoi(next().c_str()));
    else if (a == "--draft-reps")
      dopt.reps = std::max(1, std::atoi(next().c_str()));
    else if (a == "--profile")
      profile = true;
    else if (a == "--draft-prompts")
      draft_prompts = next();
    else if (a == "--draft-streams")
      draft_streams = parse_list(next());
    else {
      std::fprintf(stderr,
                   "usage: cuda_bench (--model DIR | --config JSON --load-format dummy) "
                   "[--batches 1,8,32] [--steps 64] [--prompt 32] [--prefill 512] [--no-graphs] "
                   "[--kernels] [--step-times] [--engine] [--chain] [--draft K [--draft-fixed] "
                   "[--draft-prompts JSON] [--draft-streams 1,4] [--draft-max-streams 1] "
                   "[--draft-reps 3] [--draft-lookup N] "
                   "[--draft-warm] [--draft-control] [--profile]]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "cuda_bench: no CUDA device\n");
    return 1;
  }
  const double bw = copy_bandwidth();
  std::printf("device: %s, %.0f GiB; copy bandwidth (read + write): %.0f GB/s\n", prop.name,
              static_cast<double>(prop.totalGlobalMem) / (1u << 30), bw);

  std::unique_ptr<CudaModel> m;
  std::unique_ptr<Model> host;  // --model: the checkpoint (--engine moves it to the device)
  std::string name;
  const double t0 = now_s();
  if (!model.empty()) {
    auto h = Model::load(model);
    if (!h.is_ok()) {
      std::fprintf(stderr, "cuda_bench: %s\n", h.status().to_string().c_str());
      return 1;
    }
    host = std::move(*h);
    auto g = CudaModel::create(*host);
    if (!g.is_ok()) {
      std::fprintf(stderr, "cuda_bench: %s\n", g.status().to_string().c_str());
      return 1;
    }
    m = std::move(*g);
    name = model;
  } else if (!config.empty() && load_format == "dummy") {
    auto c = load_model_config(config);
    if (!c.is_ok()) {
      std::fprintf(stderr, "cuda_bench: %s\n", c.status().to_string().c_str());
      return 1;
    }
    auto g = CudaModel::create_dummy(*c, 1, 0, /*mtp=*/draft > 0);
    if (!g.is_ok()) {
      std::fprintf(stderr, "cuda_bench: %s\n", g.status().to_string().c_str());
      return 1;
    }
    m = std::move(*g);
    name = config + " (dummy weights)";
  } else {
    std::fprintf(stderr, "cuda_bench: give --model DIR, or --config JSON --load-format dummy\n");
    return 2;
  }
  m->set_graphs(graphs);
  if (kernels) kernel_table(m->config(), prompt + steps / 2);
  const ModelConfig& c = m->config();
  const CudaWeightBytes& wb = m->weight_bytes();
  std::printf(
      "model: %s: %lld layers, %lld experts top-%lld; weights %.2f GB on the device "
      "(loaded in %.1f s)\n",
      name.c_str(), static_cast<long long>(c.num_hidden_layers),
      static_cast<long long>(c.num_experts), static_cast<long long>(c.num_experts_per_tok),
      static_cast<double>(wb.total) / 1e9, now_s() - t0);

  int64_t n_attn = 0, n_gdn = 0;
  for (bool f : c.full_attention) (f ? n_attn : n_gdn)++;
  const double state_gdn =
      2.0 * n_gdn *
      (c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim +
       (c.linear_conv_kernel_dim - 1) * c.conv_dim()) *
      4.0;
  const double kv_pos = 2.0 * n_attn * c.num_key_value_heads * c.head_dim * 4.0;  // per position
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);

  std::printf(
      "\n| run | batch | tokens/s | step ms | bytes/step (GB) | achieved GB/s | roofline %% |\n"
      "|---|---|---|---|---|---|---|\n");
  // Prefill: one sequence of `prefill` tokens in one step (best of 3).
  if (prefill > 0) {
    std::vector<int32_t> p(prefill);
    for (auto& t : p) t = tok(rng);
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      CudaSequenceState s = m->new_state();
      m->reserve(&s, prefill + 1);
      std::vector<int32_t> out;
      const CudaStepInput x{&s, p, false};
      const double a = now_s();
      m->forward_greedy(std::span(&x, 1), &out);
      best = std::min(best, now_s() - a);
    }
    std::printf("| prefill %d tokens | 1 | %.0f | %.2f | | | |\n", prefill, prefill / best,
                best * 1e3);
  }
  std::vector<std::string> times;  // --step-times lines
  for (int B : batches) {
    std::vector<CudaSequenceState> st(B);
    std::vector<int32_t> next(B);
    for (int i = 0; i < B; ++i) {
      st[i] = m->new_state();
      m->reserve(&st[i], prompt + 3 * steps + 8);
      std::vector<int32_t> p(prompt);
      for (auto& t : p) t = tok(rng);
      std::vector<int32_t> out;
      const CudaStepInput x{&st[i], p, false};
      m->forward_greedy(std::span(&x, 1), &out);
      next[i] = out[0];
    }
    auto decode = [&](int n) {
      for (int s = 0; s < n; ++s) {
        std::vector<CudaStepInput> in;
        for (int i = 0; i < B; ++i) in.push_back({&st[i], std::span(&next[i], 1), false});
        std::vector<int32_t> out;
        m->forward_greedy(in, &out);
        next = out;
      }
    };
    // The same steps with the host reading each step's tokens while the device runs the next
    // (CudaModel::launch_greedy, chained): the host's work between steps off the critical path.
    auto decode_chained = [&](int n) {
      std::vector<CudaStepInput> in;
      for (int i = 0; i < B; ++i) in.push_back({&st[i], std::span(&next[i], 1), false});
      m->launch_greedy(in);
      std::vector<int32_t> out;
      for (int s = 1; s < n; ++s) {
        m->launch_greedy(in, /*chained=*/true);
        out.clear();
        m->take_greedy(&out);
      }
      out.clear();
      m->take_greedy(&out);
      next = out;
    };
    decode(3);  // the first decode step of B rows captures its graph
    const double E = static_cast<double>(c.num_experts),
                 k = static_cast<double>(c.num_experts_per_tok);
    const double distinct = B == 1 ? k : E * (1.0 - std::pow(1.0 - k / E, B));
    // A row of the table: `n` steps of `run` from context `ctx0`.
    auto row = [&](const char* name, auto&& run, int n, double ctx0) {
      const double a = now_s();
      run(n);
      const double dt = (now_s() - a) / n;
      const double ctx = ctx0 + n / 2.0;
      const double bytes = static_cast<double>(wb.dense + wb.lm_head) +
                           static_cast<double>(wb.embed_row) * B +
                           distinct * static_cast<double>(wb.expert * wb.moe_layers) +
                           B * (state_gdn + kv_pos * ctx);
      const double gbs = bytes / dt / 1e9;
      std::printf("| %s%s | %d | %.1f | %.3f | %.3f | %.0f | %.1f |\n", name,
                  graphs ? "" : " (no graphs)", B, B / dt, dt * 1e3, bytes / 1e9, gbs,
                  100.0 * gbs / bw);
    };
    row("decode", decode, steps, prompt + 3);
    row("decode, chained", decode_chained, steps, prompt + 3 + steps);
    if (step_times) {
      m->set_step_times(true);
      const double t0 = now_s();
      decode(steps);
      const double wall = (now_s() - t0) / steps * 1e3;
      const CudaModel::StepTimes st = m->step_times();
      m->set_step_times(false);
      const double n = static_cast<double>(std::max<int64_t>(1, st.steps));
      const double a = st.to_graph_ms / n, g = st.graph_ms / n, r = st.argmax_ms / n;
      times.push_back(fmt::format(
          "batch {}: {:.3f} ms a step = {:.3f} to the graph's start (table built, copied) + "
          "{:.3f} graph + {:.3f} argmax and read-back + {:.3f} host after it",
          B, wall, a, g, r, wall - a - g - r));
    }
  }
  for (const std::string& line : times) std::printf("step times, %s\n", line.c_str());
  if (draft > 0 && m->has_mtp()) draft_cost_table(*m, prompt, 100, profile ? draft : 0, rng);
  if (engine && host) {
    if (Status st = host->use_cuda(); !st.is_ok()) {
      std::fprintf(stderr, "cuda_bench: %s\n", st.to_string().c_str());
      return 1;
    }
    // Unchained then chained (EngineOptions::chain) on the same prompts, run after run.
    std::printf(
        "\n| engine (--device cuda), greedy | streams | decode tokens/s | chained | ratio "
        "|\n|---|---|---|---|---|\n");
    for (int B : batches) {
      std::mt19937 rng_chained = rng;  // the chained run's prompts are the unchained run's
      const double plain = engine_decode(*host, B, prompt, steps, /*chain=*/false, rng);
      const double chained = engine_decode(*host, B, prompt, steps, /*chain=*/true, rng_chained);
      std::printf("| prompt %d, %d tokens each | %d | %.1f | %.1f | %.2fx |\n", prompt, steps, B,
                  plain, chained, plain > 0 ? chained / plain : 0);
    }
  }
  if (draft > 0 && host) {
    dopt.draft_max = draft;
    dopt.chain = chain;
    return draft_table(*host, dopt, draft_prompts, draft_streams, draft_control);
  }
  return 0;
}

}  // namespace
}  // namespace tf

int main(int argc, char** argv) {
  return tf::run(argc, argv);
}
