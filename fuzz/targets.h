// Fuzz entry points: each takes arbitrary bytes, drives one of Shardwise's readers of files
// that other people make, and returns 0. A sw::Error (the reader refusing the input with its
// one-line message) is the expected outcome for bad input and is swallowed; anything else (a
// crash, a sanitizer report, another exception, an allocation beyond the fuzzer's limit) is a
// finding. libFuzzer calls them through libfuzzer_main.cpp; fuzz_replay (a ctest, normal
// compiler) feeds them the seed corpora and every regression input.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace sw::fuzz {

// A whole .safetensors file: SafeTensorsReader validates it, then every tensor is read (as
// bytes, and as f32 when the dtype converts).
int safetensors(const uint8_t* data, size_t size);
// A checkpoint's metadata.json document. When the input parses as a JSON object, the harness
// seals it as the writer does (metadata_crc32c = CRC-32C of the compact dump without that key)
// so the fuzzer gets past the checksum to every field check; other inputs go in as they are.
int ckpt_metadata(const uint8_t* data, size_t size);
// A config: the bytes up to the first NUL are the JSON text, each further NUL-separated piece
// a --set override (KEY=VALUE); parsed for a world of 2 ranks.
int config(const uint8_t* data, size_t size);
// A token shard (.bin): header, count against the size, token ids against the vocabulary.
int token_header(const uint8_t* data, size_t size);

// By name ("safetensors", ...); null when unknown.
using Entry = int (*)(const uint8_t*, size_t);
Entry entry(const std::string& name);

}  // namespace sw::fuzz
