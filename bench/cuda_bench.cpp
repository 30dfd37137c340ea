// The CUDA decode and prefill benchmark (issue 9): tokens/s of greedy decoding at several batch
// sizes and of one prefill, each with the bytes a step must move (weights + sequence state)
// against this device's measured device-to-device copy bandwidth (the roofline).
//
//   cuda_bench --model models/tiny-next
//   cuda_bench --config bench/qwen3-next-80b-a3b-24l.json --load-format dummy
//
// Options: --batches 1,8,32  --steps 64 (timed decode steps per batch)  --prompt 32 (prefill of
// each decode sequence)  --prefill 512 (the prefill measurement's tokens)  --no-graphs.
// Bytes per decode step: every non-expert weight of the layers once, the lm_head once, one
// embedding row per row, and per MoE layer the distinct routed experts of the step (k at batch 1;
// at batch B the expected number under uniform routing, E (1 - (1 - k/E)^B)); plus per sequence
// the Gated DeltaNet state read and written and the attention KV read (mean context of the timed
// steps). Roofline % = (bytes per step / step time) / copy bandwidth; the copy bandwidth counts
// the bytes read plus the bytes written of a cudaMemcpy between two 4 GiB device buffers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "io/config.h"
#include "model/cuda_model.h"
#include "model/model.h"

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
  bool graphs = true;
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
    else {
      std::fprintf(stderr,
                   "usage: cuda_bench (--model DIR | --config JSON --load-format dummy) "
                   "[--batches 1,8,32] [--steps 64] [--prompt 32] [--prefill 512] [--no-graphs]\n");
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
  std::string name;
  const double t0 = now_s();
  if (!model.empty()) {
    auto host = Model::load(model);
    if (!host.is_ok()) {
      std::fprintf(stderr, "cuda_bench: %s\n", host.status().to_string().c_str());
      return 1;
    }
    auto g = CudaModel::create(**host);
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
    auto g = CudaModel::create_dummy(*c, 1);
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
  for (int B : batches) {
    std::vector<CudaSequenceState> st(B);
    std::vector<int32_t> next(B);
    for (int i = 0; i < B; ++i) {
      st[i] = m->new_state();
      m->reserve(&st[i], prompt + steps + 8);
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
    decode(3);  // the first decode step of B rows captures its graph
    const double a = now_s();
    decode(steps);
    const double dt = (now_s() - a) / steps;
    const double E = static_cast<double>(c.num_experts),
                 k = static_cast<double>(c.num_experts_per_tok);
    const double distinct = B == 1 ? k : E * (1.0 - std::pow(1.0 - k / E, B));
    const double ctx = prompt + 3 + steps / 2.0;
    const double bytes =
        static_cast<double>(wb.dense + wb.lm_head) + static_cast<double>(wb.embed_row) * B +
        distinct * static_cast<double>(wb.expert * wb.moe_layers) + B * (state_gdn + kv_pos * ctx);
    const double gbs = bytes / dt / 1e9;
    std::printf("| decode%s | %d | %.1f | %.3f | %.3f | %.0f | %.1f |\n",
                graphs ? "" : " (no graphs)", B, B / dt, dt * 1e3, bytes / 1e9, gbs,
                100.0 * gbs / bw);
  }
  return 0;
}

}  // namespace
}  // namespace tf

int main(int argc, char** argv) {
  return tf::run(argc, argv);
}
