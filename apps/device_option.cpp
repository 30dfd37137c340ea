// --device cpu|cuda and --load-mode of generate, serve and bench-engine (--load-mode of bench too).
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

void add_load_option(CLI::App* cmd, std::string* mode) {
  cmd->add_option("--load-mode", *mode,
                  "How the weights are held: copy (read out of the checkpoint into the process's "
                  "memory, like llama.cpp's --no-mmap), mmap (views of the mapped files, zero "
                  "copy), or auto (copy on the CPU, mmap with --device cuda)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "copy", "mmap"}));
}

LoadOptions load_options(const std::string& mode, const std::string& device) {
  return LoadOptions{.copy = mode == "copy" || (mode == "auto" && device != "cuda")};
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
