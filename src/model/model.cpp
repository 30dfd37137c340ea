#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/cpu/ops.h"
#include "core/check.h"

namespace tf {

using cpu::matmul;

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const LoadProgress& progress) {
  auto m = std::unique_ptr<Model>(new Model());
  TF_ASSIGN_OR_RETURN(m->ckpt_, Checkpoint::open(dir));
  TF_ASSIGN_OR_RETURN(m->weights_, load_weights(*m->ckpt_, progress));
  const ModelConfig& c = m->config();
  // inv_freq[i] = theta^(-2i / rotary_dim), in float32 as transformers computes it.
  const int64_t rd = c.rotary_dim();
  for (int64_t i = 0; i < rd / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rd);
    m->inv_freq_.push_back(1.0f /
                           static_cast<float>(std::pow(c.rope_theta, static_cast<double>(e))));
  }
  return m;
}

size_t SequenceState::bytes() const {
  size_t n = 0;
  for (const Attention& a : attn) n += (a.k.capacity() + a.v.capacity()) * sizeof(float);
  for (const DeltaNet& d : delta) n += (d.conv.capacity() + d.S.capacity()) * sizeof(float);
  return n;
}

SequenceState Model::new_state(BufferObserver* observer) const {
  const ModelConfig& c = config();
  const TrackedAllocator<float> alloc(observer);
  SequenceState s;
  s.attn.resize(c.num_hidden_layers, SequenceState::Attention{FloatBuf(alloc), FloatBuf(alloc)});
  s.delta.resize(c.num_hidden_layers, SequenceState::DeltaNet{FloatBuf(alloc), FloatBuf(alloc)});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.full_attention[i]) continue;
    s.delta[i].conv.assign((c.linear_conv_kernel_dim - 1) * c.conv_dim(), 0.0f);
    s.delta[i].S.assign(c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim,
                        0.0f);
  }
  return s;
}

void Model::forward(std::span<const StepInput> inputs, std::vector<float>* logits,
                    ThreadPool* pool) const {
  const ModelConfig& c = config();
  const Weights& w = *weights_;
  const int64_t H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  int64_t N = 0;
  for (const auto& in : inputs) N += static_cast<int64_t>(in.tokens.size());
  if (N == 0) return;

  std::vector<float> x(N * H), xn(N * H), y(N * H);
  int64_t row = 0;
  for (const auto& in : inputs) {
    for (int32_t tok : in.tokens) cpu::row_to_f32(w.embed, tok, &x[row++ * H]);
  }

  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const LayerWeights& L = w.layers[li];
    cpu::rmsnorm_zc(x.data(), L.input_norm.data(), N, H, eps, xn.data());
    if (L.full_attention)
      attention_layer(L, li, inputs, xn.data(), y.data(), pool);
    else
      deltanet_layer(L, li, inputs, xn.data(), y.data(), pool);
    for (int64_t i = 0; i < N * H; ++i) x[i] += y[i];
    cpu::rmsnorm_zc(x.data(), L.post_norm.data(), N, H, eps, xn.data());
    if (L.moe)
      moe(L, xn.data(), N, y.data(), pool);
    else
      ffn(L.mlp, xn.data(), N, y.data(), pool);
    for (int64_t i = 0; i < N * H; ++i) x[i] += y[i];
  }

  // Final norm and lm_head on the rows that want logits.
  std::vector<int64_t> rows;
  row = 0;
  for (const auto& in : inputs) {
    const int64_t T = static_cast<int64_t>(in.tokens.size());
    if (T > 0) {
      for (int64_t t = in.all_logits ? 0 : T - 1; t < T; ++t) rows.push_back(row + t);
    }
    row += T;
    in.state->n_past += T;
  }
  std::vector<float> h(rows.size() * H);
  for (size_t i = 0; i < rows.size(); ++i) {
    cpu::rmsnorm_zc(&x[rows[i] * H], w.final_norm.data(), 1, H, eps, &h[i * H]);
  }
  const size_t first = logits->size();
  logits->resize(first + rows.size() * c.vocab_size);
  matmul(w.lm_head, h.data(), static_cast<int64_t>(rows.size()), logits->data() + first, pool);
}

