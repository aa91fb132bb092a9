// Byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Llama 3, Qwen2 style), with the ids
// `tokenizers` gives for Tokenizer.encode(text, add_special_tokens=False):
//   1. added tokens whose "normalized" is false (the special ones) are found in the raw text,
//      leftmost-longest, with their lstrip / rstrip;
//   2. each remaining piece is normalized (nothing, or NFC through ICU), and the added tokens
//      whose "normalized" is true are found in it the same way;
//   3. the pre-tokenizer steps split each piece: Split(Regex, Isolated) and ByteLevel (its
//      prefix space, then GPT-2's regex when use_regex). Regexes run on PCRE2 (UTF + UCP, JIT);
//      its \s, \p{L}, \p{N} split as `tokenizers`' Oniguruma does on the tests' texts (Unicode
//      spaces U+0085, U+00A0, U+2028, U+3000 and non-spaces U+180E, U+200B, U+FEFF included);
//   4. each word (its raw bytes; the byte-to-unicode mapping only names the vocabulary) is one
//      vocabulary entry when ignore_merges is set and it is one, else its bytes merged by rank:
//      the lowest-ranked adjacent pair first, leftmost among equals (a heap, as `tokenizers`).
// Words are cached per thread. Invalid UTF-8 does not stop the encoder (`tokenizers` only
// takes valid strings): PCRE2's MATCH_INVALID_UTF leaves such bytes between matches, and the
// byte-level model encodes them as bytes.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/tokenizer_impl.h"

namespace sw {

namespace {

using json = nlohmann::json;

// GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to U+0100 upward.
std::array<uint32_t, 256> byte_to_unicode() {
  std::array<uint32_t, 256> cs{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; b++) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; b++) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; b++) direct[b] = true;
  uint32_t n = 0;
  for (int b = 0; b < 256; b++) cs[b] = direct[b] ? static_cast<uint32_t>(b) : 256 + n++;
  return cs;
}

// The next code point of s at i (advancing i); -1 for an invalid byte (advancing one byte).
int32_t next_cp(std::string_view s, size_t& i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    i++;
    return -1;
  }
  int32_t cp = len == 1 ? c : c & (0x7F >> len);
  for (int k = 1; k < len; k++) {
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d >> 6) != 2) {
      i++;
      return -1;
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  i += len;
  return cp;
}

// The code point that ends s[0:end) (-1 if none or invalid) and its start.
int32_t prev_cp(std::string_view s, size_t end, size_t& start) {
  if (end == 0) return -1;
  size_t b = end - 1;
  while (b > 0 && end - b < 4 && (static_cast<unsigned char>(s[b]) >> 6) == 2) b--;
  size_t i = b;
  const int32_t cp = next_cp(s, i);
  start = b;
  return i == end ? cp : -1;
}

// Rust's char::is_whitespace (Unicode White_Space).
bool is_white_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// A string hash that also takes string_views, so that a lookup by view (a word on the encode
// path) builds no std::string.
struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct Pcre2Code {
  pcre2_code* code = nullptr;
  ~Pcre2Code() {
    if (code) pcre2_code_free(code);
  }
};

// Per-thread PCRE2 match state: the match data and a JIT stack larger than the default 32 KiB.
struct MatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    md = pcre2_match_data_create(32, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(mctx);
    pcre2_match_data_free(md);
  }
};

// One pre-tokenizer step: an optional prefix space (ByteLevel's add_prefix_space), then an
// optional Isolated split by a regex.
struct PreStep {
  bool prefix_space = false;
  std::shared_ptr<Pcre2Code> re;
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool lstrip = false, rstrip = false, normalized = false;
};

// A byte trie over the added tokens of one pass (normalized false / true).
struct Trie {
  std::vector<std::unordered_map<unsigned char, int>> next{1};
  std::vector<int> token{-1};  // index into the added tokens, -1 = none ends here
  std::array<bool, 256> first{};  // bytes a token starts with (most text skips the walk)
  void add(const std::string& s, int idx) {
    first[static_cast<unsigned char>(s[0])] = true;
    int n = 0;
    for (unsigned char c : s) {
      auto it = next[n].find(c);
      if (it == next[n].end()) {
        next.emplace_back();
        token.push_back(-1);
        it = next[n].emplace(c, static_cast<int>(next.size()) - 1).first;
      }
      n = it->second;
    }
    token[n] = idx;
  }
  bool empty() const { return next[0].empty(); }
};

