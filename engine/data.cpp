#include "engine/data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace sw {

namespace {
constexpr size_t kHeaderBytes = kTokenHeaderInts * sizeof(int32_t);

std::string errno_str() {
  return std::strerror(errno);
}

}  // namespace

// Token counts for the unigram entropy: dense below kDense ids, a map above (a vocabulary of
// 2^31 ids must not cost 16 GiB of counters).
struct TokenCounts {
  static constexpr int64_t kDense = int64_t{1} << 22;
  std::vector<int64_t> dense;
  std::unordered_map<int32_t, int64_t> sparse;
  int64_t total = 0;
  double entropy() const {
    double h = 0;
    auto term = [&](int64_t c) {
      if (c <= 0) return;
      const double p = static_cast<double>(c) / static_cast<double>(total);
      h -= p * std::log(p);
    };
    for (int64_t c : dense) term(c);
    for (const auto& kv : sparse) term(kv.second);
    return h;
  }
};

namespace {

// Opens path.tmp for writing and writes a zero header (patched by finish_file).
FILE* open_tmp(const std::string& path) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("data", path + ": cannot write (" + errno_str() + ")");
  const int32_t zero[kTokenHeaderInts] = {};
  if (std::fwrite(zero, sizeof zero, 1, f) != 1) {
    const std::string why = errno_str();
    std::fclose(f);
    std::remove(tmp.c_str());
    fail("data", path + ": write failed (" + why + ")");
  }
  return f;
}

// Writes the header at offset 0, closes, renames path.tmp to path. Closes f either way.
void finish_file(FILE*& f, const std::string& path, int32_t magic, int32_t version, int64_t n) {
  int32_t header[kTokenHeaderInts] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(n);
  bool ok = std::fflush(f) == 0 && std::fseek(f, 0, SEEK_SET) == 0 &&
            std::fwrite(header, sizeof header, 1, f) == 1;
  ok = (std::fclose(f) == 0) && ok;
  f = nullptr;
  const std::string tmp = path + ".tmp";
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_str();
    std::remove(tmp.c_str());
    fail("data", path + ": write failed (" + why + ")");
  }
}

void abandon(FILE*& f, const std::string& path) {
  if (!f) return;
  std::fclose(f);
  f = nullptr;
  std::remove((path + ".tmp").c_str());
}

void check_count(const std::string& path, int64_t n) {
  if (n > INT32_MAX)
    fail("data", path + ": " + std::to_string(n) +
                     " tokens do not fit the header's int32 count; split them into shards");
}

// Maps a whole regular file read-only. Returns its size; throws naming `what`.
void* map_file(const std::string& path, const char* what, size_t* bytes_out) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("data", path + ": cannot open " + what + " (" + errno_str() + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("data", path + ": not a regular file");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < kHeaderBytes) {
    ::close(fd);
    fail("data", path + ": truncated header (" + std::to_string(bytes) + " bytes, a " + what +
                     " starts with " + std::to_string(kHeaderBytes) + ")");
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) fail("data", path + ": cannot map (" + errno_str() + ")");
  *bytes_out = bytes;
  return m;
}

