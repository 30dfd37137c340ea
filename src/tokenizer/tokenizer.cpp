#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/file.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/utf8.h"

namespace tf::tok {
namespace {

using json = nlohmann::json;

// Open-addressing map from a (left id, right id) pair to (rank, merged id): the BPE merge table.
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, 0);
    mask_ = cap - 1;
  }
  // Returns false when the pair is already present (the first, lowest rank, wins).
  bool insert(uint64_t key, uint64_t val) {
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return false;
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        vals_[i] = val;
        return true;
      }
    }
  }
  // (rank << 32 | merged id), or kNone.
  uint64_t find(uint64_t key) const {
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return vals_[i];
      if (keys_[i] == kEmpty) return kNone;
    }
  }
  static constexpr uint64_t kNone = ~uint64_t{0};

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<uint64_t> keys_, vals_;
  size_t mask_ = 0;
};

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

enum class SplitBehavior { kIsolated, kRemoved };
struct SplitStage {
  RegexSplitter regex;
  SplitBehavior behavior;
};

// Added tokens as a byte trie, matched leftmost-longest (HF uses aho-corasick LeftmostLongest).
class AddedMatcher {
 public:
  void add(std::string_view s, int index) {
    int node = 0;
    for (unsigned char c : s) {
      auto it = std::find_if(nodes_[node].next.begin(), nodes_[node].next.end(),
                             [&](const auto& e) { return e.first == c; });
      if (it == nodes_[node].next.end()) {
        nodes_.push_back({});
        nodes_[node].next.push_back({c, static_cast<int>(nodes_.size() - 1)});
        node = static_cast<int>(nodes_.size() - 1);
      } else {
        node = it->second;
      }
    }
    nodes_[node].token = index;
    first_[static_cast<unsigned char>(s[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // Longest token starting at text[i]: (token index, length), or index -1.
  std::pair<int, size_t> longest_at(std::string_view text, size_t i) const {
    if (!first_[static_cast<unsigned char>(text[i])]) return {-1, 0};
    int node = 0;
    std::pair<int, size_t> best{-1, 0};
    for (size_t k = i; k < text.size(); ++k) {
      const auto& next = nodes_[node].next;
      const auto c = static_cast<unsigned char>(text[k]);
      auto it = std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == c; });
      if (it == next.end()) break;
      node = it->second;
      if (nodes_[node].token >= 0) best = {nodes_[node].token, k + 1 - i};
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;
    int token = -1;
  };
  std::vector<Node> nodes_{Node{}};
  bool first_[256] = {};
  bool empty_ = true;
};

std::atomic<uint64_t> g_next_instance{1};

// Python's str.isspace / Rust's char::is_whitespace agree on these (White_Space property).
bool is_whitespace_cp(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace

struct Tokenizer::Impl {
  uint64_t instance = g_next_instance.fetch_add(1);
  std::vector<Normalizer> normalizers;  // applied in order
  std::vector<SplitStage> splits;       // applied in order, each on the pieces of the previous
  bool ignore_merges = false;
  int32_t byte_id[256];  // id of the single-byte token of each byte (-1: absent)
  MergeTable merges;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab;        // token -> id
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_bytes;  // bytes->id
  std::vector<std::string> id_token;   // id -> token string as in tokenizer.json ("" if none)
  std::vector<uint32_t> id_bytes_off;  // id -> [off, off + len) in id_bytes_buf
  std::vector<uint32_t> id_bytes_len;
  std::string id_bytes_buf;
  std::vector<uint8_t> id_flags;  // bit 0: present, bit 1: special, bit 2: added
  std::vector<AddedToken> added;
  AddedMatcher raw_matcher, normalized_matcher;

  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_uncached(std::string_view piece, std::vector<int32_t>& out) const;
  Status encode_normalized(std::string_view text, std::vector<int32_t>& out) const;
  Status encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void split_added(std::string_view text, const AddedMatcher& m,
                   std::vector<std::pair<std::string_view, int>>& parts) const;
};

// ---------------------------------------------------------------------------------------------
// Loading

namespace {

// Byte-level token string -> raw bytes; nullopt when a char is outside the byte alphabet.
std::optional<std::string> byte_level_decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    const int b = unicode_to_byte(utf8_next(token, i));
    if (b < 0) return std::nullopt;
    out += static_cast<char>(b);
  }
  return out;
}

const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

Status add_normalizer(const json& n, std::string_view src, std::vector<Normalizer>& out) {
  if (n.is_null()) return Status::ok();
  if (!n.is_object() || !n.contains("type") || !n["type"].is_string())
    return Status::corrupt("{}: normalizer: expected an object with a \"type\"", src);
  const std::string type = n["type"];
  if (type == "Sequence") {
    const json* list = field(n, "normalizers");
    if (!list || !list->is_array())
      return Status::corrupt("{}: normalizer Sequence without a \"normalizers\" list", src);
    for (const json& e : *list) TF_RETURN_IF_ERROR(add_normalizer(e, src, out));
    return Status::ok();
  }
  auto form = normalizer_form(type);
  if (!form) return Status::unsupported("{}: normalizer type {} is not supported", src, type);
  TF_ASSIGN_OR_RETURN(Normalizer norm, Normalizer::create(*form));
  out.push_back(norm);
  return Status::ok();
}

// The regex HF's ByteLevel pre-tokenizer applies when use_regex is true (GPT-2's).
constexpr const char* kByteLevelRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status add_pre_tokenizer(const json& p, std::string_view src, std::vector<SplitStage>& out,
                         bool& saw_byte_level) {
  if (p.is_null()) return Status::ok();
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
    return Status::corrupt("{}: pre_tokenizer: expected an object with a \"type\"", src);
  const std::string type = p["type"];
  if (type == "Sequence") {
    const json* list = field(p, "pretokenizers");
    if (!list || !list->is_array())
      return Status::corrupt("{}: pre_tokenizer Sequence without a \"pretokenizers\" list", src);
    for (const json& e : *list) TF_RETURN_IF_ERROR(add_pre_tokenizer(e, src, out, saw_byte_level));
    return Status::ok();
  }
  if (type == "ByteLevel") {
    if (p.value("add_prefix_space", false))
      return Status::unsupported("{}: ByteLevel pre-tokenizer with add_prefix_space", src);
    saw_byte_level = true;
    if (p.value("use_regex", true)) {
      TF_ASSIGN_OR_RETURN(RegexSplitter re, RegexSplitter::compile(kByteLevelRegex));
      out.push_back({std::move(re), SplitBehavior::kIsolated});
    }
    return Status::ok();
  }
  if (type == "Split") {
    const json* pat = field(p, "pattern");
    if (!pat || !pat->is_object())
      return Status::corrupt("{}: Split pre-tokenizer without a \"pattern\" object", src);
    std::string regex;
    if (pat->contains("Regex") && (*pat)["Regex"].is_string()) {
      regex = (*pat)["Regex"];
    } else if (pat->contains("String") && (*pat)["String"].is_string()) {
      regex = RegexSplitter::quote((*pat)["String"].get<std::string>());
    } else {
      return Status::corrupt("{}: Split pattern must hold \"Regex\" or \"String\"", src);
    }
    if (p.value("invert", false))
      return Status::unsupported("{}: Split pre-tokenizer with invert=true", src);
    const std::string behavior = p.value("behavior", std::string("Isolated"));
    SplitBehavior b;
    if (behavior == "Isolated") {
      b = SplitBehavior::kIsolated;
    } else if (behavior == "Removed") {
      b = SplitBehavior::kRemoved;
    } else {
      return Status::unsupported("{}: Split behavior {} is not supported", src, behavior);
    }
    auto re = RegexSplitter::compile(regex);
    if (!re) return Status::corrupt("{}: Split regex: {}", src, re.status().message());
    out.push_back({std::move(re).value(), b});
    return Status::ok();
  }
  return Status::unsupported("{}: pre_tokenizer type {} is not supported", src, type);
}

}  // namespace

Result<Tokenizer> Tokenizer::load(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  TF_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return from_json(text, path);
}

Result<Tokenizer> Tokenizer::from_json(std::string_view text, std::string_view src) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::corrupt("{}: not valid JSON", src);
  if (!j.is_object()) return Status::corrupt("{}: top level must be an object", src);
  auto impl = std::make_shared<Impl>();

  if (const json* n = field(j, "normalizer"))
    TF_RETURN_IF_ERROR(add_normalizer(*n, src, impl->normalizers));
  bool byte_level = false;
  if (const json* p = field(j, "pre_tokenizer"))
    TF_RETURN_IF_ERROR(add_pre_tokenizer(*p, src, impl->splits, byte_level));
  if (!byte_level)
    return Status::unsupported("{}: only byte-level BPE is supported (no ByteLevel pre-tokenizer)",
                               src);
  const json* dec = field(j, "decoder");
  if (!dec || !dec->is_object() || dec->value("type", std::string()) != "ByteLevel")
    return Status::unsupported("{}: decoder must be ByteLevel", src);

  const json* model = field(j, "model");
  if (!model || !model->is_object()) return Status::corrupt("{}: missing \"model\"", src);
  if (model->value("type", std::string("BPE")) != "BPE")
    return Status::unsupported("{}: model type {} is not supported (BPE only)", src,
                               model->value("type", std::string()));
  for (const char* k : {"dropout", "unk_token"})
    if (field(*model, k)) return Status::unsupported("{}: BPE {} is not supported", src, k);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = field(*model, k);
    if (v && !(v->is_string() && v->get<std::string>().empty()))
      return Status::unsupported("{}: BPE {} is not supported", src, k);
  }
  if (model->value("byte_fallback", false))
    return Status::unsupported("{}: BPE byte_fallback is not supported", src);
  impl->ignore_merges = model->value("ignore_merges", false);

