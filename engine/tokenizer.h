// Tokenizers: text to token ids and back, with the same ids as the reference packages.
//   bytes           one token per byte (vocabulary 256): Shardwise's original data.
//   tokenizer.json  Hugging Face byte-level BPE (GPT-2, Llama 3, Qwen style): no normalizer or
//                   NFC, pre-tokenizer regex splits, byte-to-unicode mapping, ranked merges
//                   (ignore_merges), special and added tokens matched before splitting
//                   (engine/tokenizer_bpe.cpp).
//   *.model         SentencePiece (Llama 2), through Debian's libsentencepiece.
// Encoding matches `tokenizers`' Tokenizer.encode(text, add_special_tokens=False) and
// SentencePieceProcessor.encode(text); added / special tokens written in the text encode to
// their ids (as `tokenizers` does). Thread-safe: encode and decode are const and may run on
// many threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sw {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of ids (special tokens written out as their text). Throws sw::Error on an id
  // outside the vocabulary.
  virtual std::string decode(const int32_t* ids, size_t n) const = 0;
  std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }
  // Ids span [0, vocab_size()) (added tokens included).
  virtual int64_t vocab_size() const = 0;
  // The id that separates documents (GPT-2's <|endoftext|>, Llama 3's <|end_of_text|>, Llama 2's
  // </s>; the byte tokenizer: -1 = none).
  virtual int32_t eot_id() const = 0;
  // The id a sequence starts with, when the tokenizer's template adds one (Llama's <s> /
  // <|begin_of_text|>), else -1.
  virtual int32_t bos_id() const = 0;
  // "bytes", "bpe" or "sentencepiece".
  virtual const char* kind() const = 0;
  // The files this tokenizer was read from (empty for bytes): an export copies them.
  virtual std::vector<std::string> files() const = 0;
  // Where to cut `text` so that its first part may be encoded alone (large inputs are encoded
  // in chunks, on many threads): returns the first part's end, the last cut at or before
  // `target` bytes, else the first after it, else text.size(); *next = where the rest starts
  // (the end, or one byte on). The parts' ids joined equal the whole text's:
  //   bytes          anywhere;
  //   BPE            just after "X\n" followed by an ASCII letter or digit (X printable ASCII,
  //                  not a space), where the pre-tokenizer regexes of GPT-2, Llama 3 and Qwen2
  //                  end a word either way (an added token holding "\n" inside is not looked
  //                  for across a cut); never with a prefix space (each part would get one);
  //   SentencePiece  BPE models: at a space between printable ASCII and an ASCII letter or
  //                  digit, the space dropped (the rest's dummy prefix "▁" stands for it), when
  //                  a probe at load shows the model encodes so; unigram models: never (cut,
  //                  a long text gave a few ids unlike the whole's, far from the cuts).
  virtual size_t chunk_cut(std::string_view text, size_t target, size_t* next) const;
};

// "" or "bytes": the byte tokenizer. A path ending in .json: byte-level BPE from a Hugging Face
// tokenizer.json. A path ending in .model: SentencePiece. A directory: its tokenizer.json, else
// its tokenizer.model. Throws sw::Error("tokenizer: <file>: <key>: <problem>") naming the file
// and key on anything it cannot read exactly (an unknown pre-tokenizer, model type or
// normalizer, a malformed merge).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace sw
