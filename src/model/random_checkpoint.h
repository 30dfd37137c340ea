// Random qwen3_next checkpoints for a config: benchmarks of real-size shapes without a download,
// and model tests that need weights. Weights ~ U(-a, a) with a = sqrt(3 / fan_in) (unit-variance
// outputs), zero-centred norms ~ U(-0.1, 0.1), the gated norm ~ U(0.9, 1.1), A_log, dt_bias and the
// conv kernel in their usual ranges. Same seed, same bytes.
#pragma once

#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors_writer.h"

namespace tf {

struct RandomCheckpointOptions {
  DType dtype = DType::kBF16;
  bool packed_experts = false;  // experts as [E, 2I, H] + [E, H, I] (Qwen3.5 layout)
  bool mtp = false;             // include an MTP layer (mtp.*)
  uint64_t seed = 1;
};

// Every tensor the config implies, with its on-disk name, dtype and shape.
std::vector<TensorSpec> checkpoint_tensors(const ModelConfig& c, const RandomCheckpointOptions& o);

// Writes config_json (the text of config.json) and model.safetensors into out_dir.
Status write_random_checkpoint(const ModelConfig& c, const std::string& config_json,
                               const std::string& out_dir, const RandomCheckpointOptions& o);

}  // namespace tf