  const json* vocab = field(*model, "vocab");
  if (!vocab || !vocab->is_object())
    return Status::corrupt("{}: model.vocab must be an object", src);
  int32_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > (1 << 30))
      return Status::corrupt("{}: model.vocab[{}] must be a non-negative id", src, it.key());
    const auto id = it.value().get<int32_t>();
    impl->vocab.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  const json* added = field(j, "added_tokens");
  if (added && !added->is_array()) return Status::corrupt("{}: added_tokens must be a list", src);
  if (added) {
    for (const json& a : *added) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() > (1 << 30))
        return Status::corrupt("{}: added_tokens: each needs an integer \"id\" and a \"content\"",
                               src);
      AddedToken t;
      t.id = a["id"].get<int32_t>();
      t.content = a["content"].get<std::string>();
      if (t.content.empty() || !utf8_valid(t.content))
        return Status::corrupt("{}: added token {} has empty or invalid content", src, t.id);
      t.special = a.value("special", false);
      t.normalized = a.value("normalized", !t.special);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      max_id = std::max(max_id, t.id);
      impl->added.push_back(std::move(t));
    }
  }

  // id -> token string, decoded bytes and flags. Ids must be (nearly) dense: a stray huge id would
  // make these tables enormous.
  const size_t n_tokens = impl->vocab.size() + impl->added.size();
  if (static_cast<size_t>(max_id) >= 2 * n_tokens + 1024)
    return Status::corrupt("{}: id {} is far beyond the {} tokens defined (ids must be dense)", src,
                           max_id, n_tokens);
  const size_t n_ids = static_cast<size_t>(max_id + 1);
  impl->id_token.assign(n_ids, std::string());
  impl->id_flags.assign(n_ids, 0);
  impl->id_bytes_off.assign(n_ids, 0);
  impl->id_bytes_len.assign(n_ids, 0);
  for (const auto& [tok, id] : impl->vocab) {
    impl->id_token[id] = tok;
    impl->id_flags[id] |= 1;
  }
  for (const AddedToken& t : impl->added) {
    impl->id_token[t.id] = t.content;
    impl->id_flags[t.id] |= 1 | 4 | (t.special ? 2 : 0);
  }
  for (size_t id = 0; id < n_ids; ++id) {
    if (!(impl->id_flags[id] & 1)) continue;
    // HF's ByteLevel decoder: a token whose chars all map to bytes gives those bytes, otherwise
    // its own UTF-8 text (added tokens go through the same rule).
    auto bytes = byte_level_decode(impl->id_token[id]);
    const std::string& b = bytes ? *bytes : impl->id_token[id];
    impl->id_bytes_off[id] = static_cast<uint32_t>(impl->id_bytes_buf.size());
    impl->id_bytes_len[id] = static_cast<uint32_t>(b.size());
    impl->id_bytes_buf += b;
    if (bytes && !(impl->id_flags[id] & 4)) impl->vocab_bytes.emplace(*bytes, static_cast<int>(id));
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, byte_to_unicode()[b]);
    auto it = impl->vocab.find(s);
    impl->byte_id[b] = it == impl->vocab.end() ? -1 : it->second;
  }

  const json* merges = field(*model, "merges");
  if (!merges || !merges->is_array())
    return Status::corrupt("{}: model.merges must be a list", src);
  impl->merges.reserve(merges->size());
  int32_t rank = 0;
  for (const json& m : *merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return Status::corrupt("{}: merge {} \"{}\" is not two tokens", src, rank, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0];
      b = m[1];
    } else {
      return Status::corrupt("{}: merge {} must be \"a b\" or [a, b]", src, rank);
    }
    auto ia = impl->vocab.find(a), ib = impl->vocab.find(b), iab = impl->vocab.find(a + b);
    if (ia == impl->vocab.end() || ib == impl->vocab.end() || iab == impl->vocab.end())
      return Status::corrupt("{}: merge {} ({} {}) uses a token missing from the vocab", src, rank,
                             a, b);
    impl->merges.insert(pair_key(ia->second, ib->second),
                        (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(iab->second));
    ++rank;
  }

  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    (t.normalized ? impl->normalized_matcher : impl->raw_matcher)
        .add(t.content, static_cast<int>(i));
  }
  return Tokenizer(std::move(impl));
}

