// mtp_check DIR...: compares our MTP head with tools/mtp_reference.py's logits (mtp_reference.json
// and mtp.logits.f32 in each case folder; the reference runs the target model in transformers and
// the head in PyTorch from qwen3-next.md section 6.1).
//
// Per prompt x[0..P-1]:
//   teacher rows p (every p when P <= 65, else every 8th and the last 4): prefill x[0..p], then
//     draft(next = x[p+1], k = 1): the head at p on (H[p], x[p+1]) over its cache rows 0..p, which
//     forward's catch-up wrote;
//   chained rows s = 1..k: prefill the prompt, draft(next = g0, k), g0 the reference's target
//     argmax; compared while the reference's previous draft had a top-2 margin above --min-margin.
// Passes when every compared row's relative L2 error is <= --max-rel-l2 (1e-4) and every chained
// draft equals the reference's. Exits 1 on any failure, 2 on bad input.
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "golden_util.h"

namespace {

using tf::golden::rel_l2;

// Returns the number of failures for one case directory, or -1 on bad input.
int check_case(const std::string& dir, double max_rel_l2, double min_margin, tf::ThreadPool* pool) {
  const tf::golden::Case c = tf::golden::load_case(dir, "mtp_reference.json");
  if (!c.model) return -1;
  const nlohmann::json& ref = c.ref;
  const tf::Model& model = *c.model;
  if (!model.has_mtp()) {
    std::fprintf(stderr, "%s: the checkpoint has no MTP head\n", dir.c_str());
    return -1;
  }
  const int64_t V = model.config().vocab_size;
  const int64_t rows = ref.at("rows").get<int64_t>();
  std::vector<float> want;
  if (ref.at("vocab_size").get<int64_t>() != V ||
      !tf::golden::read_logits(dir, ref.at("logits_file").get<std::string>(), rows * V, &want)) {
    std::fprintf(stderr, "%s: short logits file or other vocab\n", dir.c_str());
    return -1;
  }
  // The head's logits at n_past - 1 for `next`, after prefilling `prefix`.
  auto draft_rows = [&](std::span<const int32_t> prefix, int32_t next, int k) {
    tf::SequenceState st = model.new_state(nullptr, true);
    std::vector<float> logits;
    const tf::StepInput step{&st, prefix, false};
    model.forward({&step, 1}, &logits, pool);
    const tf::DraftInput d{&st, next, k, 0.0f, true};
    tf::Draft out;
    model.draft({&d, 1}, {&out, 1}, pool);
    return out;
  };
  int failures = 0;
  for (const auto& p : ref.at("prompts")) {
    const auto ids = p.at("ids").get<std::vector<int32_t>>();
    const auto margins = p.at("margins").get<std::vector<double>>();
    const auto drafts = p.at("drafts").get<std::vector<int32_t>>();
    const int64_t row0 = p.at("row0").get<int64_t>();
    const int64_t P = static_cast<int64_t>(ids.size());
    double worst = 0;
    int checked = 0;
    for (int64_t t = 0; t + 1 < P; ++t) {
      if (P > 65 && t % 8 != 0 && t + 5 < P) continue;
      const auto d = draft_rows(std::span<const int32_t>(ids).first(t + 1), ids[t + 1], 1);
      worst = std::max(worst, rel_l2(d.logits.data(), &want[(row0 + t) * V], V));
      ++checked;
    }
    const int k = p.at("draft_rows").get<int>();
    const auto d = draft_rows(ids, p.at("g0").get<int32_t>(), k);
    int chained = 0;
    bool tokens_ok = true;
    for (int s = 0; s < k; ++s) {
      const int64_t r = row0 + (P - 1) + s;
      if (s > 0 && margins[r - row0 - 1] < min_margin) break;  // the reference's d_s is a near tie
      worst = std::max(worst, rel_l2(&d.logits[s * V], &want[r * V], V));
      tokens_ok = tokens_ok && d.tokens[s] == drafts[s];
      ++chained;
    }
    const bool ok = worst <= max_rel_l2 && tokens_ok;
    failures += ok ? 0 : 1;
    std::printf("%s %s: %d teacher rows, %d chained, max rel-L2 %.2e, drafts %s -> %s\n",
                dir.c_str(), p.at("name").get<std::string>().c_str(), checked, chained, worst,
                tokens_ok ? "equal" : "DIFFER", ok ? "ok" : "FAIL");
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  return tf::golden::main(argc, argv, "mtp_check", check_case);
}
