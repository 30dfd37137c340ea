// The qwen3_next forward pass on a CUDA device: the same steps as Model::forward (model.h), with
// the weights copied to the device once and each sequence's state in device memory.
//
// A first version, built for correctness: every op is a kernel of src/backends/cuda (batch
// invariant: a row's result does not depend on the other rows of the step), the Gated DeltaNet
// runs its exact recurrence for prompts too (split-invariant, so a prompt fed in any pieces gives
// the same bits), MoE experts run one after another in ascending index order, and each step
// synchronises once per MoE layer to read the routing. CUDA graphs, fused kernels and tensor-core
// GEMMs come next (issue 9).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace tf {

// A device allocation of `count` T, freed on destruction; movable.
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

// One sequence's state on the device (CudaModel::new_state).
struct CudaSequenceState {
  int64_t n_past = 0;
  struct Layer {
    DeviceArray<float> k, v;  // attention: [capacity, n_kv, D] each (rows < n_past are valid)
    int64_t capacity = 0;     // positions the caches hold
    DeviceArray<float> conv;  // Gated DeltaNet: [K-1, conv_dim]
    DeviceArray<float> S;     // Gated DeltaNet: [Hv, Dk, Dv]
  };
  std::vector<Layer> layers;
};

struct CudaStepInput {
  CudaSequenceState* state;
  std::span<const int32_t> tokens;
  bool all_logits = false;
};

class CudaModel {
 public:
  // Copies the weights of `host` to device `device` (bf16 and f32 matrices as they are, f16 ones
  // as f32). kUnavailable when there is no such device, kResourceExhausted when they do not fit.
  static Result<std::unique_ptr<CudaModel>> create(const Model& host, int device = 0);
  ~CudaModel();

  CudaSequenceState new_state() const;
  // As Model::forward: appends [vocab] logits rows (host memory) for each input's last token
  // (every token if all_logits) and advances each state.
  void forward(std::span<const CudaStepInput> inputs, std::vector<float>* logits);
  const ModelConfig& config() const { return host_.config(); }

 private:
  struct DevMat;
  struct DevFfn;
  struct DevLayer;
  explicit CudaModel(const Model& host);
  void attention_layer(const DevLayer& L, int64_t li, std::span<const CudaStepInput> in,
                       const float* xn, float* y);
  void deltanet_layer(const DevLayer& L, int64_t li, std::span<const CudaStepInput> in,
                      const float* xn, float* y);
  void moe(const DevLayer& L, const float* xn, int64_t N, float* y);
  void ffn(const DevFfn& f, const float* x, int64_t N, float* y);
  float* scratch(int slot, size_t count);

  const Model& host_;
  int device_ = 0;
  void* stream_ = nullptr;  // cudaStream_t
  std::unique_ptr<DevMat> embed_, lm_head_;
  DeviceArray<float> final_norm_, inv_freq_;
  std::vector<DevLayer> layers_;
  std::vector<DeviceArray<float>> scratch_;  // grown on demand, one per slot
  DeviceArray<int32_t> ids_, idx_, route_ex_, route_rows_;
  DeviceArray<int64_t> pos_;
  DeviceArray<float> route_w_;
};

}  // namespace tf