// ---------------------------------------------------------------------------------------------
// Encoding

namespace {

// Per-thread cache of BPE results of pre-tokenized pieces, for the tokenizer `owner`.
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  static constexpr size_t kMaxEntries = 1 << 19;
  static constexpr size_t kMaxPieceBytes = 256;
};
thread_local WordCache t_cache;

}  // namespace

void Tokenizer::Impl::bpe_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  // Symbols of a doubly linked list over the piece's bytes; merges applied by lowest rank, ties
  // to the leftmost pair, as HF's BPE::merge_word.
  struct Sym {
    int32_t id, prev, next;
    uint32_t rank;  // rank of the merge (this, next), UINT32_MAX if none
    int32_t merged;
  };
  const int n = static_cast<int>(piece.size());
  std::vector<Sym> sym;
  sym.reserve(n);
  for (int i = 0; i < n; ++i) {
    const int32_t id = byte_id[static_cast<unsigned char>(piece[i])];
    if (id < 0) continue;  // a byte missing from the vocab (no unk token): dropped, as HF does
    const auto k = static_cast<int32_t>(sym.size());
    sym.push_back({id, k - 1, k + 1, UINT32_MAX, -1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  auto update = [&](int i) {
    Sym& s = sym[i];
    s.rank = UINT32_MAX;
    if (s.next < 0) return;
    const uint64_t v = merges.find(pair_key(s.id, sym[s.next].id));
    if (v == MergeTable::kNone) return;
    s.rank = static_cast<uint32_t>(v >> 32);
    s.merged = static_cast<int32_t>(v & 0xffffffffu);
  };
  for (int i = 0; i < static_cast<int>(sym.size()); ++i) update(i);

  auto merge_at = [&](int i) {
    Sym& s = sym[i];
    const int j = s.next;
    s.id = s.merged;
    s.next = sym[j].next;
    if (s.next >= 0) sym[s.next].prev = i;
    sym[j].id = -1;  // dead
    update(i);
    if (s.prev >= 0) update(s.prev);
  };

  if (sym.size() <= 128) {
    for (;;) {
      int best = -1;
      uint32_t best_rank = UINT32_MAX;
      for (int i = 0; i >= 0; i = sym[i].next)
        if (sym[i].rank < best_rank) best_rank = sym[i].rank, best = i;
      if (best < 0) break;
      merge_at(best);
    }
  } else {
    // Long pieces: a heap of (rank, position); stale entries are skipped on pop.
    std::vector<uint64_t> heap;
    auto push = [&](int i) {
      if (sym[i].rank == UINT32_MAX) return;
      heap.push_back((static_cast<uint64_t>(sym[i].rank) << 32) | static_cast<uint32_t>(i));
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    };
    for (int i = 0; i < static_cast<int>(sym.size()); ++i)
      if (sym[i].rank != UINT32_MAX) heap.push_back((uint64_t{sym[i].rank} << 32) | uint32_t(i));
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const uint64_t top = heap.back();
      heap.pop_back();
      const int i = static_cast<int>(top & 0xffffffffu);
      const auto r = static_cast<uint32_t>(top >> 32);
      if (sym[i].id < 0 || sym[i].rank != r) continue;  // dead or stale
      merge_at(i);
      push(i);
      if (sym[i].prev >= 0) push(sym[i].prev);
    }
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    const int32_t id = byte_id[static_cast<unsigned char>(piece[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (ignore_merges) {
    auto it = vocab_bytes.find(piece);
    if (it != vocab_bytes.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() > WordCache::kMaxPieceBytes) {
    bpe_uncached(piece, out);
    return;
  }
  WordCache& cache = t_cache;
  if (cache.owner != instance) {
    cache.map.clear();
    cache.owner = instance;
  }
  auto it = cache.map.find(piece);
  if (it != cache.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t start = out.size();
  bpe_uncached(piece, out);
  if (cache.map.size() >= WordCache::kMaxEntries) cache.map.clear();
  cache.map.emplace(std::string(piece), std::vector<int32_t>(out.begin() + start, out.end()));
}

Status Tokenizer::Impl::encode_normalized(std::string_view text, std::vector<int32_t>& out) const {
  // Apply the split stages in order; the last stage's pieces go to BPE.
  auto run = [&](auto&& self, std::string_view s, size_t stage) -> Status {
    if (s.empty()) return Status::ok();
    if (stage == splits.size()) {
      bpe(s, out);
      return Status::ok();
    }
    const SplitStage& st = splits[stage];
    const bool isolated = st.behavior == SplitBehavior::kIsolated;
    size_t last = 0;
    Status inner;
    TF_RETURN_IF_ERROR(st.regex.for_each_match(s, [&](size_t b, size_t e) {
      if (!inner.is_ok()) return;
      if (b > last) inner = self(self, s.substr(last, b - last), stage + 1);
      if (isolated && inner.is_ok()) inner = self(self, s.substr(b, e - b), stage + 1);
      last = e;
    }));
    TF_RETURN_IF_ERROR(inner);
    if (last < s.size()) return self(self, s.substr(last), stage + 1);
    return Status::ok();
  };
  return run(run, text, 0);
}

void Tokenizer::Impl::split_added(std::string_view text, const AddedMatcher& m,
                                  std::vector<std::pair<std::string_view, int>>& parts) const {
  // parts: (text, -1) for plain text, (content, token index) for an added token.
  if (m.empty()) {
    parts.push_back({text, -1});
    return;
  }
  size_t plain = 0, i = 0;
  while (i < text.size()) {
    auto [tok, len] = m.longest_at(text, i);
    if (tok < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = added[tok];
    size_t b = i, e = i + len;
    if (t.single_word) {
      auto word_char = [](char32_t c) {
        return c == '_' || (c < 0x80 && std::isalnum(static_cast<int>(c))) ||
               (c >= 0x80 && !is_whitespace_cp(c));
      };
      bool ok = true;
      if (b > 0) {
        size_t k = b - 1;
        while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
        size_t kk = k;
        ok &= !word_char(utf8_next(text, kk));
      }
      if (e < text.size()) {
        size_t kk = e;
        ok &= !word_char(utf8_next(text, kk));
      }
      if (!ok) {
        i += len;  // the match is consumed without effect (non-overlapping iteration)
        continue;
      }
    }
    if (t.lstrip) {
      while (b > plain) {
        size_t k = b - 1;
        while (k > plain && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
        size_t kk = k;
        if (!is_whitespace_cp(utf8_next(text, kk))) break;
        b = k;
      }
    }
    if (t.rstrip) {
      while (e < text.size()) {
        size_t kk = e;
        if (!is_whitespace_cp(utf8_next(text, kk))) break;
        e = kk;
      }
    }
    if (b > plain) parts.push_back({text.substr(plain, b - plain), -1});
    parts.push_back({text.substr(b, e - b), tok});
    plain = i = e;
  }
  if (plain < text.size()) parts.push_back({text.substr(plain), -1});
}

Status Tokenizer::Impl::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  if (normalizers.empty()) return encode_normalized(text, out);
  std::string norm(text), tmp;
  for (const Normalizer& n : normalizers) {
    TF_RETURN_IF_ERROR(n.apply(norm, tmp));
    std::swap(norm, tmp);
  }
  std::vector<std::pair<std::string_view, int>> parts;
  split_added(norm, normalized_matcher, parts);
  for (const auto& [s, tok] : parts) {
    if (tok >= 0) {
      out.push_back(added[tok].id);
    } else {
      TF_RETURN_IF_ERROR(encode_normalized(s, out));
    }
  }
  return Status::ok();
}

Status Tokenizer::encode_valid(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::pair<std::string_view, int>> parts;
  impl_->split_added(text, impl_->raw_matcher, parts);
  for (const auto& [s, tok] : parts) {
    if (tok >= 0) {
      ids.push_back(impl_->added[tok].id);
    } else {
      TF_RETURN_IF_ERROR(impl_->encode_segment(s, ids));
    }
  }
  return Status::ok();
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text) const {
  if (size_t bad = utf8_find_invalid(text); bad != std::string_view::npos)
    return Status::invalid("text is not valid UTF-8 (byte {} of {}: 0x{:02x})", bad, text.size(),
                           static_cast<unsigned char>(text[bad]));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  TF_RETURN_IF_ERROR(encode_valid(text, ids));
  return ids;
}

// ---------------------------------------------------------------------------------------------
// Decoding and lookups

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->id_flags.size());
}
bool Tokenizer::contains(int32_t id) const {
  return id >= 0 && id < vocab_size() && (impl_->id_flags[id] & 1);
}
bool Tokenizer::is_special(int32_t id) const {
  return contains(id) && (impl_->id_flags[id] & 2);
}
std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (!contains(id)) return {};
  return std::string_view(impl_->id_bytes_buf)
      .substr(impl_->id_bytes_off[id], impl_->id_bytes_len[id]);
}
std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (!contains(id)) return std::nullopt;
  return impl_->id_token[id];
}
std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& t : impl_->added)
    if (t.content == token) return t.id;
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (!contains(id) || (skip_special && is_special(id))) continue;
    bytes += token_bytes(id);
  }
  return utf8_lossy(bytes);
}

std::string StreamDecoder::push(int32_t id) {
  std::string out;
  if (!tokenizer_->contains(id) || (skip_special_ && tokenizer_->is_special(id))) return out;
  pending_ += tokenizer_->token_bytes(id);
  const size_t keep = utf8_lossy_append(out, pending_, /*final=*/false);
  pending_.erase(0, keep);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  utf8_lossy_append(out, pending_, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace tf::tok
