#include "model/cuda_model.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cuda/check.h"
#include "backends/cuda/ops.h"

namespace tf {

namespace {
cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}
}  // namespace

// ---- DeviceArray
// ---------------------------------------------------------------------------------

template <class T>
DeviceArray<T>::DeviceArray(size_t count) : n_(count) {
  if (count > 0) TF_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), count * sizeof(T)));
}
template <class T>
DeviceArray<T>& DeviceArray<T>::operator=(DeviceArray&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = o.p_, n_ = o.n_;
    o.p_ = nullptr, o.n_ = 0;
  }
  return *this;
}
template <class T>
DeviceArray<T>::~DeviceArray() {
  if (p_) cudaFree(p_);
}
template class DeviceArray<float>;
template class DeviceArray<int32_t>;
template class DeviceArray<int64_t>;
template class DeviceArray<uint8_t>;

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
};
struct CudaModel::DevFfn {
  DevMat gate, up, down;
};
struct CudaModel::DevLayer {
  bool full_attention = false, moe = false;
  DeviceArray<float> input_norm, post_norm;
  DevMat q_proj, k_proj, v_proj, o_proj;
  DeviceArray<float> q_norm, k_norm;
  DevMat in_qkvz, in_ba, out_proj;
  DeviceArray<float> conv, dt_bias, neg_exp_a, gnorm;
  DevMat router;
  std::vector<DevFfn> experts;
  DevFfn shared, mlp;
  DevMat shared_gate;  // [1, H] f32
};

static void copy_mat(const Mat& m, DType* dtype, DeviceArray<uint8_t>* bytes, int64_t* rows,
                     int64_t* cols) {
  *rows = m.rows, *cols = m.cols;
  const size_t n = static_cast<size_t>(m.rows * m.cols);
  if (m.data == nullptr || n == 0) return;
  if (m.dtype == DType::kF16) {  // no f16 matmul on CUDA yet: widen to f32
    std::vector<float> f(n);
    const uint16_t* h = static_cast<const uint16_t*>(m.data);
    for (size_t i = 0; i < n; ++i) f[i] = f16_to_f32(h[i]);
    *dtype = DType::kF32;
    *bytes = upload(reinterpret_cast<const uint8_t*>(f.data()), n * sizeof(float));
    return;
  }
  *dtype = m.dtype;
  *bytes = upload(static_cast<const uint8_t*>(m.data), n * dtype_size(m.dtype));
}

Result<std::unique_ptr<CudaModel>> CudaModel::create(const Model& host, int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= device)
    return Status(StatusCode::kUnavailable,
                  fmt::format("no CUDA device {} ({} found)", device, count));
  TF_CUDA_CHECK(cudaSetDevice(device));
  const ModelConfig& c = host.config();
  const Weights& w = host.weights();
  if (c.hidden_size % 8 != 0 || c.head_dim * c.num_attention_heads % 8 != 0)
    return Status::invalid("the CUDA backend needs widths that are multiples of 8");
  auto m = std::unique_ptr<CudaModel>(new CudaModel(host));
  m->device_ = device;
  cudaStream_t s;
  TF_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  m->stream_ = s;
  auto mat = [](const Mat& src) {
    DevMat d;
    copy_mat(src, &d.dtype, &d.bytes, &d.rows, &d.cols);
    return d;
  };
  auto ffn = [&](const FfnWeights& f) { return DevFfn{mat(f.gate), mat(f.up), mat(f.down)}; };
  m->embed_ = std::make_unique<DevMat>(mat(w.embed));
  m->lm_head_ = std::make_unique<DevMat>(mat(w.lm_head));
  m->final_norm_ = upload(w.final_norm);
  std::vector<float> inv_freq;
  for (int64_t i = 0; i < c.rotary_dim() / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(c.rotary_dim());
    inv_freq.push_back(1.0f / static_cast<float>(std::pow(c.rope_theta, static_cast<double>(e))));
  }
  m->inv_freq_ = upload(inv_freq);
  for (const LayerWeights& L : w.layers) {
    DevLayer d;
    d.full_attention = L.full_attention;
    d.moe = L.moe;
    d.input_norm = upload(L.input_norm);
    d.post_norm = upload(L.post_norm);
    if (L.full_attention) {
      d.q_proj = mat(L.q_proj), d.k_proj = mat(L.k_proj), d.v_proj = mat(L.v_proj);
      d.o_proj = mat(L.o_proj);
      d.q_norm = upload(L.q_norm), d.k_norm = upload(L.k_norm);
    } else {
      d.in_qkvz = mat(L.in_qkvz), d.in_ba = mat(L.in_ba), d.out_proj = mat(L.out_proj);
      d.conv = upload(L.conv), d.dt_bias = upload(L.dt_bias);
      d.neg_exp_a = upload(L.neg_exp_a), d.gnorm = upload(L.gnorm);
    }
    if (L.moe) {
      d.router = mat(L.router);
      for (const FfnWeights& e : L.experts) d.experts.push_back(ffn(e));
      d.shared = ffn(L.shared);
      d.shared_gate = mat(Mat{DType::kF32, L.shared_gate.data(), 1, c.hidden_size});
    } else {
      d.mlp = ffn(L.mlp);
    }
    m->layers_.push_back(std::move(d));
  }
  TF_CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}