std::atomic<uint64_t> g_instance{0};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const std::string& path);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const int32_t* ids, size_t n) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_bytes_.size()); }
  int32_t eot_id() const override { return eot_; }
  int32_t bos_id() const override { return bos_; }
  const char* kind() const override { return "bpe"; }
  std::vector<std::string> files() const override { return {path_}; }
  size_t chunk_cut(std::string_view text, size_t target, size_t* next) const override {
    for (const PreStep& s : steps_)
      if (s.prefix_space) return *next = text.size();
    return Tokenizer::chunk_cut(text, target, next);
  }

 private:
  [[noreturn]] void bad(const std::string& key, const std::string& problem) const {
    fail("tokenizer", path_ + ": " + key + ": " + problem);
  }
  std::shared_ptr<Pcre2Code> compile(const std::string& pattern, const std::string& key) const;
  void read_model(const json& m);
  void read_normalizer(const json& n, const std::string& key);
  void read_pre_tokenizer(const json& p, const std::string& key, bool last);
  void read_added(const json& a);
  void read_post_processor(const json& p);

  // The stages of encode (see the file's head).
  void added_pass(std::string_view s, bool normalized, std::vector<int32_t>& out) const;
  void normalized_piece(std::string_view s, std::vector<int32_t>& out) const;
  void pre_tokenize(size_t step, std::string_view s, std::vector<int32_t>& out) const;
  void word(std::string_view w, std::vector<int32_t>& out) const;
  void merge(std::string_view w, std::vector<int32_t>& out) const;

  std::string path_;
  uint64_t instance_ = ++g_instance;
  std::unordered_map<std::string, int32_t, StrHash, std::equal_to<>> vocab_;   // raw bytes -> id (the model's vocabulary)
  std::vector<std::string> id_bytes_;                // id -> the bytes decode writes
  std::array<int32_t, 256> byte_id_{};               // a byte's own id (-1: not in the vocabulary)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (a, b) -> (rank, merged id)
  bool ignore_merges_ = false;
  int32_t unk_ = -1;
  bool fuse_unk_ = false;
  bool nfc_ = false;
  std::vector<PreStep> steps_;
  std::vector<AddedToken> added_;
  Trie trie_[2];  // [0]: normalized false, matched on the raw text; [1]: normalized true
  int32_t eot_ = -1, bos_ = -1;
};

