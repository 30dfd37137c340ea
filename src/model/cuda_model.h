// The qwen3_next forward pass on a CUDA device: the same steps as Model::forward (model.h), with
// the weights on the device (copied from a loaded Model, or random at the config's real size for
// benchmarks) and each sequence's state in device memory.
//
// A step enqueues its kernels with no host synchronisation until the logits: the MoE routing stays
// on the device (route_topk, then expert kernels that read the expert ids from device memory),
// the attention caches and the Gated DeltaNet states are reached through per-step pointer tables
// (uploaded with the token ids and positions in one copy), so one launch serves every sequence.
// Steps made of decode rows and verify steps (speculative decoding's, StepInput::verify) are
// captured into a CUDA graph per shape (rows, sequences, logits rows, MTP head kept or not) on
// their first run and replayed afterwards, and so are draft() calls (set_graphs); the kernels
// launch with programmatic dependent launch, and attention and the MoE combine run as clusters of
// blocks that join through distributed shared memory (backends/cuda/ops.cu). A decode layer is
// about ten kernels: the residual add lives in the next norm, the MoE combine also adds its
// output to the residual and norms it for the next layer, the router and the shared expert's gate
// are one product, and gdn_prep does a Gated DeltaNet layer's split, gates, conv and q/k norms.
// Every kernel is batch invariant (a row's result does not depend on the other rows of the step),
// the Gated DeltaNet runs its exact recurrence for prompts too (split-invariant), and the experts
// of a token are summed in ascending index order, as on the CPU.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/buffer.h"
#include "core/status.h"
#include "model/model.h"
#include "residency/cuda_backend.h"

namespace tf {

// Where the process's device buffers come from: every DeviceArray (weights, scratch, sequence
// states and their copies) and the pinned host staging of the device's copies. It knows what is
// live, so that the residency owner can hold what exists at startup (for_each) and follow what is
// made and freed later (set_observer: told after each allocation, before each free). One per
// process (a server runs one engine on one device). Thread-safe.
//
// Freed device blocks of up to kKeepBlockBytes are kept, up to kKeepBytes in all, and handed out
// again for an allocation of the same size: a request's state is a few dozen buffers (the
// recurrent and conv states, the attention caches, with drafting the verify history and the MTP
// head's rows), made when it starts and freed when it ends, and each cudaMalloc or cudaFree
// (which waits for the whole device) is a driver call of its own. A kept block is still device
// memory this process holds, so it stays live here (for_each lists it, the observer is told of it
// only when it is made and when it is really freed), and the residency set keeps counting it.
// Work enqueued before a free may still use the block, so a reuse first waits for the device
// (cudaDeviceSynchronize) when blocks were kept since the last such wait. When cudaMalloc runs
// out of memory, the kept blocks are freed and it is tried once more.
class DeviceHeap {
 public:
  static constexpr size_t kKeepBlockBytes = size_t{64} << 20, kKeepBytes = size_t{512} << 20;
  struct Stats {
    uint64_t allocs = 0;  // cudaMalloc calls for device blocks
    uint64_t reuses = 0;  // device allocations served by a kept block
    size_t kept_bytes = 0;
  };
  // cudaMalloc (kDevice) or cudaMallocHost (kHost: pinned); a CHECK failure when out of memory.
  void* alloc(size_t bytes, BufferKind kind);
  void free(void* p) noexcept;  // nullptr: nothing
  void set_observer(BufferObserver* o);
  // Every live allocation (kept blocks included), in address order.
  void for_each(const std::function<void(const void* p, size_t bytes, BufferKind kind)>& f) const;
  Stats stats() const;
  // Frees every kept block (alloc does, and retries, when cudaMalloc runs out of memory).
  void release_kept();

