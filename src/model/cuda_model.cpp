#include "model/cuda_model.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cuda/check.h"
#include "backends/cuda/ops.h"
#include "core/check.h"

namespace tf {

namespace {
cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}
uint64_t addr(const void* p) {
  return reinterpret_cast<uint64_t>(p);
}
}  // namespace

// ---- DeviceHeap, DeviceArray
// ------------------------------------------------------------------------

void* DeviceHeap::alloc(size_t bytes, BufferKind kind) {
  if (kind == BufferKind::kDevice) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = keep_.find(bytes); it != keep_.end()) {
      void* p = it->second;
      keep_.erase(it);
      if (kept_since_sync_) {  // work enqueued before the free may still use it
        TF_CUDA_CHECK(cudaDeviceSynchronize());
        kept_since_sync_ = false;
      }
      stats_.kept_bytes -= bytes;
      ++stats_.reuses;
      return p;
    }
  }
  void* p = nullptr;
  if (kind == BufferKind::kDevice) {
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clears it; the kept blocks go back to the driver, then a retry
      release_kept();
      e = cudaMalloc(&p, bytes);
    }
    TF_CUDA_CHECK(e);
  } else {
    TF_CUDA_CHECK(cudaMallocHost(&p, bytes));
  }
  std::lock_guard<std::mutex> lock(mu_);
  live_.emplace(p, Block{bytes, kind});
  stats_.allocs += kind == BufferKind::kDevice;
  if (observer_) observer_->on_create(p, bytes, kind);
  return p;
}

void DeviceHeap::free(void* p) noexcept {
  if (p == nullptr) return;
  BufferKind kind = BufferKind::kDevice;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it != live_.end()) {
      const Block& b = it->second;
      kind = b.kind;
      if (kind == BufferKind::kDevice && b.bytes <= kKeepBlockBytes &&
          stats_.kept_bytes + b.bytes <= kKeepBytes) {
        keep_.emplace(b.bytes, p);
        stats_.kept_bytes += b.bytes;
        kept_since_sync_ = true;
        return;
      }
      if (observer_) observer_->on_release(p, b.bytes);
      live_.erase(it);
    }
  }
  if (kind == BufferKind::kDevice)
    cudaFree(p);
  else
    cudaFreeHost(p);
}

void DeviceHeap::release_kept() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [bytes, p] : keep_) {
    if (observer_) observer_->on_release(p, bytes);
    live_.erase(p);
    cudaFree(p);
  }
  keep_.clear();
  stats_.kept_bytes = 0;
  kept_since_sync_ = false;
}

DeviceHeap::Stats DeviceHeap::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void DeviceHeap::set_observer(BufferObserver* o) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = o;
}

void DeviceHeap::for_each(
    const std::function<void(const void* p, size_t bytes, BufferKind kind)>& f) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [p, b] : live_) f(p, b.bytes, b.kind);
}

DeviceHeap& device_heap() {
  static DeviceHeap* heap = new DeviceHeap();  // never destroyed: arrays may outlive statics
  return *heap;
}

template <class T>
DeviceArray<T>::DeviceArray(size_t count) : n_(count) {
  if (count > 0) p_ = static_cast<T*>(device_heap().alloc(count * sizeof(T), BufferKind::kDevice));
}
template <class T>
DeviceArray<T>& DeviceArray<T>::operator=(DeviceArray&& o) noexcept {
  if (this != &o) {
    device_heap().free(p_);
    p_ = o.p_, n_ = o.n_;
    o.p_ = nullptr, o.n_ = 0;
  }
  return *this;
}
template <class T>
DeviceArray<T>::~DeviceArray() {
  device_heap().free(p_);
}
template class DeviceArray<float>;
template class DeviceArray<int32_t>;
template class DeviceArray<int64_t>;
template class DeviceArray<uint8_t>;
template class DeviceArray<uint64_t>;

namespace {

template <class T>
DeviceArray<T> upload(const T* data, size_t n) {
  DeviceArray<T> a(n);
  if (n > 0) TF_CUDA_CHECK(cudaMemcpy(a.data(), data, n * sizeof(T), cudaMemcpyHostToDevice));
  return a;
}
template <class T>
DeviceArray<T> upload(const std::vector<T>& v) {
  return upload(v.data(), v.size());
}

// Makes `a` hold at least n elements (contents not kept).
template <class T>
T* grow(DeviceArray<T>& a, size_t n) {
  if (a.size() < n) a = DeviceArray<T>(std::max(n, a.size() * 2));
  return a.data();
}

}  // namespace

// ---- weights on the device
// -----------------------------------------------------------------------

struct CudaModel::DevMat {
  DType dtype = DType::kF32;
  DeviceArray<uint8_t> bytes;
  int64_t rows = 0, cols = 0;
  int64_t size() const { return static_cast<int64_t>(bytes.size()); }
};
// A dense MLP or shared expert (one matrix each), or a layer's routed experts packed: gate, up
// [E * I, H] and down [E * H, I], expert e's rows at e * I (e * H).
struct CudaModel::DevFfn {
  DevMat gate, up, down;
  int64_t I = 0;
};
struct CudaModel::DevLayer {
  bool full_attention = false, moe = false;
  DeviceArray<float> input_norm, post_norm;
  DevMat qkv, o_proj;  // qkv: q_proj, k_proj and v_proj stacked, one product
  DeviceArray<float> q_norm, k_norm;
  DevMat in_proj, out_proj;  // in_proj: in_qkvz and in_ba stacked, one product for both
  DeviceArray<float> conv, dt_bias, neg_exp_a, gnorm;
  // router [E + 1, H]: the router's E rows, then the shared expert's gate row (one product).
  DevMat router;
  DevFfn experts;
  DevFfn shared, mlp;
};
// The MTP head (qwen3-next.md §6): fc [H, 2H], its input norms, one decoder layer, its final norm.
struct CudaModel::DevMtp {
  DevMat fc;
  DeviceArray<float> pre_fc_norm_embedding, pre_fc_norm_hidden, norm;
  DevLayer layer;
};

namespace {

// The matrices `ms` (same cols) stacked row-wise on the device: bf16 and f32 as they are when all
// share that dtype, otherwise (and f16, which has no CUDA matmul) widened to f32.
void upload_stacked(const std::vector<const Mat*>& ms, DType* dtype, DeviceArray<uint8_t>* bytes,
                    int64_t* rows, int64_t* cols) {
  *rows = 0, *cols = ms.empty() ? 0 : ms[0]->cols;
  bool same = true;
  for (const Mat* m : ms) {
    *rows += m->rows;
    same = same && m->dtype == ms[0]->dtype && m->data != nullptr;
  }
  if (*rows * *cols == 0 || ms[0]->data == nullptr) return;
  const DType t = same && (ms[0]->dtype == DType::kBF16 || ms[0]->dtype == DType::kF32)
                      ? ms[0]->dtype
                      : DType::kF32;
  const size_t es = dtype_size(t);
  std::vector<uint8_t> host(static_cast<size_t>(*rows * *cols) * es);
  size_t at = 0;
  for (const Mat* m : ms) {
    const size_t n = static_cast<size_t>(m->rows * m->cols);
    if (m->dtype == t) {
      std::memcpy(host.data() + at, m->data, n * es);
    } else {
      float* f = reinterpret_cast<float*>(host.data() + at);
      const uint16_t* h = static_cast<const uint16_t*>(m->data);
      for (size_t i = 0; i < n; ++i)
        f[i] = m->dtype == DType::kF16    ? f16_to_f32(h[i])
               : m->dtype == DType::kBF16 ? bf16_to_f32(h[i])
                                          : static_cast<const float*>(m->data)[i];
    }
    at += n * es;
  }
  *dtype = t;
  *bytes = upload(host.data(), host.size());
}

}  // namespace

CudaModel::CudaModel(const ModelConfig& config) : config_(config) {}

Status CudaModel::init_device(CudaModel* m, int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= device)
    return Status(StatusCode::kUnavailable,
                  fmt::format("no CUDA device {} ({} found)", device, count));
  const ModelConfig& c = m->config_;
  if (c.hidden_size % 8 != 0 || c.head_dim * c.num_attention_heads % 8 != 0 ||
      c.moe_intermediate_size % 8 != 0 || c.shared_expert_intermediate_size % 8 != 0)
    return Status::invalid("the CUDA backend needs widths that are multiples of 8");
  if (c.num_experts_per_tok > 64)
    return Status::invalid("the CUDA backend routes at most 64 experts per token");
  if (c.linear_key_head_dim % 8 != 0 || c.linear_key_head_dim > 128 || c.linear_conv_kernel_dim > 8)
    return Status::invalid(
        "the CUDA backend needs linear_key_head_dim a multiple of 8 up to 128 and a conv kernel "
        "of at most 8");
  TF_CUDA_CHECK(cudaSetDevice(device));
  m->device_ = device;
  cudaStream_t s;
  TF_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  m->stream_ = s;
  std::vector<float> inv_freq;
  for (int64_t i = 0; i < c.rotary_dim() / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(c.rotary_dim());
    inv_freq.push_back(1.0f / static_cast<float>(std::pow(c.rope_theta, static_cast<double>(e))));
  }
  m->inv_freq_ = upload(inv_freq);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    m->ordinal_.push_back(c.full_attention[i] ? m->n_attn_++ : m->n_gdn_++);
  return Status::ok();
}

