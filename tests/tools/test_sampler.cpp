// engine/sampler: properties of sample_text on a small random-init GPT-2, checked against
// logits the test computes itself with ShardedModel::logits_last.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"

using namespace sw;

namespace {

ModelConfig tiny_cfg() {
  ModelConfig c;
  c.type = "gpt2";
  c.vocab_size = 256;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 32;
  c.seq_len = 8;
  return c;
}

std::vector<float> last_logits(ShardedModel& sm, const std::string& text) {
  std::vector<int32_t> toks;
  for (unsigned char c : text) toks.push_back(c);
  const int T = std::min<int>(static_cast<int>(toks.size()), sm.model().config.seq_len);
  Batch b;
  b.tokens = toks.data() + toks.size() - static_cast<size_t>(T);
  b.B = 1;
  b.T = T;
  std::vector<float> lg(256);
  sm.logits_last(b, lg.data());
  return lg;
}

}  // namespace

TEST_CASE("sampler: greedy follows the argmax of the model's logits, window slides") {
  Model m = build_model(tiny_cfg());
  ShardedModel sm(m, ops_for(Device::cpu()), 5);
  SampleOptions o;
  o.prompt = "hello";
  o.tokens = 20;  // runs past seq_len = 8: the window must slide
  o.temperature = 0.f;
  const std::string g = sample_text(sm, o);
  REQUIRE(g.size() == 20);

  // Independent greedy loop: argmax over logits of the last seq_len bytes of the text so far.
  std::string text = o.prompt;
  for (int i = 0; i < 20; i++) {
    const auto lg = last_logits(sm, text);
    text.push_back(static_cast<char>(std::max_element(lg.begin(), lg.end()) - lg.begin()));
  }
  CHECK(g == text.substr(o.prompt.size()));

  // Greedy ignores the seed; top_k = 1 at any temperature is greedy too.
  o.seed = 1234;
  CHECK(sample_text(sm, o) == g);
  o.temperature = 1.5f;
  o.top_k = 1;
  CHECK(sample_text(sm, o) == g);

  // Only the last seq_len tokens matter: a longer prompt with the same last 8 bytes continues
  // the same way.
  SampleOptions a, b;
  a.temperature = b.temperature = 0.f;
  a.tokens = b.tokens = 12;
  a.prompt = "some long preamble, then: abcdefgh";
  b.prompt = "abcdefgh";
  CHECK(sample_text(sm, a) == sample_text(sm, b));

  // Empty prompt = a newline.
  SampleOptions e, n;
  e.temperature = n.temperature = 0.f;
  e.tokens = n.tokens = 6;
  n.prompt = "\n";
  CHECK(sample_text(sm, e) == sample_text(sm, n));
  CHECK(sample_text(sm, SampleOptions{"", 0, 1.f, 0, 0}).empty());
}

TEST_CASE("sampler: temperature and top-k sample the filtered softmax, reproducibly") {
  Model m = build_model(tiny_cfg());
  ShardedModel sm(m, ops_for(Device::cpu()), 9);
  const std::string prompt = "abc";
  const auto lg = last_logits(sm, prompt);

  // The 5 largest logits; a temperature that spreads their probabilities (random-init logits
  // are close together, so a small one).
  std::vector<int> idx(256);
  for (int i = 0; i < 256; i++) idx[static_cast<size_t>(i)] = i;
  std::sort(idx.begin(), idx.end(), [&](int x, int y) { return lg[x] > lg[y]; });
  const int K = 5;
  const float spread = lg[idx[0]] - lg[idx[K - 1]];
  REQUIRE(spread > 0.f);
  const float temp = spread / 1.5f;
  std::map<int, double> p;
  double z = 0;
  for (int i = 0; i < K; i++) z += std::exp((lg[idx[i]] - lg[idx[0]]) / temp);
  for (int i = 0; i < K; i++) p[idx[i]] = std::exp((lg[idx[i]] - lg[idx[0]]) / temp) / z;

  const int S = 3000;
  std::map<int, int> count;
  SampleOptions o;
  o.prompt = prompt;
  o.tokens = 1;
  o.temperature = temp;
  o.top_k = K;
  for (int s = 0; s < S; s++) {
    o.seed = static_cast<uint64_t>(s);
    const std::string t = sample_text(sm, o);
    REQUIRE(t.size() == 1);
    count[static_cast<unsigned char>(t[0])]++;
  }
  for (const auto& [tok, c] : count) {
    INFO("token " << tok);
    CHECK(p.count(tok) == 1);  // never outside the top k
  }
  for (const auto& [tok, pt] : p) {
    const double f = static_cast<double>(count[tok]) / S;
    const double sigma = std::sqrt(pt * (1 - pt) / S);
    INFO("token " << tok << " p " << pt << " freq " << f);
    CHECK(std::abs(f - pt) < 4.5 * sigma + 1e-9);
  }

  // Same seed, same text; the text is a function of the seed.
  o.tokens = 30;
  o.top_k = 0;
  o.temperature = 1.f;
  o.seed = 77;
  const std::string s1 = sample_text(sm, o);
  CHECK(sample_text(sm, o) == s1);
  o.seed = 78;
  CHECK(sample_text(sm, o) != s1);  // 30 near-uniform bytes: equal with prob ~256^-30
}

TEST_CASE("sampler: bad options throw sw::Error") {
  Model m = build_model(tiny_cfg());
  ShardedModel sm(m, ops_for(Device::cpu()), 1);
  SampleOptions o;
  o.tokens = -1;
  CHECK_THROWS_AS(sample_text(sm, o), Error);
  o.tokens = 3;
  o.temperature = -0.5f;
  CHECK_THROWS_AS(sample_text(sm, o), Error);
  o.temperature = NAN;
  CHECK_THROWS_AS(sample_text(sm, o), Error);
  o.temperature = 1.f;
  o.top_k = -2;
  CHECK_THROWS_AS(sample_text(sm, o), Error);
}
