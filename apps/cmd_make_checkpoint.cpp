// tensorfold make-checkpoint: writes a random qwen3_next checkpoint for a config.json, so that
// real-size shapes can be benchmarked without a download (see model/random_checkpoint.h).
#include <cstdio>

#include "apps/commands.h"
#include "core/file.h"
#include "model/random_checkpoint.h"

namespace tf::app {
namespace {

struct MakeOptions {
  std::string config;
  std::string out;
  std::string dtype = "bf16";
  bool packed = false;
  bool mtp = false;
  uint64_t seed = 1;
};

int run_make(const MakeOptions& o) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "error: %s\n", st.to_string().c_str());
    return 1;
  };
  auto text = read_file(o.config);
  if (!text) return fail(text.status());
  auto cfg = parse_model_config(*text, o.config);
  if (!cfg) return fail(cfg.status());
  RandomCheckpointOptions ro;
  ro.dtype = o.dtype == "f32" ? DType::kF32 : o.dtype == "f16" ? DType::kF16 : DType::kBF16;
  ro.packed_experts = o.packed;
  ro.mtp = o.mtp;
  ro.seed = o.seed;
  if (Status st = write_random_checkpoint(*cfg, *text, o.out, ro); !st) return fail(st);
  size_t bytes = 0, n = 0;
  for (const auto& t : checkpoint_tensors(*cfg, ro)) bytes += t.nbytes(), ++n;
  std::printf("wrote %s: %zu tensors, %.3f GB\n", o.out.c_str(), n, bytes / 1e9);
  return 0;
}

}  // namespace

void add_make_checkpoint(CLI::App& app) {
  auto o = std::make_shared<MakeOptions>();
  CLI::App* cmd =
      app.add_subcommand("make-checkpoint", "Write a random checkpoint for a config.json");
  cmd->add_option("--config", o->config, "config.json of the shape to build")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", o->out, "Output directory")->required();
  cmd->add_option("--dtype", o->dtype)
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  cmd->add_flag("--packed-experts", o->packed, "Store experts packed [E, 2I, H] (Qwen3.5 layout)");
  cmd->add_flag("--mtp", o->mtp, "Include an MTP layer (mtp.*)");
  cmd->add_option("--seed", o->seed)->capture_default_str();
  cmd->callback([o] { exit_code() = run_make(*o); });
}

}  // namespace tf::app
