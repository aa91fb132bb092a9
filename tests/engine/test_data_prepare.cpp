// `shardwise data prepare --tokenizer` (tools/data_prepare.cpp), the real binary on the
// tokenizers tok_ref.py trains: a ~200 KB document streamed in pieces on 1 and 2 threads gives
// exactly the reference package's ids of the whole document, then the end-of-text id; JSONL
// gives one document per line and, with prompt / completion, the loss mask; a vocabulary past
// 65,536 writes 4-byte ids; --val takes every (1/F)-th piece; a tokenizer.json it cannot read is one line naming the file and key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/cli_run.h"
#include "engine/tokenizer.h"
#include "engine_test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path& ref_dir() {
  static const fs::path dir = [] {
    const fs::path d = sw::enginetest::make_test_dir("sw_prep_ref");
    std::string cmd = SW_REF_PYTHON;
    cmd += " ";
    cmd += SW_SOURCE_DIR;
    cmd += "/tests/engine/tok_ref.py ";
    cmd += d.string();
    REQUIRE(std::system(cmd.c_str()) == 0);
    return d;
  }();
  return dir;
}

// A token file's ids (version 1: uint16, version 2: int32) or a mask file's bytes.
std::vector<int32_t> read_ids(const fs::path& p) {
  const std::string b = clitest::slurp(p);
  REQUIRE(b.size() >= 1024);
  int32_t h[3];
  std::memcpy(h, b.data(), sizeof h);
  const size_t n = static_cast<size_t>(h[2]);
  const size_t w = h[0] == 20240520 ? (h[1] == 1 ? 2 : 4) : 1;  // mask files: 1 byte
  REQUIRE(b.size() == 1024 + n * w);
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; i++) {
    if (w == 2) {
      uint16_t v;
      std::memcpy(&v, b.data() + 1024 + 2 * i, 2);
      ids[i] = v;
    } else if (w == 4) {
      std::memcpy(&ids[i], b.data() + 1024 + 4 * i, 4);
    } else {
      ids[i] = static_cast<unsigned char>(b[1024 + i]);
    }
  }
  return ids;
}

}  // namespace

TEST_CASE("data prepare: a streamed document's ids equal the reference's, on any threads",
          "[data_prepare][reference]") {
  const fs::path& ref = ref_dir();
  std::ifstream f(ref / "ref.json");
  const json r = json::parse(f);
  const fs::path dir = sw::enginetest::make_test_dir("sw_prep_doc");
  for (const json& t : r["tokenizers"]) {
    const std::string name = t["name"];
    INFO("tokenizer " << name);
    std::vector<int32_t> want = t["document_ids"].get<std::vector<int32_t>>();
    want.push_back(t["eot"].get<int32_t>());
    for (const char* threads : {"1", "2"}) {
      const fs::path out = dir / (name + "_" + threads + ".bin");
      const auto res =
          clitest::sw_run(dir, {"data", "prepare", r["document"].get<std::string>(),
                                "--tokenizer", t["file"].get<std::string>(), "--out",
                                out.string(), "--threads", threads}, 1);
      INFO(res.err);
      REQUIRE(res.rc == 0);
      CHECK(res.out.find("tokens/s on " + std::string(threads) + " threads") != std::string::npos);
      CHECK(read_ids(out) == want);
    }
  }
}

