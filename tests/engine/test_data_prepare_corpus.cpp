// `shardwise data prepare --tokenizer` on a real corpus (~5 MB of Debian's fortunes and license
// texts: CRLF, tabs, NULs, form feeds, U+FFFD where the files are not UTF-8), two threads,
// against the reference packages' ids of the whole text (tok_corpus_ref.py) for the five
// tokenizers tok_ref.py trains. Labels reference and slow (the references take ~20 s).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../common/cli_run.h"
#include "engine_test_util.h"

namespace fs = std::filesystem;

namespace {

std::vector<int32_t> read_raw_ids(const fs::path& p) {
  const std::string b = clitest::slurp(p);
  std::vector<int32_t> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

std::vector<int32_t> read_token_file(const fs::path& p) {
  const std::string b = clitest::slurp(p);
  REQUIRE(b.size() >= 1024);
  int32_t h[3];
  std::memcpy(h, b.data(), sizeof h);
  std::vector<int32_t> ids(static_cast<size_t>(h[2]));
  for (size_t i = 0; i < ids.size(); i++) {
    uint16_t v = 0;
    if (h[1] == 1)
      std::memcpy(&v, b.data() + 1024 + 2 * i, 2), ids[i] = v;
    else
      std::memcpy(&ids[i], b.data() + 1024 + 4 * i, 4);
  }
  return ids;
}

}  // namespace

TEST_CASE("data prepare: a real corpus streamed in pieces equals the reference, five tokenizers",
          "[data_prepare][reference][slow]") {
  const fs::path dir = sw::enginetest::make_test_dir("sw_prep_corpus");
  for (const char* script : {"tok_ref.py", "tok_corpus_ref.py"}) {
    std::string cmd = SW_REF_PYTHON;
    cmd += " ";
    cmd += SW_SOURCE_DIR;
    cmd += "/tests/engine/";
    cmd += script;
    cmd += " ";
    cmd += dir.string();
    REQUIRE(std::system(cmd.c_str()) == 0);
  }
  REQUIRE(fs::file_size(dir / "corpus.txt") > 1000000);
  for (const std::string name : {"gpt2", "llama3", "qwen2", "sp_bpe", "sp_unigram"}) {
    INFO("tokenizer " << name);
    const std::string file = name + (name.rfind("sp_", 0) == 0 ? ".model" : ".json");
    const auto res = clitest::sw_run(dir, {"data", "prepare", "corpus.txt", "--tokenizer", file,
                                           "--out", name + ".bin", "--threads", "2"}, 1);
    INFO(res.err);
    REQUIRE(res.rc == 0);
    CHECK(read_token_file(dir / (name + ".bin")) == read_raw_ids(dir / (name + ".ids")));
  }
}
