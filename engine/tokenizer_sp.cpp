// SentencePiece .model files (Llama 2) through Debian's libsentencepiece: ids as Python's
// SentencePieceProcessor.encode(text) gives them (no bos / eos added).
//
// Cuts (chunk_cut) only for BPE models: a BPE merges within whitespace-delimited pieces, so a
// text cut at a single space encodes as the whole (the rest's dummy prefix stands for the
// space); a probe at load checks that on a few strings. A unigram model is never cut: cut at
// spaces, 5.5 MB of fortunes gave 56 of 3.3 M ids unlike the whole text's, far from any cut
// (a dash run segmented otherwise; likely near-ties in its Viterbi's float sums, which run
// along the whole text).
#include <sentencepiece_processor.h>

#include <fstream>
#include <iterator>

#include "core/error.h"
#include "engine/tokenizer_impl.h"

namespace sw {

namespace {

// encode hands a BPE model parts of about this many bytes, cut as chunk_cut cuts (the same
// ids): measured ~1.3x faster than one call per 31 KB piece on bench/tokenize_vs_hf.sh's text.
constexpr size_t kSubPiece = 2048;

// The model type in a .model file (a ModelProto): trainer_spec (field 2) . model_type (field 3;
// UNIGRAM = 1 when absent, BPE = 2, WORD = 3, CHAR = 4); 0 when the bytes do not parse.
int model_type(const std::string& bytes) {
  size_t i = 0;
  auto varint = [&](const std::string& b, size_t& k, uint64_t& v) {
    v = 0;
    for (int shift = 0; k < b.size() && shift < 64; shift += 7) {
      const auto c = static_cast<unsigned char>(b[k++]);
      v |= static_cast<uint64_t>(c & 0x7F) << shift;
      if (!(c & 0x80)) return true;
    }
    return false;
  };
  // Skips one field of wire type `wt` at k (k just past its key); false on malformed input.
  auto skip = [&](const std::string& b, size_t& k, uint64_t wt) {
    uint64_t v = 0;
    if (wt == 0) return varint(b, k, v);
    if (wt == 1) return (k += 8) <= b.size();
    if (wt == 5) return (k += 4) <= b.size();
    if (wt == 2) return varint(b, k, v) && v <= b.size() - k && ((k += v), true);
    return false;
  };
  while (i < bytes.size()) {
    uint64_t key = 0, len = 0;
    if (!varint(bytes, i, key)) return 0;
    if (key == ((2u << 3) | 2)) {  // trainer_spec
      if (!varint(bytes, i, len) || len > bytes.size() - i) return 0;
      const std::string spec = bytes.substr(i, len);
      for (size_t k = 0; k < spec.size();) {
        uint64_t fkey = 0, v = 0;
        if (!varint(spec, k, fkey)) return 0;
        if (fkey == ((3u << 3) | 0)) return varint(spec, k, v) ? static_cast<int>(v) : 0;
        if (!skip(spec, k, fkey & 7)) return 0;
      }
      return 1;
    }
    if (!skip(bytes, i, key & 7)) return 0;
  }
  return 1;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    const auto st = sp_.Load(path);
    if (!st.ok()) fail("tokenizer", path + ": not a SentencePiece model: " + st.ToString());
    // Cuts at a space (chunk_cut) only for a BPE model that encodes "A B" as "A" then "B" on
    // the probes.
    std::ifstream f(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    cuts_ = model_type(bytes) == 2;
    for (const char* probe : {"hello world", "The quick, brown fox", "x1 2y", "a b", "Z. 9"}) {
      const std::string_view t(probe);
      const size_t sp = t.rfind(' ');
      auto whole = encode(t), a = encode(t.substr(0, sp)), b = encode(t.substr(sp + 1));
      a.insert(a.end(), b.begin(), b.end());
      cuts_ = cuts_ && a == whole;
    }
  }
  size_t chunk_cut(std::string_view text, size_t target, size_t* next) const override {
    if (!cuts_) return *next = text.size();
    const size_t p = find_cut(text, target, ' ');
    *next = p;
    return p < text.size() ? p - 1 : p;  // the part ends before the space; the rest after it
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    std::vector<int> ids;
    for (;;) {
      size_t next = text.size();
      const size_t cut = cuts_ ? chunk_cut(text, kSubPiece, &next) : text.size();
      const auto st = sp_.Encode(text.substr(0, cut), &ids);
      if (!st.ok()) fail("tokenizer", path_ + ": encode: " + st.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
      if (next >= text.size()) return out;
      text.remove_prefix(next);
    }
  }
  std::string decode(const int32_t* ids, size_t n) const override {
    const int V = sp_.GetPieceSize();
    std::vector<int> v(n);
    for (size_t i = 0; i < n; i++) {
      if (ids[i] < 0 || ids[i] >= V)
        fail("tokenizer", path_ + ": id " + std::to_string(ids[i]) +
                              " is outside the vocabulary (" + std::to_string(V) + ")");
      v[i] = ids[i];
    }
    std::string out;
    const auto st = sp_.Decode(v, &out);
    if (!st.ok()) fail("tokenizer", path_ + ": decode: " + st.ToString());
    return out;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t eot_id() const override { return sp_.eos_id(); }
  int32_t bos_id() const override { return sp_.bos_id(); }
  const char* kind() const override { return "sentencepiece"; }
  std::vector<std::string> files() const override { return {path_}; }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
  bool cuts_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace sw