TEST_CASE("data prepare: JSONL documents, prompt / completion masks, the validation split",
          "[data_prepare][reference]") {
  const fs::path& ref = ref_dir();
  const fs::path dir = sw::enginetest::make_test_dir("sw_prep_jsonl");
  const std::string tokfile = (ref / "llama3.json").string();
  const auto tok = sw::load_tokenizer(tokfile);
  const int32_t eot = tok->eot_id();
  clitest::spit(dir / "ft.jsonl",
                "{\"prompt\": \"Q: what is 2+2?\", \"completion\": \" A: 4\"}\n"
                "\n"
                "{\"text\": \"plain text, all counted\"}\n"
                "{\"prompt\": \"日本語?\", \"completion\": \" はい。\"}\n");
  auto res = clitest::sw_run(dir, {"data", "prepare", "ft.jsonl", "--jsonl", "--tokenizer",
                                   tokfile, "--out", "ft.bin"}, 1);
  INFO(res.err);
  REQUIRE(res.rc == 0);
  std::vector<int32_t> ids, mask;
  auto add = [&](const std::string& s, int m) {
    for (int32_t id : tok->encode(s)) {
      ids.push_back(id);
      mask.push_back(m);
    }
  };
  add("Q: what is 2+2?", 0);
  add(" A: 4", 1);
  ids.push_back(eot), mask.push_back(1);
  add("plain text, all counted", 1);
  ids.push_back(eot), mask.push_back(1);
  add("日本語?", 0);
  add(" はい。", 1);
  ids.push_back(eot), mask.push_back(1);
  CHECK(read_ids(dir / "ft.bin") == ids);
  CHECK(read_ids(dir / "ft.mask") == mask);

  // A vocabulary past 65,536 (an added token with id 70,000): 4-byte ids (token file v2).
  json big = json::parse(clitest::slurp(tokfile));
  big["added_tokens"].push_back({{"id", 70000}, {"content", "<|big|>"}, {"single_word", false},
                                 {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                 {"special", true}});
  clitest::spit(dir / "big.json", big.dump());
  clitest::spit(dir / "big.txt", "a <|big|> b\nsecond line<|big|>");
  res = clitest::sw_run(dir, {"data", "prepare", "big.txt", "--tokenizer", "big.json", "--out",
                              "big.bin"}, 1);
  INFO(res.err);
  REQUIRE(res.rc == 0);
  CHECK(res.out.find("(4-byte ids)") != std::string::npos);
  const auto big_tok = sw::load_tokenizer((dir / "big.json").string());
  CHECK(big_tok->vocab_size() == 70001);
  std::vector<int32_t> big_ids = big_tok->encode("a <|big|> b\nsecond line<|big|>");
  CHECK(std::count(big_ids.begin(), big_ids.end(), 70000) == 2);
  big_ids.push_back(eot);
  CHECK(read_ids(dir / "big.bin") == big_ids);

  // Text only: no mask file.
  clitest::spit(dir / "t.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
  res = clitest::sw_run(dir, {"data", "prepare", "t.jsonl", "--jsonl", "--tokenizer", tokfile,
                              "--out", "t.bin"}, 1);
  REQUIRE(res.rc == 0);
  CHECK(fs::exists(dir / "t.bin"));
  CHECK(!fs::exists(dir / "t.mask"));
  CHECK(!fs::exists(dir / "t.mask.tmp"));

  // --val on the document: pieces of clamp(N/256, 4 KiB, 1 MiB) bytes, every 10th to val;
  // train and val together hold every id of the document once.
  res = clitest::sw_run(dir, {"data", "prepare", (ref / "document.txt").string(), "--tokenizer",
                              tokfile, "--out", "tr.bin", "--val", "va.bin", "--val-fraction",
                              "0.1"}, 1);
  INFO(res.err);
  REQUIRE(res.rc == 0);
  const auto tr = read_ids(dir / "tr.bin"), va = read_ids(dir / "va.bin");
  CHECK(va.size() > tr.size() / 20);
  CHECK(va.size() < tr.size() / 5);
  std::vector<int32_t> all(tr), whole = tok->encode(clitest::slurp(ref / "document.txt"));
  all.insert(all.end(), va.begin(), va.end());
  whole.push_back(eot);
  std::sort(all.begin(), all.end());
  std::sort(whole.begin(), whole.end());
  CHECK(all == whole);
}

TEST_CASE("data prepare: bad tokenizer and JSONL inputs are one line, non-zero exit",
          "[data_prepare][reference]") {
  const fs::path& ref = ref_dir();
  const fs::path dir = sw::enginetest::make_test_dir("sw_prep_bad");
  json j = json::parse(clitest::slurp(ref / "gpt2.json"));
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  clitest::spit(dir / "bad.json", j.dump());
  clitest::spit(dir / "a.txt", "hello\n");
  auto res = clitest::sw_run(dir, {"data", "prepare", "a.txt", "--tokenizer", "bad.json",
                                   "--out", "a.bin"}, 1);
  CHECK(res.rc != 0);
  CHECK(res.err == "shardwise: error: tokenizer: bad.json: pre_tokenizer.type: 'Whitespace' is "
                   "not supported (ByteLevel, Split, or a Sequence of them are)\n");
  CHECK(!fs::exists(dir / "a.bin"));
  clitest::spit(dir / "b.jsonl", "{\"text\": \"ok\"}\n{\"prompt\": \"no completion\"}\n");
  res = clitest::sw_run(dir, {"data", "prepare", "b.jsonl", "--jsonl", "--tokenizer",
                              (ref / "gpt2.json").string(), "--out", "b.bin"}, 1);
  CHECK(res.rc != 0);
  CHECK(res.err == "shardwise: error: data: b.jsonl:2: neither a \"text\" string nor \"prompt\" "
                   "and \"completion\" strings\n");
  CHECK(!fs::exists(dir / "b.bin"));
  CHECK(!fs::exists(dir / "b.bin.tmp"));
}