std::shared_ptr<Pcre2Code> BpeTokenizer::compile(const std::string& pattern,
                                                 const std::string& key) const {
  const std::string& p = pattern;
  int err = 0;
  PCRE2_SIZE at = 0;
  auto c = std::make_shared<Pcre2Code>();
  c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
  if (!c->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    bad(key, "regex '" + pattern + "' does not compile: " + reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  return c;
}

BpeTokenizer::BpeTokenizer(const std::string& path) : path_(path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("tokenizer", path + ": cannot open");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    fail("tokenizer", path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) bad("(top level)", "not an object");
  try {
    if (!j.contains("model") || !j["model"].is_object()) bad("model", "missing");
    read_model(j["model"]);
    if (j.contains("normalizer")) read_normalizer(j["normalizer"], "normalizer");
    if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
      bad("pre_tokenizer", "missing: a byte-level BPE needs a ByteLevel pre-tokenizer");
    read_pre_tokenizer(j["pre_tokenizer"], "pre_tokenizer", true);
    if (j.contains("added_tokens")) read_added(j["added_tokens"]);
    const json& d = j.contains("decoder") ? j["decoder"] : json();
    const std::string dtype = d.is_object() ? d.value("type", "") : "";
    if (dtype != "ByteLevel") {
      std::string problem = "missing (ByteLevel is supported)";
      if (d.is_object()) {  // appended piece by piece: GCC 12's -Wrestrict misfires on "'" + s
        problem = "'";
        problem += dtype;
        problem += "' is not supported (ByteLevel is)";
      }
      bad("decoder.type", problem);
    }
    if (j.contains("post_processor")) read_post_processor(j["post_processor"]);
  } catch (const json::exception& e) {
    bad("(structure)", e.what());
  }
  // Documents end with the first of these the vocabulary has.
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
    for (const AddedToken& a : added_)
      if (a.content == name) eot_ = a.id;
    if (eot_ >= 0) break;
  }
}

void BpeTokenizer::read_model(const json& m) {
  const std::string type = m.value("type", "BPE");
  if (type != "BPE") bad("model.type", "'" + type + "' is not supported (BPE is)");
  if (m.contains("dropout") && !m["dropout"].is_null()) bad("model.dropout", "must be null");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && m[k] != "")
      bad(std::string("model.") + k, "must be null for a byte-level BPE");
  if (m.value("byte_fallback", false)) bad("model.byte_fallback", "must be false");
  ignore_merges_ = m.value("ignore_merges", false);
  fuse_unk_ = m.value("fuse_unk", false);

  const auto b2u = byte_to_unicode();
  std::unordered_map<int32_t, int> u2b;
  for (int b = 0; b < 256; b++) u2b[static_cast<int32_t>(b2u[b])] = b;
  // A vocabulary string to raw bytes; false when a character is outside the byte alphabet
  // (decode then writes the string itself, as the ByteLevel decoder does).
  auto to_bytes = [&](const std::string& s, std::string& out) {
    out.clear();
    for (size_t i = 0; i < s.size();) {
      const int32_t cp = next_cp(s, i);
      const auto it = u2b.find(cp);
      if (it == u2b.end()) return false;
      out.push_back(static_cast<char>(it->second));
    }
    return true;
  };

  if (!m.contains("vocab") || !m["vocab"].is_object()) bad("model.vocab", "missing");
  std::unordered_map<std::string, int32_t> by_string;
  int32_t max_id = -1;
  std::string raw;
  for (const auto& [tok, idj] : m["vocab"].items()) {
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() > INT32_MAX)
      bad("model.vocab[\"" + tok + "\"]", "not a non-negative 32-bit id");
    const int32_t id = idj.get<int32_t>();
    by_string[tok] = id;
    max_id = std::max(max_id, id);
  }
  // Ids index a table: a sparse one (an id far past the entry count) would be a huge table.
  auto dense = [](int64_t id, size_t entries) {
    return id < 4 * static_cast<int64_t>(entries) + (1 << 20);
  };
  if (!dense(max_id, by_string.size()))
    bad("model.vocab", "id " + std::to_string(max_id) + " is far past the " +
                           std::to_string(by_string.size()) + " entries (ids must be dense)");
  id_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : by_string) {
    if (to_bytes(tok, raw)) {
      vocab_[raw] = id;
      id_bytes_[static_cast<size_t>(id)] = raw;
    } else {
      id_bytes_[static_cast<size_t>(id)] = tok;
    }
  }
  for (int b = 0; b < 256; b++) {
    const auto it = vocab_.find(std::string(1, static_cast<char>(b)));
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    const auto it = by_string.find(m["unk_token"].get<std::string>());
    if (it == by_string.end()) bad("model.unk_token", "not in the vocabulary");
    unk_ = it->second;
  }

  if (!m.contains("merges") || !m["merges"].is_array()) bad("model.merges", "missing");
  const json& merges = m["merges"];
  merges_.reserve(merges.size() * 2);
  for (size_t r = 0; r < merges.size(); r++) {
    const json& e = merges[r];
    const std::string key = "model.merges[" + std::to_string(r) + "]";
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        bad(key, "'" + s + "' is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      bad(key, "not a string \"a b\" nor a pair [a, b]");
    }
    const auto ia = by_string.find(a), ib = by_string.find(b), im = by_string.find(a + b);
    if (ia == by_string.end() || ib == by_string.end() || im == by_string.end())
      bad(key, "'" + a + "' + '" + b + "': a part or the merged token is not in the vocabulary");
    const uint64_t k = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    // A merge listed twice keeps its later rank, as `tokenizers`' map does.
    merges_.insert_or_assign(k, std::make_pair(static_cast<int32_t>(r), im->second));
  }
}