int64_t check_shard(const std::string& path, const void* data, size_t bytes, int64_t vocab_size,
                    int64_t min_tokens, int* width_out, TokenCounts* counts) {
  if (bytes < kHeaderBytes)
    fail("data", path + ": truncated header (" + std::to_string(bytes) +
                     " bytes, a token file starts with " + std::to_string(kHeaderBytes) + ")");
  int32_t h[kTokenHeaderInts];
  std::memcpy(h, data, kHeaderBytes);
  if (h[0] != kTokenMagic) {
    std::string hint = h[0] == 20240801  ? " (llm.c's uint32-token format is not supported)"
                       : h[0] == kMaskMagic ? " (a loss-mask file, not a token file)"
                                            : " (not an llm.c/nanoGPT token file)";
    fail("data", path + ": bad magic " + std::to_string(h[0]) + ", expected " +
                     std::to_string(kTokenMagic) + hint);
  }
  if (h[1] != kTokenVersion && h[1] != kTokenVersion32)
    fail("data", path + ": unsupported version " + std::to_string(h[1]) + " (expected " +
                     std::to_string(kTokenVersion) + " or " + std::to_string(kTokenVersion32) +
                     ")");
  const size_t w = h[1] == kTokenVersion ? 2 : 4;
  // The count must account for the file exactly (as llm.c's loader requires): a count that is
  // too large would read past the end, one that is too small hides a truncated or
  // concatenated shard.
  const int64_t n = h[2];
  const size_t body = bytes - kHeaderBytes;
  const int64_t held = static_cast<int64_t>(body / w);
  if (n < 0 || n != held || body % w != 0)
    fail("data", path + ": header says " + std::to_string(n) + " tokens but the file holds " +
                     std::to_string(held) + (body % w ? " and stray bytes" : "") +
                     (n > held ? " (truncated?)" : ""));
  if (n < min_tokens)
    fail("data", path + ": " + std::to_string(n) + " tokens, need at least " +
                     std::to_string(min_tokens) + " for one (seq_len + 1) window");
  const unsigned char* toks = static_cast<const unsigned char*>(data) + kHeaderBytes;
  auto bad = [&](int64_t i, int64_t t) {
    fail("data", path + ": token " + std::to_string(t) + " at position " + std::to_string(i) +
                     " is " + (t < 0 ? "negative" : ">= model.vocab_size " +
                                                        std::to_string(vocab_size)));
  };
  // One pass: vocabulary check and token counts (dense counters up to the vocabulary or
  // kDense ids, sized once, so the loop has one compare per token).
  const int64_t dense_n = std::min<int64_t>(
      TokenCounts::kDense, w == 2 ? std::min<int64_t>(vocab_size, 65536) : vocab_size);
  if (counts && static_cast<int64_t>(counts->dense.size()) < dense_n)
    counts->dense.resize(static_cast<size_t>(dense_n), 0);
  int64_t* dense = counts ? counts->dense.data() : nullptr;
  if (w == 2) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t t;
      std::memcpy(&t, toks + 2 * i, 2);
      if (t >= vocab_size) bad(i, t);
      if (dense) ++dense[t];
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      int32_t t;
      std::memcpy(&t, toks + 4 * i, 4);
      if (t < 0 || t >= vocab_size) bad(i, t);
      if (!dense) continue;
      if (t < dense_n)
        ++dense[t];
      else
        ++counts->sparse[t];
    }
  }
  if (counts) counts->total += n;
  if (width_out) *width_out = static_cast<int>(w);
  return n;
}
}  // namespace

int token_width_for(int64_t vocab_size) {
  return vocab_size <= 65536 ? 2 : 4;
}

std::string mask_path_for(const std::string& token_path) {
  const std::string ext = ".bin";
  if (token_path.size() > ext.size() &&
      token_path.compare(token_path.size() - ext.size(), ext.size(), ext) == 0)
    return token_path.substr(0, token_path.size() - ext.size()) + ".mask";
  return token_path + ".mask";
}

// ---- writers

TokenWriter::TokenWriter(const std::string& path, int64_t vocab_size)
    : path_(path), vocab_(vocab_size), width_(token_width_for(vocab_size)) {
  if (vocab_size < 1 || vocab_size > kMaxVocab)
    fail("data", path + ": vocabulary size " + std::to_string(vocab_size) +
                     " is outside [1, 2147483647]");
  f_ = open_tmp(path);
}

TokenWriter::~TokenWriter() {
  abandon(f_, path_);
}

void TokenWriter::append(const int32_t* ids, size_t n) {
  if (!f_) fail("data", path_ + ": append after finish");
  check_count(path_, n_ + static_cast<int64_t>(n));
  buf_.resize(n * width_);
  for (size_t i = 0; i < n; ++i) {
    const int32_t t = ids[i];
    if (t < 0 || t >= vocab_)
      fail("data", path_ + ": token " + std::to_string(t) + " at position " +
                       std::to_string(n_ + static_cast<int64_t>(i)) + " is " +
                       (t < 0 ? "negative" : ">= the vocabulary size " + std::to_string(vocab_)));
    if (width_ == 2) {
      const uint16_t v = static_cast<uint16_t>(t);
      std::memcpy(&buf_[2 * i], &v, 2);
    } else {
      std::memcpy(&buf_[4 * i], &t, 4);
    }
  }
  if (n && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size())
    fail("data", path_ + ": write failed (" + errno_str() + ")");
  n_ += static_cast<int64_t>(n);
}

