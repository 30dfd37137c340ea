// --device cpu|cuda of generate, serve and bench-engine; --load-mode and --matmul-precision of
// those and of bench.
#include <cstdio>

#include "apps/commands.h"
#include "model/model.h"

namespace tf::app {

void add_device_option(CLI::App* cmd, std::string* device) {
  cmd->add_option("--device", *device,
                  "Where the model runs: cpu, or cuda (weights and sequence states on GPU 0; "
                  "builds with the CUDA backend)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

void add_load_options(CLI::App* cmd, WeightOptions* o) {
  cmd->add_option("--load-mode", o->mode,
                  "How the weights are held: copy (read out of the checkpoint into the process's "
                  "memory, like llama.cpp's --no-mmap), mmap (views of the mapped files, zero "
                  "copy), or auto (copy on the CPU, mmap with --device cuda)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "copy", "mmap"}));
  cmd->add_option("--matmul-precision", o->precision,
                  "Inputs of the CPU's products with bf16 weights: f32 (exact fp32 products, "
                  "logits within 1e-4 of transformers') or bf16 (rounded to bf16 for bf16 dot "
                  "products, as llama.cpp does: faster prefill on CPUs with AVX512-BF16, logits "
                  "within about 0.1 relative L2); the same tokens alone, batched or drafted "
                  "either way")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
}

LoadOptions load_options(const WeightOptions& o, const std::string& device) {
  return LoadOptions{.copy = o.mode == "copy" || (o.mode == "auto" && device != "cuda"),
                     .bf16_products = o.precision == "bf16"};
}

LoadOptions follower_options(const WeightOptions& o) {
  return LoadOptions{.bf16_products = o.precision == "bf16"};
}

bool use_device(Model& model, const std::string& device) {
  if (device != "cuda") return true;
  if (Status s = model.use_cuda(); !s.is_ok()) {
    std::fprintf(stderr, "error: --device cuda: %s\n", s.to_string().c_str());
    return false;
  }
  return true;
}

}  // namespace tf::app
