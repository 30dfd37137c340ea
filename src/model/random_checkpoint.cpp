#include "model/random_checkpoint.h"

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace tf {
namespace {

void add_ffn(std::vector<TensorSpec>& t, const std::string& p, int64_t H, int64_t I, DType d) {
  t.push_back({p + ".gate_proj.weight", d, {I, H}});
  t.push_back({p + ".up_proj.weight", d, {I, H}});
  t.push_back({p + ".down_proj.weight", d, {H, I}});
}

void add_moe(std::vector<TensorSpec>& t, const ModelConfig& c, const std::string& p, bool packed,
             DType d) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  t.push_back({p + ".gate.weight", d, {E, H}});
  if (packed) {
    t.push_back({p + ".experts.gate_up_proj", d, {E, 2 * I, H}});
    t.push_back({p + ".experts.down_proj", d, {E, H, I}});
  } else {
    for (int64_t e = 0; e < E; ++e) add_ffn(t, p + ".experts." + std::to_string(e), H, I, d);
  }
  add_ffn(t, p + ".shared_expert", H, c.shared_expert_intermediate_size, d);
  t.push_back({p + ".shared_expert_gate.weight", d, {1, H}});
}

void add_attention(std::vector<TensorSpec>& t, const ModelConfig& c, const std::string& p,
                   DType d) {
  const int64_t H = c.hidden_size, D = c.head_dim;
  t.push_back({p + ".q_proj.weight", d, {c.num_attention_heads * D * 2, H}});
  t.push_back({p + ".k_proj.weight", d, {c.num_key_value_heads * D, H}});
  t.push_back({p + ".v_proj.weight", d, {c.num_key_value_heads * D, H}});
  t.push_back({p + ".o_proj.weight", d, {H, c.num_attention_heads * D}});
  t.push_back({p + ".q_norm.weight", d, {D}});
  t.push_back({p + ".k_norm.weight", d, {D}});
}

std::vector<TensorSpec> tensor_list(const ModelConfig& c, bool packed, bool mtp, DType d) {
  std::vector<TensorSpec> t;
  const int64_t H = c.hidden_size;
  t.push_back({"model.embed_tokens.weight", d, {c.vocab_size, H}});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", d, {c.vocab_size, H}});
  t.push_back({"model.norm.weight", d, {H}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    t.push_back({p + ".input_layernorm.weight", d, {H}});
    t.push_back({p + ".post_attention_layernorm.weight", d, {H}});
    if (c.full_attention[i]) {
      add_attention(t, c, p + ".self_attn", d);
    } else {
      const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
      const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim, r = Hv / Hk;
      const std::string q = p + ".linear_attn";
      t.push_back({q + ".in_proj_qkvz.weight", d, {Hk * (2 * Dk + 2 * r * Dv), H}});
      t.push_back({q + ".in_proj_ba.weight", d, {Hk * 2 * r, H}});
      t.push_back({q + ".conv1d.weight", d, {c.conv_dim(), 1, c.linear_conv_kernel_dim}});
      t.push_back({q + ".dt_bias", d, {Hv}});
      t.push_back({q + ".A_log", DType::kF32, {Hv}});
      t.push_back({q + ".norm.weight", d, {Dv}});
      t.push_back({q + ".out_proj.weight", d, {H, Hv * Dv}});
    }
    if (c.is_moe_layer(i))
      add_moe(t, c, p + ".mlp", packed, d);
    else
      add_ffn(t, p + ".mlp", H, c.intermediate_size, d);
  }
  if (mtp) {
    t.push_back({"mtp.fc.weight", d, {H, 2 * H}});
    for (const char* n :
         {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
          "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.post_attention_layernorm.weight"}) {
      t.push_back({n, d, {H}});
    }
    add_attention(t, c, "mtp.layers.0.self_attn", d);
    add_moe(t, c, "mtp.layers.0.mlp", packed, d);
  }
  return t;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Fills one tensor with seeded uniform values in the range its role wants.
void fill_tensor(const TensorSpec& t, void* buf, uint64_t seed) {
  uint64_t s = seed ^ std::hash<std::string>{}(t.name);
  auto next = [&s]() {  // xorshift64*, uniform in [-1, 1)
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return static_cast<float>(static_cast<double>((s * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-52 -
                              1.0);
  };
  float lo = 0, hi = 0;
  const int64_t fan_in = t.shape.back();  // the input dimension of [out, in] and [E, out, in]
  if (ends_with(t.name, "norm.weight") && t.name.find("linear_attn") != std::string::npos) {
    lo = 0.9f, hi = 1.1f;  // plain-weight gated norm
  } else if (ends_with(t.name, "norm.weight") || ends_with(t.name, "layernorm.weight")) {
    lo = -0.1f, hi = 0.1f;  // zero-centred norms
  } else if (ends_with(t.name, "A_log")) {
    lo = -1.0f, hi = 1.0f;
  } else if (ends_with(t.name, "dt_bias")) {
    lo = -0.5f, hi = 0.5f;
  } else if (t.name.find("conv1d") != std::string::npos) {
    lo = -0.5f, hi = 0.5f;
  } else {
    hi = static_cast<float>(std::sqrt(3.0 / static_cast<double>(fan_in)));
    lo = -hi;
  }
  size_t n = t.nbytes() / dtype_size(t.dtype);
  for (size_t i = 0; i < n; ++i) {
    const float v = lo + (hi - lo) * 0.5f * (next() + 1.0f);
    switch (t.dtype) {
      case DType::kF32:
        static_cast<float*>(buf)[i] = v;
        break;
      case DType::kBF16:
        static_cast<uint16_t*>(buf)[i] = f32_to_bf16(v);
        break;
      case DType::kF16:
        static_cast<uint16_t*>(buf)[i] = std::bit_cast<uint16_t>(static_cast<_Float16>(v));
        break;
    }
  }
}

}  // namespace

std::vector<TensorSpec> checkpoint_tensors(const ModelConfig& c, const RandomCheckpointOptions& o) {
  return tensor_list(c, o.packed_experts, o.mtp, o.dtype);
}

Status write_random_checkpoint(const ModelConfig& c, const std::string& config_json,
                               const std::string& out_dir, const RandomCheckpointOptions& o) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Status::io("{}: {}", out_dir, ec.message());
  {
    std::ofstream f(std::filesystem::path(out_dir) / "config.json");
    f << config_json;
    if (!f) return Status::io("{}: cannot write config.json", out_dir);
  }
  return write_safetensors((std::filesystem::path(out_dir) / "model.safetensors").string(),
                           checkpoint_tensors(c, o),
                           [&](const TensorSpec& t, void* buf) { fill_tensor(t, buf, o.seed); });
}

}  // namespace tf
