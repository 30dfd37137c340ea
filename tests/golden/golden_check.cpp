// golden_check DIR...: compares our engine with transformers' reference on checkpoints made by
// tools/make_golden.py (see tests/golden/README.md for the file format).
//
// For each prompt: one prefill over the prompt ids (chunked delta rule), then the reference's
// greedy tokens fed back one at a time (recurrent delta rule), so every row of our logits lines up
// with a reference row. Passes when every row's relative L2 error is <= --max-rel-l2 (1e-4) and our
// argmax equals the reference's greedy token wherever the reference's top-2 margin is above
// --min-margin (1e-3). Prints one line per prompt; exits 1 on any failure, 2 on bad input.
#include <cstdio>
#include <string>
#include <vector>

#include "golden_util.h"
#include "runtime/sampler.h"

namespace {

using tf::golden::rel_l2;

// Returns the number of failures for one case directory, or -1 on bad input.
int check_case(const std::string& dir, double max_rel_l2, double min_margin, tf::ThreadPool* pool) {
  const tf::golden::Case c = tf::golden::load_case(dir, "reference.json");
  if (!c.model) return -1;
  const nlohmann::json& ref = c.ref;
  const tf::Model& model = *c.model;
  const int64_t V = model.config().vocab_size;
  int failures = 0;
  for (const auto& p : ref.at("prompts")) {
    const auto ids = p.at("ids").get<std::vector<int32_t>>();
    const auto greedy = p.at("greedy").get<std::vector<int32_t>>();
    const auto greedy_margins = p.at("greedy_margins").get<std::vector<double>>();
    const int64_t rows = p.at("rows").get<int64_t>();
    std::vector<float> want;
    if (!tf::golden::read_logits(dir, p.at("logits_file").get<std::string>(), rows * V, &want)) {
      std::fprintf(stderr, "%s: %s: short logits file\n", dir.c_str(),
                   p.at("name").get<std::string>().c_str());
      return -1;
    }
    tf::SequenceState st = model.new_state();
    std::vector<float> got;
    tf::StepInput prefill{&st, ids, true};
    model.forward({&prefill, 1}, &got, pool);
    for (size_t i = 0; i + 1 < greedy.size(); ++i) {
      tf::StepInput step{&st, std::span<const int32_t>(&greedy[i], 1), false};
      model.forward({&step, 1}, &got, pool);
    }
    if (static_cast<int64_t>(got.size()) != rows * V) {
      std::fprintf(stderr, "%s: row count %zu != %ld\n", dir.c_str(), got.size() / V, long(rows));
      return -1;
    }
    double worst = 0;
    int64_t worst_row = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double e = rel_l2(&got[r * V], &want[r * V], V);
      if (e > worst) worst = e, worst_row = r;
    }
    int token_mismatch = 0, low_margin_skips = 0;
    const int64_t P = static_cast<int64_t>(ids.size());
    for (size_t i = 0; i < greedy.size(); ++i) {
      const int32_t ours = tf::argmax(std::span<const float>(&got[(P - 1 + i) * V], V));
      if (ours == greedy[i]) continue;
      if (greedy_margins[i] > min_margin)
        ++token_mismatch;
      else
        ++low_margin_skips;
    }
    const bool ok = worst <= max_rel_l2 && token_mismatch == 0;
    failures += ok ? 0 : 1;
    std::printf("%s %-28s %-6s P=%-4ld max rel-L2 %.3e (row %ld)  greedy %zu/%zu%s\n",
                ok ? "ok  " : "FAIL", dir.substr(dir.find_last_of('/') + 1).c_str(),
                p.at("name").get<std::string>().c_str(), long(P), worst, long(worst_row),
                greedy.size() - token_mismatch - low_margin_skips, greedy.size(),
                low_margin_skips ? " (low-margin ties skipped)" : "");
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  return tf::golden::main(argc, argv, "golden_check", check_case);
}