void Model::attention_layer(const LayerWeights& L, int64_t li, std::span<const StepInput> inputs,
                            const float* xn, float* y, ThreadPool* pool) const {
  const ModelConfig& c = config();
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, D = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  int64_t N = 0;
  for (const auto& in : inputs) N += static_cast<int64_t>(in.tokens.size());

  std::vector<float> qg(N * nh * 2 * D), k(N * nkv * D), v(N * nkv * D);
  matmul(L.q_proj, xn, N, qg.data(), pool);
  matmul(L.k_proj, xn, N, k.data(), pool);
  matmul(L.v_proj, xn, N, v.data(), pool);
  // Split each head's [query D | gate D].
  std::vector<float> q(N * nh * D), gate(N * nh * D), o(N * nh * D);
  for (int64_t r = 0; r < N * nh; ++r) {
    std::copy_n(&qg[r * 2 * D], D, &q[r * D]);
    std::copy_n(&qg[r * 2 * D + D], D, &gate[r * D]);
  }
  cpu::rmsnorm_zc(q.data(), L.q_norm.data(), N * nh, D, eps, q.data());
  cpu::rmsnorm_zc(k.data(), L.k_norm.data(), N * nkv, D, eps, k.data());

  int64_t row = 0;
  std::vector<int64_t> pos;
  for (const auto& in : inputs) {
    const int64_t T = static_cast<int64_t>(in.tokens.size());
    SequenceState::Attention& cache = in.state->attn[li];
    const int64_t base = in.state->n_past;
    TF_CHECK(static_cast<int64_t>(cache.k.size()) == base * nkv * D,
             "layer {}: cache has {} floats, n_past {}", li, cache.k.size(), base);
    pos.resize(T);
    for (int64_t t = 0; t < T; ++t) {
      pos[t] = base + t;
      cpu::rope_neox(&q[(row + t) * nh * D], nh, D, c.rotary_dim(), inv_freq_.data(), pos[t]);
      cpu::rope_neox(&k[(row + t) * nkv * D], nkv, D, c.rotary_dim(), inv_freq_.data(), pos[t]);
    }
    cache.k.insert(cache.k.end(), k.begin() + row * nkv * D, k.begin() + (row + T) * nkv * D);
    cache.v.insert(cache.v.end(), v.begin() + row * nkv * D, v.begin() + (row + T) * nkv * D);
    cpu::attention(&q[row * nh * D], T, pos.data(), cache.k.data(), cache.v.data(), nh, nkv, D,
                   1.0f / std::sqrt(static_cast<float>(D)), &o[row * nh * D], pool);
    row += T;
  }
  for (int64_t i = 0; i < N * nh * D; ++i) o[i] *= cpu::sigmoid(gate[i]);
  matmul(L.o_proj, o.data(), N, y, pool);
}

