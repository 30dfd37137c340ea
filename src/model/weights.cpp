#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace tf {
namespace {

class Loader {
 public:
  Loader(const Checkpoint& ckpt, Weights* w, const LoadProgress& progress)
      : ckpt_(ckpt), w_(w), progress_(progress), total_(progress ? ckpt.names().size() : 0) {}

  Status mat(const std::string& name, int64_t rows, int64_t cols, Mat* out) {
    tick();
    TF_ASSIGN_OR_RETURN(TensorView t, ckpt_.get(name, {rows, cols}));
    *out = Mat{t.dtype, aligned(t), rows, cols};
    w_->bytes_mapped += t.nbytes;
    return Status::ok();
  }

  // A [E, R, C] packed tensor, as E matrices [R, C] (optionally a row range of each).
  Status packed(const std::string& name, int64_t E, int64_t R, int64_t C, int64_t row0,
                int64_t rows, std::vector<Mat>* out) {
    tick();
    TF_ASSIGN_OR_RETURN(TensorView t, ckpt_.get(name, {E, R, C}));
    const void* data = aligned(t);
    out->clear();
    for (int64_t e = 0; e < E; ++e)
      out->push_back(Mat{t.dtype, data, E * R, C}.row_slice(e * R + row0, rows));
    w_->bytes_mapped += t.nbytes * rows / R;
    return Status::ok();
  }

  // Any-dtype tensor of `shape` converted to fp32.
  Status vec(const std::string& name, const std::vector<int64_t>& shape, std::vector<float>* out) {
    tick();
    TF_ASSIGN_OR_RETURN(TensorView t, ckpt_.get(name, shape));
    out->resize(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint16_t h;
      switch (t.dtype) {
        case DType::kF32:
          std::memcpy(&(*out)[i], static_cast<const char*>(t.data) + 4 * i, 4);
          break;
        case DType::kBF16:
          std::memcpy(&h, static_cast<const char*>(t.data) + 2 * i, 2);
          (*out)[i] = bf16_to_f32(h);
          break;
        case DType::kF16:
          std::memcpy(&h, static_cast<const char*>(t.data) + 2 * i, 2);
          (*out)[i] = f16_to_f32(h);
          break;
      }
    }
    return Status::ok();
  }

 private:
  void tick() {
    if (progress_) progress_(std::min(++done_, total_), total_);
  }
  // The tensor's data, copied to an aligned buffer if the file placed it off its element size.
  const void* aligned(const TensorView& t) {
    if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) == 0) return t.data;
    w_->owned.emplace_back(new char[t.nbytes]);
    w_->owned_bytes.push_back(t.nbytes);
    std::memcpy(w_->owned.back().get(), t.data, t.nbytes);
    return w_->owned.back().get();
  }

  const Checkpoint& ckpt_;
  Weights* w_;
  const LoadProgress& progress_;
  size_t total_, done_ = 0;
};

Status load_ffn(Loader& ld, const std::string& p, int64_t H, int64_t I, FfnWeights* f) {
  TF_RETURN_IF_ERROR(ld.mat(p + ".gate_proj.weight", I, H, &f->gate));
  TF_RETURN_IF_ERROR(ld.mat(p + ".up_proj.weight", I, H, &f->up));
  return ld.mat(p + ".down_proj.weight", H, I, &f->down);
}