CudaModel::CudaModel(const Model& host) : host_(host) {}

CudaModel::~CudaModel() {
  if (stream_) cudaStreamDestroy(as_stream(stream_));
}

CudaSequenceState CudaModel::new_state() const {
  const ModelConfig& c = config();
  CudaSequenceState s;
  s.layers.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.full_attention[i]) continue;
    const size_t conv = (c.linear_conv_kernel_dim - 1) * c.conv_dim();
    const size_t S = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
    s.layers[i].conv = DeviceArray<float>(conv);
    s.layers[i].S = DeviceArray<float>(S);
    TF_CUDA_CHECK(cudaMemset(s.layers[i].conv.data(), 0, conv * sizeof(float)));
    TF_CUDA_CHECK(cudaMemset(s.layers[i].S.data(), 0, S * sizeof(float)));
  }
  return s;
}

float* CudaModel::scratch(int slot, size_t count) {
  if (scratch_.size() <= static_cast<size_t>(slot)) scratch_.resize(slot + 1);
  return grow(scratch_[slot], count);
}

namespace {
// Scratch slots (each a distinct device buffer, grown on demand).
enum Slot : int {
  kX,
  kXn,
  kY,
  kProj,
  kProj2,
  kProj3,
  kQ,
  kGate,
  kO,
  kXc,
  kZ,
  kB,
  kA,
  kBeta,
  kG,
  kHist,
  kConvOut,
  kQq,
  kKk,
  kVv,
  kRouter,
  kRouteW,
  kFfnG,
  kFfnU,
  kXe,
  kYe,
  kShared,
  kSharedGate,
  kRows,
  kLogits
};

void matmul(const auto& W, const float* x, int64_t n, float* y, cudaStream_t s) {
  cuda::matmul(W.dtype, W.bytes.data(), W.rows, W.cols, x, n, y, s);
}
}  // namespace

