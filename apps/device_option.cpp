// --device cpu|cuda of generate, serve and bench-engine.
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

bool use_device(Model& model, const std::string& device) {
  if (device != "cuda") return true;
  if (Status s = model.use_cuda(); !s.is_ok()) {
    std::fprintf(stderr, "error: --device cuda: %s\n", s.to_string().c_str());
    return false;
  }
  return true;
}

}  // namespace tf::app
