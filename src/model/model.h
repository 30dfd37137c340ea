// The qwen3_next forward pass over a batch of sequences, on the CPU.
//
// A step feeds each sequence some new tokens (a prefill chunk or one decode token). Token-wise work
// (projections, norms, MoE, lm_head) runs over all rows of the step at once; sequence-mixing work
// (attention over the KV cache, conv + gated delta rule over the recurrent state) runs per
// sequence. Per-sequence state lives in SequenceState, outside the immutable weights.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/tp.h"
#include "model/weights.h"
#include "residency/backend.h"

namespace tf {

// Prompts run the chunked delta rule in chunks that end at absolute multiples of this (§5).
inline constexpr int64_t kDeltaChunk = 64;
// forward computes the MTP head's pending cache rows of a state once this many are due.
// 256, not fewer: a request that never drafts (prose under the adaptive policy, a batch above the
// gate) should not pay for the head's rows of its prompt; the held rows cost H floats each.
inline constexpr size_t kMtpSyncRows = 256;

// A sequence's state on a device (Model::use_cuda; model/cuda_model.h), behind an interface so
// that this header does not depend on the device's types.
struct DeviceState {
  virtual ~DeviceState() = default;
  virtual std::unique_ptr<DeviceState> clone() const = 0;  // a deep copy: a snapshot
  virtual size_t bytes() const = 0;                        // device memory held
  // SequenceState::rollback and release_verify, on the device's buffers.
  virtual void rollback(int64_t n) = 0;
  virtual void release_verify() = 0;
};

// Owns a DeviceState. Copying copies the state, so a copy of a SequenceState stays a snapshot on
// the device too.
class DeviceStateBox {
 public:
  DeviceStateBox() = default;
  explicit DeviceStateBox(std::unique_ptr<DeviceState> s) : s_(std::move(s)) {}
  DeviceStateBox(const DeviceStateBox& o) : s_(o.s_ ? o.s_->clone() : nullptr) {}
  DeviceStateBox& operator=(const DeviceStateBox& o) {
    if (this != &o) s_ = o.s_ ? o.s_->clone() : nullptr;
    return *this;
  }
  DeviceStateBox(DeviceStateBox&&) noexcept = default;
  DeviceStateBox& operator=(DeviceStateBox&&) noexcept = default;
  DeviceState* get() const { return s_.get(); }
  explicit operator bool() const { return s_ != nullptr; }

 private:
  std::unique_ptr<DeviceState> s_;
};

// The state of one sequence after n_past tokens. Copyable on purpose: a copy is a snapshot. Its
// buffers are FloatBufs, so the observer given to Model::new_state follows them and their copies.
//
// Notation: x[p] is the token fed at position p; H[p] is the target's final normed hidden state
// there (the model.norm output that feeds lm_head).
struct SequenceState {
  int64_t n_past = 0;
  struct Attention {
    FloatBuf k, v;  // [rows, n_kv, D] each, post-norm, post-RoPE keys
  };
  struct DeltaNet {
    FloatBuf conv;  // [K-1, conv_dim]: the last K-1 pre-conv inputs, oldest first
    FloatBuf S;     // [Hv, Dk, Dv] fp32 recurrent state
  };
  std::vector<Attention> attn;  // one per layer (empty for GDN layers); rows = n_past
  std::vector<DeltaNet> delta;  // one per layer (empty for attention layers)

  // The MTP head's state (qwen3-next.md §6), kept only when `has_mtp` (Model::new_state(.., true)).
  // Row p of the head's cache is computed from (H[p], x[p+1]); forward collects those pairs and the
  // rows are computed in batches (Model::mtp_sync: by draft(), and by forward once kMtpSyncRows are
  // due), so that plain steps pay almost nothing for keeping the head ready. With R = mtp_kv rows:
  //   mtp_kv: [R, n_kv, D], R <= n_past - 1, each row exactly as the head's own forward writes it;
  //   mtp_hidden: [n_past - R, H] = H[R .. n_past - 1] (the last row waits for x[n_past]);
  //   mtp_tokens: [n_past - 1 - R] = x[R + 1 .. n_past - 1].
  // Two states of the same tokens are equal after mtp_sync whatever R each had.
  bool has_mtp = false;
  Attention mtp_kv;
  FloatBuf mtp_hidden;
  std::vector<int32_t> mtp_tokens;

