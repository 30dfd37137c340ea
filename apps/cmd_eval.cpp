// tensorfold eval: the held-out evaluation of the embedded model (issue 4's targets) on our engine.
//   tensorfold eval [--model DIR] [--cases FILE] [--copy N] [--arith N] [--batch B] [--threads T]
//                   [--prose N] [--min-copy F] [--min-arith-off F] [--min-arith-on F] [--min-same
//                   F]
//                   [--min-mtp-copy F] [--min-mtp-prose F] [--json]
// Each case is one user message rendered with the model's own chat template (generation prompt on),
// encoded with its tokenizer and decoded greedily with Model::forward (fp32, CPU), many sequences
// per step. Copy: the answer must be the passage exactly, then <|im_end|> (thinking off).
// Arithmetic: the last integer after </think> must be a + b or a - b (thinking off and on). Cases
// and transformers' greedy tokens for them come from tools/tiny_next/eval_cases.json
// (tools/tiny_next/make_eval_cases.py); "same tokens" is the share of cases where the engine
// produced exactly transformers' tokens. With --min-*, the exit code is 1 when a result is below
// its floor (the ctest `tiny_next_eval`).
//
// MTP agreement (train.py's mtp_agreement, on our engine): before each token x the model is fed
// after the prompt, the head drafts one token from (H of the last position, x) (Model::draft, k =
// 1); it agrees when the draft equals the model's own argmax after x, i.e. a one-token draft is
// accepted. Measured on the copy answers, on held-out prose teacher-forced (the first 256 tokens of
// each document: positions 0..254, the model's argmax as the target) and on the model's own greedy
// continuation of held-out prose ("Continue this text" with the first 40 words, 64 tokens).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <regex>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tf::app {
namespace {

struct EvalOptions {
  std::string model = kDefaultModel;
  std::string cases = "tools/tiny_next/eval_cases.json";
  int copy = -1;   // the first N copy cases (-1: all)
  int arith = -1;  // the first N arithmetic cases, run with thinking off and on (-1: all)
  int prose = -1;  // the first N held-out prose documents for MTP agreement (-1: all)
  int batch = 32;
  int threads = 0;
  WeightOptions weights;  // --load-mode, --matmul-precision
  double min_copy = 0, min_arith_off = 0, min_arith_on = 0, min_same = 0;
  double min_mtp_copy = 0, min_mtp_prose = 0;
  bool json = false;
};

// One greedy generation, or (forced non-empty) one teacher-forced pass.
struct Job {
  std::vector<int32_t> prompt;
  int max_new = 0;
  std::vector<int32_t> out;     // generated tokens (the stop token included)
  std::vector<int32_t> forced;  // fed after the prompt instead of generating; out stays empty
  bool mtp = false;             // measure MTP agreement (the model must have a head)
  int mtp_n = 0, mtp_agree = 0;
};

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// Greedy decoding (or teacher forcing) of every job, `batch` sequences per forward step; a
// generating job ends at a stop token (kept in out) or after max_new tokens, a forced one after its
// last forced token. MTP jobs draft one token before each token fed after the prompt, and score it
// against the argmax of the logits row that feeding the token gives.
void greedy(const Model& model, std::vector<Job>& jobs, const std::vector<int32_t>& stops,
            int batch, ThreadPool* pool) {
  const int64_t V = model.config().vocab_size;
  auto is_stop = [&](int32_t t) { return std::find(stops.begin(), stops.end(), t) != stops.end(); };
  for (size_t s = 0; s < jobs.size(); s += static_cast<size_t>(batch)) {
    const size_t e = std::min(jobs.size(), s + static_cast<size_t>(batch));
    std::vector<SequenceState> states;
    states.reserve(e - s);
    std::vector<StepInput> in;
    std::vector<size_t> active;
    for (size_t i = s; i < e; ++i) {
      states.push_back(model.new_state(nullptr, jobs[i].mtp && model.has_mtp()));
      in.push_back({&states.back(), jobs[i].prompt, false});
      active.push_back(i);
    }
    std::vector<int32_t> fed(e - s, -1), drafted(e - s, -1);  // per job of the batch
    std::vector<size_t> n_forced(e - s, 0);
    std::vector<float> logits;
    model.forward(in, &logits, pool);
    while (!active.empty()) {
      std::vector<size_t> next;
      for (size_t k = 0; k < active.size(); ++k) {
        const size_t b = active[k] - s;
        Job& j = jobs[active[k]];
        const int32_t top = argmax(logits.data() + static_cast<int64_t>(k) * V, V);
        if (drafted[b] >= 0) {
          j.mtp_n += 1;
          j.mtp_agree += drafted[b] == top;
        }
        if (!j.forced.empty()) {
          if (n_forced[b] == j.forced.size()) continue;
          fed[b] = j.forced[n_forced[b]++];
        } else {
          j.out.push_back(top);
          if (is_stop(top) || static_cast<int>(j.out.size()) >= j.max_new) continue;
          fed[b] = top;
        }
        next.push_back(active[k]);
      }
      if (next.empty()) break;
      std::vector<DraftInput> din;
      for (size_t idx : next)
        if (states[idx - s].has_mtp) din.push_back({&states[idx - s], fed[idx - s], 1});
      std::vector<Draft> dout(din.size());
      if (!din.empty()) model.draft(din, dout, pool);
      for (size_t d = 0, k = 0; k < next.size(); ++k) {
        const size_t b = next[k] - s;
        drafted[b] = states[b].has_mtp ? dout[d++].tokens.at(0) : -1;
      }
      in.clear();
      for (size_t idx : next)
        in.push_back({&states[idx - s], std::span<const int32_t>(&fed[idx - s], 1), false});
      logits.clear();
      model.forward(in, &logits, pool);
      active = std::move(next);
    }
  }
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
    s.replace(p, from.size(), to);
  return s;
}

// The last integer after the last </think> (train.py's parse_answer).
std::optional<long long> parse_answer(const std::string& text) {
  const size_t p = text.rfind("</think>");
  const std::string ans = p == std::string::npos ? text : text.substr(p + 8);
  static const std::regex num("-?[0-9]+");
  std::optional<long long> last;
  for (auto it = std::sregex_iterator(ans.begin(), ans.end(), num); it != std::sregex_iterator();
       ++it) {
    try {
      last = std::stoll(it->str());
    } catch (const std::exception&) {
      last.reset();
    }
  }
  return last;
}

std::vector<int32_t> ids_of(const nlohmann::json& j) {
  std::vector<int32_t> v;
  if (j.is_array())
    for (const auto& x : j) v.push_back(x.get<int32_t>());
  return v;
}

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f%%", 100.0 * x);
  return b;
}

