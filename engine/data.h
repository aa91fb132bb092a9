// Token data in llm.c / nanoGPT's shard format, so prepared datasets load as they are:
//   header: 256 int32 (little-endian) — [0] = 20240520 (magic), [1] = version,
//           [2] = number of tokens; the rest zero;
//   version 1 (llm.c's, unchanged): then exactly that many uint16 ids (vocabularies <= 65,536);
//   version 2 (ours): then exactly that many int32 ids >= 0 (larger vocabularies; llm.c and
//   Shardwise before it refuse version 2 with one line).
//   A count that disagrees with the file's size is an error (as llm.c's loader requires).
//
// Loss mask beside a token file (X.bin -> X.mask, mask_path_for): header 256 int32 —
// [0] = 20261129 (kMaskMagic), [1] = 1, [2] = number of tokens (equal to the token file's);
// then one byte per token: mask[i] = 1 when token i, as a target, counts in the loss; 0 when
// it is excluded (a prompt token in fine-tuning). mask[0] is never a target.
//
// A corpus (Corpus) is one file, a directory (every *.bin in it, sorted by name) or a glob.
// It is cut into N windows of T + 1 tokens that never cross a file (file i with n_i tokens
// holds (n_i - 1) / T of them, window k at tokens [k T, k T + T]: consecutive windows share
// one token, so every token but a file's first is a target once per epoch). Training order
// is a pure function of (seed, step, row): global row g = step * global_batch + row, epoch
// e = g / N, window = P_e(g mod N) with P_e a seeded bijection of [0, N) (a Feistel network,
// reseeded per epoch). Resuming at step s draws exactly the windows an uninterrupted run
// would, without replaying; within an epoch, ranks and micro-steps draw disjoint windows.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace sw {

struct TokenCounts;  // token frequencies (engine/data.cpp), for a corpus's unigram entropy

constexpr int32_t kTokenMagic = 20240520;
constexpr int32_t kTokenVersion = 1;    // uint16 ids
constexpr int32_t kTokenVersion32 = 2;  // int32 ids
constexpr int kTokenHeaderInts = 256;
constexpr int32_t kMaskMagic = 20261129;
constexpr int32_t kMaskVersion = 1;
constexpr int64_t kMaxVocab = 2147483647;  // 2^31 - 1: ids are int32 everywhere

// Bytes per id in a token file for a vocabulary of `vocab_size` ids: 2 (version 1) up to
// 65,536, else 4 (version 2).
int token_width_for(int64_t vocab_size);

// "dir/X.bin" -> "dir/X.mask"; a name not ending in .bin gets ".mask" appended.
std::string mask_path_for(const std::string& token_path);

// Streaming token-file writer: append chunks of ids, finish() patches the header's count and
// renames path.tmp to path. The id width follows vocab_size (token_width_for). Every id is
// checked in [0, vocab_size) (one line naming the file, position and id). An unfinished
// writer (an exception, or never finished) removes its path.tmp. Throws sw::Error("data: ...").
class TokenWriter {
 public:
  TokenWriter(const std::string& path, int64_t vocab_size);
  ~TokenWriter();
  TokenWriter(const TokenWriter&) = delete;
  TokenWriter& operator=(const TokenWriter&) = delete;

  void append(const int32_t* ids, size_t n);
  void append(const std::vector<int32_t>& ids) { append(ids.data(), ids.size()); }
  void finish();
  int64_t count() const { return n_; }
  int width() const { return width_; }  // 2 or 4
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int64_t vocab_;
  int width_;
  FILE* f_ = nullptr;
  int64_t n_ = 0;
  std::vector<unsigned char> buf_;
};

// The same for a mask file: bytes 0 or 1 (anything else is refused).
class MaskWriter {
 public:
  explicit MaskWriter(const std::string& path);
  ~MaskWriter();
  MaskWriter(const MaskWriter&) = delete;
  MaskWriter& operator=(const MaskWriter&) = delete;

  void append(const uint8_t* m, size_t n);
  void append(const std::vector<uint8_t>& m) { append(m.data(), m.size()); }
  void finish();
  int64_t count() const { return n_; }

 private:
  std::string path_;
  FILE* f_ = nullptr;
  int64_t n_ = 0;
};

// Whole-vector forms (version 1 for uint16; for int32 the width follows vocab_size).
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens);
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens,
                      int64_t vocab_size);
void write_mask_file(const std::string& path, const std::vector<uint8_t>& mask);

// Checks a token shard held in memory (`bytes` bytes at `data`; `path` names it in messages):
// header, magic, version, a count that matches the size exactly, at least `min_tokens` tokens,
// every id < vocab_size. Returns the token count, and the unigram entropy (see TokenFile) when
// `entropy` is given. Throws one line naming the file. TokenFile runs it on the mapped file.
int64_t check_token_shard(const std::string& path, const void* data, size_t bytes,
                          int64_t vocab_size, int64_t min_tokens, double* entropy = nullptr);