void CudaModel::forward(std::span<const CudaStepInput> inputs, std::vector<float>* logits) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<int32_t> ids;
  std::vector<int64_t> pos;
  for (const auto& in : inputs) {
    for (size_t t = 0; t < in.tokens.size(); ++t) {
      ids.push_back(in.tokens[t]);
      pos.push_back(in.state->n_past + static_cast<int64_t>(t));
    }
  }
  const int64_t N = static_cast<int64_t>(ids.size());
  if (N == 0) return;
  int32_t* d_ids = grow(ids_, N);
  TF_CUDA_CHECK(cudaMemcpyAsync(d_ids, ids.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  TF_CUDA_CHECK(
      cudaMemcpyAsync(grow(pos_, N), pos.data(), N * sizeof(int64_t), cudaMemcpyHostToDevice, s));
  float* x = scratch(kX, N * H);
  float* xn = scratch(kXn, N * H);
  float* y = scratch(kY, N * H);
  cuda::embed_rows(embed_->dtype, embed_->bytes.data(), H, d_ids, N, x, s);

  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const DevLayer& L = layers_[li];
    cuda::rmsnorm_zc(x, L.input_norm.data(), N, H, eps, xn, s);
    if (L.full_attention)
      attention_layer(L, li, inputs, xn, y);
    else
      deltanet_layer(L, li, inputs, xn, y);
    cuda::add(x, y, N * H, s);
    cuda::rmsnorm_zc(x, L.post_norm.data(), N, H, eps, xn, s);
    if (L.moe)
      moe(L, xn, N, y);
    else
      ffn(L.mlp, xn, N, y);
    cuda::add(x, y, N * H, s);
  }

  // Final norm and lm_head on the rows that want logits.
  std::vector<int32_t> rows;
  int64_t row = 0;
  for (const auto& in : inputs) {
    const int64_t T = static_cast<int64_t>(in.tokens.size());
    for (int64_t t = in.all_logits ? 0 : T - 1; t < T && T > 0; ++t)
      rows.push_back(static_cast<int32_t>(row + t));
    row += T;
    in.state->n_past += T;
  }
  const int64_t R = static_cast<int64_t>(rows.size()), V = c.vocab_size;
  int32_t* d_rows = grow(idx_, R);
  TF_CUDA_CHECK(
      cudaMemcpyAsync(d_rows, rows.data(), R * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  float* h = scratch(kRows, R * H);
  cuda::gather_rows(x, d_rows, R, H, h, s);
  cuda::rmsnorm_zc(h, final_norm_.data(), R, H, eps, h, s);
  float* d_logits = scratch(kLogits, R * V);
  matmul(*lm_head_, h, R, d_logits, s);
  const size_t first = logits->size();
  logits->resize(first + R * V);
  TF_CUDA_CHECK(cudaMemcpyAsync(logits->data() + first, d_logits, R * V * sizeof(float),
                                cudaMemcpyDeviceToHost, s));
  TF_CUDA_CHECK(cudaStreamSynchronize(s));
}

void CudaModel::attention_layer(const DevLayer& L, int64_t li, std::span<const CudaStepInput> in,
                                const float* xn, float* y) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, D = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  int64_t N = 0;
  for (const auto& i : in) N += static_cast<int64_t>(i.tokens.size());
  float* qg = scratch(kProj, N * nh * 2 * D);
  float* k = scratch(kProj2, N * nkv * D);
  float* v = scratch(kProj3, N * nkv * D);
  matmul(L.q_proj, xn, N, qg, s);
  matmul(L.k_proj, xn, N, k, s);
  matmul(L.v_proj, xn, N, v, s);
  // Each head's [query D | gate D] -> q, gate.
  float* q = scratch(kQ, N * nh * D);
  float* gate = scratch(kGate, N * nh * D);
  const size_t rowb = D * sizeof(float);
  TF_CUDA_CHECK(
      cudaMemcpy2DAsync(q, rowb, qg, 2 * rowb, rowb, N * nh, cudaMemcpyDeviceToDevice, s));
  TF_CUDA_CHECK(
      cudaMemcpy2DAsync(gate, rowb, qg + D, 2 * rowb, rowb, N * nh, cudaMemcpyDeviceToDevice, s));
  cuda::rmsnorm_zc(q, L.q_norm.data(), N * nh, D, eps, q, s);
  cuda::rmsnorm_zc(k, L.k_norm.data(), N * nkv, D, eps, k, s);
  cuda::rope_neox(q, N, nh, D, c.rotary_dim(), inv_freq_.data(), pos_.data(), s);
  cuda::rope_neox(k, N, nkv, D, c.rotary_dim(), inv_freq_.data(), pos_.data(), s);

  float* o = scratch(kO, N * nh * D);
  const size_t kv_row = nkv * D;
  int64_t row = 0;
  for (const auto& i : in) {
    const int64_t T = static_cast<int64_t>(i.tokens.size());
    CudaSequenceState::Layer& st = i.state->layers[li];
    const int64_t base = i.state->n_past;
    if (base + T > st.capacity) {  // grow the caches, keeping rows < base
      const int64_t cap = std::max<int64_t>({base + T, 2 * st.capacity, 256});
      DeviceArray<float> nk(cap * kv_row), nv(cap * kv_row);
      if (base > 0) {
        TF_CUDA_CHECK(cudaMemcpyAsync(nk.data(), st.k.data(), base * kv_row * sizeof(float),
                                      cudaMemcpyDeviceToDevice, s));
        TF_CUDA_CHECK(cudaMemcpyAsync(nv.data(), st.v.data(), base * kv_row * sizeof(float),
                                      cudaMemcpyDeviceToDevice, s));
      }
      TF_CUDA_CHECK(cudaStreamSynchronize(s));  // before the old buffers are freed
      st.k = std::move(nk), st.v = std::move(nv), st.capacity = cap;
    }
    TF_CUDA_CHECK(cudaMemcpyAsync(st.k.data() + base * kv_row, k + row * kv_row,
                                  T * kv_row * sizeof(float), cudaMemcpyDeviceToDevice, s));
    TF_CUDA_CHECK(cudaMemcpyAsync(st.v.data() + base * kv_row, v + row * kv_row,
                                  T * kv_row * sizeof(float), cudaMemcpyDeviceToDevice, s));
    cuda::attention(q + row * nh * D, T, pos_.data() + row, st.k.data(), st.v.data(), nh, nkv, D,
                    1.0f / std::sqrt(static_cast<float>(D)), o + row * nh * D, s);
    row += T;
  }
  cuda::mul_sigmoid(o, gate, N * nh * D, s);
  matmul(L.o_proj, o, N, y, s);
}

void CudaModel::deltanet_layer(const DevLayer& L, int64_t li, std::span<const CudaStepInput> in,
                               const float* xn, float* y) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim, r = Hv / Hk;
  const int64_t K = c.linear_conv_kernel_dim, C = c.conv_dim(), kd = Hk * Dk;
  const float eps = static_cast<float>(c.rms_norm_eps);
  int64_t N = 0;
  for (const auto& i : in) N += static_cast<int64_t>(i.tokens.size());
  float* P = scratch(kProj, N * Hk * (2 * Dk + 2 * r * Dv));
  float* BA = scratch(kProj2, N * Hk * 2 * r);
  matmul(L.in_qkvz, xn, N, P, s);
  matmul(L.in_ba, xn, N, BA, s);
  float* xc = scratch(kXc, N * C);
  float* z = scratch(kZ, N * Hv * Dv);
  float* b = scratch(kB, N * Hv);
  float* a = scratch(kA, N * Hv);
  cuda::split_qkvz(P, BA, N, Hk, Dk, r, Dv, xc, z, b, a, s);
  float* beta = scratch(kBeta, N * Hv);
  float* g = scratch(kG, N * Hv);
  cuda::gdn_gates(b, a, L.dt_bias.data(), L.neg_exp_a.data(), N, Hv, beta, g, s);

  float* o = scratch(kO, N * Hv * Dv);
  float* qq = scratch(kQq, N * kd);
  float* kk = scratch(kKk, N * kd);
  float* vv = scratch(kVv, N * Hv * Dv);
  const size_t cb = C * sizeof(float);
  int64_t row = 0;
  for (const auto& i : in) {
    const int64_t T = static_cast<int64_t>(i.tokens.size());
    CudaSequenceState::Layer& st = i.state->layers[li];
    // Causal conv over [K-1 history rows | T new rows]; the last K-1 rows become the history.
    float* hist = scratch(kHist, (K - 1 + T) * C);
    float* co = scratch(kConvOut, T * C);
    TF_CUDA_CHECK(cudaMemcpyAsync(hist, st.conv.data(), (K - 1) * cb, cudaMemcpyDeviceToDevice, s));
    TF_CUDA_CHECK(
        cudaMemcpyAsync(hist + (K - 1) * C, xc + row * C, T * cb, cudaMemcpyDeviceToDevice, s));
    cuda::causal_conv_silu(hist, L.conv.data(), T, C, K, co, s);
    TF_CUDA_CHECK(
        cudaMemcpyAsync(st.conv.data(), hist + T * C, (K - 1) * cb, cudaMemcpyDeviceToDevice, s));
    // Conv channels [q | k | v] -> contiguous q, k, v rows.
    TF_CUDA_CHECK(cudaMemcpy2DAsync(qq + row * kd, kd * sizeof(float), co, cb, kd * sizeof(float),
                                    T, cudaMemcpyDeviceToDevice, s));
    TF_CUDA_CHECK(cudaMemcpy2DAsync(kk + row * kd, kd * sizeof(float), co + kd, cb,
                                    kd * sizeof(float), T, cudaMemcpyDeviceToDevice, s));
    TF_CUDA_CHECK(cudaMemcpy2DAsync(vv + row * Hv * Dv, Hv * Dv * sizeof(float), co + 2 * kd, cb,
                                    Hv * Dv * sizeof(float), T, cudaMemcpyDeviceToDevice, s));
    row += T;
  }
  cuda::l2norm_scale(qq, N * Hk, Dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(Dk)), s);
  cuda::l2norm_scale(kk, N * Hk, Dk, 1e-6f, 1.0f, s);
  row = 0;
  for (const auto& i : in) {
    const int64_t T = static_cast<int64_t>(i.tokens.size());
    cuda::delta_rule_recurrent(qq + row * kd, kk + row * kd, vv + row * Hv * Dv, g + row * Hv,
                               beta + row * Hv, T, Hk, Hv, Dk, Dv, i.state->layers[li].S.data(),
                               o + row * Hv * Dv, s);
    row += T;
  }
  cuda::rmsnorm_gated(o, z, L.gnorm.data(), N * Hv, Dv, eps, o, s);
  matmul(L.out_proj, o, N, y, s);
}