// Counts the bytes of every weight (CudaWeightBytes).
void CudaModel::finish_init() {
  CudaWeightBytes& b = bytes_;
  auto f = [](const DeviceArray<float>& a) { return static_cast<int64_t>(a.size() * 4); };
  auto ffn = [](const DevFfn& x) { return x.gate.size() + x.up.size() + x.down.size(); };
  for (const DevLayer& L : layers_) {
    b.dense += f(L.input_norm) + f(L.post_norm) + L.qkv.size() + L.o_proj.size() + f(L.q_norm) +
               f(L.k_norm) + L.in_proj.size() + L.out_proj.size() + f(L.conv) + f(L.dt_bias) +
               f(L.neg_exp_a) + f(L.gnorm) + L.router.size() + ffn(L.shared) + ffn(L.mlp);
    if (L.moe) {
      ++b.moe_layers;
      b.expert = ffn(L.experts) / config_.num_experts;
      b.total += ffn(L.experts);
    }
  }
  b.lm_head = lm_head_->size();
  b.embed_row = embed_->size() / std::max<int64_t>(1, embed_->rows);
  b.total += b.dense + b.lm_head + embed_->size() + f(final_norm_);
  if (mtp_) {
    const DevLayer& L = mtp_->layer;
    b.total += mtp_->fc.size() + 3 * f(mtp_->norm) + L.qkv.size() + L.o_proj.size() +
               L.router.size() + ffn(L.experts) + ffn(L.shared) + ffn(L.mlp);
  }
  TF_CUDA_CHECK(cudaDeviceSynchronize());
}

Result<std::unique_ptr<CudaModel>> CudaModel::create(const Model& host, int device) {
  auto m = std::unique_ptr<CudaModel>(new CudaModel(host.config()));
  if (Status st = init_device(m.get(), device); !st.is_ok()) return st;
  const ModelConfig& c = host.config();
  const Weights& w = host.weights();
  auto mat = [](const Mat& src) {
    DevMat d;
    upload_stacked({&src}, &d.dtype, &d.bytes, &d.rows, &d.cols);
    return d;
  };
  auto ffn = [&](const FfnWeights& f) {
    return DevFfn{mat(f.gate), mat(f.up), mat(f.down), f.gate.rows};
  };
  m->embed_ = std::make_unique<DevMat>(mat(w.embed));
  m->lm_head_ = std::make_unique<DevMat>(mat(w.lm_head));
  m->final_norm_ = upload(w.final_norm);
  auto layer = [&](const LayerWeights& L) -> Result<DevLayer> {
    DevLayer d;
    d.full_attention = L.full_attention;
    d.moe = L.moe;
    d.input_norm = upload(L.input_norm);
    d.post_norm = upload(L.post_norm);
    if (L.full_attention) {
      upload_stacked({&L.q_proj, &L.k_proj, &L.v_proj}, &d.qkv.dtype, &d.qkv.bytes, &d.qkv.rows,
                     &d.qkv.cols);
      d.o_proj = mat(L.o_proj);
      d.q_norm = upload(L.q_norm), d.k_norm = upload(L.k_norm);
    } else {
      upload_stacked({&L.in_qkvz, &L.in_ba}, &d.in_proj.dtype, &d.in_proj.bytes, &d.in_proj.rows,
                     &d.in_proj.cols);
      d.out_proj = mat(L.out_proj);
      d.conv = upload(L.conv), d.dt_bias = upload(L.dt_bias);
      d.neg_exp_a = upload(L.neg_exp_a), d.gnorm = upload(L.gnorm);
    }
    if (L.moe) {
      // The shared expert's gate row [1, H] below the router's rows. Kept in the router's bf16
      // when that is exact (checkpoints store it in bf16), else both widened to f32; the same
      // values either way, so the same products.
      const Mat gate_f32{DType::kF32, L.shared_gate.data(), 1, c.hidden_size};
      std::vector<uint16_t> gate_bf16(L.shared_gate.size());
      bool exact = L.router.dtype == DType::kBF16;
      for (size_t i = 0; i < gate_bf16.size() && exact; ++i) {
        gate_bf16[i] = f32_to_bf16(L.shared_gate[i]);
        exact = bf16_to_f32(gate_bf16[i]) == L.shared_gate[i];
      }
      const Mat gate_b{DType::kBF16, gate_bf16.data(), 1, c.hidden_size};
      upload_stacked({&L.router, exact ? &gate_b : &gate_f32}, &d.router.dtype, &d.router.bytes,
                     &d.router.rows, &d.router.cols);
      std::vector<const Mat*> g, u, dn;
      for (const FfnWeights& e : L.experts) g.push_back(&e.gate), u.push_back(&e.up);
      for (const FfnWeights& e : L.experts) dn.push_back(&e.down);
      DevFfn& x = d.experts;
      upload_stacked(g, &x.gate.dtype, &x.gate.bytes, &x.gate.rows, &x.gate.cols);
      upload_stacked(u, &x.up.dtype, &x.up.bytes, &x.up.rows, &x.up.cols);
      upload_stacked(dn, &x.down.dtype, &x.down.bytes, &x.down.rows, &x.down.cols);
      x.I = L.experts.empty() ? 0 : L.experts[0].gate.rows;
      if (x.gate.dtype != x.up.dtype || x.gate.dtype != x.down.dtype)
        return Status::invalid("the CUDA backend needs one dtype for an expert's three matrices");
      d.shared = ffn(L.shared);
    } else {
      d.mlp = ffn(L.mlp);
    }
    return d;
  };
  for (const LayerWeights& L : w.layers) {
    TF_ASSIGN_OR_RETURN(DevLayer d, layer(L));
    m->layers_.push_back(std::move(d));
  }
  if (w.mtp != nullptr) {
    m->mtp_ = std::make_unique<DevMtp>();
    m->mtp_->fc = mat(w.mtp->fc);
    m->mtp_->pre_fc_norm_embedding = upload(w.mtp->pre_fc_norm_embedding);
    m->mtp_->pre_fc_norm_hidden = upload(w.mtp->pre_fc_norm_hidden);
    m->mtp_->norm = upload(w.mtp->norm);
    TF_ASSIGN_OR_RETURN(m->mtp_->layer, layer(w.mtp->layer));
  }
  m->finish_init();
  return m;
}

Result<std::unique_ptr<CudaModel>> CudaModel::create_dummy(const ModelConfig& c, uint64_t seed,
                                                           int device, bool mtp) {
  auto m = std::unique_ptr<CudaModel>(new CudaModel(c));
  if (Status st = init_device(m.get(), device); !st.is_ok()) return st;
  const cudaStream_t s = as_stream(m->stream_);
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim, r = Hv / Hk;
  // The bytes needed, checked against the free memory first (a Status, not an abort).
  // With an MTP head: fc and one attention + MoE layer.
  auto layer_bytes = [&](bool attention, bool moe) {
    return (attention ? 2 * H *
                            (c.num_attention_heads * c.head_dim * 3 +
                             2 * c.num_key_value_heads * c.head_dim)
                      : 2 * H * (Hk * (2 * Dk + 2 * r * Dv) + Hk * 2 * r + Hv * Dv)) +
           (moe ? 2 * H * (E + 3 * E * I + 3 * c.shared_expert_intermediate_size)
                : 2 * H * 3 * c.intermediate_size);
  };
  int64_t need = 2 * c.vocab_size * H * 2 + (mtp ? 2 * H * 2 * H + layer_bytes(true, true) : 0);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    need += layer_bytes(c.full_attention[i], c.is_moe_layer(i));
  size_t free_b = 0, total_b = 0;
  TF_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (static_cast<size_t>(need) + (size_t{2} << 30) > free_b)
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("dummy weights need {:.1f} GB, the device has {:.1f} GB free",
                              static_cast<double>(need) / 1e9, static_cast<double>(free_b) / 1e9));
  uint64_t tensor = seed * 1000003u;
  // Uniform with variance 1 / cols (a = sqrt(3 / cols)) keeps activations near unit scale.
  auto mat = [&](int64_t rows, int64_t cols) {
    DevMat d;
    d.dtype = DType::kBF16, d.rows = rows, d.cols = cols;
    d.bytes = DeviceArray<uint8_t>(static_cast<size_t>(rows * cols * 2));
    cuda::fill_uniform(DType::kBF16, d.bytes.data(), rows * cols, ++tensor,
                       std::sqrt(3.0f / static_cast<float>(cols)), 0.0f, s);
    return d;
  };
  auto vec = [&](int64_t n, float scale, float offset) {
    DeviceArray<float> a(static_cast<size_t>(n));
    cuda::fill_uniform(DType::kF32, a.data(), n, ++tensor, scale, offset, s);
    return a;
  };
  auto ffn = [&](int64_t inter) {
    return DevFfn{mat(inter, H), mat(inter, H), mat(H, inter), inter};
  };
  m->embed_ = std::make_unique<DevMat>(mat(c.vocab_size, H));
  cuda::fill_uniform(DType::kBF16, m->embed_->bytes.data(), c.vocab_size * H, ++tensor, 1.0f, 0.0f,
                     s);
  m->lm_head_ = std::make_unique<DevMat>(mat(c.vocab_size, H));
  m->final_norm_ = vec(H, 0.1f, 0.0f);
  auto layer = [&](bool attention, bool moe) {
    DevLayer d;
    d.full_attention = attention;
    d.moe = moe;
    d.input_norm = vec(H, 0.1f, 0.0f);  // zero-centred: scale 1 +- 0.1
    d.post_norm = vec(H, 0.1f, 0.0f);
    if (d.full_attention) {
      const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, D = c.head_dim;
      d.qkv = mat(nh * 2 * D + 2 * nkv * D, H);
      d.o_proj = mat(H, nh * D);
      d.q_norm = vec(D, 0.1f, 0.0f), d.k_norm = vec(D, 0.1f, 0.0f);
    } else {
      d.in_proj = mat(Hk * (2 * Dk + 2 * r * Dv) + Hk * 2 * r, H);
      d.out_proj = mat(H, Hv * Dv);
      d.conv = vec(c.conv_dim() * c.linear_conv_kernel_dim, 0.5f, 0.0f);
      d.dt_bias = vec(Hv, 0.5f, 0.0f);
      d.neg_exp_a = vec(Hv, 3.0f, -4.0f);  // -exp(A_log) in [-7, -1]
      d.gnorm = vec(Dv, 0.1f, 1.0f);
    }
    if (d.moe) {
      d.router = mat(E + 1, H);  // the last row is the shared expert's gate
      d.experts = DevFfn{mat(E * I, H), mat(E * I, H), mat(E * H, I), I};
      d.shared = ffn(c.shared_expert_intermediate_size);
    } else {
      d.mlp = ffn(c.intermediate_size);
    }
    return d;
  };
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    m->layers_.push_back(layer(c.full_attention[i], c.is_moe_layer(i)));
  if (mtp) {
    m->mtp_ = std::make_unique<DevMtp>();
    m->mtp_->fc = mat(H, 2 * H);
    m->mtp_->pre_fc_norm_embedding = vec(H, 0.1f, 0.0f);
    m->mtp_->pre_fc_norm_hidden = vec(H, 0.1f, 0.0f);
    m->mtp_->norm = vec(H, 0.1f, 0.0f);
    m->mtp_->layer = layer(true, true);
  }
  m->finish_init();
  return m;
}

