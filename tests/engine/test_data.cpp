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
  CHECK(tf.width() == 2);
  CHECK(tf.token(2) == 65535);
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
  write_raw(p, header(20240520, 3, 4), {1, 2, 3, 4});
  CHECK_THROWS_WITH(TokenFile(p, 256, 2), Contains(p + ": unsupported version 3 (expected 1 or 2)"));
  write_raw(p, header(20240520, 2, 4), {1, 2, 3, 4});  // 8 bytes: 2 int32 ids, not 4
  CHECK_THROWS_WITH(TokenFile(p, 256, 2),
                    Contains(p + ": header says 4 tokens but the file holds 2"));
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