  // A verify step (StepInput::verify) of T tokens fed at positions base..base+T-1 leaves what
  // rollback() needs here; rollback() closes the window (base < 0). The buffers are scratch that
  // keeps its size between windows (so the next verify step does not re-allocate or re-zero it);
  // release_verify() frees it, e.g. before keeping a copy of the state.
  struct Verify {
    int64_t base = -1;  // n_past before the verify step; < 0: no window open
    int64_t T = 0;
    std::vector<FloatBuf> conv_hist;  // per GDN layer: [(K-1) + T, conv_dim], old conv state + new
    std::vector<FloatBuf> S_hist;     // per GDN layer: [>= T, Hv, Dk, Dv], S after each token
  } verify;

  // Sizes of one row of the buffers above, set by Model::new_state.
  int64_t kv_row = 0;     // n_kv * D floats per attention cache row (target layers and MTP)
  int64_t conv_rows = 0;  // K - 1
  int64_t hidden_size = 0;

  // Closes the verify window opened by the last forward step: the state becomes exactly (every
  // buffer, bit for bit) the state after feeding the first n - base tokens of that step one at a
  // time. Requires base < n <= n_past; n == n_past keeps everything. The GDN conv and recurrent
  // state come from the per-position snapshots, the attention caches and the MTP head's pending
  // rows are truncated. Buffers keep their capacity for the next window.
  void rollback(int64_t n);
  // Frees the verify scratch (no window may be open).
  void release_verify();

  // Bytes held by the buffers (capacity, as allocated).
  size_t bytes() const;

  // Under tensor parallelism, on rank 0: this state's id in the group (model/tp.h), so that the
  // other ranks copy, free and roll back their shards of it when this one is. Empty at TP=1.
  StateLink link;

  // On a device (Model::use_cuda): the whole state lives there and the host buffers above stay
  // empty; n_past follows the device state's after every step. Empty on the CPU.
  DeviceStateBox device;
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
  // Verify step of speculative decoding: tokens = [x, d_1 .. d_k] (the sampled token and k
  // drafts). Every position is computed with exactly the arithmetic of a one-token decode (token
  // recurrence of the delta rule, per-token conv, decode attention rows, per-row everything else),
  // so its logits row equals, bit for bit, the row a one-at-a-time decode of the same tokens
  // gives. Logits for every token; the state opens a verify window that the caller must close
  // with state->rollback(n) before the sequence's next step.
  bool verify = false;
  DeltaForm form = DeltaForm::kAuto;  // prompt pieces: kChunked; decode rows: kRecurrent
};

// One sequence's drafting request (Model::draft).
struct DraftInput {
  SequenceState* state;  // has_mtp, n_past >= 1, no verify window open; not changed by draft()
  int32_t next_token;    // x[n_past]: the token sampled from the last logits row, not fed yet
  int max_tokens = 1;    // k: draft at most this many tokens
  float p_min = 0.0f;    // adaptive gate: stop before a draft whose top probability is below p_min
  bool want_logits = false;
};

// Drafts d_1..d_j (j <= k) for x[n_past + 1]..x[n_past + j].
struct Draft {
  std::vector<int32_t> tokens;  // [j] the head's argmax at each step (lowest id on ties)
  std::vector<float> top_prob;  // [j] softmax probability of that argmax
  std::vector<float> logits;    // [j, vocab] when want_logits
};

class CudaModel;  // model/cuda_model.h (CUDA builds)

class Model {
 public:
  // Loads the model; in a tensor-parallel group (tp_install, the CLI's --tp N) this rank's shard.
  static Result<std::unique_ptr<Model>> load(const std::string& dir,
                                             const LoadProgress& progress = {},
                                             const LoadOptions& opts = {});
  // Loads this rank's shard of the model for the group `comm` (nullptr or size 1: the whole model,
  // the single-process code path). On rank 0 of a group of several, the Model leads: each of its
  // compute calls is first sent to the other ranks, which must run tp_follow (model/tp.h).
  // With opts.copy the weights are copied out of the checkpoint, which is then unmapped.
  static Result<std::unique_ptr<Model>> load(const std::string& dir, const LoadProgress& progress,
                                             Communicator* comm, const LoadOptions& opts = {});
  ~Model();  // rank 0 of a group: tells the followers to stop

  const ModelConfig& config() const { return ckpt_->config(); }
  const Weights& weights() const { return *weights_; }
  const Checkpoint& checkpoint() const { return *ckpt_; }

  bool has_mtp() const { return weights_->mtp != nullptr; }