CudaModel::~CudaModel() {
  drop_graphs();
  for (void* e : step_events_)
    if (e != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  device_heap().free(pinned_);
  for (auto* ring : {&table_stage_, &greedy_}) {
    for (PinnedSlot& p : *ring) {
      if (p.done != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(p.done));
      device_heap().free(p.host);
    }
  }
  if (stream_) cudaStreamDestroy(as_stream(stream_));
}

void CudaModel::drop_graphs() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
  graphs_.clear();
}

std::unique_ptr<DeviceState> CudaSequenceState::clone() const {
  TF_CUDA_REQUIRE(verify_base < 0 && chained_token_at < 0,
                  "clone(): a verify window is open or a chained token is unknown");
  auto c = std::make_unique<CudaSequenceState>();
  c->n_past = n_past;
  c->conv_rows = conv_rows;
  c->stream = stream;
  c->layers.resize(layers.size());
  auto copy = [](DeviceArray<float>& to, const DeviceArray<float>& from, size_t n) {
    to = DeviceArray<float>(n);
    if (n > 0)
      TF_CUDA_CHECK(
          cudaMemcpy(to.data(), from.data(), n * sizeof(float), cudaMemcpyDeviceToDevice));
  };
  // The first `rows` rows of an attention cache.
  auto copy_cache = [&](Layer& b, const Layer& a, int64_t rows) {
    if (a.capacity <= 0) return;
    const size_t kv_row = a.k.size() / static_cast<size_t>(a.capacity);
    b.capacity = rows;
    copy(b.k, a.k, rows * kv_row);
    copy(b.v, a.v, rows * kv_row);
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    const Layer& a = layers[i];
    Layer& b = c->layers[i];
    copy_cache(b, a, n_past);
    copy(b.conv, a.conv, a.conv.size());
    copy(b.S, a.S, a.S.size());
  }
  if (has_mtp) {  // the head's R rows, and the held H rows from row 0
    c->has_mtp = true;
    c->hidden_size = hidden_size;
    c->mtp_rows = mtp_rows;
    c->mtp_tokens = mtp_tokens;
    copy_cache(c->mtp, mtp, mtp_rows);
    const int64_t held = n_past - mtp_rows;
    if (held > 0) {
      c->hidden_cap = held;
      c->mtp_hidden = DeviceArray<float>(held * hidden_size);
      TF_CUDA_CHECK(cudaMemcpy(c->mtp_hidden.data(), mtp_hidden.data() + hidden_base * hidden_size,
                               held * hidden_size * sizeof(float), cudaMemcpyDeviceToDevice));
    }
  }
  // Device-to-device cudaMemcpy may return before the copy is done, and the model's stream does
  // not wait for the legacy stream (cudaStreamNonBlocking).
  TF_CUDA_CHECK(cudaDeviceSynchronize());
  return c;
}

size_t CudaSequenceState::bytes() const {
  size_t n = mtp.k.size() + mtp.v.size() + mtp_hidden.size();
  for (const Layer& l : layers)
    n +=
        l.k.size() + l.v.size() + l.conv.size() + l.S.size() + l.conv_hist.size() + l.S_hist.size();
  return n * sizeof(float);
}

void CudaSequenceState::rollback(int64_t n) {
  TF_CUDA_REQUIRE(
      verify_base >= 0 && verify_base < n && n <= n_past && n_past == verify_base + verify_T,
      "rollback(): outside the verify window of the last step");
  if (n < n_past) {
    const int64_t j = n - verify_base;  // tokens of the verify step that stay, 1 .. T-1
    const cudaStream_t s = as_stream(stream);
    // Each Gated DeltaNet layer's S after token j - 1 and its conv window after j tokens, in one
    // launch (cuda::copy_segments).
    std::vector<uint64_t> segs;
    for (Layer& l : layers) {
      if (l.S.size() == 0) continue;
      const size_t ns = l.S.size(), nc = l.conv.size(), C = conv_rows > 0 ? nc / conv_rows : 0;
      segs.insert(segs.end(), {addr(l.S.data()), addr(l.S_hist.data() + (j - 1) * ns), ns});
      if (nc > 0)
        segs.insert(segs.end(), {addr(l.conv.data()), addr(l.conv_hist.data() + j * C), nc});
    }
    if (rollback_segs.size() < segs.size()) rollback_segs = DeviceArray<uint64_t>(segs.size());
    // From pageable memory: the copy has read `segs` when this returns.
    TF_CUDA_CHECK(cudaMemcpyAsync(rollback_segs.data(), segs.data(), segs.size() * sizeof(uint64_t),
                                  cudaMemcpyHostToDevice, s));
    cuda::copy_segments(rollback_segs.data(), static_cast<int64_t>(segs.size() / 3), s);
    // The rejected tokens' H rows lie beyond n - R and are overwritten later.
    if (has_mtp) {
      TF_CUDA_REQUIRE(mtp_rows <= n - 1,
                      "rollback(): the MTP head's rows were synced in the window");
      mtp_tokens.resize(n - 1 - mtp_rows);
    }
    n_past = n;
  }
  verify_base = -1;
  verify_T = 0;
}

void CudaSequenceState::release_verify() {
  TF_CUDA_REQUIRE(verify_base < 0, "release_verify(): the verify window is open");
  for (Layer& l : layers) l.conv_hist = DeviceArray<float>(), l.S_hist = DeviceArray<float>();
}

CudaSequenceState CudaModel::new_state(bool mtp) const {
  const ModelConfig& c = config();
  TF_CUDA_REQUIRE(!mtp || has_mtp(), "new_state(mtp = true): the model has no MTP head");
  CudaSequenceState s;
  s.has_mtp = mtp;
  s.conv_rows = c.linear_conv_kernel_dim - 1;
  s.hidden_size = c.hidden_size;
  s.stream = stream_;
  s.layers.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.full_attention[i]) continue;
    const size_t conv = (c.linear_conv_kernel_dim - 1) * c.conv_dim();
    const size_t S = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
    s.layers[i].conv = DeviceArray<float>(conv);
    s.layers[i].S = DeviceArray<float>(S);
    if (conv > 0) TF_CUDA_CHECK(cudaMemset(s.layers[i].conv.data(), 0, conv * sizeof(float)));
    TF_CUDA_CHECK(cudaMemset(s.layers[i].S.data(), 0, S * sizeof(float)));
  }
  return s;
}

namespace {
// Replaces `a` by a buffer of `n` floats holding its first `keep` floats. The stream is drained
// before an old buffer is freed (a step may still read it); a state's first buffer (each new
// request's caches and verify history) replaces nothing and waits for nothing.
void regrow(DeviceArray<float>& a, size_t n, size_t keep, cudaStream_t s) {
  DeviceArray<float> b(n);
  if (keep > 0)
    TF_CUDA_CHECK(
        cudaMemcpyAsync(b.data(), a.data(), keep * sizeof(float), cudaMemcpyDeviceToDevice, s));
  if (a.data() != nullptr) TF_CUDA_CHECK(cudaStreamSynchronize(s));
  a = std::move(b);
}
// Grows the attention caches of layer `st` to hold `need` positions, keeping rows < keep.
void grow_cache(CudaSequenceState::Layer& st, int64_t need, int64_t keep, size_t kv_row,
                cudaStream_t s) {
  if (need <= st.capacity) return;
  const int64_t cap = std::max<int64_t>({need, 2 * st.capacity, 256});
  regrow(st.k, cap * kv_row, keep * kv_row, s);
  regrow(st.v, cap * kv_row, keep * kv_row, s);
  st.capacity = cap;
}
}  // namespace