struct Tally {
  int ok = 0, n = 0, same = 0;
  double rate() const { return n ? static_cast<double>(ok) / n : 0.0; }
  double same_rate() const { return n ? static_cast<double>(same) / n : 0.0; }
};

// MTP agreement over a range of jobs: positions and agreeing drafts.
Tally mtp_tally(std::span<const Job> jobs) {
  Tally t;
  for (const Job& j : jobs) {
    t.ok += j.mtp_agree;
    t.n += j.mtp_n;
  }
  return t;
}

int run_eval(const EvalOptions& o) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "error: %s\n", st.to_string().c_str());
    return 2;
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto model_or = Model::load(o.model, {}, load_options(o.weights, "cpu"));
  if (!model_or) return fail(model_or.status());
  const Model& model = **model_or;
  auto tok_or = tok::Tokenizer::load(o.model);
  if (!tok_or) return fail(tok_or.status());
  const tok::Tokenizer& tk = *tok_or;
  auto tmpl_or = tok::ChatTemplate::load(o.model);
  if (!tmpl_or) return fail(tmpl_or.status());
  const tok::ChatTemplate& tmpl = *tmpl_or;

  std::ifstream f(o.cases, std::ios::binary);
  if (!f) return fail(Status::not_found("cannot open --cases {}", o.cases));
  nlohmann::json cases;
  try {
    cases = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    return fail(Status::invalid("{}: not valid JSON: {}", o.cases, e.what()));
  }
  const auto im_end = tk.token_to_id("<|im_end|>");
  const auto eot = tk.token_to_id("<|endoftext|>");
  if (!im_end || !eot)
    return fail(Status::invalid("{}: no <|im_end|> / <|endoftext|> token", o.model));
  const std::vector<int32_t> stops = {*im_end, *eot};

  auto render = [&](const std::string& user, bool thinking) -> Result<std::vector<int32_t>> {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    msgs.push_back({{"role", "user"}, {"content", user}});
    tok::ChatOptions opt;
    opt.add_generation_prompt = true;
    opt.enable_thinking = thinking;
    auto text = tmpl.render(msgs, nullptr, opt);
    if (!text) return text.status();
    return tk.encode(*text);
  };
  auto text_of = [&](const std::vector<int32_t>& out) {
    std::vector<int32_t> v;
    for (int32_t t : out)
      if (t != *im_end && t != *eot) v.push_back(t);
    return tk.decode(v);
  };

  std::vector<Job> jobs;
  // copy
  const auto& cc = cases.at("copy");
  const size_t n_copy = o.copy < 0 ? cc.size() : std::min(cc.size(), static_cast<size_t>(o.copy));
  const std::string copy_prompt = cases.value("copy_prompt", "Copy this text exactly:\n\n{text}");
  for (size_t i = 0; i < n_copy; ++i) {
    const std::string text = cc[i].at("text").get<std::string>();
    auto p = render(replace_all(copy_prompt, "{text}", text), false);
    if (!p) return fail(p.status());
    auto t = tk.encode(text);
    if (!t) return fail(t.status());
    jobs.push_back({std::move(*p), static_cast<int>(t->size()) + 8, {}, {}, true});
  }
  // arithmetic, thinking off then on
  const auto& ac = cases.at("arith");
  const size_t n_arith =
      o.arith < 0 ? ac.size() : std::min(ac.size(), static_cast<size_t>(o.arith));
  const std::string arith_prompt = cases.value("arith_prompt", "What is {a} {op} {b}?");
  for (int think = 0; think < 2; ++think) {
    for (size_t i = 0; i < n_arith; ++i) {
      const auto& c = ac[i];
      std::string q = replace_all(arith_prompt, "{a}", std::to_string(c.at("a").get<long long>()));
      q = replace_all(q, "{op}", c.at("op").get<std::string>());
      q = replace_all(q, "{b}", std::to_string(c.at("b").get<long long>()));
      auto p = render(q, think == 1);
      if (!p) return fail(p.status());
      jobs.push_back({std::move(*p), think ? 200 : 24, {}, {}, false});
    }
  }
  // held-out prose for MTP agreement: teacher-forced, then the model's own continuations
  const size_t prose_at = jobs.size();
  const nlohmann::json no_prose = nlohmann::json::array();
  const auto& pc = model.has_mtp() && cases.contains("prose") ? cases.at("prose") : no_prose;
  const size_t n_prose =
      o.prose < 0 ? pc.size() : std::min(pc.size(), static_cast<size_t>(o.prose));
  for (size_t i = 0; i < n_prose; ++i) {
    auto ids = tk.encode(pc[i].at("text").get<std::string>());
    if (!ids) return fail(ids.status());
    if (ids->size() > 256) ids->resize(256);
    if (ids->size() < 8) continue;
    Job j{{ids->front()}, 0, {}, {}, true};
    j.forced.assign(ids->begin() + 1, ids->end() - 1);  // x[1 .. T-2]: positions 0 .. T-3
    jobs.push_back(std::move(j));
  }
  const size_t continue_at = jobs.size();
  const std::string continue_prompt =
      cases.value("continue_prompt", "Continue this text:\n\n{text}");
  for (size_t i = 0; i < n_prose; ++i) {
    std::istringstream ws(pc[i].at("text").get<std::string>());
    std::vector<std::string> words;
    for (std::string w; ws >> w;) words.push_back(w);
    if (words.size() < 20) continue;
    std::string head;
    for (size_t w = 0; w < std::min<size_t>(40, words.size()); ++w)
      head += (w ? " " : "") + words[w];
    auto p = render(replace_all(continue_prompt, "{text}", head), false);
    if (!p) return fail(p.status());
    jobs.push_back({std::move(*p), 64, {}, {}, true});
  }
  const auto t1 = std::chrono::steady_clock::now();
  ThreadPool pool(o.threads);
  greedy(model, jobs, stops, std::max(1, o.batch), &pool);
  const auto t2 = std::chrono::steady_clock::now();

  size_t gen_tokens = 0, prompt_tokens = 0;
  for (const Job& j : jobs) {
    gen_tokens += j.out.size();
    prompt_tokens += j.prompt.size();
  }
  Tally copy_all, copy_short, copy_long, arith[2], arith_add[2], arith_sub[2];
  std::vector<std::string> failures;
  for (size_t i = 0; i < n_copy; ++i) {
    const std::string text = cc[i].at("text").get<std::string>();
    const Job& j = jobs[i];
    const bool ok = !j.out.empty() && j.out.back() == *im_end && text_of(j.out) == text;
    const bool same = j.out == ids_of(cc[i].value("hf", nlohmann::json()));
    int words = 0;
    std::istringstream ws(text);
    for (std::string w; ws >> w;) ++words;
    for (Tally* t : {&copy_all, words <= 20 ? &copy_short : &copy_long}) {
      t->ok += ok;
      t->same += same;
      t->n += 1;
    }
    if (!ok && failures.size() < 3)
      failures.push_back("copy: want \"" + text + "\"\n      got  \"" + text_of(j.out) + "\"");
  }
  for (int think = 0; think < 2; ++think) {
    for (size_t i = 0; i < n_arith; ++i) {
      const auto& c = ac[i];
      const Job& j = jobs[n_copy + think * n_arith + i];
      const long long a = c.at("a").get<long long>(), b = c.at("b").get<long long>();
      const bool add = c.at("op").get<std::string>() == "+";
      const auto got = parse_answer(text_of(j.out));
      const bool ok = got && *got == (add ? a + b : a - b);
      const bool same = j.out == ids_of(c.value(think ? "hf_on" : "hf_off", nlohmann::json()));
      for (Tally* t : {&arith[think], add ? &arith_add[think] : &arith_sub[think]}) {
        t->ok += ok;
        t->same += same;
        t->n += 1;
      }
      if (!ok && failures.size() < 6)
        failures.push_back(std::string("arithmetic (thinking ") + (think ? "on" : "off") +
                           "): " + std::to_string(a) + (add ? " + " : " - ") + std::to_string(b) +
                           " -> \"" + text_of(j.out) + "\"");
    }
  }
  const double load_s = std::chrono::duration<double>(t1 - t0).count();
  const double run_s = std::chrono::duration<double>(t2 - t1).count();

  std::printf("TensorFold eval: %s on %s (greedy, fp32 CPU, batch %d)\n\n", o.model.c_str(),
              o.cases.c_str(), o.batch);
  std::printf("| task | result | n | same tokens as transformers |\n|---|---|---|---|\n");
  if (copy_all.n) {
    std::printf("| copy a held-out passage exactly (thinking off) | %s | %d | %s |\n",
                pct(copy_all.rate()).c_str(), copy_all.n, pct(copy_all.same_rate()).c_str());
    if (copy_short.n)
      std::printf("| - passages of 1-20 words | %s | %d | %s |\n", pct(copy_short.rate()).c_str(),
                  copy_short.n, pct(copy_short.same_rate()).c_str());
    if (copy_long.n)
      std::printf("| - passages of 21-40 words | %s | %d | %s |\n", pct(copy_long.rate()).c_str(),
                  copy_long.n, pct(copy_long.same_rate()).c_str());
  }
  for (int think = 0; think < 2; ++think) {
    if (!arith[think].n) continue;
    std::printf("| a + b / a - b (a, b < 1000), thinking %s | %s (add %s, sub %s) | %d | %s |\n",
                think ? "on" : "off", pct(arith[think].rate()).c_str(),
                pct(arith_add[think].rate()).c_str(), pct(arith_sub[think].rate()).c_str(),
                arith[think].n, pct(arith[think].same_rate()).c_str());
  }
  const std::span<const Job> all(jobs);
  const Tally mtp_copy = mtp_tally(all.subspan(0, n_copy));
  const Tally mtp_forced = mtp_tally(all.subspan(prose_at, continue_at - prose_at));
  const Tally mtp_own = mtp_tally(all.subspan(continue_at));
  if (model.has_mtp()) {
    std::printf("| MTP top-1 agreement, copy answers (positions) | %s | %d | |\n",
                pct(mtp_copy.rate()).c_str(), mtp_copy.n);
    if (mtp_forced.n)
      std::printf(
          "| MTP top-1 agreement, held-out prose teacher-forced (positions) | %s | %d | |\n",
          pct(mtp_forced.rate()).c_str(), mtp_forced.n);
    if (mtp_own.n)
      std::printf(
          "| MTP top-1 agreement, the model's own continuation of held-out prose (positions) | %s "
          "| "
          "%d | |\n",
          pct(mtp_own.rate()).c_str(), mtp_own.n);
  } else {
    std::printf("| MTP top-1 agreement | the model has no MTP head | | |\n");
  }
  std::printf("\n");
  std::printf("%zu sequences, %zu prompt + %zu generated tokens; load %.1f s, run %.1f s\n",
              jobs.size(), prompt_tokens, gen_tokens, load_s, run_s);
  for (const auto& s : failures) std::printf("  failure: %s\n", s.c_str());

  const Tally total_same = [&] {
    Tally t;
    for (const Tally* x : {&copy_all, &arith[0], &arith[1]}) {
      t.same += x->same;
      t.n += x->n;
    }
    return t;
  }();
  std::vector<std::string> below;
  auto floor = [&](const char* name, const Tally& t, double min, double v) {
    if (t.n && v < min) below.push_back(std::string(name) + " " + pct(v) + " < " + pct(min));
  };
  floor("copy", copy_all, o.min_copy, copy_all.rate());
  floor("arithmetic thinking off", arith[0], o.min_arith_off, arith[0].rate());
  floor("arithmetic thinking on", arith[1], o.min_arith_on, arith[1].rate());
  floor("same tokens as transformers", total_same, o.min_same, total_same.same_rate());
  floor("MTP agreement on copy", mtp_copy, o.min_mtp_copy, mtp_copy.rate());
  floor("MTP agreement on the model's own prose", mtp_own, o.min_mtp_prose, mtp_own.rate());
  if (o.json) {
    nlohmann::json j = {{"copy_exact", copy_all.rate()},
                        {"copy_n", copy_all.n},
                        {"copy_exact_1_20_words", copy_short.rate()},
                        {"copy_exact_21_40_words", copy_long.rate()},
                        {"arith_thinking_off", arith[0].rate()},
                        {"arith_thinking_on", arith[1].rate()},
                        {"arith_n", arith[0].n},
                        {"same_tokens_as_transformers", total_same.same_rate()},
                        {"mtp_copy_agreement", mtp_copy.rate()},
                        {"mtp_copy_positions", mtp_copy.n},
                        {"mtp_prose_teacher_forced_agreement", mtp_forced.rate()},
                        {"mtp_prose_teacher_forced_positions", mtp_forced.n},
                        {"mtp_prose_generated_agreement", mtp_own.rate()},
                        {"mtp_prose_generated_positions", mtp_own.n},
                        {"generated_tokens", gen_tokens},
                        {"seconds", run_s},
                        {"below_floor", below}};
    std::printf("%s\n", j.dump().c_str());
  }
  for (const auto& b : below) std::printf("BELOW FLOOR: %s\n", b.c_str());
  return below.empty() ? 0 : 1;
}

}  // namespace