void TokenWriter::finish() {
  if (!f_) fail("data", path_ + ": finished twice");
  finish_file(f_, path_, kTokenMagic, width_ == 2 ? kTokenVersion : kTokenVersion32, n_);
}

MaskWriter::MaskWriter(const std::string& path) : path_(path) {
  f_ = open_tmp(path);
}

MaskWriter::~MaskWriter() {
  abandon(f_, path_);
}

void MaskWriter::append(const uint8_t* m, size_t n) {
  if (!f_) fail("data", path_ + ": append after finish");
  check_count(path_, n_ + static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i)
    if (m[i] > 1)
      fail("data", path_ + ": mask byte " + std::to_string(m[i]) + " at position " +
                       std::to_string(n_ + static_cast<int64_t>(i)) + " is not 0 or 1");
  if (n && std::fwrite(m, 1, n, f_) != n)
    fail("data", path_ + ": write failed (" + errno_str() + ")");
  n_ += static_cast<int64_t>(n);
}

void MaskWriter::finish() {
  if (!f_) fail("data", path_ + ": finished twice");
  finish_file(f_, path_, kMaskMagic, kMaskVersion, n_);
}

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
  check_count(path, static_cast<int64_t>(tokens.size()));
  TokenWriter w(path, 65536);
  std::vector<int32_t> chunk;
  for (size_t i = 0; i < tokens.size(); i += 65536) {
    const size_t e = std::min(tokens.size(), i + 65536);
    chunk.assign(tokens.begin() + static_cast<std::ptrdiff_t>(i),
                 tokens.begin() + static_cast<std::ptrdiff_t>(e));
    w.append(chunk);
  }
  w.finish();
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens,
                      int64_t vocab_size) {
  check_count(path, static_cast<int64_t>(tokens.size()));
  TokenWriter w(path, vocab_size);
  w.append(tokens);
  w.finish();
}

void write_mask_file(const std::string& path, const std::vector<uint8_t>& mask) {
  check_count(path, static_cast<int64_t>(mask.size()));
  MaskWriter w(path);
  w.append(mask);
  w.finish();
}

// ---- readers

int64_t check_token_shard(const std::string& path, const void* data, size_t bytes,
                          int64_t vocab_size, int64_t min_tokens, double* entropy) {
  TokenCounts counts;
  const int64_t n =
      check_shard(path, data, bytes, vocab_size, min_tokens, nullptr, entropy ? &counts : nullptr);
  if (entropy) *entropy = counts.entropy();
  return n;
}

TokenFile::TokenFile(const std::string& path, int64_t vocab_size, int64_t min_tokens,
                     TokenCounts* counts)
    : path_(path) {
  map_ = map_file(path, "token file", &map_bytes_);
  try {
    TokenCounts own;
    n_ = check_shard(path, map_, map_bytes_, vocab_size, min_tokens, &width_,
                     counts ? counts : &own);
    entropy_ = counts ? std::nan("") : own.entropy();
    ids_ = static_cast<const char*>(map_) + kHeaderBytes;
    const std::string mp = mask_path_for(path);
    if (std::filesystem::exists(mp)) {
      mask_map_ = map_file(mp, "mask file", &mask_bytes_);
      int32_t h[kTokenHeaderInts];
      std::memcpy(h, mask_map_, kHeaderBytes);
      if (h[0] != kMaskMagic)
        fail("data", mp + ": bad magic " + std::to_string(h[0]) + ", expected " +
                         std::to_string(kMaskMagic) + " (a loss-mask file)");
      if (h[1] != kMaskVersion)
        fail("data", mp + ": unsupported version " + std::to_string(h[1]) + " (expected " +
                         std::to_string(kMaskVersion) + ")");
      const int64_t held = static_cast<int64_t>(mask_bytes_ - kHeaderBytes);
      if (h[2] != held)
        fail("data", mp + ": header says " + std::to_string(h[2]) +
                         " tokens but the file holds " + std::to_string(held));
      if (held != n_)
        fail("data", mp + ": masks " + std::to_string(held) + " tokens but " + path + " holds " +
                         std::to_string(n_));
      mask_ = static_cast<const uint8_t*>(mask_map_) + kHeaderBytes;
      for (int64_t i = 0; i < n_; ++i)
        if (mask_[i] > 1)
          fail("data", mp + ": mask byte " + std::to_string(mask_[i]) + " at position " +
                           std::to_string(i) + " is not 0 or 1");
    }
  } catch (...) {
    unmap();
    throw;
  }
}