 private:
  struct Block {
    size_t bytes;
    BufferKind kind;
  };
  mutable std::mutex mu_;
  std::map<const void*, Block> live_;   // guarded by mu_; kept blocks (in keep_) too
  std::multimap<size_t, void*> keep_;   // guarded by mu_: kept device blocks by size
  bool kept_since_sync_ = false;        // guarded by mu_
  Stats stats_;                         // guarded by mu_
  BufferObserver* observer_ = nullptr;  // guarded by mu_
};
DeviceHeap& device_heap();

// A device allocation of `count` T (from device_heap()), freed on destruction; movable.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t count);
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept;
  ~DeviceArray();
  T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// One sequence's state on the device (CudaModel::new_state). As a DeviceState it rides in a
// SequenceState (Model::use_cuda), where copies (kept states) are device-to-device copies.
struct CudaSequenceState final : DeviceState {
  // A copy with the same n_past whose caches hold exactly n_past rows (they grow again on demand);
  // complete when it returns.
  std::unique_ptr<DeviceState> clone() const override;
  size_t bytes() const override;

  // Closes the verify window of the last step (as SequenceState::rollback, model.h): keeps its
  // first n - verify_base tokens. The copies are enqueued on the model's stream.
  void rollback(int64_t n) override;
  void release_verify() override;  // frees the verify scratch (window closed)

  int64_t n_past = 0;
  // Layer li's Gated DeltaNet state buffers, or attention caches (capacity grows on demand, or
  // by CudaModel::reserve up front).
  struct Layer {
    DeviceArray<float> k, v;  // attention: [capacity, n_kv, D] each (rows < n_past are valid)
    int64_t capacity = 0;     // positions the caches hold
    DeviceArray<float> conv;  // Gated DeltaNet: [K-1, conv_dim]
    DeviceArray<float> S;     // Gated DeltaNet: [Hv, Dk, Dv]
    // A verify step's history of this Gated DeltaNet layer (cuda::gdn_prep, delta_rule_seqs):
    // conv_hist [(K-1) + T, conv_dim], S_hist [>= T, Hv, Dk, Dv]; sizes kept between windows.
    DeviceArray<float> conv_hist, S_hist;
  };
  std::vector<Layer> layers;

  // The MTP head's state when `has_mtp`, kept as the CPU keeps it (SequenceState::mtp_kv): the
  // head's cache rows are computed in batches (CudaModel::mtp_sync: by draft(), and by a step once
  // kMtpSyncRows are due), so a step of a request that may draft only stores its tokens' H (one
  // kernel). With R = mtp_rows:
  //   mtp.k / mtp.v: rows < R valid, R <= n_past - 1, each as the head's own forward writes it;
  //   mtp_hidden: row hidden_base + i = H[R + i] for i < n_past - R (the last waits for x[n_past]);
  //   mtp_tokens: x[R + 1 .. n_past - 1] (host memory).
  // A verify step's rejected tokens leave their H rows beyond n_past - R: dead, overwritten later.
  bool has_mtp = false;
  Layer mtp;
  int64_t mtp_rows = 0;
  DeviceArray<float> mtp_hidden;  // [hidden_cap, H]
  int64_t hidden_cap = 0, hidden_base = 0;
  std::vector<int32_t> mtp_tokens;
  // A chained step's token (launch_greedy, chained: read on the device) is not known on the host
  // when the step is launched: its mtp_tokens entry, at this index, waits for
  // CudaModel::set_chained_token (-1: none waits). No mtp_sync or clone until then.
  int64_t chained_token_at = -1;

