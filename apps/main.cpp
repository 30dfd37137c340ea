// tensorfold: the command-line entry point. One subcommand per job (generate, bench, ...).
#include <cstdio>

#include "apps/commands.h"

namespace tf::app {
int& exit_code() {
  static int code = 0;
  return code;
}
}  // namespace tf::app

int main(int argc, char** argv) {
  CLI::App app{"TensorFold: an inference engine for Qwen3-Next hybrid MoE models"};
  app.require_subcommand(1);
  tf::app::add_generate(app);
  tf::app::add_bench(app);
  tf::app::add_bench_engine(app);
  tf::app::add_make_checkpoint(app);
  tf::app::add_tokenize(app);
  tf::app::add_template(app);
  tf::app::add_serve(app);
  tf::app::add_eval(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return tf::app::exit_code();
}