void TokenFile::copy(int64_t start, int64_t n, int32_t* out) const {
  if (width_ == 2) {
    const uint16_t* p = static_cast<const uint16_t*>(ids_) + start;
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    std::memcpy(out, static_cast<const int32_t*>(ids_) + start, static_cast<size_t>(n) * 4);
  }
}

void TokenFile::unmap() {
  if (map_) ::munmap(map_, map_bytes_);
  if (mask_map_) ::munmap(mask_map_, mask_bytes_);
  map_ = mask_map_ = nullptr;
  map_bytes_ = mask_bytes_ = 0;
  ids_ = nullptr;
  mask_ = nullptr;
  n_ = 0;
}

TokenFile::~TokenFile() {
  unmap();
}

TokenFile::TokenFile(TokenFile&& o) noexcept {
  *this = std::move(o);
}

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    mask_map_ = std::exchange(o.mask_map_, nullptr);
    mask_bytes_ = std::exchange(o.mask_bytes_, 0);
    ids_ = std::exchange(o.ids_, nullptr);
    mask_ = std::exchange(o.mask_, nullptr);
    width_ = o.width_;
    n_ = std::exchange(o.n_, 0);
    entropy_ = o.entropy_;
  }
  return *this;
}

// ---- corpora

std::vector<std::string> resolve_token_files(const std::string& spec) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    for (const auto& e : fs::directory_iterator(spec, ec))
      if (e.path().extension() == ".bin" && e.is_regular_file()) out.push_back(e.path().string());
    if (ec) fail("data", spec + ": cannot list (" + ec.message() + ")");
    if (out.empty()) fail("data", spec + ": a directory with no *.bin token files");
  } else if (spec.find_first_of("*?[") != std::string::npos && !fs::exists(spec, ec)) {
    glob_t g{};
    const int rc = ::glob(spec.c_str(), 0, nullptr, &g);
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (out.empty()) fail("data", spec + ": no token files match");
  } else {
    out.push_back(spec);  // a file (TokenFile reports a missing one)
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t permute_index(int64_t i, int64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int half = 1;  // bits per half: the domain is [0, 4^half) >= n
  while ((uint64_t{1} << (2 * half)) < static_cast<uint64_t>(n)) ++half;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = static_cast<uint64_t>(i);
  do {  // cycle-walk: a permutation of the larger domain, reapplied until it lands in [0, n)
    uint64_t l = x >> half, r = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = mix64(key + mix64(round * 0x9e3779b97f4a7c15ull + r)) & mask;
      const uint64_t nl = r;
      r = l ^ f;
      l = nl;
    }
    x = (l << half) | r;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

Corpus::Corpus(const std::string& spec, int64_t vocab_size, int T) : T_(T) {
  SW_CHECK(T >= 1, "Corpus: seq_len < 1");
  TokenCounts counts;
  const std::vector<std::string> paths = resolve_token_files(spec);
  // One file must hold a window; in a corpus of several, a short file (a last shard) holds none.
  const int64_t min_tokens = paths.size() == 1 ? int64_t{T} + 1 : 0;
  int64_t s = 0;  // possible window starts so far (n_i - T per file)
  for (const std::string& p : paths) {
    files_.emplace_back(p, vocab_size, min_tokens, &counts);
    const TokenFile& f = files_.back();
    first_window_.push_back(N_);
    first_start_.push_back(s);  // starts in the files before this one
    N_ += f.size() > T ? (f.size() - 1) / T : 0;
    s += std::max<int64_t>(0, f.size() - T);
    tokens_ += f.size();
    has_mask_ = has_mask_ || f.mask() != nullptr;
  }
  if (N_ == 0)
    fail("data", spec + ": no file holds seq_len + 1 = " + std::to_string(T + 1) +
                     " tokens (one window)");
  first_start_.push_back(s);
  first_window_.push_back(N_);
  entropy_ = counts.entropy();
}

size_t Corpus::map_bytes() const {
  size_t b = 0;
  for (const TokenFile& f : files_) b += f.map_bytes();
  return b;
}

Corpus::Window Corpus::window(int64_t w) const {
  SW_CHECK(w >= 0 && w < N_, "Corpus::window out of range");
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), w) - 1;
  const int f = static_cast<int>(it - first_window_.begin());
  return {f, (w - *it) * T_};
}

