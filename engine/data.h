// Token data in llm.c / nanoGPT's shard format, so prepared datasets load as they are:
//   header: 256 int32 (little-endian) — [0] = 20240520 (magic), [1] = 1 (version),
//           [2] = number of tokens; the rest zero;
//   then exactly that many uint16 token ids (as llm.c's loader requires: a count that
//   disagrees with the file's size is an error).
//
// Batches are a pure function of (seed, step, row): resuming at step s draws exactly
// the batches an uninterrupted run would, without replaying earlier steps.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sw {

constexpr int32_t kTokenMagic = 20240520;
constexpr int32_t kTokenVersion = 1;
constexpr int kTokenHeaderInts = 256;

// Writes `tokens` with the header above (to path.tmp, then renamed). Throws sw::Error("data: ...").
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens);

// Checks a token shard held in memory (`bytes` bytes at `data`; `path` names it in messages):
// header, magic, version, a count that matches the size exactly, at least `min_tokens` tokens,
// every id < vocab_size. Returns the token count, and the unigram entropy (see TokenFile) when
// `entropy` is given. Throws one line naming the file. TokenFile runs it on the mapped file.
int64_t check_token_shard(const std::string& path, const void* data, size_t bytes, int vocab_size,
                          int64_t min_tokens, double* entropy = nullptr);

// A validated, memory-mapped token file (read-only).
class TokenFile {
 public:
  // Maps and checks `path` (check_token_shard): readable, complete header, magic and
  // version, the header's token count matches the file, at least `min_tokens` tokens, every id < vocab_size. Each failure
  // throws one line naming the file (a bad token: its position and value).
  TokenFile(const std::string& path, int vocab_size, int64_t min_tokens);
  ~TokenFile();
  TokenFile(TokenFile&& o) noexcept;
  TokenFile& operator=(TokenFile&& o) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const uint16_t* tokens() const { return tokens_; }
  int64_t size() const { return n_; }
  const std::string& path() const { return path_; }
  size_t map_bytes() const { return map_bytes_; }  // the whole file, mapped (resident once checked)
  // Entropy (nats) of the file's token-frequency (unigram) distribution: the loss a model that
  // only learned token frequencies would reach. For byte-level data, the byte-unigram entropy.
  double unigram_entropy() const { return entropy_; }

 private:
  void unmap();
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t n_ = 0;
  double entropy_ = 0;
};

// Start of the training window of row `row` of optimizer step `step` (0-based): uniform in
// [0, n_tokens - T - 1], a function of (seed, step, row) only. Rows are numbered across the
// whole step's global batch: micro-step k, rank r, local row b of a micro-batch of B rows is
// row (k * world + r) * B + b. So any split of the same global batch into micro-steps (and,
// later, ranks) trains on the same windows.
int64_t train_window_start(int64_t n_tokens, int T, uint64_t seed, int64_t step, int64_t row);

// Fills inputs/targets (B, T) with rows first_row .. first_row + B - 1 of step `step`:
// each row is a window w = tokens[start : start + T + 1], inputs = w[0:T], targets = w[1:T+1].
void train_batch(const TokenFile& f, uint64_t seed, int64_t step, int64_t first_row, int B, int T,
                 int32_t* inputs, int32_t* targets);

// Validation batch `batch` of `n_batches`: the n_batches * B windows are spread evenly over the
// file (first window at 0, last at the end), the same for every run and seed.
void eval_batch(const TokenFile& f, int batch, int n_batches, int B, int T, int32_t* inputs,
                int32_t* targets);

}  // namespace sw