void CudaModel::reserve(CudaSequenceState* st, int64_t positions) {
  const ModelConfig& c = config();
  const size_t kv_row = c.num_key_value_heads * c.head_dim;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (c.full_attention[i])
      grow_cache(st->layers[i], positions, st->n_past, kv_row, as_stream(stream_));
}

template <class T>
T* CudaModel::grow_tracked(DeviceArray<T>& a, size_t n) {
  if (a.size() < n) {
    a = DeviceArray<T>(std::max(n, a.size() * 2));
    ++generation_;
  }
  return a.data();
}

float* CudaModel::scratch(int slot, size_t count) {
  if (scratch_.size() <= static_cast<size_t>(slot)) scratch_.resize(slot + 1);
  return grow_tracked(scratch_[slot], count);
}

namespace {
// Verify steps of up to this many tokens (16 drafts) replay CUDA graphs.
constexpr size_t kMaxGraphVerify = 17;
// mtp_sync()s of up to this many rows (what a few streams' verify steps leave) replay CUDA graphs.
constexpr int64_t kMaxGraphSync = 32;
// MoE steps of up to this many tokens read each slot's expert (expert_gate_up / expert_down);
// larger ones group the slots by expert (grouped_experts), reading each expert once per 8 slots.
// 16 covers the verify steps of deep prompt-lookup drafts.
constexpr int64_t kSlotTokens = 16;
// Steps of up to this many tokens run a Gated DeltaNet layer's prep in one kernel (gdn_prep);
// longer ones (prompts) in three, whose norms run over all rows at once (the same bits).
constexpr int64_t kPrepTokens = 64;
// Scratch slots (each a distinct device buffer, grown on demand).
enum Slot : int {
  kX,
  kXn,
  kY,
  kProj,
  kQ,
  kGate,
  kO,
  kXc,
  kZ,
  kBeta,
  kG,
  kQq,
  kVv,
  kRouter,
  kRouteW,
  kFfnH,
  kExpertOut,
  kShared,
  kRows,
  kLogits,
  kMtpU,     // the head's fc input [M, 2H]
  kDraftH0,  // drafting: the head's output hidden states, two buffers taking turns [M, H]
  kDraftH1,
  kDraftProb,    // [steps, M] top probabilities
  kDraftLogits,  // [steps, M, V] (rows wanted by the caller) or [M, V]
  kArgmaxWork,   // cuda::argmax_rows's partial results
  kResid,        // one token's residual x + the mixer's output, formed by the router product
};

void matmul(const auto& W, const float* x, int64_t n, float* y, cudaStream_t s) {
  cuda::matmul(W.dtype, W.bytes.data(), W.rows, W.cols, x, n, y, s);
}
}  // namespace

// One step's tables in table_, in 8-byte words: ids int32 [N], rows int32 [R], starts int32
// [nseq + 1], pos int64 [N], then per attention layer k and v cache pointers [N] each, then per
// Gated DeltaNet layer conv and S state pointers [nseq] each and the verify history pointers
// conv_hist and S_hist [nseq] each (null outside verify steps), then per token the MTP head's
// hidden-row destination hid [N] (null for states without the head). Offsets depend on (N, nseq,
// R) only.
struct CudaModel::Table {
  int64_t ids, rows, starts, pos, kc, vc, conv, S, conv_hist, S_hist, hid, words;
  int64_t N, nseq;
  const uint64_t* base;
  Table(int64_t N_, int64_t nseq_, int64_t R, int64_t n_attn, int64_t n_gdn, const uint64_t* b)
      : N(N_), nseq(nseq_), base(b) {
    ids = 0;
    rows = ids + (N + 1) / 2;
    starts = rows + (R + 1) / 2;
    pos = starts + (nseq + 2) / 2;
    kc = pos + N;
    vc = kc + n_attn * N;
    conv = vc + n_attn * N;
    S = conv + n_gdn * nseq;
    conv_hist = S + n_gdn * nseq;
    S_hist = conv_hist + n_gdn * nseq;
    hid = S_hist + n_gdn * nseq;
    words = hid + N;
  }
  template <class T>
  T* at(int64_t off) const {
    return reinterpret_cast<T*>(const_cast<uint64_t*>(base) + off);
  }
};

int64_t CudaModel::prepare(std::span<const CudaStepInput> in, int64_t* N_out, int64_t* nseq_out,
                           bool* mtp_out, const int32_t* ids_on_device, bool staged) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  int64_t N = 0, R = 0;
  for (const auto& i : in) {
    const int64_t T = static_cast<int64_t>(i.tokens.size());
    TF_CUDA_REQUIRE(i.state->verify_base < 0,
                    "a state's verify window is open: call rollback() before its next step");
    N += T;
    R += T == 0 ? 0 : (i.all_logits || i.verify ? T : 1);
  }
  const int64_t nseq = static_cast<int64_t>(in.size());
  bool mtp = false;
  for (const auto& i : in) mtp = mtp || i.state->has_mtp;
  *N_out = N, *nseq_out = nseq, *mtp_out = mtp;
  if (N == 0) return 0;
  const size_t kv_row = c.num_key_value_heads * c.head_dim;
  const int64_t H = c.hidden_size, C = c.conv_dim(), K1 = c.linear_conv_kernel_dim - 1;
  const size_t S_size = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  for (const auto& i : in) {
    CudaSequenceState& st = *i.state;
    const int64_t T = static_cast<int64_t>(i.tokens.size());
    for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
      CudaSequenceState::Layer& l = st.layers[li];
      if (c.full_attention[li]) {
        grow_cache(l, st.n_past + T, st.n_past, kv_row, s);
      } else if (i.verify && T > 0) {  // history scratch, grown only
        const size_t nc = static_cast<size_t>((K1 + T) * C);
        if (l.conv_hist.size() < nc) regrow(l.conv_hist, nc, 0, s);
        if (l.S_hist.size() < T * S_size) regrow(l.S_hist, T * S_size, 0, s);
      }
    }
    if (st.has_mtp && T > 0) {
      // Room for the new tokens' H after the n_past - R held rows: the held rows move to row 0,
      // in place where they do not overlap their new place, else into a larger buffer.
      const int64_t held = st.n_past - st.mtp_rows;
      if (st.hidden_base + held + T > st.hidden_cap) {
        const size_t row = H * sizeof(float);
        if (held <= st.hidden_base && held + T <= st.hidden_cap) {
          if (held > 0)
            TF_CUDA_CHECK(cudaMemcpyAsync(st.mtp_hidden.data(),
                                          st.mtp_hidden.data() + st.hidden_base * H, held * row,
                                          cudaMemcpyDeviceToDevice, s));
        } else {
          const int64_t cap = std::max<int64_t>({2 * (held + T), 2 * st.hidden_cap, 64});
          DeviceArray<float> h(cap * H);
          if (held > 0)
            TF_CUDA_CHECK(cudaMemcpyAsync(h.data(), st.mtp_hidden.data() + st.hidden_base * H,
                                          held * row, cudaMemcpyDeviceToDevice, s));
          // Before the old buffer is freed (the first has none).
          if (st.mtp_hidden.data() != nullptr) TF_CUDA_CHECK(cudaStreamSynchronize(s));
          st.mtp_hidden = std::move(h);
          st.hidden_cap = cap;
        }
        st.hidden_base = 0;
      }
    }
  }
  Table tb(N, nseq, R, n_attn_, n_gdn_, nullptr);
  host_table_.assign(tb.words, 0);
  Table ht(N, nseq, R, n_attn_, n_gdn_, host_table_.data());
  int32_t* ids = ht.at<int32_t>(ht.ids);
  int32_t* rows = ht.at<int32_t>(ht.rows);
  int32_t* starts = ht.at<int32_t>(ht.starts);
  int64_t* pos = ht.at<int64_t>(ht.pos);
  int64_t t = 0, r = 0;
  for (int64_t q = 0; q < nseq; ++q) {
    const CudaStepInput& i = in[q];
    const int64_t T = static_cast<int64_t>(i.tokens.size());
    starts[q] = static_cast<int32_t>(t);
    CudaSequenceState& st = *i.state;
    // The mtp_hidden row of this step's first token's H.
    const int64_t hrow = st.hidden_base + st.n_past - st.mtp_rows;
    for (int64_t u = 0; u < T; ++u) {
      ids[t + u] = i.tokens[u];
      pos[t + u] = i.state->n_past + u;
      if (u == T - 1 || i.all_logits || i.verify) rows[r++] = static_cast<int32_t>(t + u);
      if (st.has_mtp) {  // H of this token, and the token as the input of the head's row p - 1
        host_table_[ht.hid + t + u] = addr(st.mtp_hidden.data() + (hrow + u) * H);
        if (st.n_past + u > 0) {
          if (ids_on_device != nullptr) {  // a chained step: its token comes later
            TF_CUDA_REQUIRE(st.chained_token_at < 0,
                            "a chained step on an MTP state whose last chained token is unknown");
            st.chained_token_at = static_cast<int64_t>(st.mtp_tokens.size());
          }
          st.mtp_tokens.push_back(i.tokens[u]);
        }
      }
      for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
        if (!c.full_attention[li]) continue;
        host_table_[ht.kc + ordinal_[li] * N + t + u] =
            reinterpret_cast<uint64_t>(i.state->layers[li].k.data());
        host_table_[ht.vc + ordinal_[li] * N + t + u] =
            reinterpret_cast<uint64_t>(i.state->layers[li].v.data());
      }
    }
    for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
      if (c.full_attention[li]) continue;
      host_table_[ht.conv + ordinal_[li] * nseq + q] =
          reinterpret_cast<uint64_t>(i.state->layers[li].conv.data());
      host_table_[ht.S + ordinal_[li] * nseq + q] =
          reinterpret_cast<uint64_t>(i.state->layers[li].S.data());
      if (i.verify && T > 0) {
        host_table_[ht.conv_hist + ordinal_[li] * nseq + q] =
            reinterpret_cast<uint64_t>(i.state->layers[li].conv_hist.data());
        host_table_[ht.S_hist + ordinal_[li] * nseq + q] =
            reinterpret_cast<uint64_t>(i.state->layers[li].S_hist.data());
      }
    }
    if (i.verify && T > 0) st.verify_base = st.n_past, st.verify_T = T;
    t += T;
  }
  starts[nseq] = static_cast<int32_t>(t);
  uint64_t* d = grow_tracked(table_, host_table_.size());
  const size_t bytes = host_table_.size() * sizeof(uint64_t);
  if (staged) {
    PinnedSlot& stage = table_stage_[table_next_];
    table_next_ ^= 1;
    std::memcpy(claim(stage, bytes), host_table_.data(), bytes);
    TF_CUDA_CHECK(cudaMemcpyAsync(d, stage.host, bytes, cudaMemcpyHostToDevice, s));
    mark(stage, stream_);
  } else {
    TF_CUDA_CHECK(cudaMemcpyAsync(d, host_table_.data(), bytes, cudaMemcpyHostToDevice, s));
  }
  if (ids_on_device != nullptr)  // the tokens are on the device already (launch_greedy, chained)
    TF_CUDA_CHECK(cudaMemcpyAsync(d + tb.ids, ids_on_device, N * sizeof(int32_t),
                                  cudaMemcpyDeviceToDevice, s));
  for (const auto& i : in) i.state->n_past += static_cast<int64_t>(i.tokens.size());
  return R;
}

