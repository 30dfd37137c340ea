// The hyper-parameters of a `qwen3_next` checkpoint, read from its config.json.
// Field names and defaults follow transformers' Qwen3NextConfig (see ../shared/design/qwen3-next.md
// §1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace tf {

struct ModelConfig {
  std::string model_type;  // "qwen3_next"
  int64_t vocab_size = 151936;
  int64_t hidden_size = 2048;
  int64_t num_hidden_layers = 48;
  std::vector<bool>
      full_attention;  // [num_hidden_layers]: true = gated full attention, false = Gated DeltaNet
  // Gated full attention.
  int64_t num_attention_heads = 16;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 256;
  double partial_rotary_factor = 0.25;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 32768;
  // Gated DeltaNet.
  int64_t linear_num_key_heads = 16;
  int64_t linear_num_value_heads = 32;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_conv_kernel_dim = 4;
  // MLP / MoE.
  int64_t num_experts = 512;
  int64_t num_experts_per_tok = 10;
  int64_t moe_intermediate_size = 512;
  int64_t shared_expert_intermediate_size = 512;
  bool norm_topk_prob = true;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  int64_t intermediate_size = 5632;  // dense MLP width (mlp_only layers)
  // Misc.
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t num_mtp_layers = 0;  // set by the loader from the mtp.* tensors present
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;

  // Derived.
  int64_t rotary_dim() const { return static_cast<int64_t>(head_dim * partial_rotary_factor); }
  int64_t linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  // Layer i uses the sparse MoE block (else the dense MLP of width intermediate_size).
  bool is_moe_layer(int64_t i) const;
};

// Parses config.json text; `file` names it in errors. Unsupported options (attention_bias, another
// activation, rope scaling, another model_type) are refused with a message that names the field.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& file);
Result<ModelConfig> load_model_config(const std::string& path);

}  // namespace tf
