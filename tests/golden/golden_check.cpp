// golden_check DIR...: compares our engine with transformers' reference on checkpoints made by
// tools/make_golden.py (see tests/golden/README.md for the file format).
//
// For each prompt: one prefill over the prompt ids (chunked delta rule), then the reference's
// greedy tokens fed back one at a time (recurrent delta rule), so every row of our logits lines up
// with a reference row. Passes when every row's relative L2 error is <= --max-rel-l2 (1e-4) and our
// argmax equals the reference's greedy token wherever the reference's top-2 margin is above
// --min-margin (1e-3). Prints one line per prompt; exits 1 on any failure, 2 on bad input.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "runtime/sampler.h"

namespace {

using nlohmann::json;

double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Returns the number of failures for one case directory, or -1 on bad input.
int check_case(const std::string& dir, double max_rel_l2, double min_margin, tf::ThreadPool* pool) {
  std::ifstream in(dir + "/reference.json");
  if (!in) {
    std::fprintf(stderr, "%s: no reference.json\n", dir.c_str());
    return -1;
  }
  json ref;
  try {
    ref = json::parse(in);
  } catch (const json::exception& e) {
    std::fprintf(stderr, "%s/reference.json: %s\n", dir.c_str(), e.what());
    return -1;
  }
  // The weights live in the case folder, or where its "checkpoint" (relative to it) points.
  const std::string model_dir =
      ref.contains("checkpoint") ? dir + "/" + ref["checkpoint"].get<std::string>() : dir;
  auto model_or = tf::Model::load(model_dir);
  if (!model_or) {
    std::fprintf(stderr, "%s: %s\n", dir.c_str(), model_or.status().to_string().c_str());
    return -1;
  }
  const tf::Model& model = **model_or;
  const int64_t V = model.config().vocab_size;
  int failures = 0;
  for (const auto& p : ref.at("prompts")) {
    const auto ids = p.at("ids").get<std::vector<int32_t>>();
    const auto greedy = p.at("greedy").get<std::vector<int32_t>>();
    const auto greedy_margins = p.at("greedy_margins").get<std::vector<double>>();
    const int64_t rows = p.at("rows").get<int64_t>();
    std::vector<float> want(rows * V);
    std::ifstream lf(dir + "/" + p.at("logits_file").get<std::string>(), std::ios::binary);
    lf.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 4));
    if (!lf) {
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
  double max_rel_l2 = 1e-4, min_margin = 1e-3;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--max-rel-l2" && i + 1 < argc)
      max_rel_l2 = std::atof(argv[++i]);
    else if (a == "--min-margin" && i + 1 < argc)
      min_margin = std::atof(argv[++i]);
    else
      dirs.push_back(a.size() > 1 && a.back() == '/' ? a.substr(0, a.size() - 1) : a);
  }
  if (dirs.empty()) {
    std::fprintf(stderr, "usage: golden_check [--max-rel-l2 X] [--min-margin Y] CASE_DIR...\n");
    return 2;
  }
  tf::ThreadPool pool(0);
  int failures = 0;
  for (const auto& d : dirs) {
    const int f = check_case(d, max_rel_l2, min_margin, &pool);
    if (f < 0) return 2;
    failures += f;
  }
  std::printf("%d prompt(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