void CudaModel::ffn(const DevFfn& f, const float* x, int64_t N, float* y) {
  const cudaStream_t s = as_stream(stream_);
  const int64_t I = f.gate.rows;
  float* g = scratch(kFfnG, N * I);
  float* u = scratch(kFfnU, N * I);
  matmul(f.gate, x, N, g, s);
  matmul(f.up, x, N, u, s);
  cuda::silu_mul(g, u, N * I, g, s);
  matmul(f.down, g, N, y, s);
}

void CudaModel::moe(const DevLayer& L, const float* xn, int64_t N, float* y) {
  const ModelConfig& c = config();
  const cudaStream_t s = as_stream(stream_);
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
  float* logits = scratch(kRouter, N * E);
  matmul(L.router, xn, N, logits, s);
  int32_t* d_ex = grow(route_ex_, N * k);
  float* d_w = scratch(kRouteW, N * k);
  cuda::route_topk(logits, N, E, k, c.norm_topk_prob, d_ex, d_w, s);
  std::vector<int32_t> ex(N * k);
  std::vector<float> wt(N * k);
  TF_CUDA_CHECK(
      cudaMemcpyAsync(ex.data(), d_ex, N * k * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  TF_CUDA_CHECK(cudaMemcpyAsync(wt.data(), d_w, N * k * sizeof(float), cudaMemcpyDeviceToHost, s));
  TF_CUDA_CHECK(cudaStreamSynchronize(s));
  // Per expert, its rows (ascending) and weights, packed expert after expert.
  std::vector<int32_t> rows;
  std::vector<float> weights;
  std::vector<int64_t> begin(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    begin[e] = static_cast<int64_t>(rows.size());
    for (int64_t t = 0; t < N; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        if (ex[t * k + j] == e)
          rows.push_back(static_cast<int32_t>(t)), weights.push_back(wt[t * k + j]);
      }
    }
  }
  begin[E] = static_cast<int64_t>(rows.size());
  int32_t* d_rows = grow(route_rows_, rows.size());
  float* d_rw = grow(route_w_, weights.size());
  TF_CUDA_CHECK(cudaMemcpyAsync(d_rows, rows.data(), rows.size() * sizeof(int32_t),
                                cudaMemcpyHostToDevice, s));
  TF_CUDA_CHECK(cudaMemcpyAsync(d_rw, weights.data(), weights.size() * sizeof(float),
                                cudaMemcpyHostToDevice, s));
  // Experts in ascending index order, so each row accumulates its experts in one fixed order.
  TF_CUDA_CHECK(cudaMemsetAsync(y, 0, N * H * sizeof(float), s));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = begin[e + 1] - begin[e];
    if (n == 0) continue;
    float* xe = scratch(kXe, n * H);
    float* ye = scratch(kYe, n * H);
    cuda::gather_rows(xn, d_rows + begin[e], n, H, xe, s);
    ffn(L.experts[e], xe, n, ye);
    cuda::scatter_add_scaled(ye, d_rows + begin[e], d_rw + begin[e], n, H, y, s);
  }
  // Shared expert, scaled by sigmoid(x . shared_gate) per row.
  float* sh = scratch(kShared, N * H);
  ffn(L.shared, xn, N, sh);
  float* gl = scratch(kSharedGate, N);
  matmul(L.shared_gate, xn, N, gl, s);
  cuda::add_gated(sh, gl, N, H, y, s);
}

}  // namespace tf