int64_t Corpus::train_window(uint64_t seed, int64_t g) const {
  static const uint64_t kStream = rng_stream("data.train.epoch");
  const int64_t epoch = g / N_;
  return permute_index(g % N_, N_, rng_bits(seed, kStream, static_cast<uint64_t>(epoch)));
}

namespace {
// Row of a batch from window w: inputs = tokens[start, start + T), targets = tokens
// [start + 1, start + T], a target whose mask byte is 0 set to -1 (ignored by the loss).
// Returns the targets kept.
int64_t fill(const Corpus& c, const Corpus::Window& w, int T, int32_t* in, int32_t* tg) {
  const TokenFile& f = c.file(static_cast<size_t>(w.file));
  f.copy(w.start, T, in);
  std::memcpy(tg, in + 1, static_cast<size_t>(T - 1) * sizeof(int32_t));
  tg[T - 1] = f.token(w.start + T);
  const uint8_t* m = f.mask();
  if (!m) return T;
  int64_t kept = 0;
  for (int t = 0; t < T; ++t) {
    if (m[w.start + 1 + t])
      ++kept;
    else
      tg[t] = -1;
  }
  return kept;
}
}  // namespace

int64_t train_batch(const Corpus& c, uint64_t seed, int64_t step, int64_t global_batch,
                    int64_t first_row, int B, int T, int32_t* inputs, int32_t* targets) {
  SW_CHECK(T == c.seq_len(), "train_batch: T differs from the corpus's seq_len");
  SW_CHECK(first_row >= 0 && first_row + B <= global_batch, "train_batch: rows outside the step");
  int64_t kept = 0;
  for (int b = 0; b < B; ++b) {
    const int64_t g = step * global_batch + first_row + b;
    kept += fill(c, c.window(c.train_window(seed, g)), T, inputs + static_cast<size_t>(b) * T,
                 targets + static_cast<size_t>(b) * T);
  }
  return kept;
}

int64_t train_counted(const Corpus& c, uint64_t seed, int64_t step, int64_t global_batch,
                      int64_t first_row, int64_t rows) {
  const int T = c.seq_len();
  if (!c.has_mask()) return rows * T;
  int64_t kept = 0;
  for (int64_t b = 0; b < rows; ++b) {
    const Corpus::Window w = c.window(c.train_window(seed, step * global_batch + first_row + b));
    const uint8_t* m = c.file(static_cast<size_t>(w.file)).mask();
    if (!m) {
      kept += T;
      continue;
    }
    for (int t = 1; t <= T; ++t) kept += m[w.start + t];
  }
  return kept;
}

int64_t eval_batch(const Corpus& c, int batch, int n_batches, int B, int T, int32_t* inputs,
                   int32_t* targets) {
  SW_CHECK(T == c.seq_len(), "eval_batch: T differs from the corpus's seq_len");
  SW_CHECK(batch >= 0 && batch < n_batches, "eval batch index out of range");
  const int64_t W = static_cast<int64_t>(n_batches) * B;
  // Possible starts: file i has n_i - T of them (0 .. n_i - T - 1); S in all.
  const std::vector<int64_t>& fs = c.starts_prefix();
  const int64_t last = fs.back() - 1;  // the last valid start, counted across files
  int64_t kept = 0;
  for (int b = 0; b < B; ++b) {
    const int64_t w = static_cast<int64_t>(batch) * B + b;
    const int64_t gs =
        W > 1 ? static_cast<int64_t>(static_cast<__int128>(w) * last / (W - 1)) : 0;
    const auto it = std::upper_bound(fs.begin(), fs.end() - 1, gs) - 1;
    const Corpus::Window win{static_cast<int>(it - fs.begin()), gs - *it};
    kept += fill(c, win, T, inputs + static_cast<size_t>(b) * T,
                 targets + static_cast<size_t>(b) * T);
  }
  return kept;
}

}  // namespace sw
