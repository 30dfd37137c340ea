// Immutable weights of a qwen3_next model, as views into the memory-mapped checkpoint (zero copy
// for matrices) or copies of them (LoadOptions::copy), plus small fp32 copies of the vectors
// (norm weights, gates, conv kernels).
// Tensor names and shapes: ../shared/design/qwen3-next.md §2.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backends/cpu/matmul.h"
#include "backends/cpu/moe.h"
#include "io/checkpoint.h"

namespace tf {

using cpu::Mat;

// This process's part of a tensor-parallel model: rank of size ranks (TP=1: {0, 1}, everything).
struct Shard {
  int rank = 0;
  int size = 1;
};

// Which heads, experts and rows a rank holds (design: docs/PERFORMANCE.md "Tensor parallelism").
// Ranges are [begin, begin + count). At TP=1 every range is the whole and the weights are the
// checkpoint's own views, so the forward pass is the single-process one.
//  - Full attention: query heads split evenly; a rank holds the KV heads its query heads read, so
//    when there are fewer KV heads than ranks a KV head is replicated (computed on several ranks).
//  - Gated DeltaNet: value heads split evenly; a rank holds the key heads its value heads read
//    (replicated the same way when there are fewer key heads than ranks).
//  - MoE: experts split in contiguous blocks (expert parallelism; the router is replicated); the
//    shared expert and dense MLPs split by intermediate rows (gate/up by rows, down by columns).
//  - Embedding and lm_head: vocabulary rows split in contiguous blocks.
struct TpLayout {
  Shard shard;
  int64_t q0 = 0, nh = 0;    // query heads
  int64_t kv0 = 0, nkv = 0;  // KV heads
  int64_t v0 = 0, hv = 0;    // GDN value heads
  int64_t k0 = 0, hk = 0;    // GDN key heads
  int64_t e0 = 0, e1 = 0;    // routed experts [e0, e1)
  int64_t vocab0 = 0, vocab_n = 0;
  int64_t vocab_stride = 0;  // max vocab_n over ranks: the block each rank sends when gathering
  int64_t conv_dim = 0;      // 2 hk Dk + hv Dv: GDN conv channels held here
  bool whole() const { return shard.size == 1; }
};

// [begin, begin + count) of `n` items split in `size` contiguous blocks (the first n % size one
// longer): the block of `rank`.
inline void split_block(int64_t n, Shard s, int64_t* begin, int64_t* count) {
  *begin = n * s.rank / s.size;
  *count = n * (s.rank + 1) / s.size - *begin;
}

// The layout of `shard`, or an error naming the head count that does not split over the ranks.
Result<TpLayout> make_tp_layout(const ModelConfig& c, Shard shard);

// A SwiGLU feed-forward: down(silu(gate x) * up x); gate, up [I, H], down [H, I].
using FfnWeights = cpu::FfnMats;

struct LayerWeights {
  bool full_attention = false;
  bool moe = false;
  std::vector<float> input_norm, post_norm;  // [H], zero-centred

  // Gated full attention.
  Mat q_proj;                         // [n_heads * 2 * D, H]: per head [query D | gate D]
  Mat k_proj, v_proj;                 // [n_kv * D, H]
  Mat o_proj;                         // [H, n_heads * D]
  std::vector<float> q_norm, k_norm;  // [D], zero-centred

  // Gated DeltaNet.
  Mat in_qkvz;              // [Hk * (2 Dk + 2 r Dv), H], rows grouped per k-head
  Mat in_ba;                // [Hk * 2 r, H], rows grouped per k-head
  Mat out_proj;             // [H, Hv * Dv]
  std::vector<float> conv;  // [conv_dim, K]: depthwise kernel, tap K-1 multiplies the current token
  std::vector<float> dt_bias;    // [Hv]
  std::vector<float> neg_exp_a;  // [Hv]: -exp(A_log)
  std::vector<float> gnorm;      // [Dv], plain weight

  // MoE: router, routed experts, shared expert with its sigmoid gate.
  Mat router;                       // [E, H]
  std::vector<FfnWeights> experts;  // [E]
  FfnWeights shared;
  std::vector<float> shared_gate;  // [H]
  // Dense MLP (mlp_only layers).
  FfnWeights mlp;
};

struct MtpWeights {
  Mat fc;  // [H, 2H], input = concat(norm(embedding), norm(hidden))
  std::vector<float> pre_fc_norm_embedding, pre_fc_norm_hidden, norm;  // [H]
  LayerWeights layer;                                                  // full attention + MoE
};

// Host memory the Weights own: an anonymous mapping of `bytes`, unmapped when released.
struct HostBlockUnmap {
  size_t bytes = 0;
  void operator()(char* p) const;
};
using HostBlock = std::unique_ptr<char, HostBlockUnmap>;

struct Weights {
  Mat embed;                      // [V, H]
  Mat lm_head;                    // [V, H] (the embedding when tied)
  std::vector<float> final_norm;  // [H]
  std::vector<LayerWeights> layers;
  std::unique_ptr<MtpWeights> mtp;  // null when the checkpoint has no mtp.* tensors
  size_t bytes_mapped = 0;          // bytes of matrices viewed in the checkpoint
  // Copies (every matrix with LoadOptions::copy; else where a tensor was not aligned to its
  // element size, or a rank's share is not one row range), and their sizes.
  std::vector<HostBlock> owned;

  bool bf16_products = false;  // LoadOptions::bf16_products (every bf16 Mat has bf16_inputs)

  // Every buffer the Weights own (the fp32 vectors and the copies; other matrices are views of
  // the checkpoint's mapping), for the residency owner to hold.
  void for_each_owned(const std::function<void(const void* data, size_t bytes)>& fn) const;
  // Every matrix (the tied lm_head is the embedding, visited twice).
  void for_each_mat(const std::function<void(Mat& m)>& fn);
};

// Called with (tensors loaded, tensors in the checkpoint) as loading advances.
using LoadProgress = std::function<void(size_t done, size_t total)>;

struct LoadOptions {
  // Copy every matrix out of the checkpoint's mapping into memory the Weights own (llama.cpp's
  // --no-mmap), after which the Model drops the mapping. On the CPU this is what decodes at the
  // memory's speed on VMs whose host ages guest page-cache pages (docs/PERFORMANCE.md, "Weights
  // copied out of the page cache": bench-mid decode 2.8x); it costs a copy at load and needs the
  // weights' size in free memory. Off: matrices are views of the mapping (zero copy).
  bool copy = false;
  // Products with bf16 weight matrices round their inputs to bf16 and use bf16 dot products
  // (Mat::bf16_inputs; the CLI's --matmul-precision bf16), llama.cpp's arithmetic for bf16
  // weights: prefill 1.3-1.5x faster on AVX512-BF16 (docs/PERFORMANCE.md, "bf16 products"),
  // logits within bf16 input rounding of the fp32 products (tests/golden: relative L2 up to 0.1
  // on tiny-next instead of 1e-4; greedy tokens equal where the top-2 margin exceeds 0.01).
  // Every product of a matrix takes the same path, so batch invariance holds either way. CPU
  // only: Model::use_cuda refuses it.
  bool bf16_products = false;
};

// Loads and checks every tensor the config implies. Errors name the file, tensor and expected vs
// actual shape or dtype.
// With a layout of more than one rank, loads only that rank's share (copied out of the mapping
// where it is not a contiguous row range).
Result<std::unique_ptr<Weights>> load_weights(const Checkpoint& ckpt,
                                              const LoadProgress& progress = {},
                                              const TpLayout* layout = nullptr,
                                              const LoadOptions& opts = {});

}  // namespace tf