  // A fresh state (n_past 0) whose buffers report to `observer` (nullptr: none). With `mtp` (the
  // model must have an MTP head) every forward also keeps the head's state, so that draft() can
  // run after any step; that costs one fc + k/v projection row of the head per token fed.
  SequenceState new_state(BufferObserver* observer = nullptr, bool mtp = false) const;

  // Runs one step. Appends logits rows ([vocab] each) to *logits in order: for each input, every
  // token's row if all_logits or verify, else its last token's row. Advances each state by its
  // token count. Token ids must be in [0, vocab); the caller validates. Inputs may mix prefill
  // chunks, decode rows and verify steps; each row's result is the same as in any other batch.
  void forward(std::span<const StepInput> inputs, std::vector<float>* logits,
               ThreadPool* pool) const;
  // As forward, but appends each logits row's argmax (the lowest id on ties: the greedy sampler's
  // token) instead of the row. On the device the rows stay there (argmax by a kernel, R ints read
  // back instead of R x vocab floats); on the CPU the same rows as forward's, then the argmax.
  void forward_argmax(std::span<const StepInput> inputs, std::vector<int32_t>* tokens,
                      ThreadPool* pool) const;
  // forward_argmax in two halves, so that on the device the host reads one step's tokens while
  // the device runs the next (CudaModel::launch_greedy): launch_argmax enqueues the step and
  // returns; with `chained`, row i's token is the one the step launched before picked for its row
  // i (one token per row, as many rows, no verify; the tokens in `inputs` are not read; a state
  // keeping the MTP head then waits for set_chained_token). take_argmax appends the tokens of the
  // oldest step launched and not taken. At most two steps are launched and not taken. On the CPU
  // launch_argmax runs the step at once and keeps its tokens for take_argmax: nothing overlaps, but
  // a caller's bookkeeping runs (and is tested) on every machine. One caller at a time, as for the
  // device's stream.
  void launch_argmax(std::span<const StepInput> inputs, bool chained, ThreadPool* pool) const;
  void take_argmax(std::vector<int32_t>* tokens) const;
  // The token a chained step fed `state` (the step before's, once taken), for a state keeping the
  // MTP head: on the device its pending head rows wait for it on the host
  // (CudaSequenceState::chained_token_at); due before another chained step on the state is
  // launched. On the CPU the chained step was fed it already: nothing to do.
  void set_chained_token(SequenceState* state, int32_t token) const;

  // Chained MTP drafting (§6), batched over sequences. For each input, step s = 1..k runs the
  // head at position n_past - 2 + s on (h, t): step 1 on (H[n_past - 1], next_token), step s > 1
  // on the head's own output hidden state and draft of step s - 1; d_s is its argmax. Stops at
  // max_tokens or before the first draft whose top probability is below p_min. Each state is
  // mtp_sync'ed first and otherwise left as it was (the draft positions' rows are scratch).
  // out: one per input.
  void draft(std::span<const DraftInput> inputs, std::span<Draft> out, ThreadPool* pool) const;

  // Computes the MTP head's pending cache rows of these states (has_mtp, no verify window open),
  // all in one batch: afterwards mtp_kv has n_past - 1 rows. Changes no result of any later call.
  void mtp_sync(std::span<SequenceState* const> states, ThreadPool* pool) const;

  // This rank's share of the model (TP=1: everything) and its group (nullptr at TP=1).
  const TpLayout& tp_layout() const { return tp_; }
  Communicator* communicator() const { return comm_; }

  // Bytes read from weights to decode one token (active experts only): the roofline's numerator.
  double decode_bytes_per_token() const;

  // Runs every later step on CUDA device `device` (the CLI's --device cuda): copies the weights
  // there (CudaModel::create; the host copy stays, for tools that read it); states made by
  // new_state() afterwards live on the device, and forward() runs there (same steps, bf16 weights,
  // fp32 state and accumulation: within bf16 tolerances of the CPU, not bitwise), and so do
  // verify steps, rollback, draft() and mtp_sync() (the MTP head is copied too), with the same
  // contract among themselves: drafted == plain bit for bit on the device. kUnavailable in a
  // build without the CUDA backend, without such a device, or under tensor parallelism;
  // kResourceExhausted when the weights do not fit.
  Status use_cuda(int device = 0);
  bool on_device() const { return cuda_ != nullptr; }
  // The device model (nullptr on the CPU), e.g. for the device's name and memory in reports.
  CudaModel* cuda() const { return cuda_.get(); }

