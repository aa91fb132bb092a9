// Token files of either width, the streaming writers, loss-mask files, and corpora: the
// window order (a seeded bijection per epoch), rank disjointness, resume across an epoch and a
// file boundary, masks in batches, validation windows across files.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "engine/data.h"

using namespace sw;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
fs::path tmp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sw_test_corpus_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
std::vector<char> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), {});
}
// Token i of file f is unique across a corpus: f * 100000 + i (so a window names its origin).
std::vector<int32_t> tagged(int file, int n) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = file * 100000 + i;
  return v;
}
}  // namespace

TEST_CASE("data: TokenWriter picks 16- or 32-bit ids by vocabulary and streams in chunks") {
  const fs::path d = tmp_dir("writer");
  const std::string p16 = (d / "a.bin").string(), p32 = (d / "b.bin").string();
  {
    TokenWriter w(p16, 65536);
    CHECK(w.width() == 2);
    w.append({1, 2, 3});
    w.append({65535});
    CHECK(fs::exists(p16 + ".tmp"));
    CHECK(!fs::exists(p16));
    w.finish();
  }
  CHECK(!fs::exists(p16 + ".tmp"));
  std::vector<char> b = slurp(p16);
  REQUIRE(b.size() == 1024 + 8);
  int32_t h[256];
  std::memcpy(h, b.data(), 1024);
  CHECK((h[0] == 20240520 && h[1] == 1 && h[2] == 4));
  {
    TokenWriter w(p32, 151936);  // Qwen2's vocabulary
    CHECK(w.width() == 4);
    w.append({0, 151935});
    w.append({70000, 5});
    w.finish();
  }
  b = slurp(p32);
  REQUIRE(b.size() == 1024 + 16);
  std::memcpy(h, b.data(), 1024);
  CHECK((h[0] == 20240520 && h[1] == 2 && h[2] == 4));
  CHECK(std::all_of(h + 3, h + 256, [](int32_t x) { return x == 0; }));
  int32_t ids[4];
  std::memcpy(ids, b.data() + 1024, 16);
  CHECK((ids[0] == 0 && ids[1] == 151935 && ids[2] == 70000 && ids[3] == 5));
  const TokenFile tf(p32, 151936, 2);
  CHECK(tf.width() == 4);
  CHECK(tf.size() == 4);
  CHECK(tf.token(1) == 151935);
  std::vector<int32_t> out(3);
  tf.copy(1, 3, out.data());
  CHECK(out == std::vector<int32_t>{151935, 70000, 5});
  // A vocabulary check on read names the file, position and id.
  CHECK_THROWS_WITH(TokenFile(p32, 100000, 2),
                    Contains("data: " + p32 + ": token 151935 at position 1 is >= model.vocab_size 100000"));
  // ... and on write.
  {
    TokenWriter w((d / "c.bin").string(), 1000);
    CHECK_THROWS_WITH(w.append({5, 1000}),
                      Contains((d / "c.bin").string() + ": token 1000 at position 1 is >= the vocabulary size 1000"));
    CHECK_THROWS_WITH(w.append({-3}), Contains("token -3 at position 0 is negative"));
  }
  CHECK(!fs::exists(d / "c.bin.tmp"));  // an unfinished writer leaves nothing
  CHECK(!fs::exists(d / "c.bin"));
  CHECK_THROWS_WITH(TokenWriter((d / "x.bin").string(), int64_t{1} << 31),
                    Contains("vocabulary size 2147483648 is outside [1, 2147483647]"));
  // The uint16 form of existing callers is version 1.
  write_token_file(p16, std::vector<uint16_t>{9, 8, 7});
  CHECK(TokenFile(p16, 256, 2).width() == 2);
  fs::remove_all(d);
}

