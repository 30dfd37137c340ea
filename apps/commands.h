// Subcommands of the `tensorfold` CLI. Each add_* registers its options and its callback.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/status.h"

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

// Exit code of a subcommand, set by its callback.
int& exit_code();

}  // namespace tf::app
