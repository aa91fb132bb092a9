// SentencePiece .model files (Llama 2) through Debian's libsentencepiece: ids as Python's
// SentencePieceProcessor.encode(text) gives them (no bos / eos added).
#include <sentencepiece_processor.h>

#include "core/error.h"
#include "engine/tokenizer_impl.h"

namespace sw {

namespace {

// encode hands SentencePiece parts of about this many bytes, cut as chunk_cut cuts (the same
// ids): on a long text it is ~1.3x faster than one call (its work per byte grows with length).
constexpr size_t kSubPiece = 2048;

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    const auto st = sp_.Load(path);
    if (!st.ok()) fail("tokenizer", path + ": not a SentencePiece model: " + st.ToString());
    // Cuts at a space (chunk_cut) only if the model encodes "A B" as "A" then "B" on probes.
    cuts_ = true;
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