// A validated, memory-mapped token file (read-only), with its mask file when one sits beside it.
class TokenFile {
 public:
  // Maps and checks `path` (check_token_shard): readable, complete header, magic and
  // version, the header's token count matches the file, at least `min_tokens` tokens, every id
  // < vocab_size. Each failure throws one line naming the file (a bad token: its position and
  // value). If mask_path_for(path) exists it is mapped and checked too (magic, version, a count
  // equal to the token count, bytes 0 or 1). With `counts`, the token frequencies are added
  // there (and unigram_entropy() is NaN).
  TokenFile(const std::string& path, int64_t vocab_size, int64_t min_tokens,
            TokenCounts* counts = nullptr);
  ~TokenFile();
  TokenFile(TokenFile&& o) noexcept;
  TokenFile& operator=(TokenFile&& o) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int width() const { return width_; }  // 2 (version 1) or 4 (version 2)
  int32_t token(int64_t i) const {
    return width_ == 2 ? int32_t(static_cast<const uint16_t*>(ids_)[i])
                       : static_cast<const int32_t*>(ids_)[i];
  }
  // out[0 .. n) = tokens [start, start + n).
  void copy(int64_t start, int64_t n, int32_t* out) const;
  int64_t size() const { return n_; }
  const std::string& path() const { return path_; }
  // The loss mask (size() bytes), or nullptr when the file has none.
  const uint8_t* mask() const { return mask_; }
  size_t map_bytes() const { return map_bytes_ + mask_bytes_; }  // files mapped (resident once checked)
  // Entropy (nats) of the file's token-frequency (unigram) distribution: the loss a model that
  // only learned token frequencies would reach. For byte-level data, the byte-unigram entropy.
  double unigram_entropy() const { return entropy_; }

 private:
  void unmap();
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  void* mask_map_ = nullptr;
  size_t mask_bytes_ = 0;
  const void* ids_ = nullptr;
  const uint8_t* mask_ = nullptr;
  int width_ = 2;
  int64_t n_ = 0;
  double entropy_ = 0;
};

// The token files `spec` names: a file; a directory (every *.bin in it, sorted by name); or a
// glob pattern (sorted). None found: one line naming the spec.
std::vector<std::string> resolve_token_files(const std::string& spec);

// A seeded bijection of [0, n) (n >= 1): a 4-round Feistel network over the smallest even
// power of two >= n, cycle-walked into [0, n). Different keys give independent permutations.
int64_t permute_index(int64_t i, int64_t n, uint64_t key);

// Training (and validation) data: the token files of a spec, cut into windows (see top).
class Corpus {
 public:
  // A single file needs at least T + 1 tokens (one window); in a corpus of several files a
  // shorter one holds no window, and at least one file must hold one.
  Corpus(const std::string& spec, int64_t vocab_size, int T);
  Corpus(Corpus&&) noexcept = default;
  Corpus& operator=(Corpus&&) noexcept = default;

  int seq_len() const { return T_; }
  int64_t windows() const { return N_; }  // N
  int64_t tokens() const { return tokens_; }
  size_t files() const { return files_.size(); }
  const TokenFile& file(size_t i) const { return files_[i]; }
  bool has_mask() const { return has_mask_; }  // some file has a mask
  size_t map_bytes() const;
  double unigram_entropy() const { return entropy_; }  // of all files' tokens together

  struct Window {
    int file;
    int64_t start;  // tokens [start, start + T] of that file
  };
  Window window(int64_t w) const;  // w in [0, N)

  // Window of global row g (g = step * global_batch + row) and its epoch (g / N).
  int64_t train_window(uint64_t seed, int64_t g) const;
  int64_t epoch_of(int64_t g) const { return g / N_; }

  // Per file, then the total: windows' possible starts in the files before it (n_i - T each).
  const std::vector<int64_t>& starts_prefix() const { return first_start_; }

 private:
  int T_ = 0;
  int64_t N_ = 0, tokens_ = 0;
  bool has_mask_ = false;
  double entropy_ = 0;
  std::vector<TokenFile> files_;
  std::vector<int64_t> first_window_;  // per file, then N: prefix sums of windows
  std::vector<int64_t> first_start_;   // per file, then the total: prefix sums of n_i - T (eval)
};

// Fills inputs/targets (B, T) with rows first_row .. first_row + B - 1 of step `step`, rows
// numbered across the step's global batch of `global_batch` rows: micro-step k, rank r,
// local row b of a micro-batch of B rows is row (k * world + r) * B + b. So any split of the
// same global batch into micro-steps and ranks trains on the same windows. Returns the number
// of targets counted by the loss (B * T without masks).
int64_t train_batch(const Corpus& c, uint64_t seed, int64_t step, int64_t global_batch,
                    int64_t first_row, int B, int T, int32_t* inputs, int32_t* targets);

// The targets the loss counts in rows first_row .. first_row + rows - 1 of step `step` (as
// train_batch draws them; rows * T without masks), read from the masks alone.
int64_t train_counted(const Corpus& c, uint64_t seed, int64_t step, int64_t global_batch,
                      int64_t first_row, int64_t rows);

// Validation batch `batch` of `n_batches`: the n_batches * B windows' starts are spread
// evenly over the corpus's possible starts (every start of a window inside one file; first
// at 0, last at the end of the last file), the same for every run and seed. Masked targets
// are -1. Returns the number of targets counted.
int64_t eval_batch(const Corpus& c, int batch, int n_batches, int B, int T, int32_t* inputs,
                   int32_t* targets);

}  // namespace sw
