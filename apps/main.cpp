// tensorfold: the command-line entry point. One subcommand per job (generate, bench, ...).
#include <malloc.h>

#include <cstdio>

#include "apps/commands.h"

namespace tf::app {
int& exit_code() {
  static int code = 0;
  return code;
}
}  // namespace tf::app

int main(int argc, char** argv) {
  // A CPU forward's temporaries (activations, the MoE's and the delta rule's buffers: about 11 MB
  // for a 256-token prompt of tiny-next) are vectors made and freed per call. By default glibc
  // gives freed memory above 128 KiB-32 MiB back to the kernel, so every prefill faulted its pages
  // in again and the kernel zeroed them: tiny-next's prefill is 6-13% faster without that
  // (docs/PERFORMANCE.md, "Freed scratch kept in the heap"). Blocks under 64 MiB now come from
  // the heap, and up to 512 MiB of freed heap stays mapped for the next call. (The weights are
  // mapped by the loader itself, not through malloc.)
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
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