  // The verify window opened by the last step (verify_base < 0: none), as SequenceState::verify.
  int64_t verify_base = -1, verify_T = 0;
  DeviceArray<uint64_t> rollback_segs;  // rollback's copies (cuda::copy_segments)
  int64_t conv_rows = 0;                // K - 1
  int64_t hidden_size = 0;              // H
  void* stream = nullptr;  // the model's cudaStream_t: rollback's copies are ordered with steps
};

struct CudaStepInput {
  CudaSequenceState* state;
  std::span<const int32_t> tokens;
  bool all_logits = false;
  // A verify step (StepInput::verify): logits for every token, and the Gated DeltaNet history
  // kept so that state->rollback(n) can close the window. The device's steps are split-invariant
  // (every kernel computes a token as a one-token decode does), so its rows equal decode rows.
  bool verify = false;
};

// Bytes of weights a step reads (for the benchmark's roofline).
struct CudaWeightBytes {
  int64_t total = 0;       // every weight on the device
  int64_t dense = 0;       // read once per step whatever the batch: every non-expert weight of the
                           // layers (attention, Gated DeltaNet, router, shared expert, norms)
  int64_t expert = 0;      // one routed expert's gate + up + down
  int64_t moe_layers = 0;  // layers with routed experts
  int64_t lm_head = 0;
  int64_t embed_row = 0;  // one embedding row
};

class CudaModel {
 public:
  // Copies the weights of `host` to device `device` (bf16 and f32 matrices as they are, f16 ones
  // as f32). kUnavailable when there is no such device, kResourceExhausted when they do not fit.
  static Result<std::unique_ptr<CudaModel>> create(const Model& host, int device = 0);
  // Random bf16 weights at the config's real size, generated on the device from `seed` (no files,
  // no host copies): for benchmarks (`--load-format dummy`). kResourceExhausted when they do not
  // fit in the device's free memory. With `mtp`, an MTP head too (its fc and one attention + MoE
  // layer; Qwen3-Next checkpoints carry one).
  static Result<std::unique_ptr<CudaModel>> create_dummy(const ModelConfig& config, uint64_t seed,
                                                         int device = 0, bool mtp = false);
  ~CudaModel();

  // A fresh state; with `mtp` (has_mtp()) it keeps the MTP head's state too.
  CudaSequenceState new_state(bool mtp = false) const;
  bool has_mtp() const { return mtp_ != nullptr; }
  // Sizes the attention caches of `s` for `positions` positions, so no step has to grow them.
  void reserve(CudaSequenceState* s, int64_t positions);
  // As Model::forward: appends [vocab] logits rows (host memory) for each input's last token
  // (every token if all_logits) and advances each state.
  void forward(std::span<const CudaStepInput> inputs, std::vector<float>* logits);
  // As forward, but the logits stay on the device: appends each logits row's argmax (ties to the
  // lower index) to `tokens`. Greedy decoding without moving [vocab] rows to the host.
  void forward_greedy(std::span<const CudaStepInput> inputs, std::vector<int32_t>* tokens);
  // forward_greedy in two halves, so that the host reads one step's tokens while the device runs
  // the next (the host's work between steps leaves the critical path): launch_greedy enqueues a
  // step and returns without waiting; take_greedy waits for the oldest step launched and not yet
  // taken and appends its tokens. With `chained`, row i's token is the one the step launched just
  // before picked for its row i, read on the device: every row one token (no verify row), as many
  // rows as that step; the tokens in `inputs` are not read. A state keeping the MTP head has that
  // token in its mtp_tokens once the caller passes it to set_chained_token (after taking the step
  // before's tokens, before launching another chained step on it). At most two steps are launched
  // and not taken. The kernels and their inputs are forward_greedy's, so are the tokens, bit for
  // bit.
  void launch_greedy(std::span<const CudaStepInput> inputs, bool chained = false);
  void take_greedy(std::vector<int32_t>* tokens);
  void set_chained_token(CudaSequenceState* state, int32_t token);
  // Computes the MTP head's pending cache rows of `states` (has_mtp, window closed) in one batch:
  // afterwards each has n_past - 1 rows. The rows are those a one-token forward of the head writes
  // (every kernel is split-invariant), so no later result depends on when this ran.
  void mtp_sync(std::span<CudaSequenceState* const> states);
  // Model::draft on the device (has_mtp(); the states are device states, SequenceState::device):
  // every step of every input runs on the device (a CUDA graph per shape of the call) with one
  // host synchronisation at the end; the confidence gate (p_min) is applied to the results, which
  // gives what stopping at the first low-confidence draft gives.
  void draft(std::span<const DraftInput> inputs, std::span<Draft> out);
  // Decode and verify steps, and drafts, through CUDA graphs (default on); off: every step
  // launches its kernels.
  void set_graphs(bool on) { graphs_on_ = on; }
  // CUDA graphs captured so far: a step that captured one (a shape's first use, or any shape
  // again after a buffer grew) ran its kernels twice and instantiated the graph.
  int64_t graph_captures() const { return captures_; }
  // Where forward_greedy's steps spend their time (cuda_bench --step-times), from device
  // timestamps taken when on: the step's start (before the host builds and copies its table) to
  // the graph's start, the graph (the kernels), and the argmax with its read-back; summed over
  // the steps since it was turned on. A step's wall time minus the three is the host's part after
  // the read-back (the caller's own work, waking from the synchronisation).
  struct StepTimes {
    int64_t steps = 0;
    double to_graph_ms = 0, graph_ms = 0, argmax_ms = 0;
  };
  void set_step_times(bool on);
  StepTimes step_times() const { return step_times_; }
  const ModelConfig& config() const { return config_; }
  const CudaWeightBytes& weight_bytes() const { return bytes_; }
  // The runtime calls of residency's CUDA mapping (residency/cuda_backend.h) on this model's
  // device and stream. The tick's copy never lands inside a graph being captured.
  residency::CudaApi residency_api();
  // The device's memory in bytes (the default device residency budget).
  size_t device_memory_bytes() const;