void CudaModel::enqueue(int64_t N, int64_t nseq, int64_t R, bool mtp) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const Table tb(N, nseq, R, n_attn_, n_gdn_, table_.data());
  float* x = scratch(kX, N * H);
  float* xn = scratch(kXn, N * H);
  float* y = scratch(kY, N * H);
  float* const* hid = tb.at<float* const>(tb.hid);  // mtp: the final hidden rows' destinations
  cuda::embed_rows(embed_->dtype, embed_->bytes.data(), H, tb.at<int32_t>(tb.ids), N, x, s);
  cuda::rmsnorm_zc(x, layers_[0].input_norm.data(), N, H, eps, xn, s);
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const DevLayer& L = layers_[li];
    if (L.full_attention)
      attention_layer(L, tb, N, xn, y);
    else
      deltanet_layer(L, tb, N, nseq, xn, y);
    // The MLP's output joins the residual and is normed for the next layer (or the final norm,
    // row-local, so on every row) in its last kernel.
    const bool last = li + 1 == c.num_hidden_layers;
    const float* next = last ? final_norm_.data() : layers_[li + 1].input_norm.data();
    // The final hidden states H of the tokens of states keeping the MTP head (the input of its
    // cache rows, computed later by mtp_sync) leave with the last MoE layer's combine.
    float* const* rows = last && mtp && L.moe ? hid : nullptr;
    if (router_adds(L, N)) {
      mlp(L, N, x, xn, y, next, xn, /*mixer_out=*/y, rows);
      continue;
    }
    cuda::add_rmsnorm_zc(x, y, L.post_norm.data(), N, H, eps, xn, s);
    mlp(L, N, x, xn, y, next, xn, nullptr, rows);
  }
  // Then the logits rows. prepare() lists them in token order, so R == N means every token's row
  // in order (decode and verify steps): the product reads xn itself, one launch fewer.
  const float* h = xn;
  if (R != N) {
    float* g = scratch(kRows, R * H);
    cuda::gather_rows(xn, tb.at<int32_t>(tb.rows), R, H, g, s);
    h = g;
  }
  matmul(*lm_head_, h, R, scratch(kLogits, R * V), s);
  if (mtp && !layers_.back().moe) cuda::store_rows(xn, N, H, hid, s);
}

void CudaModel::run_graph(const std::vector<int64_t>& key, const std::function<void()>& enqueue) {
  const cudaStream_t s = as_stream(stream_);
  if (!graphs_on_) {
    enqueue();
    return;
  }
  if (graphs_gen_ != generation_) drop_graphs(), graphs_gen_ = generation_;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    TF_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(it->second), s));
    return;
  }
  // First use of this shape: run it, then capture the same launches for the next ones (the
  // buffers now have their sizes, so the capture allocates nothing).
  enqueue();
  if (graphs_gen_ != generation_) drop_graphs(), graphs_gen_ = generation_;
  cudaGraph_t graph;
  {
    std::lock_guard<std::mutex> lock(capture_mu_);
    TF_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    enqueue();
    TF_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  }
  TF_CUDA_REQUIRE(graphs_gen_ == generation_, "a buffer grew while capturing a graph");
  cudaGraphExec_t exec;
  TF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TF_CUDA_CHECK(cudaGraphDestroy(graph));
  graphs_.emplace(key, exec);
  ++captures_;
}

residency::CudaApi CudaModel::residency_api() {
  residency::CudaApi a;
  const int device = device_;
  a.device_alloc = [device](void** p, size_t n) {
    cudaError_t e = cudaSetDevice(device);
    return static_cast<int>(e != cudaSuccess ? e : cudaMalloc(p, n));
  };
  a.device_free = [](void* p) { return static_cast<int>(cudaFree(p)); };
  a.copy_sync = [this](void* dst, const void* src, size_t n) {
    std::lock_guard<std::mutex> lock(capture_mu_);
    const cudaStream_t s = as_stream(stream_);
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s);
    return static_cast<int>(e != cudaSuccess ? e : cudaStreamSynchronize(s));
  };
  a.error_string = [](int e) {
    return std::string(cudaGetErrorString(static_cast<cudaError_t>(e)));
  };
  return a;
}

size_t CudaModel::device_memory_bytes() const {
  size_t free_b = 0, total_b = 0;
  TF_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b;
}

int64_t CudaModel::step(std::span<const CudaStepInput> in, const int32_t* ids, bool staged) {
  // Decode rows and verify steps (the engine's steady state) replay a graph per shape; prompt
  // pieces, whose shapes vary, launch their kernels.
  bool graph = true;
  for (const auto& i : in) {
    const size_t T = i.tokens.size();
    graph = graph && (i.verify ? T <= kMaxGraphVerify : T == 1 && !i.all_logits);
  }
  int64_t N = 0, nseq = 0;
  bool mtp = false;
  const cudaStream_t s = as_stream(stream_);
  const bool timed = step_events_[0] != nullptr;
  if (timed) TF_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(step_events_[0]), s));
  const int64_t R = prepare(in, &N, &nseq, &mtp, ids, staged);
  if (N == 0) return 0;
  auto run = [&] { enqueue(N, nseq, R, mtp); };
  if (timed) TF_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(step_events_[1]), s));
  if (graph)
    run_graph({0, N, nseq, R, mtp}, run);
  else
    run();
  if (timed) TF_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(step_events_[2]), s));
  // The head's rows of states with kMtpSyncRows or more due (never inside a verify window, whose
  // rejected tokens would leave rows behind).
  std::vector<CudaSequenceState*> due;
  for (const auto& i : in)
    if (i.state->has_mtp && !i.verify && i.state->chained_token_at < 0 &&
        i.state->mtp_tokens.size() >= kMtpSyncRows)
      due.push_back(i.state);
  if (!due.empty()) mtp_sync(due);
  return R;
}

void CudaModel::forward(std::span<const CudaStepInput> inputs, std::vector<float>* logits) {
  TF_CUDA_REQUIRE(greedy_n_ == 0, "forward: a launched step is not taken");
  const cudaStream_t s = as_stream(stream_);
  const int64_t R = step(inputs), V = config().vocab_size;
  greedy_rows_ = -1;  // no argmax: no chained launch may follow
  if (R == 0) return;
  // Through pinned memory: a copy from the device into pageable memory runs at a fraction of the
  // bus speed (0.6 MB per row at vocabulary 151936).
  const size_t bytes = R * V * sizeof(float);
  void* host = pinned(bytes);
  TF_CUDA_CHECK(cudaMemcpyAsync(host, scratch_[kLogits].data(), bytes, cudaMemcpyDeviceToHost, s));
  TF_CUDA_CHECK(cudaStreamSynchronize(s));
  const size_t first = logits->size();
  logits->resize(first + R * V);
  std::memcpy(logits->data() + first, host, bytes);
}

void* CudaModel::pinned(size_t bytes) {
  if (pinned_bytes_ < bytes) {
    device_heap().free(pinned_);
    pinned_bytes_ = std::max(bytes, 2 * pinned_bytes_);
    pinned_ = device_heap().alloc(pinned_bytes_, BufferKind::kHost);
  }
  return pinned_;
}

