#include "engine/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
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

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    fail("data", path + ": " + std::to_string(tokens.size()) +
                     " tokens do not fit the header's int32 count; split them into shards");
  int32_t header[kTokenHeaderInts] = {};
  header[0] = kTokenMagic;
  header[1] = kTokenVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("data", path + ": cannot write (" + errno_str() + ")");
  bool ok = std::fwrite(header, sizeof header, 1, f) == 1;
  if (ok && !tokens.empty())
    ok = std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f) == tokens.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_str();
    std::remove(tmp.c_str());
    fail("data", path + ": write failed (" + why + ")");
  }
}

TokenFile::TokenFile(const std::string& path, int vocab_size, int64_t min_tokens) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("data", path + ": cannot open token file (" + errno_str() + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("data", path + ": not a regular file");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < kHeaderBytes) {
    ::close(fd);
    fail("data", path + ": truncated header (" + std::to_string(bytes) +
                     " bytes, a token file starts with " + std::to_string(kHeaderBytes) + ")");
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) fail("data", path + ": cannot map (" + errno_str() + ")");
  map_ = m;
  map_bytes_ = bytes;
  try {
    n_ = check_token_shard(path, m, bytes, vocab_size, min_tokens, &entropy_);
    tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(m) + kHeaderBytes);
  } catch (...) {
    unmap();
    throw;
  }
}

int64_t check_token_shard(const std::string& path, const void* data, size_t bytes, int vocab_size,
                          int64_t min_tokens, double* entropy) {
  if (bytes < kHeaderBytes)
    fail("data", path + ": truncated header (" + std::to_string(bytes) +
                     " bytes, a token file starts with " + std::to_string(kHeaderBytes) + ")");
  int32_t h[kTokenHeaderInts];
  std::memcpy(h, data, kHeaderBytes);
  if (h[0] != kTokenMagic) {
    std::string hint = h[0] == 20240801 ? " (llm.c's uint32-token format is not supported)"
                                        : " (not an llm.c/nanoGPT token file)";
    fail("data", path + ": bad magic " + std::to_string(h[0]) + ", expected " +
                     std::to_string(kTokenMagic) + hint);
  }
  if (h[1] != kTokenVersion)
    fail("data", path + ": unsupported version " + std::to_string(h[1]) + " (expected " +
                     std::to_string(kTokenVersion) + ")");
  // The count must account for the file exactly (as llm.c's loader requires): a count that is
  // too large would read past the end, one that is too small hides a truncated or
  // concatenated shard.
  const int64_t n = h[2];
  const size_t body = bytes - kHeaderBytes;
  const int64_t held = static_cast<int64_t>(body / sizeof(uint16_t));
  if (n < 0 || n != held || body % sizeof(uint16_t) != 0)
    fail("data", path + ": header says " + std::to_string(n) + " tokens but the file holds " +
                     std::to_string(held) + (body % 2 ? " and a stray byte" : "") +
                     (n > held ? " (truncated?)" : ""));
  if (n < min_tokens)
    fail("data", path + ": " + std::to_string(n) + " tokens, need at least " +
                     std::to_string(min_tokens) + " for one (seq_len + 1) window");
  const unsigned char* toks = static_cast<const unsigned char*>(data) + kHeaderBytes;
  // One pass: vocabulary check and token counts.
  std::vector<int64_t> counts(65536, 0);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t t;
    std::memcpy(&t, toks + 2 * i, 2);
    if (t >= vocab_size)
      fail("data", path + ": token " + std::to_string(t) + " at position " + std::to_string(i) +
                       " is >= model.vocab_size " + std::to_string(vocab_size));
    ++counts[t];
  }
  if (entropy) {
    double h_nats = 0;
    for (int64_t c : counts)
      if (c > 0) {
        const double p = static_cast<double>(c) / static_cast<double>(n);
        h_nats -= p * std::log(p);
      }
    *entropy = h_nats;
  }
  return n;
}

void TokenFile::unmap() {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
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
    tokens_ = std::exchange(o.tokens_, nullptr);
    n_ = std::exchange(o.n_, 0);
    entropy_ = o.entropy_;
  }
  return *this;
}

int64_t train_window_start(int64_t n_tokens, int T, uint64_t seed, int64_t step, int64_t row) {
  static const uint64_t kStream = rng_stream("data.train");
  const uint64_t stream = mix64(kStream + static_cast<uint64_t>(step));
  const uint64_t n_starts = static_cast<uint64_t>(n_tokens - T);  // starts 0 .. n - T - 1
  return static_cast<int64_t>(rng_bits(seed, stream, static_cast<uint64_t>(row)) % n_starts);
}

namespace {
void fill_row(const TokenFile& f, int64_t start, int T, int32_t* in, int32_t* tg) {
  const uint16_t* w = f.tokens() + start;
  for (int t = 0; t < T; ++t) {
    in[t] = w[t];
    tg[t] = w[t + 1];
  }
}
}  // namespace

void train_batch(const TokenFile& f, uint64_t seed, int64_t step, int64_t first_row, int B, int T,
                 int32_t* inputs, int32_t* targets) {
  SW_CHECK(f.size() >= T + 1, "token file shorter than one window");
  for (int b = 0; b < B; ++b)
    fill_row(f, train_window_start(f.size(), T, seed, step, first_row + b), T,
             inputs + static_cast<size_t>(b) * T, targets + static_cast<size_t>(b) * T);
}

void eval_batch(const TokenFile& f, int batch, int n_batches, int B, int T, int32_t* inputs,
                int32_t* targets) {
  SW_CHECK(f.size() >= T + 1, "token file shorter than one window");
  SW_CHECK(batch >= 0 && batch < n_batches, "eval batch index out of range");
  const int64_t W = static_cast<int64_t>(n_batches) * B;
  const int64_t last = f.size() - T - 1;  // the last valid start
  for (int b = 0; b < B; ++b) {
    const int64_t w = static_cast<int64_t>(batch) * B + b;
    const int64_t start =
        W > 1 ? static_cast<int64_t>(static_cast<__int128>(w) * last / (W - 1)) : 0;
    fill_row(f, start, T, inputs + static_cast<size_t>(b) * T,
             targets + static_cast<size_t>(b) * T);
  }
}

}  // namespace sw
