// engine/sampler with a tokenizer: the prompt goes in as the tokenizer's ids, the continuation
// comes out as its decode of the generated ids, and generation stops at its end-of-text id.
// The reference is a greedy loop over ShardedModel::logits_last written here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"

using namespace sw;

namespace {

constexpr int kVocab = 300;

// a + id + b, appended piece by piece (GCC 12's -Wrestrict misfires on "a" + temporary).
std::string wrap(const char* a, int32_t id, const char* b) {
  std::string s = a;
  s += std::to_string(id);
  s += b;
  return s;
}

// A tokenizer over ids [0, vocab): a character c encodes as id 3 * c mod 256 + 7 (not the
// byte itself, so the test sees which path encoded it); an id decodes as "[id]".
class FakeTokenizer : public Tokenizer {
 public:
  int32_t eot = -1, bos = -1;
  int64_t vocab = kVocab;
  using Tokenizer::decode;
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back((3 * c) % 256 + 7);
    return ids;
  }
  std::string decode(const int32_t* ids, size_t n) const override {
    std::string s;
    for (size_t i = 0; i < n; i++) s += wrap("[", ids[i], "]");
    return s;
  }
  int64_t vocab_size() const override { return vocab; }
  int32_t eot_id() const override { return eot; }
  int32_t bos_id() const override { return bos; }
  const char* kind() const override { return "fake"; }
  std::vector<std::string> files() const override { return {}; }
};

ModelConfig tiny_cfg() {
  ModelConfig c;
  c.type = "gpt2";
  c.vocab_size = kVocab;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 32;
  c.seq_len = 8;
  return c;
}

// Greedy ids after `prompt` (ids), n of them, the window sliding at seq_len.
std::vector<int32_t> greedy(ShardedModel& sm, std::vector<int32_t> toks, int n) {
  std::vector<int32_t> out;
  std::vector<float> lg(kVocab);
  for (int i = 0; i < n; i++) {
    const int T = std::min<int>(static_cast<int>(toks.size()), sm.model().config.seq_len);
    Batch b;
    b.tokens = toks.data() + toks.size() - static_cast<size_t>(T);
    b.B = 1;
    b.T = T;
    sm.logits_last(b, lg.data());
    const int32_t next = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    toks.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace

TEST_CASE("sampler: a tokenizer encodes the prompt, decodes the ids, and its eot stops",
          "[sampler]") {
  Model m = build_model(tiny_cfg());
  ShardedModel sm(m, ops_for(Device::cpu()), 11);
  FakeTokenizer tok;
  SampleOptions o;
  o.prompt = "hi there";
  o.tokens = 20;
  o.temperature = 0.f;
  o.tokenizer = &tok;
  const std::vector<int32_t> want = greedy(sm, tok.encode(o.prompt), 20);
  CHECK(sample_text(sm, o) == tok.decode(want));

  // The end-of-text id: generation stops before it (the first time it comes).
  const size_t k = 5;
  tok.eot = want[k];
  const size_t first = static_cast<size_t>(std::find(want.begin(), want.end(), tok.eot) - want.begin());
  CHECK(sample_text(sm, o) == tok.decode(want.data(), first));

  // An empty prompt starts from bos (else eot, else 0).
  o.prompt = "";
  tok.eot = -1;
  tok.bos = 42;
  CHECK(sample_text(sm, o) == tok.decode(greedy(sm, {42}, 20)));
  tok.bos = -1;
  tok.eot = 17;
  const auto from_eot = greedy(sm, {17}, 20);
  const size_t stop = static_cast<size_t>(std::find(from_eot.begin(), from_eot.end(), 17) - from_eot.begin());
  CHECK(sample_text(sm, o) == tok.decode(from_eot.data(), stop));

  // Ids past the tokenizer's vocabulary (a padded embedding) come out as <|id|>.
  tok.eot = -1;
  tok.vocab = 1;  // every generated id but 0 is past it
  o.prompt = "";
  std::string expect;
  for (int32_t id : greedy(sm, {0}, 20))
    expect += id == 0 ? tok.decode(&id, 1) : wrap("<|", id, "|>");
  CHECK(sample_text(sm, o) == expect);

  // A prompt id outside the model's vocabulary: one line.
  tok.vocab = kVocab;
  struct Big : FakeTokenizer {
    std::vector<int32_t> encode(std::string_view) const final { return {5, 400}; }
  } wide;
  o.tokenizer = &wide;
  o.prompt.assign(1, 'x');  // (not = "x": GCC 12's -Wrestrict false positive, PR 105329)
  CHECK_THROWS_WITH(sample_text(sm, o),
                    "sample: the prompt's token 400 is outside the model's vocabulary "
                    "(vocab_size 300)");
}
