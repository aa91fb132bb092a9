// Token files: format, every validation error, batch determinism and the resume property.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "engine/data.h"

using namespace sw;
using Catch::Matchers::Contains;

namespace {
std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("sw_test_data_" + name)).string();
}
std::vector<uint16_t> ramp(size_t n, int mod) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(i % mod);
  return v;
}
void write_raw(const std::string& path, const std::vector<int32_t>& header,
               const std::vector<uint16_t>& toks) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  f.write(reinterpret_cast<const char*>(toks.data()), toks.size() * 2);
}
std::vector<int32_t> header(int32_t magic, int32_t version, int32_t n) {
  std::vector<int32_t> h(256, 0);
  h[0] = magic, h[1] = version, h[2] = n;
  return h;
}
}  // namespace

TEST_CASE("data: write_token_file writes llm.c's header and the tokens") {
  const std::string p = tmp_path("fmt.bin");
  const std::vector<uint16_t> toks = {1, 2, 65535, 0, 7};
  write_token_file(p, toks);
  std::ifstream f(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
  REQUIRE(bytes.size() == 1024 + 2 * toks.size());
  int32_t h[256];
  std::memcpy(h, bytes.data(), 1024);
  CHECK(h[0] == 20240520);
  CHECK(h[1] == 1);
  CHECK(h[2] == 5);
  CHECK(std::all_of(h + 3, h + 256, [](int32_t x) { return x == 0; }));
  uint16_t back[5];
  std::memcpy(back, bytes.data() + 1024, 10);
  CHECK(std::equal(back, back + 5, toks.begin()));
  const TokenFile tf(p, 65536, 5);
  CHECK(tf.size() == 5);
  CHECK(tf.tokens()[2] == 65535);
  CHECK(!std::filesystem::exists(p + ".tmp"));
  std::filesystem::remove(p);
}

TEST_CASE("data: every malformed file gives one line naming the file") {
  const std::string p = tmp_path("bad.bin");
  CHECK_THROWS_WITH(
      TokenFile(tmp_path("missing.bin"), 256, 2),
      Contains("data: " + tmp_path("missing.bin") + ": cannot open token file (No such file"));
  { std::ofstream(p, std::ios::binary) << std::string(100, '\0'); }
  CHECK_THROWS_WITH(TokenFile(p, 256, 2), Contains(p + ": truncated header (100 bytes"));
  write_raw(p, header(12345, 1, 4), {1, 2, 3, 4});
  CHECK_THROWS_WITH(TokenFile(p, 256, 2), Contains(p + ": bad magic 12345, expected 20240520"));
  write_raw(p, header(20240520, 2, 4), {1, 2, 3, 4});
  CHECK_THROWS_WITH(TokenFile(p, 256, 2), Contains(p + ": unsupported version 2"));
  write_raw(p, header(20240520, 1, 10), {1, 2, 3, 4});  // header claims more than the file has
  CHECK_THROWS_WITH(TokenFile(p, 256, 2),
                    Contains(p + ": header says 10 tokens but the file holds 4"));
  write_raw(p, header(20240520, 1, 4), {1, 2, 3, 4});
  CHECK_THROWS_WITH(TokenFile(p, 256, 9),
                    Contains(p + ": 4 tokens, need at least 9 for one (seq_len + 1) window"));
  write_token_file(p, {1, 2, 300, 4, 999});
  CHECK_THROWS_WITH(TokenFile(p, 256, 2),
                    Contains(p + ": token 300 at position 2 is >= model.vocab_size 256"));
  CHECK_NOTHROW(TokenFile(p, 1000, 2));
  CHECK_THROWS_WITH(write_token_file("/nonexistent-dir/x.bin", {1}),
                    Contains("data: /nonexistent-dir/x.bin: cannot write"));
  std::filesystem::remove(p);
}

TEST_CASE("data: batches are pure functions of seed and step and row so resuming reproduces them") {
  const std::string p = tmp_path("det.bin");
  std::vector<uint16_t> toks(5000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 7919) % 251);
  write_token_file(p, toks);
  const int B = 3, T = 16;
  std::vector<int32_t> in(B * T), tg(B * T), in2(B * T), tg2(B * T);
  // Run A draws steps 0..9 in order; run B (a fresh file object, as after a restart) jumps to 7.
  std::vector<std::vector<int32_t>> run_a;
  {
    const TokenFile f(p, 256, T + 1);
    for (int s = 0; s < 10; ++s)
      for (int k = 0; k < 2; ++k) {
        train_batch(f, 42, s, k * B, B, T, in.data(), tg.data());
        run_a.push_back(in);
        run_a.push_back(tg);
      }
  }
  const TokenFile g(p, 256, T + 1);
  train_batch(g, 42, 7, B, B, T, in2.data(), tg2.data());
  CHECK(in2 == run_a[(7 * 2 + 1) * 2]);
  CHECK(tg2 == run_a[(7 * 2 + 1) * 2 + 1]);
  // Targets are the inputs shifted by one inside the same window of the file.
  for (int b = 0; b < B; ++b) {
    const int64_t start = train_window_start(g.size(), T, 42, 7, B + b);
    for (int t = 0; t < T; ++t) {
      CHECK(in2[b * T + t] == toks[start + t]);
      CHECK(tg2[b * T + t] == toks[start + t + 1]);
    }
  }
  // One micro-batch of 2B rows holds exactly the rows of two micro-batches of B.
  std::vector<int32_t> big(2 * B * T), bigt(2 * B * T);
  train_batch(g, 42, 7, 0, 2 * B, T, big.data(), bigt.data());
  CHECK(std::vector<int32_t>(big.begin() + B * T, big.end()) == in2);
  CHECK(std::vector<int32_t>(bigt.begin() + B * T, bigt.end()) == tg2);
  // Different step, row or seed -> (almost surely) a different window.
  std::set<int64_t> starts;
  for (int s = 0; s < 8; ++s)
    for (int b = 0; b < 8; ++b) starts.insert(train_window_start(g.size(), T, 42, s, b));
  CHECK(starts.size() >= 60);  // 64 draws from 4984 starts
  CHECK(train_window_start(g.size(), T, 43, 7, 1) != train_window_start(g.size(), T, 42, 7, 1));
  std::filesystem::remove(p);
}

