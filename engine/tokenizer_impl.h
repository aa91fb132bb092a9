// The tokenizers behind engine/tokenizer.h (internal): load_tokenizer picks one of these.
#pragma once
#include <memory>
#include <string>

#include "engine/tokenizer.h"

namespace sw {

// The cut of Tokenizer::chunk_cut: just after `sep` (between printable ASCII and an ASCII letter
// or digit), the last at or before target, else the first after it, else text.size().
size_t find_cut(std::string_view text, size_t target, char sep);
// `path` is a Hugging Face tokenizer.json (engine/tokenizer_bpe.cpp).
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path);
// `path` is a SentencePiece .model (engine/tokenizer_sp.cpp).
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path);

}  // namespace sw