void CudaModel::forward_greedy(std::span<const CudaStepInput> inputs,
                               std::vector<int32_t>* tokens) {
  TF_CUDA_REQUIRE(greedy_n_ == 0, "forward_greedy: a launched step is not taken");
  const cudaStream_t s = as_stream(stream_);
  const int64_t R = step(inputs);
  greedy_rows_ = R;  // a chained launch may follow (its tokens: this step's argmax_)
  if (R == 0) return;
  const int32_t* d = argmax_rows(R);
  // Through pinned memory too: a pageable destination makes even these few bytes a staged copy.
  auto* host = static_cast<int32_t*>(pinned(R * sizeof(int32_t)));
  TF_CUDA_CHECK(cudaMemcpyAsync(host, d, R * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  if (step_events_[0] != nullptr) {
    TF_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(step_events_[3]), s));
    TF_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(step_events_[3])));
    add_step_times();
  }
  TF_CUDA_CHECK(cudaStreamSynchronize(s));
  tokens->insert(tokens->end(), host, host + R);
}

const int32_t* CudaModel::argmax_rows(int64_t R) {
  const int64_t V = config().vocab_size;
  int32_t* d = grow_tracked(argmax_, R);
  cuda::argmax_rows(scratch_[kLogits].data(), R, V, d, as_stream(stream_), nullptr,
                    scratch(kArgmaxWork, cuda::argmax_work_floats(R, V)));
  return d;
}

void* CudaModel::claim(PinnedSlot& p, size_t bytes) {
  if (p.done != nullptr) TF_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(p.done)));
  if (p.bytes < bytes) {
    device_heap().free(p.host);
    p.bytes = std::max(bytes, 2 * p.bytes);
    p.host = device_heap().alloc(p.bytes, BufferKind::kHost);
  }
  return p.host;
}

void CudaModel::mark(PinnedSlot& p, void* stream) {
  if (p.done == nullptr) {
    cudaEvent_t e;
    TF_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    p.done = e;
  }
  TF_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(p.done), as_stream(stream)));
}

void CudaModel::launch_greedy(std::span<const CudaStepInput> inputs, bool chained) {
  const cudaStream_t s = as_stream(stream_);
  TF_CUDA_REQUIRE(greedy_n_ < 2, "launch_greedy: two steps launched and not taken");
  const bool timed = step_events_[0] != nullptr;
  if (chained) {
    TF_CUDA_REQUIRE(greedy_rows_ == static_cast<int64_t>(inputs.size()),
                    "launch_greedy(chained): not as many rows as the step before");
    TF_CUDA_REQUIRE(!timed, "launch_greedy(chained): step times are taken one step at a time");
    for (const CudaStepInput& i : inputs)
      TF_CUDA_REQUIRE(i.tokens.size() == 1 && !i.verify && !i.all_logits,
                      "launch_greedy(chained): a row that is not one token");
  }
  // The previous step's argmax (argmax_, row i its row i's token), before this step's tables
  // land: prepare() copies them (ids written from `inputs`) and the chained ids overwrite theirs.
  const int32_t* previous = argmax_.data();
  const int64_t R = step(inputs, chained ? previous : nullptr, /*staged=*/true);
  greedy_rows_ = R;
  PinnedSlot& out = greedy_[(greedy_first_ + greedy_n_) % 2];
  out.rows = R;
  ++greedy_n_;
  if (R == 0) return;
  const int32_t* d = argmax_rows(R);
  // Through pinned memory: a pageable destination makes even these few bytes a staged copy.
  TF_CUDA_CHECK(cudaMemcpyAsync(claim(out, R * sizeof(int32_t)), d, R * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, s));
  if (timed) TF_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(step_events_[3]), s));
  mark(out, stream_);
}

void CudaModel::take_greedy(std::vector<int32_t>* tokens) {
  TF_CUDA_REQUIRE(greedy_n_ > 0, "take_greedy: no step launched");
  PinnedSlot& out = greedy_[greedy_first_];
  greedy_first_ = (greedy_first_ + 1) % 2;
  --greedy_n_;
  if (out.rows == 0) return;
  TF_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(out.done)));
  if (step_events_[0] != nullptr) add_step_times();
  const auto* host = static_cast<const int32_t*>(out.host);
  tokens->insert(tokens->end(), host, host + out.rows);
}

void CudaModel::add_step_times() {
  auto ev = [&](int i) { return static_cast<cudaEvent_t>(step_events_[i]); };
  float a = 0, b = 0, c = 0;
  TF_CUDA_CHECK(cudaEventElapsedTime(&a, ev(0), ev(1)));
  TF_CUDA_CHECK(cudaEventElapsedTime(&b, ev(1), ev(2)));
  TF_CUDA_CHECK(cudaEventElapsedTime(&c, ev(2), ev(3)));
  ++step_times_.steps;
  step_times_.to_graph_ms += a, step_times_.graph_ms += b, step_times_.argmax_ms += c;
}

void CudaModel::set_chained_token(CudaSequenceState* st, int32_t token) {
  TF_CUDA_REQUIRE(st->chained_token_at >= 0, "set_chained_token: no chained token waits");
  st->mtp_tokens[st->chained_token_at] = token;
  st->chained_token_at = -1;
}

void CudaModel::set_step_times(bool on) {
  step_times_ = StepTimes{};
  for (void*& e : step_events_) {
    if (on && e == nullptr) {
      cudaEvent_t ev;
      TF_CUDA_CHECK(cudaEventCreate(&ev));
      e = ev;
    } else if (!on && e != nullptr) {
      TF_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(e)));
      e = nullptr;
    }
  }
}

// ---- the MTP head ---------------------------------------------------------------------------

void CudaModel::mtp_in(const int32_t* ids, const float* hid, int64_t M, float* x, float* xn) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const DevMtp& m = *mtp_;
  float* u = scratch(kMtpU, M * 2 * H);
  cuda::mtp_input(embed_->dtype, embed_->bytes.data(), ids, hid, m.pre_fc_norm_embedding.data(),
                  m.pre_fc_norm_hidden.data(), M, H, eps, u, s);
  matmul(m.fc, u, M, x, s);
  cuda::rmsnorm_zc(x, m.layer.input_norm.data(), M, H, eps, xn, s);
}

void CudaModel::mtp_attention(const int64_t* pos, float* const* kc, float* const* vc, int64_t M,
                              const float* xn, float* y) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const DevLayer& L = mtp_->layer;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, D = c.head_dim;
  float* qkv = scratch(kProj, M * L.qkv.rows);
  matmul(L.qkv, xn, M, qkv, s);
  float* q = scratch(kQ, M * nh * D);
  float* gate = scratch(kGate, M * nh * D);
  cuda::attn_prep(qkv, M, nh, nkv, D, c.rotary_dim(), L.q_norm.data(), L.k_norm.data(),
                  static_cast<float>(c.rms_norm_eps), inv_freq_.data(), pos, q, gate, kc, vc, s);
  if (y == nullptr) return;  // cache rows only (a step's rows of the head)
  float* o = scratch(kO, M * nh * D);
  cuda::attention_table(q, M, pos, kc, vc, nh, nkv, D, 1.0f / std::sqrt(static_cast<float>(D)),
                        gate, o, s);
  matmul(L.o_proj, o, M, y, s);
}

namespace {
// draft()'s table, in 8-byte words: int32 ids [M], int64 pos [steps, M], then cache pointers kc,
// vc [M] and the hidden input's source src [M] (each row's H[n_past - 1]).
struct DraftTable {
  int64_t M, ids = 0, pos, kc, vc, src, words;
  DraftTable(int64_t M_, int64_t steps) : M(M_) {
    pos = (M + 1) / 2;
    kc = pos + steps * M;
    vc = kc + M;
    src = vc + M;
    words = src + M;
  }
};
}  // namespace

void CudaModel::mtp_sync(std::span<CudaSequenceState* const> states) {
  TF_CUDA_REQUIRE(has_mtp(), "mtp_sync(): the model has no MTP head");
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t H = c.hidden_size;
  const size_t kv_row = c.num_key_value_heads * c.head_dim;
  int64_t M = 0;
  for (const CudaSequenceState* st : states) {
    TF_CUDA_REQUIRE(st->has_mtp && st->verify_base < 0 && st->chained_token_at < 0,
                    "mtp_sync(): needs an MTP state with its window closed and every token known");
    M += static_cast<int64_t>(st->mtp_tokens.size());
  }
  if (M == 0) return;
  // Pending row i of a state: position R + i, from H[R + i] (mtp_hidden row hidden_base + i) and
  // x[R + i + 1] (mtp_tokens[i]).
  const DraftTable tb(M, 1);
  host_sync_table_.assign(tb.words, 0);
  uint64_t* w = host_sync_table_.data();
  int64_t r = 0;
  for (CudaSequenceState* st : states) {
    const int64_t n = static_cast<int64_t>(st->mtp_tokens.size()), R = st->mtp_rows;
    if (n == 0) continue;
    TF_CUDA_REQUIRE(R + n + 1 == st->n_past, "MTP state: rows + pending + 1 != n_past");
    grow_cache(st->mtp, R + n, R, kv_row, s);
    for (int64_t i = 0; i < n; ++i, ++r) {
      reinterpret_cast<int32_t*>(w + tb.ids)[r] = st->mtp_tokens[i];
      reinterpret_cast<int64_t*>(w + tb.pos)[r] = R + i;
      w[tb.kc + r] = addr(st->mtp.k.data());
      w[tb.vc + r] = addr(st->mtp.v.data());
      w[tb.src + r] = addr(st->mtp_hidden.data() + (st->hidden_base + i) * H);
    }
    st->mtp_rows = R + n;
    st->hidden_base += n;
    st->mtp_tokens.clear();
  }
  uint64_t* d = grow_tracked(sync_table_, tb.words);
  // From pageable memory: the copy has read the host table when this returns.
  TF_CUDA_CHECK(cudaMemcpyAsync(d, w, tb.words * sizeof(uint64_t), cudaMemcpyHostToDevice, s));
  auto run = [&] { enqueue_mtp_rows(M, d); };
  if (M <= kMaxGraphSync)
    run_graph({2, M}, run);
  else
    run();
}