TEST_CASE("data: window starts cover 0 to n-T-1 and never run past the end") {
  const int64_t n = 40;
  const int T = 8;
  int64_t lo = n, hi = -1;
  for (int s = 0; s < 2000; ++s) {
    const int64_t st = train_window_start(n, T, 1, s, 0);
    lo = std::min(lo, st);
    hi = std::max(hi, st);
    REQUIRE(st + T + 1 <= n);
  }
  CHECK(lo == 0);
  CHECK(hi == n - T - 1);
  // The smallest legal file (exactly T + 1 tokens) has exactly one window.
  CHECK(train_window_start(T + 1, T, 5, 3, 2) == 0);
}

TEST_CASE("data: eval batches are fixed windows spread over the file") {
  const std::string p = tmp_path("val.bin");
  write_token_file(p, ramp(1000, 256));
  const TokenFile f(p, 256, 9);
  const int B = 2, T = 8, NB = 3;
  std::vector<int32_t> in(B * T), tg(B * T), in2(B * T), tg2(B * T);
  eval_batch(f, 0, NB, B, T, in.data(), tg.data());
  CHECK(in[0] == 0);  // first window at 0
  eval_batch(f, NB - 1, NB, B, T, in.data(), tg.data());
  CHECK(tg[B * T - 1] == f.tokens()[999]);  // last window ends at the last token
  eval_batch(f, 1, NB, B, T, in.data(), tg.data());
  eval_batch(f, 1, NB, B, T, in2.data(), tg2.data());
  CHECK(in == in2);
  CHECK(tg == tg2);
  std::filesystem::remove(p);
}

TEST_CASE("data: unigram entropy in nats") {
  const std::string p = tmp_path("ent.bin");
  write_token_file(p, ramp(4000, 4));  // uniform over 4 ids
  CHECK(TokenFile(p, 256, 2).unigram_entropy() == Approx(std::log(4.0)).epsilon(1e-12));
  write_token_file(p, std::vector<uint16_t>(100, 9));  // one id
  CHECK(TokenFile(p, 256, 2).unigram_entropy() == 0.0);
  write_token_file(p, {0, 0, 0, 1});  // p = 3/4, 1/4
  CHECK(TokenFile(p, 256, 2).unigram_entropy() ==
        Approx(-(0.75 * std::log(0.75) + 0.25 * std::log(0.25))));
  std::filesystem::remove(p);
}