 private:
  struct DevMat;
  struct DevFfn;
  struct DevLayer;
  struct DevMtp;
  struct Table;  // offsets of one step's pointer tables (cuda_model.cpp)
  explicit CudaModel(const ModelConfig& config);
  static Status init_device(CudaModel* m, int device);
  void finish_init();
  // Host side of a step: grows caches, builds and uploads the tables; returns rows wanting logits.
  // *mtp: some state keeps the MTP head's rows (the step stores its tokens' H for them).
  // `ids`: the tokens already on the device (launch_greedy, chained; N of them, in row order).
  // `staged`: the table goes through pinned staging (table_stage_), so that its copy does not
  // wait for the steps before (launch_greedy); else from pageable memory.
  int64_t prepare(std::span<const CudaStepInput> in, int64_t* N, int64_t* nseq, bool* mtp,
                  const int32_t* ids, bool staged);
  // Device side: every kernel from the embedding to the logits rows (scratch kLogits), then with
  // `mtp` the step's H rows to the states keeping the head, on the stream; depends on the host
  // only through (N, nseq, R, mtp), so it can be captured.
  void enqueue(int64_t N, int64_t nseq, int64_t R, bool mtp);
  // prepare + enqueue (or a graph replay for decode and verify steps); returns R.
  int64_t step(std::span<const CudaStepInput> in, const int32_t* ids = nullptr,
               bool staged = false);
  void attention_layer(const DevLayer& L, const Table& tb, int64_t N, const float* xn, float* y);
  void deltanet_layer(const DevLayer& L, const Table& tb, int64_t N, int64_t nseq, const float* xn,
                      float* y);
  // The layer's MLP (MoE or dense) on xn [N, H], its output added to the residual x, then
  // out = rmsnorm_zc(x) with weight `norm` (the next layer's input norm, the final norm, or the
  // MTP head's). y: scratch [N, H]. out may be xn. With mixer_out (where router_adds): x and xn
  // are those before the mixer's output joined the residual; the router product forms x +
  // mixer_out and the layer's post-mixer norm of it into xn first. out_rows (MoE layers): a
  // device table [N] of further destinations of out's rows (null entries skipped).
  void mlp(const DevLayer& L, int64_t N, float* x, float* xn, float* y, const float* norm,
           float* out, const float* mixer_out = nullptr, float* const* out_rows = nullptr);
  // Whether a MoE layer's N tokens take the slot path (each slot reads its expert, the shared
  // expert as slot k) rather than grouping the slots by expert.
  bool slot_experts(const DevLayer& L, int64_t N) const;
  // Whether the layer's MLP takes mixer_out for N tokens: one token, a MoE layer of bf16 router
  // weights on the slot path.
  bool router_adds(const DevLayer& L, int64_t N) const;
  void ffn(const DevFfn& f, const float* x, int64_t N, float* y);
  // The MTP head's fc input u [M, 2H] = [rmsnorm(embed(ids)) | rmsnorm(hid)] (ids, hid on the
  // device), then fc and the layer's input norm: x [M, H] (the residual), xn [M, H].
  void mtp_in(const int32_t* ids, const float* hid, int64_t M, float* x, float* xn);
  // Gated attention of the head's layer for M rows at positions pos, caches kc / vc (tables).
  void mtp_attention(const int64_t* pos, float* const* kc, float* const* vc, int64_t M,
                     const float* xn, float* y);
  // mtp_sync's kernels for M rows, from the table at d (a one-step DraftTable).
  void enqueue_mtp_rows(int64_t M, const uint64_t* d);
  // The drafting steps of draft() for rows of max_tokens ks (descending), from the table at d.
  void enqueue_draft(const std::vector<int64_t>& ks, bool want_logits, const uint64_t* d);
  // Runs `enqueue` as the CUDA graph of `key` (captured on its first use, after one eager run
  // that sizes the buffers), or eagerly with graphs off.
  void run_graph(const std::vector<int64_t>& key, const std::function<void()>& enqueue);
  float* scratch(int slot, size_t count);
  template <class T>
  T* grow_tracked(DeviceArray<T>& a, size_t n);
  void drop_graphs();

