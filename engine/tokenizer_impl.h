// The tokenizers behind engine/tokenizer.h (internal): load_tokenizer picks one of these.
#pragma once
#include <memory>
#include <string>

#include "engine/tokenizer.h"

namespace sw {

std::unique_ptr<Tokenizer> make_byte_tokenizer();
// `path` is a Hugging Face tokenizer.json (engine/tokenizer_bpe.cpp).
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path);
// `path` is a SentencePiece .model (engine/tokenizer_sp.cpp).
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path);

}  // namespace sw
