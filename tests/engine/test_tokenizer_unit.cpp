// The byte tokenizer and load_tokenizer's refusals (engine/tokenizer.h), label unit; the
// reference comparisons are test_tokenizer.cpp.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/tokenizer.h"
#include "engine_test_util.h"

namespace fs = std::filesystem;
using sw::enginetest::error_of_load;
using sw::enginetest::make_test_dir;

TEST_CASE("tokenizer: bytes, and files it cannot read", "[tokenizer]") {
  for (const std::string name : {"", "bytes"}) {
    const auto tok = sw::load_tokenizer(name);
    CHECK(std::string(tok->kind()) == "bytes");
    CHECK(tok->vocab_size() == 256);
    CHECK(tok->eot_id() == -1);
    CHECK(tok->bos_id() == -1);
    CHECK(tok->files().empty());
    const std::string text = std::string("h\xc3\xa9\0\xff\n", 6);
    const auto ids = tok->encode(text);
    CHECK(ids == std::vector<int32_t>{'h', 0xc3, 0xa9, 0, 0xff, '\n'});
    CHECK(tok->decode(ids) == text);
    size_t next = 0;
    CHECK(tok->chunk_cut(text, 4, &next) == 4);
    CHECK(next == 4);
    CHECK(tok->chunk_cut(text, 40, &next) == 6);
    CHECK(next == 6);
    CHECK_THROWS_WITH(tok->decode(std::vector<int32_t>{65, 256}),
                      "tokenizer: bytes: id 256 is outside the vocabulary (256)");
  }
  const fs::path dir = make_test_dir("sw_tok_unit");
  CHECK(error_of_load((dir / "none.json").string()) ==
        "tokenizer: " + (dir / "none.json").string() + ": no such file");
  std::ofstream(dir / "broken.json") << "{\"model\": ";
  CHECK(error_of_load((dir / "broken.json").string())
            .rfind("tokenizer: " + (dir / "broken.json").string() + ": not valid JSON: ", 0) == 0);
  std::ofstream(dir / "x.model") << "not a model";
  CHECK(error_of_load((dir / "x.model").string())
            .rfind("tokenizer: " + (dir / "x.model").string() + ": not a SentencePiece model", 0) ==
        0);
  CHECK(error_of_load(dir.string()) ==
        "tokenizer: " + dir.string() +
            ": the directory holds neither tokenizer.json nor tokenizer.model");
}
