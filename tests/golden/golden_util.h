// What golden_check and mtp_check share: reading a case folder (a reference JSON, the checkpoint it
// names, f32 logits files), the relative L2 error, and the command line (flags, folders, exit
// codes).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"

namespace tf::golden {

// ||a - b|| / ||b|| over n floats, in double.
inline double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// How the case folders' models load (main's --bf16-products: LoadOptions::bf16_products).
inline LoadOptions& load_options() {
  static LoadOptions o;
  return o;
}

// A case folder's reference (DIR/file) and its model: the weights live in the folder, or where the
// reference's "checkpoint" (relative to the folder) points. Null model (and a message) on bad
// input.
struct Case {
  nlohmann::json ref;
  std::unique_ptr<Model> model;
};
inline Case load_case(const std::string& dir, const std::string& file) {
  Case c;
  std::ifstream in(dir + "/" + file);
  if (!in) {
    std::fprintf(stderr, "%s: no %s\n", dir.c_str(), file.c_str());
    return c;
  }
  try {
    c.ref = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "%s/%s: %s\n", dir.c_str(), file.c_str(), e.what());
    return c;
  }
  const std::string model_dir =
      c.ref.contains("checkpoint") ? dir + "/" + c.ref["checkpoint"].get<std::string>() : dir;
  auto model_or = Model::load(model_dir, {}, load_options());
  if (!model_or) {
    std::fprintf(stderr, "%s: %s\n", dir.c_str(), model_or.status().to_string().c_str());
    return c;
  }
  c.model = std::move(*model_or);
  return c;
}

// `count` f32 values of DIR/file (little-endian, as numpy's tofile writes them); false when short.
inline bool read_logits(const std::string& dir, const std::string& file, size_t count,
                        std::vector<float>* out) {
  out->assign(count, 0.0f);
  std::ifstream f(dir + "/" + file, std::ios::binary);
  f.read(reinterpret_cast<char*>(out->data()), static_cast<std::streamsize>(count * 4));
  return static_cast<bool>(f);
}

// Checks one case folder: the number of failed prompts, or -1 on bad input.
using CheckCase = std::function<int(const std::string& dir, double max_rel_l2, double min_margin,
                                    ThreadPool* pool)>;

// `NAME [--max-rel-l2 X] [--min-margin Y] [--bf16-products] CASE_DIR...` (defaults 1e-4 and 1e-3;
// the flag loads the models with --matmul-precision bf16): exit 0 when every prompt passes, 1 on a
// failure, 2 on bad input.
inline int main(int argc, char** argv, const char* name, const CheckCase& check) {
  double max_rel_l2 = 1e-4, min_margin = 1e-3;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--max-rel-l2" && i + 1 < argc)
      max_rel_l2 = std::atof(argv[++i]);
    else if (a == "--min-margin" && i + 1 < argc)
      min_margin = std::atof(argv[++i]);
    else if (a == "--bf16-products")
      load_options().bf16_products = true;
    else
      dirs.push_back(a.size() > 1 && a.back() == '/' ? a.substr(0, a.size() - 1) : a);
  }
  if (dirs.empty()) {
    std::fprintf(stderr,
                 "usage: %s [--max-rel-l2 X] [--min-margin Y] [--bf16-products] CASE_DIR...\n",
                 name);
    return 2;
  }
  ThreadPool pool(0);
  int failures = 0;
  for (const auto& d : dirs) {
    const int f = check(d, max_rel_l2, min_margin, &pool);
    if (f < 0) return 2;
    failures += f;
  }
  std::printf("%d prompt(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace tf::golden