void BpeTokenizer::read_normalizer(const json& n, const std::string& key) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "NFC") {
    nfc_ = true;
  } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    const json& list = n["normalizers"];
    for (size_t i = 0; i < list.size(); i++)
      read_normalizer(list[i], key + ".normalizers[" + std::to_string(i) + "]");
  } else {
    bad(key + ".type", "'" + type + "' is not supported (null, NFC or a Sequence of NFC are)");
  }
}

void BpeTokenizer::read_pre_tokenizer(const json& p, const std::string& key, bool last) {
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
      bad(key + ".pretokenizers", "missing");
    const json& list = p["pretokenizers"];
    if (list.empty()) bad(key + ".pretokenizers", "empty (a ByteLevel step is needed)");
    for (size_t i = 0; i < list.size(); i++)
      read_pre_tokenizer(list[i], key + ".pretokenizers[" + std::to_string(i) + "]",
                         last && i + 1 == list.size());
  } else if (type == "ByteLevel") {
    if (!last)
      bad(key, "a ByteLevel step must be the last pre-tokenizer (later steps would see its "
               "byte-to-unicode mapping)");
    PreStep s;
    s.prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) s.re = compile(kGpt2Pattern, key + ".use_regex");
    steps_.push_back(std::move(s));
  } else if (type == "Split") {
    if (last) bad(key, "the last pre-tokenizer must be ByteLevel");
    const std::string behavior = p.value("behavior", "");
    if (behavior != "Isolated")
      bad(key + ".behavior", "'" + behavior + "' is not supported (Isolated is)");
    if (p.value("invert", false)) bad(key + ".invert", "must be false");
    const json& pat = p.contains("pattern") ? p["pattern"] : json();
    PreStep s;
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      s.re = compile(pat["Regex"].get<std::string>(), key + ".pattern.Regex");
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      std::string lit = pat["String"].get<std::string>();
      std::string q;
      for (char c : lit) {  // quote every non-alphanumeric character
        if (!std::isalnum(static_cast<unsigned char>(c)) && static_cast<unsigned char>(c) < 0x80)
          q += '\\';
        q += c;
      }
      s.re = compile(q, key + ".pattern.String");
    } else {
      bad(key + ".pattern", "not {\"Regex\": ...} nor {\"String\": ...}");
    }
    steps_.push_back(std::move(s));
  } else {
    bad(key + ".type", "'" + type +
                           "' is not supported (ByteLevel, Split, or a Sequence of them are)");
  }
}

void BpeTokenizer::read_added(const json& a) {
  if (!a.is_array()) bad("added_tokens", "not an array");
  for (size_t i = 0; i < a.size(); i++) {
    const json& t = a[i];
    const std::string key = "added_tokens[" + std::to_string(i) + "]";
    AddedToken at;
    if (!t.contains("content") || !t["content"].is_string() || t["content"] == "")
      bad(key + ".content", "missing or empty");
    if (!t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
        t["id"].get<int64_t>() > INT32_MAX)
      bad(key + ".id", "missing or not a non-negative 32-bit id");
    at.content = t["content"].get<std::string>();
    at.id = t["id"].get<int32_t>();
    if (t.value("single_word", false)) bad(key + ".single_word", "true is not supported");
    const bool special = t.value("special", false);
    at.lstrip = t.value("lstrip", false);
    at.rstrip = t.value("rstrip", false);
    at.normalized = t.value("normalized", !special);
    if (at.id >= 4 * static_cast<int64_t>(id_bytes_.size() + a.size()) + (1 << 20))
      bad(key + ".id", std::to_string(at.id) + " is far past the vocabulary's " +
                           std::to_string(id_bytes_.size()) + " ids (ids must be dense)");
    if (static_cast<size_t>(at.id) >= id_bytes_.size())
      id_bytes_.resize(static_cast<size_t>(at.id) + 1);
    id_bytes_[static_cast<size_t>(at.id)] = at.content;
    added_.push_back(at);
  }
  // A token given twice: the later entry wins, as in `tokenizers`' added vocabulary.
  for (size_t i = 0; i < added_.size(); i++)
    trie_[added_[i].normalized ? 1 : 0].add(added_[i].content, static_cast<int>(i));
}

