// Tokenizers (engine/tokenizer.h) against the reference packages: tok_ref.py trains small
// tokenizers with PyPI's `tokenizers` (GPT-2, GPT-2 with a prefix space, Llama 3, Llama 3 with
// half its merges dropped (ignore_merges), Qwen2 with NFC) and `sentencepiece` (Llama-2 style
// BPE, unigram) in a temporary directory and encodes texts with Unicode, whitespace runs,
// digits, contractions and special tokens written in the text; the ids here must equal theirs
// exactly, decode must give what theirs gives, and a ~200 KB document encoded in chunks
// (Tokenizer::chunk_cut) must give the whole document's ids. Label reference (the venv of
// scripts/setup.sh); a tokenizer.json it cannot read exactly is one line naming the file and
// key. The byte tokenizer: test_tokenizer_unit.cpp (label unit).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/tokenizer.h"
#include "engine_test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using sw::enginetest::error_of_load;
using sw::enginetest::make_test_dir;

namespace {

// The reference directory, made once per process.
const json& reference() {
  static json ref = [] {
    const fs::path dir = make_test_dir("sw_tok_ref");
    std::string cmd = SW_REF_PYTHON;
    cmd += " ";
    cmd += SW_SOURCE_DIR;
    cmd += "/tests/engine/tok_ref.py ";
    cmd += dir.string();
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::ifstream f(dir / "ref.json");
    return json::parse(f);
  }();
  return ref;
}

}  // namespace

TEST_CASE("tokenizer: ids equal tokenizers' and sentencepiece's on Unicode and special tokens",
          "[tokenizer][reference]") {
  const json& ref = reference();
  const auto texts = ref["texts"].get<std::vector<std::string>>();
  REQUIRE(ref["tokenizers"].size() == 7);
  for (const json& t : ref["tokenizers"]) {
    const std::string name = t["name"];
    INFO("tokenizer " << name);
    const auto tok = sw::load_tokenizer(t["file"].get<std::string>());
    CHECK(tok->vocab_size() == t["vocab"].get<int64_t>());
    CHECK(tok->bos_id() == t["bos"].get<int32_t>());
    CHECK(tok->eot_id() == t["eot"].get<int32_t>());
    CHECK(std::string(tok->kind()) == (name.rfind("sp_", 0) == 0 ? "sentencepiece" : "bpe"));
    int round_trips = 0;
    for (size_t i = 0; i < texts.size(); i++) {
      INFO("text " << i << ": " << texts[i]);
      const auto want = t["ids"][i].get<std::vector<int32_t>>();
      const std::vector<int32_t> ids = tok->encode(texts[i]);
      CHECK(ids == want);
      const std::string decoded = tok->decode(want);
      CHECK(decoded == t["decoded"][i].get<std::string>());
      if (t["decoded"][i] == texts[i]) {
        CHECK(tok->decode(ids) == texts[i]);
        round_trips++;
      }
    }
    // The byte-level BPEs give nearly every text back (not: the prefix space, an lstrip token
    // taking the space before it, NFC composing); SentencePiece's unigram (NFKC) fewer.
    if (name.rfind("sp_", 0) != 0 && name != "gpt2_prefix")
      CHECK(round_trips >= static_cast<int>(texts.size()) - 2);
    const std::string doc = sw::enginetest::read_bytes(ref["document"].get<std::string>());
    const auto want_doc = t["document_ids"].get<std::vector<int32_t>>();
    CHECK(tok->encode(doc) == want_doc);
    {
      // In chunks of about 4 KB, cut where chunk_cut says: the same ids.
      std::vector<int32_t> chunked;
      int chunks = 0;
      for (std::string_view rest = doc; !rest.empty(); chunks++) {
        size_t next = 0;
        const size_t cut = tok->chunk_cut(rest, 4096, &next);
        REQUIRE(next > 0);
        const auto part = tok->encode(rest.substr(0, cut));
        chunked.insert(chunked.end(), part.begin(), part.end());
        rest.remove_prefix(next);
      }
      // One chunk for a prefix space (GPT-2 with add_prefix_space) and a unigram model.
      if (name == "gpt2_prefix" || name == "sp_unigram")
        CHECK(chunks == 1);
      else
        CHECK(chunks > 20);
      CHECK(chunked == want_doc);
    }
  }
}

TEST_CASE("tokenizer: a tokenizer.json it cannot read exactly is one line naming file and key",
          "[tokenizer][reference]") {
  const json& ref = reference();
  const fs::path dir = make_test_dir("sw_tok_bad");
  json llama;
  {
    std::ifstream f(ref["tokenizers"][2]["file"].get<std::string>());
    llama = json::parse(f);
  }
  REQUIRE(llama["pre_tokenizer"]["type"] == "Sequence");
  auto with = [&](const std::string& name, auto edit) {
    json j = llama;
    edit(j);
    const fs::path p = dir / name;
    std::ofstream(p) << j.dump();
    return p.string();
  };
  const std::string p1 = with("unknown_pre.json", [](json& j) {
    j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Digits"}, {"individual_digits", true}};
  });
  CHECK(error_of_load(p1) == "tokenizer: " + p1 +
                                 ": pre_tokenizer.pretokenizers[0].type: 'Digits' is not "
                                 "supported (ByteLevel, Split, or a Sequence of them are)");
  const std::string p2 =
      with("unknown_norm.json", [](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; });
  CHECK(error_of_load(p2) == "tokenizer: " + p2 +
                                 ": normalizer.type: 'Lowercase' is not supported (null, NFC or "
                                 "a Sequence of NFC are)");
  const std::string p3 =
      with("wordpiece.json", [](json& j) { j["model"]["type"] = "WordPiece"; });
  CHECK(error_of_load(p3) ==
        "tokenizer: " + p3 + ": model.type: 'WordPiece' is not supported (BPE is)");
  const std::string p4 =
      with("decoder.json", [](json& j) { j["decoder"] = {{"type", "Metaspace"}}; });
  CHECK(error_of_load(p4) ==
        "tokenizer: " + p4 + ": decoder.type: 'Metaspace' is not supported (ByteLevel is)");
  const std::string p5 = with("merge.json", [](json& j) { j["model"]["merges"][3] = "abc"; });
  CHECK(error_of_load(p5).find(p5 + ": model.merges[3]: ") != std::string::npos);
  const std::string p6 = with("fallback.json", [](json& j) { j["model"]["byte_fallback"] = true; });
  CHECK(error_of_load(p6) == "tokenizer: " + p6 + ": model.byte_fallback: must be false");
  const std::string p7 = with("sparse.json", [](json& j) { j["model"]["vocab"]["zz"] = 2000000000; });
  CHECK(error_of_load(p7) == "tokenizer: " + p7 +
                                 ": model.vocab: id 2000000000 is far past the 1001 entries (ids "
                                 "must be dense)");
  const std::string p8 = with("sparse_added.json", [](json& j) {
    j["added_tokens"][0]["id"] = 1 << 30;
  });
  CHECK(error_of_load(p8).find(p8 + ": added_tokens[0].id: 1073741824 is far past") !=
        std::string::npos);
  // One line each.
  for (const auto& p : {p1, p2, p3, p4, p5, p6, p7, p8})
    CHECK(error_of_load(p).find('\n') == std::string::npos);
}