TEST_CASE("data: loss-mask files beside token files") {
  const fs::path d = tmp_dir("mask");
  const std::string p = (d / "x.bin").string();
  CHECK(mask_path_for(p) == (d / "x.mask").string());
  CHECK(mask_path_for("a/b.tok") == "a/b.tok.mask");
  write_token_file(p, tagged(0, 10), 256000);
  CHECK(TokenFile(p, 256000, 2).mask() == nullptr);
  const std::vector<uint8_t> m = {0, 0, 0, 1, 1, 1, 0, 0, 1, 1};
  {
    MaskWriter w(mask_path_for(p));
    w.append(m.data(), 4);
    w.append(m.data() + 4, 6);
    w.finish();
  }
  std::vector<char> b = slurp(mask_path_for(p));
  REQUIRE(b.size() == 1024 + 10);
  int32_t h[256];
  std::memcpy(h, b.data(), 1024);
  CHECK((h[0] == kMaskMagic && h[1] == 1 && h[2] == 10));
  const TokenFile tf(p, 256000, 2);
  REQUIRE(tf.mask() != nullptr);
  CHECK(std::equal(m.begin(), m.end(), tf.mask()));
  // A mask whose count differs from the tokens', or a byte that is not 0/1: one line.
  write_mask_file(mask_path_for(p), std::vector<uint8_t>(9, 1));
  CHECK_THROWS_WITH(TokenFile(p, 256000, 2),
                    Contains(mask_path_for(p) + ": masks 9 tokens but " + p + " holds 10"));
  {
    MaskWriter w(mask_path_for(p));
    const uint8_t two = 2;
    CHECK_THROWS_WITH(w.append(&two, 1), Contains("mask byte 2 at position 0 is not 0 or 1"));
  }
  // A mask file given as the token file is named as such.
  write_mask_file(mask_path_for(p), m);
  CHECK_THROWS_WITH(TokenFile(mask_path_for(p), 256, 2),
                    Contains("bad magic 20261129, expected 20240520 (a loss-mask file"));
  fs::remove_all(d);
}

TEST_CASE("data: permute_index is a bijection of 0..n-1 for every n and key") {
  for (int64_t n : {1, 2, 3, 5, 16, 17, 100, 1000, 4097}) {
    for (uint64_t key : {0ull, 1ull, 0xdeadbeefull}) {
      std::vector<char> seen(static_cast<size_t>(n), 0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = permute_index(i, n, key);
        REQUIRE((j >= 0 && j < n));
        REQUIRE(!seen[j]);
        seen[j] = 1;
      }
    }
  }
  // It shuffles: not the identity, and keys differ.
  int fixed = 0, same = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    fixed += permute_index(i, 1000, 7) == i;
    same += permute_index(i, 1000, 7) == permute_index(i, 1000, 8);
  }
  CHECK(fixed < 20);
  CHECK(same < 20);
}

