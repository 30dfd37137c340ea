// Helpers shared by the unit tests: a temporary directory and a small random qwen3_next checkpoint.
#pragma once

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/random_checkpoint.h"

namespace tf::testing {

// Built with ASan or TSan (GCC's macros): the long randomized engine tests run fewer rounds there
// (each runs whole in the release build), to keep CI under 30 minutes.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// A fresh directory under the system temp dir, removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("tf_test_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string path(const std::string& name = "") const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Writes `bytes` to `path`, replacing what was there.
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A small hybrid config: 4 layers (GDN, GDN, attention, GDN+dense MLP), GQA 2, r = 2, 4 experts.
inline std::string small_config_json(const std::string& extra = "") {
  return R"({"model_type": "qwen3_next", "vocab_size": 96, "hidden_size": 32,
    "num_hidden_layers": 4, "full_attention_interval": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
    "linear_value_head_dim": 12, "linear_conv_kernel_dim": 4, "num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
    "norm_topk_prob": true, "mlp_only_layers": [3], "intermediate_size": 40, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": false)" +
         extra + "}";
}

// Writes a random checkpoint of small_config_json into dir.
inline void write_small_checkpoint(const std::string& dir, RandomCheckpointOptions o = {},
                                   const std::string& extra = "") {
  const std::string text = small_config_json(extra);
  auto cfg = parse_model_config(text, "config.json");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  ASSERT_TRUE(write_random_checkpoint(*cfg, text, dir, o).is_ok());
}

// ||a - b|| / ||b||
inline double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace tf::testing
