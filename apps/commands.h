// Subcommands of the `tensorfold` CLI. Each add_* registers its options and its callback.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "model/weights.h"

namespace tf {
class Model;
}

namespace tf::app {

void add_generate(CLI::App& app);
void add_bench(CLI::App& app);
void add_bench_engine(CLI::App& app);
void add_make_checkpoint(CLI::App& app);
void add_tokenize(CLI::App& app);
void add_template(CLI::App& app);
void add_serve(CLI::App& app);
void add_eval(CLI::App& app);

// The embedded default model, relative to the repository root (the working directory of every
// documented command).
inline constexpr const char* kDefaultModel = "models/tiny-next";

// "1,2,3" -> token ids, each in [0, vocab) (--prompt-ids of generate and bench).
Result<std::vector<int32_t>> parse_prompt_ids(const std::string& s, int64_t vocab);

// --draft K (help text given: what K drafts do in this command), --draft-p-min and --draft-fixed
// of generate and bench (apps/cmd_generate.cpp).
void add_draft_options(CLI::App* cmd, const std::string& draft_help, int* k, float* p_min,
                       bool* fixed);

// --tp N (apps/tp_run.cpp): the option, and the callback wrapper. With N == 1 outside mpirun,
// run_with_tp is lead(). Otherwise it checks N against the MPI job's size (a clear error if they
// differ), joins the group, and runs lead() on rank 0 while the other ranks follow it until rank
// 0's model is gone. *threads 0 becomes the cores per rank.
void add_tp_option(CLI::App* cmd, int* tp);
int run_with_tp(int tp, const std::string& model, int* threads, const LoadOptions& follow,
                const std::function<int()>& lead);

// --device cpu|cuda (apps/device_option.cpp): the option, and moving a loaded model onto the
// device it names (Model::use_cuda); false after printing the error when it cannot.
void add_device_option(CLI::App* cmd, std::string* device);
bool use_device(Model& model, const std::string& device);

// --load-mode auto|copy|mmap and --matmul-precision f32|bf16 (apps/device_option.cpp), and the
// LoadOptions they mean for a model run on `device`: auto copies the weights out of the checkpoint
// for the CPU (LoadOptions::copy) and maps them for a device (they are uploaded there anyway);
// bf16 is LoadOptions::bf16_products.
struct WeightOptions {
  std::string mode = "auto";      // --load-mode
  std::string precision = "f32";  // --matmul-precision
};
void add_load_options(CLI::App* cmd, WeightOptions* o);
LoadOptions load_options(const WeightOptions& o, const std::string& device);
// What the other ranks of --tp N load with: rank 0's precision (each rank maps its checkpoint).
LoadOptions follower_options(const WeightOptions& o);

// Exit code of a subcommand, set by its callback.
int& exit_code();

}  // namespace tf::app