TEST_CASE("data: corpora from a file, a directory or a glob") {
  const fs::path d = tmp_dir("spec");
  write_token_file((d / "b.bin").string(), tagged(1, 50), 300000);
  write_token_file((d / "a.bin").string(), tagged(0, 41), 300000);
  { std::ofstream(d / "notes.txt") << "not data"; }
  const std::vector<std::string> want = {(d / "a.bin").string(), (d / "b.bin").string()};
  CHECK(resolve_token_files(d.string()) == want);
  CHECK(resolve_token_files((d / "*.bin").string()) == want);
  CHECK(resolve_token_files((d / "b.bin").string()) == std::vector<std::string>{want[1]});
  CHECK_THROWS_WITH(resolve_token_files((d / "*.tok").string()), Contains("no token files match"));
  const fs::path e = tmp_dir("empty");
  CHECK_THROWS_WITH(resolve_token_files(e.string()), Contains("a directory with no *.bin"));
  const Corpus c(d.string(), 300000, 8);
  CHECK(c.files() == 2);
  CHECK(c.tokens() == 91);
  CHECK(c.windows() == 40 / 8 + 49 / 8);  // 5 + 6
  // Window 5 is the first of file b; windows never cross a file.
  CHECK((c.window(4).file == 0 && c.window(4).start == 32));
  CHECK((c.window(5).file == 1 && c.window(5).start == 0));
  CHECK((c.window(10).file == 1 && c.window(10).start == 40));
  // A short last shard holds no window (and no eval start); a corpus with no window is refused.
  write_token_file((d / "c.bin").string(), tagged(2, 5), 300000);
  const Corpus c3(d.string(), 300000, 8);
  CHECK(c3.files() == 3);
  CHECK(c3.windows() == 11);
  CHECK(c3.window(10).file == 1);
  std::vector<int32_t> in(24), tg(24);
  eval_batch(c3, 0, 1, 3, 8, in.data(), tg.data());  // starts 0, 37, 74 of 33 + 42 + 0
  CHECK(in[0] == 0);
  CHECK(in[8] == 100004);
  CHECK(in[16] == 100041);
  CHECK(tg[23] == 100049);  // the last window ends at file b's last token
  const fs::path f = tmp_dir("tiny");
  write_token_file((f / "x.bin").string(), tagged(0, 5), 300000);
  write_token_file((f / "y.bin").string(), tagged(1, 8), 300000);
  CHECK_THROWS_WITH(Corpus(f.string(), 300000, 8),
                    Contains(f.string() + ": no file holds seq_len + 1 = 9 tokens"));
  CHECK_THROWS_WITH(Corpus((f / "x.bin").string(), 300000, 8),
                    Contains("5 tokens, need at least 9 for one (seq_len + 1) window"));
  fs::remove_all(d);
  fs::remove_all(e);
  fs::remove_all(f);
}

TEST_CASE("data: each epoch visits every window once, ranks are disjoint and resume is exact") {
  const fs::path d = tmp_dir("order");
  // Two files, 32-bit ids: windows 0..9 in file 0 (81 tokens), 10..22 in file 1 (105).
  write_token_file((d / "s0.bin").string(), tagged(0, 81), 300000);
  write_token_file((d / "s1.bin").string(), tagged(1, 105), 300000);
  const int T = 8, B = 2, W = 2, accum = 3;  // a global batch of 12 rows
  const int64_t GB = int64_t{B} * W * accum;
  const Corpus c(d.string(), 300000, T);
  REQUIRE(c.windows() == 10 + 13);
  // The rows of steps 0.. in order: (step, k, rank) each drawing B rows.
  auto rows_of = [&](const Corpus& cc, int64_t s, int k, int r) {
    std::vector<int32_t> in(B * T), tg(B * T);
    train_batch(cc, 99, s, GB, (int64_t{k} * W + r) * B, B, T, in.data(), tg.data());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) REQUIRE(tg[b * T + t] == in[b * T + t] + 1);  // shifted by one
    return in;
  };
  std::map<int64_t, std::vector<int64_t>> per_epoch;  // epoch -> window first tokens drawn
  std::vector<std::vector<int32_t>> run;
  const int steps = 6;  // 72 rows: epochs 0, 1, 2 and part of 3
  for (int64_t s = 0; s < steps; ++s)
    for (int k = 0; k < accum; ++k)
      for (int r = 0; r < W; ++r) {
        const std::vector<int32_t> in = rows_of(c, s, k, r);
        run.push_back(in);
        for (int b = 0; b < B; ++b) {
          const int64_t g = s * GB + (int64_t{k} * W + r) * B + b;
          per_epoch[c.epoch_of(g)].push_back(in[b * T]);
        }
      }
  // Every full epoch draws each of the 23 windows exactly once (so ranks and micro-steps are
  // disjoint within an epoch), and consecutive epochs use different orders.
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> firsts = per_epoch[e];
    REQUIRE(firsts.size() == 23);
    std::vector<int64_t> want;
    for (int w = 0; w < 23; ++w) {
      const Corpus::Window win = c.window(w);
      want.push_back(int64_t{win.file} * 100000 + win.start);
    }
    std::vector<int64_t> sorted = firsts;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == want);
  }
  CHECK(per_epoch[0] != per_epoch[1]);
  // The steps cross file boundaries (rows from both files) and epoch boundaries (step 1 holds
  // rows 12..23: epoch 0 ends at row 22).
  CHECK(c.epoch_of(1 * GB) == 0);
  CHECK(c.epoch_of(2 * GB - 1) == 1);
  // Resume: a fresh corpus (as after a restart) at step 4 draws exactly what the run drew.
  const Corpus again(d.string(), 300000, T);
  for (int64_t s = 4; s < steps; ++s)
    for (int k = 0; k < accum; ++k)
      for (int r = 0; r < W; ++r)
        CHECK(rows_of(again, s, k, r) == run[static_cast<size_t>((s * accum + k) * W + r)]);
  // One rank with micro-batch W*B and no accumulation draws the same rows in the same order.
  std::vector<int32_t> big(GB * T), bigt(GB * T);
  train_batch(c, 99, 3, GB, 0, static_cast<int>(GB), T, big.data(), bigt.data());
  for (int k = 0; k < accum; ++k)
    for (int r = 0; r < W; ++r) {
      const std::vector<int32_t>& part = run[static_cast<size_t>((3 * accum + k) * W + r)];
      CHECK(std::equal(part.begin(), part.end(), big.begin() + ((k * W + r) * B) * T));
    }
  // Another seed, another order.
  std::vector<int32_t> o(B * T), ot(B * T);
  train_batch(c, 100, 0, GB, 0, B, T, o.data(), ot.data());
  CHECK(o != run[0]);
  fs::remove_all(d);
}