  // Residency (../shared/design/residency.md; server/residency_setup.cpp). The model's buffers
  // that exist now, as members of a resident set: on the host the checkpoint's mapping (none after
  // LoadOptions::copy) and the weights' owned copies; on a device every buffer of the device heap
  // (weights, scratch, the pinned staging; not the host copy of the weights, which the device path
  // never reads).
  std::vector<residency::Range> residency_ranges() const;
  // The backend that holds them: CpuBackend on the host; on a device a CudaBackend whose tick
  // copies on the model's stream (host ranges locked as on the CPU).
  Result<std::unique_ptr<residency::Backend>> residency_backend() const;
  // On a device: every device buffer made or freed from now on reports to `o` (nullptr: stop);
  // on the host nothing (host states report through new_state's observer).
  void follow_device_buffers(BufferObserver* o) const;
  // The device's memory in bytes (the default device budget); 0 on the host.
  size_t device_memory_bytes() const;
  // CUDA graphs the device model has captured so far (CudaModel::graph_captures); 0 on the host.
  // A step during which it grew did one-time work (the engine's drafting policy skips it).
  int64_t graph_captures() const;

 private:
  // Rows of one sequence in an attention layer: T new rows at positions pos0.. of `cache`.
  struct AttnRows {
    SequenceState::Attention* cache;
    int64_t pos0, T;
  };
  // Appends the post-norm, post-RoPE keys and the values of xn's rows to their caches.
  void append_kv(const LayerWeights& L, std::span<const AttnRows> seqs, const float* xn,
                 ThreadPool* pool) const;
  void attention_layer(const LayerWeights& L, std::span<const AttnRows> seqs, const float* xn,
                       float* y, ThreadPool* pool) const;
  void deltanet_layer(const LayerWeights& L, int64_t li, std::span<const StepInput> in,
                      const float* xn, float* y, ThreadPool* pool) const;
  // Appends a step's final normed hidden states h [N, H] and tokens to the MTP head's pending
  // rows (SequenceState::mtp_hidden, mtp_tokens); syncs states with kMtpSyncRows or more due.
  void mtp_collect(std::span<const StepInput> inputs, std::span<const int64_t> n0, const float* h,
                   ThreadPool* pool) const;
  // The head's fc input per row r: [rmsnorm(embed(toks[r])) | rmsnorm(hidden[r])], u: [n, 2H].
  void mtp_input(std::span<const int32_t> toks, std::span<const float* const> hidden,
                 float* u) const;
  void moe(const LayerWeights& L, const float* xn, int64_t N, float* y, ThreadPool* pool) const;
  void mtp_sync_local(std::span<SequenceState* const> states, ThreadPool* pool) const;
  // Tensor-parallel seams, each a no-op or the plain computation at TP=1:
  // y [n]: this rank's partial sum of a row-parallel product -> the sum over ranks (rank order).
  void reduce(float* y, int64_t n) const;
  // Embedding rows of toks into out ([toks, H], row stride ld): each rank converts its vocabulary
  // rows, then every rank takes each row from its owner (exact: no arithmetic across ranks).
  void embed_rows(std::span<const int32_t> toks, float* out, int64_t ld) const;
  // logits [M, V] of the hidden rows h [M, H]: each rank's vocabulary block, then gathered.
  void lm_head_rows(const float* h, int64_t M, float* logits, ThreadPool* pool) const;
  void ffn(const FfnWeights& f, const float* x, int64_t N, float* y, ThreadPool* pool) const;

  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<Weights> weights_;
  std::vector<float> inv_freq_;       // [rotary_dim / 2]
  TpLayout tp_;                       // this rank's heads, experts and vocabulary rows
  Communicator* comm_ = nullptr;      // the group (not owned); nullptr at TP=1
  std::unique_ptr<TpLeader> leader_;  // rank 0 of a group of several
  // The device copy (use_cuda); the deleter lives in model.cpp, where CudaModel is complete in
  // CUDA builds (and never called in others: the pointer stays null there).
  struct CudaDeleter {
    void operator()(CudaModel* m) const;
  };
  std::unique_ptr<CudaModel, CudaDeleter> cuda_;
  // launch_argmax on the CPU: the tokens of the steps launched and not yet taken, oldest first.
  mutable std::deque<std::vector<int32_t>> launched_;
  // A step on the device: forward() (logits to the host), forward_argmax() (tokens), or
  // launch_argmax() (chained or not: the tokens come later, through take_argmax()).
  enum class CudaRun { kLogits, kArgmax, kLaunch, kLaunchChained };
  void forward_cuda(std::span<const StepInput> inputs, CudaRun how, std::vector<float>* logits,
                    std::vector<int32_t>* tokens) const;
};

}  // namespace tf