  ModelConfig config_;
  int device_ = 0;
  void* stream_ = nullptr;  // cudaStream_t
  // Held while a graph is captured on stream_: work another thread puts on the stream then (the
  // residency tick's copy) would be captured into the graph.
  std::mutex capture_mu_;
  std::unique_ptr<DevMat> embed_, lm_head_;
  std::unique_ptr<DevMtp> mtp_;  // the MTP head (null: none)
  DeviceArray<float> final_norm_, inv_freq_;
  std::vector<DevLayer> layers_;
  std::vector<int64_t> ordinal_;  // layer -> index among the attention (or Gated DeltaNet) layers
  int64_t n_attn_ = 0, n_gdn_ = 0;
  CudaWeightBytes bytes_;
  std::vector<DeviceArray<float>> scratch_;  // grown on demand, one per slot
  DeviceArray<uint64_t> table_;              // the step's tables (8-byte words)
  std::vector<uint64_t> host_table_;
  DeviceArray<int32_t> route_ex_, route_sorted_, route_tiles_, argmax_, draft_tok_;
  DeviceArray<uint64_t> draft_table_, sync_table_;  // draft()'s and mtp_sync()'s tables
  std::vector<uint64_t> host_draft_table_, host_sync_table_;
  // Pinned host memory of at least `bytes` (pinned_, grown): forward()'s logits and
  // forward_greedy()'s tokens on their way to the host.
  void* pinned(size_t bytes);
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  // A pinned host buffer and the event recorded after the last copy that used it, reused only
  // once that copy has completed: the step table's staging (two taking turns, so that a step's
  // table is copied without waiting for the step before, which a copy from pageable memory does),
  // and launch_greedy's tokens on their way to the host (one per step in flight).
  struct PinnedSlot {
    void* host = nullptr;
    size_t bytes = 0;
    void* done = nullptr;  // cudaEvent_t, made on first use
    int64_t rows = 0;      // launch_greedy: the step's tokens
  };
  // The argmax of the step's R logits rows (scratch kLogits) into argmax_, on the stream.
  const int32_t* argmax_rows(int64_t R);
  static void* claim(PinnedSlot& p, size_t bytes);  // waits for its last copy, grows it
  static void mark(PinnedSlot& p, void* stream);    // its copies are those enqueued so far
  std::array<PinnedSlot, 2> table_stage_, greedy_;
  int table_next_ = 0;
  int greedy_first_ = 0, greedy_n_ = 0;  // the oldest step launched and not taken; how many
  int64_t greedy_rows_ = -1;             // rows of the step launched last
  // Buffers are only ever replaced, never resized in place; each replacement bumps generation_
  // and drops the graphs (they hold the old addresses).
  uint64_t generation_ = 0, graphs_gen_ = 0;
  bool graphs_on_ = true;
  int64_t captures_ = 0;
  std::array<void*, 4> step_events_{};  // cudaEvent_t; set while step times are taken
  StepTimes step_times_;
  void add_step_times();  // the step whose events 0-3 have completed
  // cudaGraphExec_t by key: steps {0, N, nseq, R, mtp}, drafts {1, want_logits, ks...},
  // mtp_sync {2, M}.
  std::map<std::vector<int64_t>, void*> graphs_;
};

}  // namespace tf
