#include "io/config.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/file.h"

namespace tf {

bool ModelConfig::is_moe_layer(int64_t i) const {
  const bool dense_forced =
      std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) != mlp_only_layers.end();
  return !dense_forced && num_experts > 0 && (i + 1) % decoder_sparse_step == 0;
}

namespace {

using nlohmann::json;

// Reads an optional field of the expected JSON type into *out; a wrong type is an error.
template <typename T>
Status read_field(const json& j, const char* key, T* out, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return Status::ok();
  const json& v = j[key];
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean())
      return Status::invalid("{}: field {} must be a boolean, got {}", file, key, v.dump());
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) {
      return Status::invalid("{}: field {} must be an integer, got {}", file, key, v.dump());
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number())
      return Status::invalid("{}: field {} must be a number, got {}", file, key, v.dump());
  } else {
    if (!v.is_string())
      return Status::invalid("{}: field {} must be a string, got {}", file, key, v.dump());
  }
  *out = v.get<T>();
  return Status::ok();
}

Status positive(int64_t v, const char* key, const std::string& file) {
  if (v <= 0) return Status::invalid("{}: field {} must be > 0, got {}", file, key, v);
  return Status::ok();
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return Status::invalid("{}: not valid JSON: {}", file, e.what());
  }
  if (!j.is_object()) return Status::invalid("{}: expected a JSON object", file);
  // Qwen3.5-style wrappers keep the text model's fields in text_config.
  if (j.contains("text_config") && j["text_config"].is_object()) j = j["text_config"];

  ModelConfig c;
  TF_RETURN_IF_ERROR(read_field(j, "model_type", &c.model_type, file));
  if (c.model_type != "qwen3_next") {
    return Status::unsupported("{}: model_type \"{}\" is not supported (expected \"qwen3_next\")",
                               file, c.model_type);
  }
  TF_RETURN_IF_ERROR(read_field(j, "vocab_size", &c.vocab_size, file));
  TF_RETURN_IF_ERROR(read_field(j, "hidden_size", &c.hidden_size, file));
  TF_RETURN_IF_ERROR(read_field(j, "num_hidden_layers", &c.num_hidden_layers, file));
  TF_RETURN_IF_ERROR(read_field(j, "num_attention_heads", &c.num_attention_heads, file));
  TF_RETURN_IF_ERROR(read_field(j, "num_key_value_heads", &c.num_key_value_heads, file));
  TF_RETURN_IF_ERROR(read_field(j, "head_dim", &c.head_dim, file));
  TF_RETURN_IF_ERROR(read_field(j, "max_position_embeddings", &c.max_position_embeddings, file));
  TF_RETURN_IF_ERROR(read_field(j, "linear_num_key_heads", &c.linear_num_key_heads, file));
  TF_RETURN_IF_ERROR(read_field(j, "linear_num_value_heads", &c.linear_num_value_heads, file));
  TF_RETURN_IF_ERROR(read_field(j, "linear_key_head_dim", &c.linear_key_head_dim, file));
  TF_RETURN_IF_ERROR(read_field(j, "linear_value_head_dim", &c.linear_value_head_dim, file));
  TF_RETURN_IF_ERROR(read_field(j, "linear_conv_kernel_dim", &c.linear_conv_kernel_dim, file));
  TF_RETURN_IF_ERROR(read_field(j, "num_experts", &c.num_experts, file));
  TF_RETURN_IF_ERROR(read_field(j, "num_experts_per_tok", &c.num_experts_per_tok, file));
  TF_RETURN_IF_ERROR(read_field(j, "moe_intermediate_size", &c.moe_intermediate_size, file));
  TF_RETURN_IF_ERROR(
      read_field(j, "shared_expert_intermediate_size", &c.shared_expert_intermediate_size, file));
  TF_RETURN_IF_ERROR(read_field(j, "norm_topk_prob", &c.norm_topk_prob, file));
  TF_RETURN_IF_ERROR(read_field(j, "decoder_sparse_step", &c.decoder_sparse_step, file));
  TF_RETURN_IF_ERROR(read_field(j, "intermediate_size", &c.intermediate_size, file));
  TF_RETURN_IF_ERROR(read_field(j, "rms_norm_eps", &c.rms_norm_eps, file));
  TF_RETURN_IF_ERROR(read_field(j, "tie_word_embeddings", &c.tie_word_embeddings, file));
  TF_RETURN_IF_ERROR(read_field(j, "bos_token_id", &c.bos_token_id, file));
  if (!j.contains("head_dim") && c.num_attention_heads > 0) {
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }

  // RoPE: legacy top-level keys, or transformers 5's rope_parameters {rope_type, rope_theta,
  // partial_rotary_factor}. Only the default (unscaled) rope is implemented.
  TF_RETURN_IF_ERROR(read_field(j, "rope_theta", &c.rope_theta, file));
  TF_RETURN_IF_ERROR(read_field(j, "partial_rotary_factor", &c.partial_rotary_factor, file));
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const json& rp = j[key];
    if (!rp.is_object()) return Status::invalid("{}: field {} must be an object", file, key);
    std::string type = "default";
    if (rp.contains("rope_type") && rp["rope_type"].is_string())
      type = rp["rope_type"];
    else if (rp.contains("type") && rp["type"].is_string())
      type = rp["type"];
    if (type != "default") {
      return Status::unsupported("{}: {}.rope_type \"{}\" is not supported (only \"default\")",
                                 file, key, type);
    }
    TF_RETURN_IF_ERROR(read_field(rp, "rope_theta", &c.rope_theta, file));
    TF_RETURN_IF_ERROR(read_field(rp, "partial_rotary_factor", &c.partial_rotary_factor, file));
  }

  bool attention_bias = false;
  TF_RETURN_IF_ERROR(read_field(j, "attention_bias", &attention_bias, file));
  if (attention_bias)
    return Status::unsupported("{}: attention_bias = true is not supported", file);
  std::string act = "silu";
  TF_RETURN_IF_ERROR(read_field(j, "hidden_act", &act, file));
  if (act != "silu") return Status::unsupported("{}: hidden_act \"{}\" (only silu)", file, act);

  for (auto [v, key] : {std::pair{c.vocab_size, "vocab_size"},
                        {c.hidden_size, "hidden_size"},
                        {c.num_hidden_layers, "num_hidden_layers"},
                        {c.num_attention_heads, "num_attention_heads"},
                        {c.num_key_value_heads, "num_key_value_heads"},
                        {c.head_dim, "head_dim"},
                        {c.linear_num_key_heads, "linear_num_key_heads"},
                        {c.linear_num_value_heads, "linear_num_value_heads"},
                        {c.linear_key_head_dim, "linear_key_head_dim"},
                        {c.linear_value_head_dim, "linear_value_head_dim"},
                        {c.linear_conv_kernel_dim, "linear_conv_kernel_dim"},
                        {c.decoder_sparse_step, "decoder_sparse_step"}}) {
    TF_RETURN_IF_ERROR(positive(v, key, file));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Status::invalid("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                           file, c.num_attention_heads, c.num_key_value_heads);
  }
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0) {
    return Status::invalid(
        "{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", file,
        c.linear_num_value_heads, c.linear_num_key_heads);
  }
  if (c.partial_rotary_factor <= 0 || c.partial_rotary_factor > 1 || c.rotary_dim() % 2 != 0) {
    return Status::invalid("{}: partial_rotary_factor {} gives an odd or empty rotary dimension",
                           file, c.partial_rotary_factor);
  }
  if (c.num_experts > 0 && (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts ||
                            c.moe_intermediate_size <= 0)) {
    return Status::invalid("{}: num_experts_per_tok {} must be in [1, num_experts {}]", file,
                           c.num_experts_per_tok, c.num_experts);
  }

  // Layer types: explicit list, else every full_attention_interval-th layer is full attention.
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& lt = j["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_hidden_layers) {
      return Status::invalid("{}: layer_types must be a list of {} entries", file,
                             c.num_hidden_layers);
    }
    for (const auto& t : lt) {
      if (t == "full_attention")
        c.full_attention.push_back(true);
      else if (t == "linear_attention")
        c.full_attention.push_back(false);
      else
        return Status::invalid("{}: unknown layer type {}", file, t.dump());
    }
  } else {
    int64_t interval = 4;
    TF_RETURN_IF_ERROR(read_field(j, "full_attention_interval", &interval, file));
    TF_RETURN_IF_ERROR(positive(interval, "full_attention_interval", file));
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      c.full_attention.push_back((i + 1) % interval == 0);
  }
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    if (!j["mlp_only_layers"].is_array()) {
      return Status::invalid("{}: mlp_only_layers must be a list of layer indices", file);
    }
    for (const auto& v : j["mlp_only_layers"]) {
      if (!v.is_number_integer())
        return Status::invalid("{}: mlp_only_layers: bad entry {}", file, v.dump());
      c.mlp_only_layers.push_back(v.get<int64_t>());
    }
  }
  if (j.contains("eos_token_id")) {
    const json& e = j["eos_token_id"];
    if (e.is_number_integer())
      c.eos_token_ids.push_back(e.get<int64_t>());
    else if (e.is_array()) {
      for (const auto& v : e) {
        if (v.is_number_integer()) c.eos_token_ids.push_back(v.get<int64_t>());
      }
    }
  }
  return c;
}

Result<ModelConfig> load_model_config(const std::string& path) {
  Result<std::string> text = read_file(path);
  if (!text && text.status().code() == StatusCode::kNotFound)
    return Status::not_found("{}: cannot open (not a checkpoint directory?)", path);
  TF_RETURN_IF_ERROR(text.status());
  return parse_model_config(*text, path);
}

}  // namespace tf