void CudaModel::enqueue_mtp_rows(int64_t M, const uint64_t* d) {
  const int64_t H = config().hidden_size;
  const DraftTable tb(M, 1);
  auto at = [&](int64_t off) { return const_cast<uint64_t*>(d) + off; };
  // §6: each row's input pair (H[p], x[p + 1]) through fc to the layer's k and v (x and xn are
  // scratch here).
  float* hid = scratch(kDraftH0, M * H);
  cuda::load_rows(reinterpret_cast<const float* const*>(at(tb.src)), M, H, hid, as_stream(stream_));
  mtp_in(reinterpret_cast<const int32_t*>(at(tb.ids)), hid, M, scratch(kX, M * H),
         scratch(kXn, M * H));
  mtp_attention(reinterpret_cast<const int64_t*>(at(tb.pos)),
                reinterpret_cast<float* const*>(at(tb.kc)),
                reinterpret_cast<float* const*>(at(tb.vc)), M, scratch(kXn, M * H), nullptr);
}

void CudaModel::enqueue_draft(const std::vector<int64_t>& ks, bool want_logits, const uint64_t* d) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t H = c.hidden_size, V = c.vocab_size, M1 = static_cast<int64_t>(ks.size());
  const int64_t steps = ks.front();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const DraftTable tb(M1, steps);
  auto at = [&](int64_t off) { return const_cast<uint64_t*>(d) + off; };
  int32_t* tok = grow_tracked(draft_tok_, steps * M1);
  float* prob = scratch(kDraftProb, steps * M1);
  float* logits = scratch(kDraftLogits, (want_logits ? steps : 1) * M1 * V);
  float* x = scratch(kX, M1 * H);
  float* xn = scratch(kXn, M1 * H);
  float* y = scratch(kY, M1 * H);
  float* hbuf[2] = {scratch(kDraftH0, M1 * H), scratch(kDraftH1, M1 * H)};
  cuda::load_rows(reinterpret_cast<const float* const*>(at(tb.src)), M1, H, hbuf[0], s);
  const DevLayer& L = mtp_->layer;
  for (int64_t step = 0; step < steps; ++step) {
    int64_t M = 0;  // rows still drafting: a prefix, ks descending
    while (M < M1 && ks[M] > step) ++M;
    const int32_t* ids =
        step == 0 ? reinterpret_cast<const int32_t*>(at(tb.ids)) : tok + (step - 1) * M1;
    float* hout = hbuf[(step + 1) % 2];
    // One decoder layer of the head (§6.1): fc, gated attention over its own cache, MoE, norm.
    mtp_in(ids, hbuf[step % 2], M, x, xn);
    mtp_attention(reinterpret_cast<const int64_t*>(at(tb.pos)) + step * M1,
                  reinterpret_cast<float* const*>(at(tb.kc)),
                  reinterpret_cast<float* const*>(at(tb.vc)), M, xn, y);
    cuda::add_rmsnorm_zc(x, y, L.post_norm.data(), M, H, eps, xn, s);
    mlp(L, M, x, xn, y, mtp_->norm.data(), hout);
    float* lg = logits + (want_logits ? step * M1 * V : 0);
    matmul(*lm_head_, hout, M, lg, s);
    cuda::argmax_rows(lg, M, V, tok + step * M1, s, prob + step * M1,
                      scratch(kArgmaxWork, cuda::argmax_work_floats(M1, V)));
  }
}

void CudaModel::draft(std::span<const DraftInput> inputs, std::span<Draft> out) {
  TF_CUDA_REQUIRE(inputs.size() == out.size() && has_mtp(), "draft(): inputs and outputs");
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const size_t kv_row = c.num_key_value_heads * c.head_dim;
  // Rows in order of max_tokens, largest first, so that the rows still drafting at step s are a
  // prefix of those at step s - 1 (their ids and hidden states are that step's first rows).
  std::vector<size_t> order;
  bool want_logits = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& d = inputs[i];
    const auto* st = static_cast<const CudaSequenceState*>(d.state->device.get());
    TF_CUDA_REQUIRE(st->has_mtp && st->n_past >= 1 && st->verify_base < 0,
                    "draft(): needs an MTP state after a step with its window closed");
    out[i] = Draft{};
    if (d.max_tokens <= 0) continue;
    order.push_back(i);
    want_logits = want_logits || d.want_logits;
  }
  if (order.empty()) return;
  std::vector<CudaSequenceState*> states;
  for (size_t i : order)
    states.push_back(static_cast<CudaSequenceState*>(inputs[i].state->device.get()));
  mtp_sync(states);  // each now holds n_past - 1 rows and H[n_past - 1] at row hidden_base
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return inputs[a].max_tokens > inputs[b].max_tokens; });
  const int64_t M1 = static_cast<int64_t>(order.size());
  std::vector<int64_t> ks;
  for (size_t i : order) ks.push_back(inputs[i].max_tokens);
  const int64_t steps = ks.front();
  const DraftTable tb(M1, steps);
  host_draft_table_.assign(tb.words, 0);
  uint64_t* w = host_draft_table_.data();
  for (int64_t r = 0; r < M1; ++r) {
    const DraftInput& d = inputs[order[r]];
    auto& st = *static_cast<CudaSequenceState*>(d.state->device.get());
    // Step s writes the head's scratch row at position n_past - 1 + s (beyond its n_past - 1
    // rows: dropped, and overwritten by later steps).
    grow_cache(st.mtp, st.n_past - 1 + d.max_tokens, st.n_past - 1, kv_row, s);
    reinterpret_cast<int32_t*>(w + tb.ids)[r] = d.next_token;
    for (int64_t step = 0; step < steps; ++step)
      reinterpret_cast<int64_t*>(w + tb.pos)[step * M1 + r] = st.n_past - 1 + step;
    w[tb.kc + r] = addr(st.mtp.k.data());
    w[tb.vc + r] = addr(st.mtp.v.data());
    w[tb.src + r] = addr(st.mtp_hidden.data() + st.hidden_base * H);
  }
  uint64_t* d = grow_tracked(draft_table_, tb.words);
  // From pageable memory: the copy has read the host table when this returns.
  TF_CUDA_CHECK(cudaMemcpyAsync(d, w, tb.words * sizeof(uint64_t), cudaMemcpyHostToDevice, s));
  std::vector<int64_t> key = {1, want_logits};
  key.insert(key.end(), ks.begin(), ks.end());
  run_graph(key, [&] { enqueue_draft(ks, want_logits, d); });

  std::vector<int32_t> htok(steps * M1);
  std::vector<float> hprob(steps * M1), hlog(want_logits ? steps * M1 * V : 0);
  TF_CUDA_CHECK(cudaMemcpyAsync(htok.data(), draft_tok_.data(), htok.size() * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, s));
  TF_CUDA_CHECK(cudaMemcpyAsync(hprob.data(), scratch_[kDraftProb].data(),
                                hprob.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
  if (want_logits)
    TF_CUDA_CHECK(cudaMemcpyAsync(hlog.data(), scratch_[kDraftLogits].data(),
                                  hlog.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
  TF_CUDA_CHECK(cudaStreamSynchronize(s));
  // The gate: a row's drafts end before its first one below p_min (the later ones are dropped).
  for (int64_t r = 0; r < M1; ++r) {
    const DraftInput& in = inputs[order[r]];
    Draft& o = out[order[r]];
    for (int step = 0; step < in.max_tokens; ++step) {
      const int64_t at = step * M1 + r;
      if (hprob[at] < in.p_min) break;
      o.tokens.push_back(htok[at]);
      o.top_prob.push_back(hprob[at]);
      if (in.want_logits) o.logits.insert(o.logits.end(), &hlog[at * V], &hlog[(at + 1) * V]);
    }
  }
}

void CudaModel::attention_layer(const DevLayer& L, const Table& tb, int64_t N, const float* xn,
                                float* y) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, D = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* qkv = scratch(kProj, N * L.qkv.rows);
  matmul(L.qkv, xn, N, qkv, s);
  float* q = scratch(kQ, N * nh * D);
  float* gate = scratch(kGate, N * nh * D);
  const int64_t* pos = tb.at<int64_t>(tb.pos);
  const int64_t la = ordinal_[&L - layers_.data()];
  float* const* kc = tb.at<float* const>(tb.kc + la * N);
  float* const* vc = tb.at<float* const>(tb.vc + la * N);
  cuda::attn_prep(qkv, N, nh, nkv, D, c.rotary_dim(), L.q_norm.data(), L.k_norm.data(), eps,
                  inv_freq_.data(), pos, q, gate, kc, vc, s);
  float* o = scratch(kO, N * nh * D);
  cuda::attention_table(q, N, pos, kc, vc, nh, nkv, D, 1.0f / std::sqrt(static_cast<float>(D)),
                        gate, o, s);
  matmul(L.o_proj, o, N, y, s);
}

void CudaModel::deltanet_layer(const DevLayer& L, const Table& tb, int64_t N, int64_t nseq,
                               const float* xn, float* y) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim, r = Hv / Hk;
  const int64_t kd = Hk * Dk;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* PB = scratch(kProj, N * L.in_proj.rows);
  matmul(L.in_proj, xn, N, PB, s);
  float* z = scratch(kZ, N * Hv * Dv);
  float* beta = scratch(kBeta, N * Hv);
  float* g = scratch(kG, N * Hv);
  float* qq = scratch(kQq, 2 * N * kd);  // q rows, then k rows
  float* kk = qq + N * kd;
  float* vv = scratch(kVv, N * Hv * Dv);
  const int64_t lg = ordinal_[&L - layers_.data()];
  const int32_t* starts = tb.at<int32_t>(tb.starts);
  float* const* conv = tb.at<float* const>(tb.conv + lg * nseq);
  float* const* conv_hist = tb.at<float* const>(tb.conv_hist + lg * nseq);
  const int64_t K = c.linear_conv_kernel_dim;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(Dk));
  if (N <= kPrepTokens && Dk <= cuda::kGdnPrepMaxDim && Dv <= cuda::kGdnPrepMaxDim) {
    // One launch; a block per head walks its sequence's tokens.
    cuda::gdn_prep(PB, starts, conv, conv_hist, L.conv.data(), nseq, Hk, Dk, r, Dv, K,
                   L.dt_bias.data(), L.neg_exp_a.data(), q_scale, qq, kk, vv, z, beta, g, s);
  } else {  // prompts: the same bits in three launches, the norms over all rows at once
    float* xc = scratch(kXc, N * c.conv_dim());
    cuda::split_qkvz_gates(PB, N, Hk, Dk, r, Dv, L.dt_bias.data(), L.neg_exp_a.data(), xc, z, beta,
                           g, s);
    cuda::conv_silu_seqs(xc, starts, conv, conv_hist, L.conv.data(), nseq, c.conv_dim(), K, kd, qq,
                         kk, vv, s);
    cuda::l2norm_scale_qk(qq, N * Hk, N * Hk, Dk, 1e-6f, q_scale, s);
  }
  float* o = scratch(kO, N * Hv * Dv);
  cuda::delta_rule_seqs(qq, kk, vv, g, beta, starts, tb.at<float* const>(tb.S + lg * nseq),
                        tb.at<float* const>(tb.S_hist + lg * nseq), nseq, Hk, Hv, Dk, Dv, o, s);
  cuda::rmsnorm_gated(o, z, L.gnorm.data(), N * Hv, Dv, eps, o, s);
  matmul(L.out_proj, o, N, y, s);
}