Status load_moe(const Checkpoint& ckpt, Loader& ld, const ModelConfig& c, const std::string& p,
                LayerWeights* L) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  TF_RETURN_IF_ERROR(ld.mat(p + ".gate.weight", E, H, &L->router));
  L->experts.resize(E);
  if (ckpt.has(p + ".experts.gate_up_proj")) {
    // Packed (Qwen3.5 style): gate_up_proj [E, 2I, H] with gate rows first; down_proj [E, H, I].
    std::vector<Mat> gate, up, down;
    TF_RETURN_IF_ERROR(ld.packed(p + ".experts.gate_up_proj", E, 2 * I, H, 0, I, &gate));
    TF_RETURN_IF_ERROR(ld.packed(p + ".experts.gate_up_proj", E, 2 * I, H, I, I, &up));
    TF_RETURN_IF_ERROR(ld.packed(p + ".experts.down_proj", E, H, I, 0, H, &down));
    for (int64_t e = 0; e < E; ++e) L->experts[e] = FfnWeights{gate[e], up[e], down[e]};
  } else {
    for (int64_t e = 0; e < E; ++e) {
      TF_RETURN_IF_ERROR(load_ffn(ld, fmt::format("{}.experts.{}", p, e), H, I, &L->experts[e]));
    }
  }
  TF_RETURN_IF_ERROR(
      load_ffn(ld, p + ".shared_expert", H, c.shared_expert_intermediate_size, &L->shared));
  return ld.vec(p + ".shared_expert_gate.weight", {1, H}, &L->shared_gate);
}

Status load_attention(Loader& ld, const ModelConfig& c, const std::string& p, LayerWeights* L) {
  const int64_t H = c.hidden_size, D = c.head_dim;
  TF_RETURN_IF_ERROR(ld.mat(p + ".q_proj.weight", c.num_attention_heads * D * 2, H, &L->q_proj));
  TF_RETURN_IF_ERROR(ld.mat(p + ".k_proj.weight", c.num_key_value_heads * D, H, &L->k_proj));
  TF_RETURN_IF_ERROR(ld.mat(p + ".v_proj.weight", c.num_key_value_heads * D, H, &L->v_proj));
  TF_RETURN_IF_ERROR(ld.mat(p + ".o_proj.weight", H, c.num_attention_heads * D, &L->o_proj));
  TF_RETURN_IF_ERROR(ld.vec(p + ".q_norm.weight", {D}, &L->q_norm));
  return ld.vec(p + ".k_norm.weight", {D}, &L->k_norm);
}

Status load_deltanet(Loader& ld, const ModelConfig& c, const std::string& p, LayerWeights* L) {
  const int64_t H = c.hidden_size, Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim,
                K = c.linear_conv_kernel_dim;
  const int64_t r = Hv / Hk;
  TF_RETURN_IF_ERROR(
      ld.mat(p + ".in_proj_qkvz.weight", Hk * (2 * Dk + 2 * r * Dv), H, &L->in_qkvz));
  TF_RETURN_IF_ERROR(ld.mat(p + ".in_proj_ba.weight", Hk * 2 * r, H, &L->in_ba));
  TF_RETURN_IF_ERROR(ld.mat(p + ".out_proj.weight", H, Hv * Dv, &L->out_proj));
  TF_RETURN_IF_ERROR(ld.vec(p + ".conv1d.weight", {c.conv_dim(), 1, K}, &L->conv));
  TF_RETURN_IF_ERROR(ld.vec(p + ".dt_bias", {Hv}, &L->dt_bias));
  std::vector<float> a_log;
  TF_RETURN_IF_ERROR(ld.vec(p + ".A_log", {Hv}, &a_log));
  L->neg_exp_a.resize(Hv);
  for (int64_t h = 0; h < Hv; ++h) L->neg_exp_a[h] = -std::exp(a_log[h]);
  return ld.vec(p + ".norm.weight", {Dv}, &L->gnorm);
}

Status load_mlp(const Checkpoint& ckpt, Loader& ld, const ModelConfig& c, int64_t i,
                const std::string& p, LayerWeights* L) {
  L->moe = c.is_moe_layer(i);
  if (L->moe) return load_moe(ckpt, ld, c, p + ".mlp", L);
  return load_ffn(ld, p + ".mlp", c.hidden_size, c.intermediate_size, &L->mlp);
}

}  // namespace

