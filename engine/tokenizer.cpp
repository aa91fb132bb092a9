// load_tokenizer (the file's kind from its name) and the byte tokenizer.
#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "engine/tokenizer_impl.h"

namespace sw {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One token per byte: ids 0..255, no end-of-text id.
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); i++) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const int32_t* ids, size_t n) const override {
    std::string out(n, '\0');
    for (size_t i = 0; i < n; i++) {
      if (ids[i] < 0 || ids[i] > 255)
        fail("tokenizer", "bytes: id " + std::to_string(ids[i]) + " is outside the vocabulary (256)");
      out[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
    }
    return out;
  }
  int64_t vocab_size() const override { return 256; }
  int32_t eot_id() const override { return -1; }
  int32_t bos_id() const override { return -1; }
  size_t chunk_cut(std::string_view text, size_t target, size_t* next) const override {
    *next = std::min(text.size(), std::max<size_t>(target, 1));
    return *next;
  }
  const char* kind() const override { return "bytes"; }
  std::vector<std::string> files() const override { return {}; }
};

bool cut_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty() || path == "bytes") return std::make_unique<ByteTokenizer>();
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path json = fs::path(path) / "tokenizer.json";
    const fs::path model = fs::path(path) / "tokenizer.model";
    if (fs::is_regular_file(json, ec)) return load_bpe_tokenizer(json.string());
    if (fs::is_regular_file(model, ec)) return load_sentencepiece_tokenizer(model.string());
    fail("tokenizer", path + ": the directory holds neither tokenizer.json nor tokenizer.model");
  }
  if (!fs::is_regular_file(path, ec)) fail("tokenizer", path + ": no such file");
  if (ends_with(path, ".json")) return load_bpe_tokenizer(path);
  if (ends_with(path, ".model")) return load_sentencepiece_tokenizer(path);
  fail("tokenizer", path + ": not a tokenizer file (a Hugging Face tokenizer.json, a "
                           "SentencePiece .model, a directory holding one, or \"bytes\")");
}

size_t find_cut(std::string_view text, size_t target, char sep) {
  if (target >= text.size()) return text.size();
  // A cut at p: text[p-2] printable ASCII but not a space, text[p-1] == sep, text[p] an ASCII
  // letter or digit (a Unicode space before a newline would join it in `\s+(?!\S)`).
  auto ok = [&](size_t p) {
    return p >= 2 && text[p - 1] == sep && text[p - 2] > ' ' && text[p - 2] < 0x7F &&
           cut_alnum(text[p]);
  };
  for (size_t p = std::min(target, text.size() - 1); p >= 2; p--)
    if (ok(p)) return p;
  for (size_t p = target + 1; p < text.size(); p++)
    if (ok(p)) return p;
  return text.size();
}

size_t Tokenizer::chunk_cut(std::string_view text, size_t target, size_t* next) const {
  const size_t p = find_cut(text, target, '\n');
  *next = p;
  return p;
}

}  // namespace sw