void Model::deltanet_layer(const LayerWeights& L, int64_t li, std::span<const StepInput> inputs,
                           const float* xn, float* y, ThreadPool* pool) const {
  const ModelConfig& c = config();
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim, r = Hv / Hk;
  const int64_t K = c.linear_conv_kernel_dim, C = c.conv_dim(), kd = Hk * Dk;
  const int64_t G = 2 * Dk + 2 * r * Dv;  // qkvz row group per k-head
  const float eps = static_cast<float>(c.rms_norm_eps);
  int64_t N = 0;
  for (const auto& in : inputs) N += static_cast<int64_t>(in.tokens.size());

  std::vector<float> P(N * Hk * G), BA(N * Hk * 2 * r);
  matmul(L.in_qkvz, xn, N, P.data(), pool);
  matmul(L.in_ba, xn, N, BA.data(), pool);
  // De-interleave the per-k-head groups into the conv channel order [q | k | v], z, b, a.
  std::vector<float> xc(N * C), z(N * Hv * Dv), b(N * Hv), a(N * Hv);
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t g = 0; g < Hk; ++g) {
      const float* src = &P[(t * Hk + g) * G];
      std::copy_n(src, Dk, &xc[t * C + g * Dk]);
      std::copy_n(src + Dk, Dk, &xc[t * C + kd + g * Dk]);
      std::copy_n(src + 2 * Dk, r * Dv, &xc[t * C + 2 * kd + g * r * Dv]);
      std::copy_n(src + 2 * Dk + r * Dv, r * Dv, &z[(t * Hv + g * r) * Dv]);
      const float* ba = &BA[(t * Hk + g) * 2 * r];
      for (int64_t j = 0; j < r; ++j) {
        b[t * Hv + g * r + j] = ba[j];
        a[t * Hv + g * r + j] = ba[r + j];
      }
    }
  }

  std::vector<float> o(N * Hv * Dv), hist, q, k, v, beta, gl;
  int64_t row = 0;
  for (const auto& in : inputs) {
    const int64_t T = static_cast<int64_t>(in.tokens.size());
    SequenceState::DeltaNet& st = in.state->delta[li];
    // Causal depthwise conv over [K-1 history rows | T new rows], then SiLU.
    hist.assign(st.conv.begin(), st.conv.end());
    hist.insert(hist.end(), xc.begin() + row * C, xc.begin() + (row + T) * C);
    q.resize(T * kd);
    k.resize(T * kd);
    v.resize(T * Hv * Dv);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t ch = 0; ch < C; ++ch) {
        float s = 0;
        for (int64_t j = 0; j < K; ++j) s += L.conv[ch * K + j] * hist[(t + j) * C + ch];
        s = cpu::silu(s);
        if (ch < kd)
          q[t * kd + ch] = s;
        else if (ch < 2 * kd)
          k[t * kd + ch - kd] = s;
        else
          v[t * Hv * Dv + ch - 2 * kd] = s;
      }
    }
    st.conv.assign(hist.end() - (K - 1) * C, hist.end());
    cpu::l2norm_scale(q.data(), T * Hk, Dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(Dk)));
    cpu::l2norm_scale(k.data(), T * Hk, Dk, 1e-6f, 1.0f);
    beta.resize(T * Hv);
    gl.resize(T * Hv);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < Hv; ++h) {
        beta[t * Hv + h] = cpu::sigmoid(b[(row + t) * Hv + h]);
        gl[t * Hv + h] = L.neg_exp_a[h] * cpu::softplus(a[(row + t) * Hv + h] + L.dt_bias[h]);
      }
    }
    const cpu::DeltaArgs args{q.data(), k.data(), v.data(), gl.data(),   beta.data(),      T, Hk,
                              Hv,       Dk,       Dv,       st.S.data(), &o[row * Hv * Dv]};
    const bool recurrent = in.form == DeltaForm::kAuto ? T == 1 : in.form == DeltaForm::kRecurrent;
    TF_CHECK(!recurrent || T == 1, "the recurrent form takes one token, got {}", T);
    if (recurrent)
      cpu::delta_rule_recurrent(args, pool);
    else
      cpu::delta_rule_chunked(args, in.state->n_past, kDeltaChunk, pool);
    row += T;
  }
  cpu::rmsnorm_gated(o.data(), z.data(), L.gnorm.data(), N * Hv, Dv, eps, o.data());
  matmul(L.out_proj, o.data(), N, y, pool);
}

void Model::ffn(const FfnWeights& f, const float* x, int64_t N, float* y, ThreadPool* pool) const {
  cpu::ffn(f, x, N, y, pool);
}

// Router, routed experts and shared expert in one fused op (backends/cpu/moe.h): softmax over
// the experts in fp32, top-k (ties to the lower index), optional renormalisation, each row's
// experts summed in ascending index order, then the sigmoid-gated shared expert.
void Model::moe(const LayerWeights& L, const float* xn, int64_t N, float* y,
                ThreadPool* pool) const {
  const ModelConfig& c = config();
  cpu::MoeArgs a;
  a.router = L.router;
  a.experts = L.experts.data();
  a.top_k = c.num_experts_per_tok;
  a.norm_topk_prob = c.norm_topk_prob;
  a.shared = &L.shared;
  a.shared_gate = L.shared_gate.data();
  cpu::moe_ffn(a, xn, N, y, pool);
}

double Model::decode_bytes_per_token() const {
  const ModelConfig& c = config();
  const Weights& w = *weights_;
  auto bytes = [](const Mat& m) {
    return static_cast<double>(m.rows * m.cols * dtype_size(m.dtype));
  };
  auto ffn_bytes = [&](const FfnWeights& f) { return bytes(f.gate) + bytes(f.up) + bytes(f.down); };
  double total = bytes(w.lm_head) + static_cast<double>(c.hidden_size * dtype_size(w.embed.dtype));
  for (const LayerWeights& L : w.layers) {
    if (L.full_attention)
      total += bytes(L.q_proj) + bytes(L.k_proj) + bytes(L.v_proj) + bytes(L.o_proj);
    else
      total += bytes(L.in_qkvz) + bytes(L.in_ba) + bytes(L.out_proj);
    if (L.moe) {
      total += bytes(L.router) + ffn_bytes(L.shared) +
               static_cast<double>(c.num_experts_per_tok) * ffn_bytes(L.experts[0]);
    } else {
      total += ffn_bytes(L.mlp);
    }
  }
  return total;
}

}  // namespace tf