void Weights::for_each_owned(const std::function<void(const void*, size_t)>& fn) const {
  auto vec = [&](const std::vector<float>& v) {
    if (!v.empty()) fn(v.data(), v.size() * sizeof(float));
  };
  auto layer = [&](const LayerWeights& L) {
    for (const auto* v : {&L.input_norm, &L.post_norm, &L.q_norm, &L.k_norm, &L.conv, &L.dt_bias,
                          &L.neg_exp_a, &L.gnorm, &L.shared_gate})
      vec(*v);
  };
  vec(final_norm);
  for (const LayerWeights& L : layers) layer(L);
  if (mtp) {
    for (const auto* v : {&mtp->pre_fc_norm_embedding, &mtp->pre_fc_norm_hidden, &mtp->norm})
      vec(*v);
    layer(mtp->layer);
  }
  for (size_t i = 0; i < owned.size(); ++i) fn(owned[i].get(), owned_bytes[i]);
}

Result<std::unique_ptr<Weights>> load_weights(const Checkpoint& ckpt,
                                              const LoadProgress& progress) {
  const ModelConfig& c = ckpt.config();
  auto w = std::make_unique<Weights>();
  Loader ld(ckpt, w.get(), progress);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  TF_RETURN_IF_ERROR(ld.mat("model.embed_tokens.weight", V, H, &w->embed));
  if (c.tie_word_embeddings) {
    w->lm_head = w->embed;
  } else {
    TF_RETURN_IF_ERROR(ld.mat("lm_head.weight", V, H, &w->lm_head));
  }
  TF_RETURN_IF_ERROR(ld.vec("model.norm.weight", {H}, &w->final_norm));
  w->layers.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& L = w->layers[i];
    const std::string p = fmt::format("model.layers.{}", i);
    L.full_attention = c.full_attention[i];
    TF_RETURN_IF_ERROR(ld.vec(p + ".input_layernorm.weight", {H}, &L.input_norm));
    TF_RETURN_IF_ERROR(ld.vec(p + ".post_attention_layernorm.weight", {H}, &L.post_norm));
    if (L.full_attention) {
      TF_RETURN_IF_ERROR(load_attention(ld, c, p + ".self_attn", &L));
    } else {
      TF_RETURN_IF_ERROR(load_deltanet(ld, c, p + ".linear_attn", &L));
    }
    TF_RETURN_IF_ERROR(load_mlp(ckpt, ld, c, i, p, &L));
  }
  // MTP (§6): one full-attention + MoE layer, present only if the checkpoint ships mtp.* tensors.
  if (ckpt.has("mtp.fc.weight")) {
    auto m = std::make_unique<MtpWeights>();
    TF_RETURN_IF_ERROR(ld.mat("mtp.fc.weight", H, 2 * H, &m->fc));
    TF_RETURN_IF_ERROR(ld.vec("mtp.pre_fc_norm_embedding.weight", {H}, &m->pre_fc_norm_embedding));
    TF_RETURN_IF_ERROR(ld.vec("mtp.pre_fc_norm_hidden.weight", {H}, &m->pre_fc_norm_hidden));
    TF_RETURN_IF_ERROR(ld.vec("mtp.norm.weight", {H}, &m->norm));
    LayerWeights& L = m->layer;
    L.full_attention = true;
    TF_RETURN_IF_ERROR(ld.vec("mtp.layers.0.input_layernorm.weight", {H}, &L.input_norm));
    TF_RETURN_IF_ERROR(ld.vec("mtp.layers.0.post_attention_layernorm.weight", {H}, &L.post_norm));
    TF_RETURN_IF_ERROR(load_attention(ld, c, "mtp.layers.0.self_attn", &L));
    L.moe = c.num_experts > 0;
    if (L.moe) {
      TF_RETURN_IF_ERROR(load_moe(ckpt, ld, c, "mtp.layers.0.mlp", &L));
    } else {
      TF_RETURN_IF_ERROR(load_ffn(ld, "mtp.layers.0.mlp", H, c.intermediate_size, &L.mlp));
    }
    w->mtp = std::move(m);
  }
  return w;
}

}  // namespace tf