void BpeTokenizer::read_post_processor(const json& p) {
  if (!p.is_object()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    for (const json& q : p["processors"]) read_post_processor(q);
  } else if (type == "TemplateProcessing" && p.contains("single") && p["single"].is_array() &&
             !p["single"].empty()) {
    const json& first = p["single"][0];
    if (first.contains("SpecialToken")) {
      const std::string name = first["SpecialToken"].value("id", "");
      if (p.contains("special_tokens") && p["special_tokens"].contains(name)) {
        const json& ids = p["special_tokens"][name]["ids"];
        if (ids.is_array() && ids.size() == 1) bos_ = ids[0].get<int32_t>();
      }
    }
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  added_pass(text, false, out);
  return out;
}

// Finds the pass's added tokens in s (leftmost, then longest), writes their ids, and sends the
// text between them on: to normalization after the raw pass, to pre-tokenization after the
// normalized one.
void BpeTokenizer::added_pass(std::string_view s, bool normalized,
                              std::vector<int32_t>& out) const {
  const Trie& trie = trie_[normalized ? 1 : 0];
  auto rest = [&](std::string_view piece) {
    if (piece.empty()) return;
    if (normalized)
      pre_tokenize(0, piece, out);
    else
      normalized_piece(piece, out);
  };
  if (trie.empty()) {
    rest(s);
    return;
  }
  size_t last = 0;
  for (size_t i = 0; i < s.size();) {
    if (!trie.first[static_cast<unsigned char>(s[i])]) {
      i++;
      continue;
    }
    int node = 0, found = -1;
    size_t end = i;
    for (size_t j = i; j < s.size(); j++) {
      const auto it = trie.next[static_cast<size_t>(node)].find(static_cast<unsigned char>(s[j]));
      if (it == trie.next[static_cast<size_t>(node)].end()) break;
      node = it->second;
      if (trie.token[static_cast<size_t>(node)] >= 0) {
        found = trie.token[static_cast<size_t>(node)];
        end = j + 1;
      }
    }
    if (found < 0) {
      i++;
      continue;
    }
    const AddedToken& t = added_[static_cast<size_t>(found)];
    size_t start = i;
    if (t.lstrip) {
      size_t b = start;
      for (int32_t cp; start > last && (cp = prev_cp(s, start, b)) >= 0 && is_white_space(cp);)
        start = b;
    }
    if (t.rstrip) {
      for (size_t k = end; k < s.size();) {
        if (!is_white_space(next_cp(s, k))) break;
        end = k;
      }
    }
    rest(s.substr(last, start - last));
    out.push_back(t.id);
    last = i = end;
  }
  rest(s.substr(last));
}

void BpeTokenizer::normalized_piece(std::string_view s, std::vector<int32_t>& out) const {
  if (nfc_ && !std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; })) {
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
    if (U_FAILURE(err)) fail("tokenizer", path_ + ": ICU's NFC normalizer is unavailable");
    std::string normal;
    icu::StringByteSink<std::string> sink(&normal);
    nfc->normalizeUTF8(0, icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), sink,
                       nullptr, err);
    if (U_FAILURE(err)) fail("tokenizer", path_ + ": NFC normalization failed");
    added_pass(normal, true, out);
    return;
  }
  added_pass(s, true, out);
}

void BpeTokenizer::pre_tokenize(size_t step, std::string_view s, std::vector<int32_t>& out) const {
  if (step == steps_.size()) {
    word(s, out);
    return;
  }
  const PreStep& st = steps_[step];
  std::string prefixed;
  if (st.prefix_space && s[0] != ' ') {
    prefixed.reserve(s.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(s);
    s = prefixed;
  }
  if (!st.re) {
    pre_tokenize(step + 1, s, out);
    return;
  }
  thread_local MatchState ms;
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.md);
  size_t last = 0, off = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  while (off < s.size()) {
    const int rc = pcre2_match(st.re->code, subject, s.size(), off, 0, ms.md, ms.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("tokenizer", path_ + ": pre-tokenizer regex: " + reinterpret_cast<const char*>(msg));
    }
    const size_t a = ov[0], b = ov[1];
    if (b == a) {  // an empty match splits nothing: look again one character on
      size_t k = a;
      next_cp(s, k);
      off = k;
      continue;
    }
    if (a > last) pre_tokenize(step + 1, s.substr(last, a - last), out);
    pre_tokenize(step + 1, s.substr(a, b - a), out);
    last = off = b;
  }
  if (last < s.size()) pre_tokenize(step + 1, s.substr(last), out);
}