TEST_CASE("data: masked targets are -1 in batches and the counted targets are returned") {
  const fs::path d = tmp_dir("maskbatch");
  const std::string p = (d / "m.bin").string();
  write_token_file(p, tagged(0, 33), 300000);
  std::vector<uint8_t> m(33);
  for (int i = 0; i < 33; ++i) m[i] = (i % 3) != 0;
  write_mask_file(mask_path_for(p), m);
  const int T = 8;
  const Corpus c(p, 300000, T);
  CHECK(c.has_mask());
  std::vector<int32_t> in(4 * T), tg(4 * T);
  const int64_t kept = train_batch(c, 1, 0, 4, 0, 4, T, in.data(), tg.data());
  int64_t want = 0;
  for (int i = 0; i < 4 * T; ++i) {
    const int32_t target = in[i] + 1;  // token index in the file
    if (m[target]) {
      CHECK(tg[i] == target);
      ++want;
    } else {
      CHECK(tg[i] == -1);
    }
  }
  CHECK(kept == want);
  CHECK(kept == 32 - 10);  // targets 1..32, once each (one epoch); 3, 6, .., 30 masked
  fs::remove_all(d);
}

TEST_CASE("data: eval windows spread over every file's possible starts") {
  const fs::path d = tmp_dir("eval");
  write_token_file((d / "a.bin").string(), tagged(0, 20), 300000);
  write_token_file((d / "b.bin").string(), tagged(1, 30), 300000);
  const int B = 2, T = 8, NB = 3;
  const Corpus c(d.string(), 300000, T);
  // Starts: a: 0..11 (12), b: 0..21 (22) -> 34; 6 windows at 0, 6.6, 13.2, ... -> global 0,
  // 6, 13, 19, 26, 33.
  const int64_t want[6] = {0, 6, 100001, 100007, 100014, 100021};
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < NB; ++i) {
    CHECK(eval_batch(c, i, NB, B, T, in.data(), tg.data()) == B * T);
    for (int b = 0; b < B; ++b) CHECK(in[b * T] == want[i * B + b]);
  }
  CHECK(tg[B * T - 1] == 100029);  // the last window ends at the last token
  fs::remove_all(d);
}