void add_eval(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "Held-out copy, arithmetic and MTP evaluation (greedy) of the model");
  cmd->add_option("--model", o->model, "Checkpoint directory")->capture_default_str();
  add_load_options(cmd, &o->weights);
  cmd->add_option("--cases", o->cases, "Cases file (tools/tiny_next/make_eval_cases.py)")
      ->capture_default_str();
  cmd->add_option("--copy", o->copy, "Run the first N copy cases (-1: all)")->capture_default_str();
  cmd->add_option("--arith", o->arith,
                  "Run the first N arithmetic cases, thinking off and on (-1: all)")
      ->capture_default_str();
  cmd->add_option("--prose", o->prose,
                  "Run the first N held-out prose documents for MTP agreement (-1: all)")
      ->capture_default_str();
  cmd->add_option("--batch", o->batch, "Sequences decoded together")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--threads", o->threads, "Worker threads (0 = all cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--min-copy", o->min_copy, "Exit 1 if copy exact match is below this (0-1)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-arith-off", o->min_arith_off,
                  "Exit 1 if arithmetic (thinking off) is below this")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-arith-on", o->min_arith_on,
                  "Exit 1 if arithmetic (thinking on) is below this")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-same", o->min_same,
                  "Exit 1 if fewer cases than this match transformers' tokens")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-mtp-copy", o->min_mtp_copy,
                  "Exit 1 if MTP agreement on the copy answers is below this")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-mtp-prose", o->min_mtp_prose,
                  "Exit 1 if MTP agreement on the model's own prose continuations is below this")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--json", o->json, "Also print one JSON line with the numbers");
  cmd->callback([o] { exit_code() = run_eval(*o); });
}

}  // namespace tf::app