// The per-thread word cache: words -> ids, for the tokenizer `owner` (a new tokenizer on the
// thread starts it afresh); cleared when it grows past kCacheWords.
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StrHash, std::equal_to<>> words;
};
constexpr size_t kCacheWords = 1 << 18;
constexpr size_t kCacheMaxLen = 64;  // longer words are not cached

void BpeTokenizer::word(std::string_view w, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    const auto it = vocab_.find(w);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (w.size() == 1 && byte_id_[static_cast<unsigned char>(w[0])] >= 0) {
    out.push_back(byte_id_[static_cast<unsigned char>(w[0])]);
    return;
  }
  if (w.size() > kCacheMaxLen) {
    merge(w, out);
    return;
  }
  thread_local WordCache cache;
  if (cache.owner != instance_) {
    cache.words.clear();
    cache.owner = instance_;
  }
  const auto it = cache.words.find(w);  // no key string built on a hit
  if (it != cache.words.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t from = out.size();
  merge(w, out);
  if (cache.words.size() >= kCacheWords) cache.words.clear();
  cache.words.emplace(std::string(w), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(from),
                                                out.end()));
}

void BpeTokenizer::merge(std::string_view w, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> sy;
  sy.reserve(w.size());
  for (unsigned char c : w) {
    const int32_t id = byte_id_[c];
    if (id < 0) {
      if (unk_ < 0) continue;  // no unk token: the byte is dropped, as `tokenizers` does
      if (fuse_unk_ && !sy.empty() && sy.back().id == unk_) continue;
      sy.push_back({unk_, 0, 0, true});
      continue;
    }
    sy.push_back({id, 0, 0, true});
  }
  const int n = static_cast<int>(sy.size());
  for (int i = 0; i < n; i++) {
    sy[static_cast<size_t>(i)].prev = i - 1;
    sy[static_cast<size_t>(i)].next = i + 1 < n ? i + 1 : -1;
  }
  auto pair_of = [&](int i, int j) -> const std::pair<int32_t, int32_t>* {
    const uint64_t k = (static_cast<uint64_t>(sy[static_cast<size_t>(i)].id) << 32) |
                       static_cast<uint32_t>(sy[static_cast<size_t>(j)].id);
    const auto it = merges_.find(k);
    return it == merges_.end() ? nullptr : &it->second;
  };
  // (rank, position, merged id), smallest rank then position first.
  using Cand = std::tuple<int32_t, int, int32_t>;
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  for (int i = 0; i + 1 < n; i++)
    if (const auto* m = pair_of(i, i + 1)) heap.emplace(m->first, i, m->second);
  while (!heap.empty()) {
    const auto [rank, pos, merged] = heap.top();
    heap.pop();
    Sym& s = sy[static_cast<size_t>(pos)];
    if (!s.alive || s.next < 0) continue;
    const auto* m = pair_of(pos, s.next);
    if (!m || m->first != rank || m->second != merged) continue;  // stale
    Sym& r = sy[static_cast<size_t>(s.next)];
    r.alive = false;
    s.id = merged;
    s.next = r.next;
    if (r.next >= 0) sy[static_cast<size_t>(r.next)].prev = pos;
    if (s.prev >= 0)
      if (const auto* p = pair_of(s.prev, pos)) heap.emplace(p->first, s.prev, p->second);
    if (s.next >= 0)
      if (const auto* q = pair_of(pos, s.next)) heap.emplace(q->first, pos, q->second);
  }
  for (int i = n > 0 ? 0 : -1; i >= 0; i = sy[static_cast<size_t>(i)].next)
    out.push_back(sy[static_cast<size_t>(i)].id);
}

std::string BpeTokenizer::decode(const int32_t* ids, size_t n) const {
  std::string out;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= id_bytes_.size())
      fail("tokenizer", path_ + ": id " + std::to_string(ids[i]) +
                            " is outside the vocabulary (" + std::to_string(id_bytes_.size()) +
                            ")");
    out += id_bytes_[static_cast<size_t>(ids[i])];
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path) {
  return std::make_unique<BpeTokenizer>(path);
}

}  // namespace sw