void CudaModel::ffn(const DevFfn& f, const float* x, int64_t N, float* y) {
  const cudaStream_t s = as_stream(stream_);
  const int64_t H = config().hidden_size;
  for (int64_t t0 = 0; t0 < N; t0 += 65535) {  // the kernels' grid limit
    const int64_t n = std::min<int64_t>(N - t0, 65535);
    float* h = scratch(kFfnH, n * f.I);
    cuda::expert_gate_up(f.gate.dtype, f.gate.bytes.data(), f.up.bytes.data(), f.I, H, nullptr, 1,
                         x + t0 * H, n, h, s);
    cuda::expert_down(f.down.dtype, f.down.bytes.data(), H, f.I, nullptr, 1, h, n, y + t0 * H, s);
  }
}

bool CudaModel::slot_experts(const DevLayer& L, int64_t N) const {
  return N <= kSlotTokens && L.shared.I == L.experts.I &&
         L.shared.gate.dtype == L.experts.gate.dtype;
}

bool CudaModel::router_adds(const DevLayer& L, int64_t N) const {
  const int64_t H = config().hidden_size;
  return N == 1 && L.moe && L.router.dtype == DType::kBF16 && slot_experts(L, N) && H % 8 == 0 &&
         H <= cuda::kNormRowMaxCols;
}

void CudaModel::mlp(const DevLayer& L, int64_t N, float* x, float* xn, float* y, const float* norm,
                    float* out, const float* mixer_out, float* const* out_rows) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (!L.moe) {
    ffn(L.mlp, xn, N, y);
    cuda::add_rmsnorm_zc(x, y, norm, N, H, eps, out, s);
    return;
  }
  const DevFfn& X = L.experts;
  const DevFfn& S = L.shared;
  // Router logits and the shared expert's gate in one product: row t is [E logits | gate].
  float* logits = scratch(kRouter, N * (E + 1));
  // With mixer_out (router_adds): the residual's add and the post-mixer norm ride in the router
  // product, which stores x + mixer_out in x2 (the combine's residual input) and the normed row in
  // xn; the same bits as add_rmsnorm_zc, then the product (ops.h). One launch fewer per layer:
  // H100, 2026-12-06, the 80B-A3B shape's batch-1 decode 473.3-473.6 -> 486.5-490.6 tok/s.
  float* x2 = mixer_out != nullptr ? scratch(kResid, N * H) : nullptr;
  if (mixer_out != nullptr)
    cuda::matmul_add_rmsnorm(L.router.bytes.data(), E + 1, H, x, mixer_out, L.post_norm.data(), eps,
                             x2, xn, logits, s);
  else
    matmul(L.router, xn, N, logits, s);
  const float* gl = logits + E;  // at a stride of E + 1
  int32_t* ex = grow_tracked(route_ex_, N * k);
  float* w = scratch(kRouteW, N * k);
  cuda::route_topk(logits, N, E, E + 1, k, c.norm_topk_prob, ex, w, s);
  TF_CHECK(mixer_out == nullptr || slot_experts(L, N), "mixer_out off the slot path");
  if (slot_experts(L, N)) {
    // A few tokens (decode rows, verify steps): each slot reads its expert (a token's k experts
    // are distinct; tokens rarely share one), with no grouping pass, and the shared expert rides
    // along as slot k of the same two launches. The same bits as the grouped path.
    float* h = scratch(kFfnH, N * (k + 1) * X.I);
    float* o = scratch(kExpertOut, N * (k + 1) * H);
    cuda::expert_gate_up(X.gate.dtype, X.gate.bytes.data(), X.up.bytes.data(), X.I, H, ex, k, xn, N,
                         h, s, S.gate.bytes.data(), S.up.bytes.data());
    cuda::expert_down(X.down.dtype, X.down.bytes.data(), H, X.I, ex, k, h, N, o, s,
                      S.down.bytes.data(), /*follows_gate_up=*/true);
    cuda::moe_combine(o, ex, w, N, k, H, nullptr, /*shared_in_o=*/true, gl, E + 1, x, norm, eps,
                      out, s, x2, out_rows, /*routing_settled=*/true);
    return;
  }
  float* sh = scratch(kShared, N * H);
  ffn(S, xn, N, sh);
  // Routed experts, in chunks of tokens within the kernels' grid limits (slots = tokens * k).
  const int64_t chunk = std::max<int64_t>(1, 65535 / k);
  for (int64_t t0 = 0; t0 < N; t0 += chunk) {
    const int64_t n = std::min(N - t0, chunk);
    float* h = scratch(kFfnH, n * k * X.I);
    float* o = scratch(kExpertOut, n * k * H);
    if (n <= kSlotTokens) {  // the shared expert's shape differs, so it ran on its own above
      cuda::expert_gate_up(X.gate.dtype, X.gate.bytes.data(), X.up.bytes.data(), X.I, H,
                           ex + t0 * k, k, xn + t0 * H, n, h, s);
      cuda::expert_down(X.down.dtype, X.down.bytes.data(), H, X.I, ex + t0 * k, k, h, n, o, s,
                        nullptr, /*follows_gate_up=*/true);
    } else {  // each expert's weights read once per tile of up to 8 of its slots
      int32_t* sorted = grow_tracked(route_sorted_, n * k);
      int32_t* tiles = grow_tracked(route_tiles_, 4 * cuda::moe_max_tiles(n, k, E) + 1);
      int32_t* n_tiles = tiles + 4 * cuda::moe_max_tiles(n, k, E);
      cuda::moe_group(ex + t0 * k, n, k, E, sorted, tiles, n_tiles, s);
      cuda::grouped_experts(X.gate.dtype, X.gate.bytes.data(), X.up.bytes.data(),
                            X.down.bytes.data(), X.I, H, k, E, n, sorted, tiles, n_tiles,
                            xn + t0 * H, h, o, s);
    }
    cuda::moe_combine(o, ex + t0 * k, w + t0 * k, n, k, H, sh + t0 * H, false, gl + t0 * (E + 1),
                      E + 1, x + t0 * H, norm, eps, out + t0 * H, s, nullptr,
                      out_rows != nullptr ? out_rows + t0 : nullptr,
                      /*routing_settled=*/n <= kSlotTokens);
  }
}

}  // namespace tf
