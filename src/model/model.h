// The qwen3_next forward pass over a batch of sequences, on the CPU.
//
// A step feeds each sequence some new tokens (a prefill chunk or one decode token). Token-wise work
// (projections, norms, MoE, lm_head) runs over all rows of the step at once; sequence-mixing work
// (attention over the KV cache, conv + gated delta rule over the recurrent state) runs per
// sequence. Per-sequence state lives in SequenceState, outside the immutable weights.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/weights.h"

namespace tf {

// Prompts run the chunked delta rule in chunks that end at absolute multiples of this (§5).
inline constexpr int64_t kDeltaChunk = 64;

// The state of one sequence after n_past tokens. Copyable on purpose: a copy is a snapshot. Its
// buffers are FloatBufs, so the observer given to Model::new_state follows them and their copies.
struct SequenceState {
  int64_t n_past = 0;
  struct Attention {
    FloatBuf k, v;  // [n_past, n_kv, D] each, post-norm, post-RoPE keys
  };
  struct DeltaNet {
    FloatBuf conv;  // [K-1, conv_dim]: the last K-1 pre-conv inputs, oldest first
    FloatBuf S;     // [Hv, Dk, Dv] fp32 recurrent state
  };
  std::vector<Attention> attn;  // one per layer (empty for GDN layers)
  std::vector<DeltaNet> delta;  // one per layer (empty for attention layers)

  // Bytes held by the buffers (capacity, as allocated).
  size_t bytes() const;
};

// Which form of the gated delta rule a step uses. Prompts use the chunked form (chunks ending at
// absolute multiples of kDeltaChunk), even for a 1-token piece of a prompt, so a prompt split
// over steps computes what one prefill computes; decode rows use the recurrent form.
enum class DeltaForm { kAuto, kChunked, kRecurrent };  // kAuto: recurrent iff one token

// One sequence's part of a batched step.
struct StepInput {
  SequenceState* state;
  std::span<const int32_t> tokens;  // new tokens, fed at positions state->n_past ...
  bool all_logits = false;          // logits for every token (else only the last)
  DeltaForm form = DeltaForm::kAuto;
};

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const std::string& dir,
                                             const LoadProgress& progress = {});

  const ModelConfig& config() const { return ckpt_->config(); }
  const Weights& weights() const { return *weights_; }
  const Checkpoint& checkpoint() const { return *ckpt_; }

  // A fresh state (n_past 0) whose buffers report to `observer` (nullptr: none).
  SequenceState new_state(BufferObserver* observer = nullptr) const;

  // Runs one step. Appends logits rows ([vocab] each) to *logits in order: for each input, every
  // token's row if all_logits, else its last token's row. Advances each state by its token count.
  // Token ids must be in [0, vocab); the caller validates.
  void forward(std::span<const StepInput> inputs, std::vector<float>* logits,
               ThreadPool* pool) const;

  // Bytes read from weights to decode one token (active experts only): the roofline's numerator.
  double decode_bytes_per_token() const;

 private:
  struct Scratch;
  void attention_layer(const LayerWeights& L, int64_t li, std::span<const StepInput> in,
                       const float* xn, float* y, ThreadPool* pool) const;
  void deltanet_layer(const LayerWeights& L, int64_t li, std::span<const StepInput> in,
                      const float* xn, float* y, ThreadPool* pool) const;
  void moe(const LayerWeights& L, const float* xn, int64_t N, float* y, ThreadPool* pool) const;
  void ffn(const FfnWeights& f, const float* x, int64_t N, float* y, ThreadPool* pool) const;

  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<Weights> weights_;
  std::vector<float> inv_freq_;  // [rotary_dim / 2]
};

}  // namespace tf
