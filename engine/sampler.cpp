// Text generation: the prompt encoded, the continuation decoded, with the run's tokenizer or
// bytes (see sampler.h).
//
// Each new token costs one forward pass over the current window (the last seq_len tokens);
// there is no KV cache. That is quadratic in the window but the windows are short and this
// path is for looking at what a model learned, not for serving.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "engine/tokenizer.h"
#include "sharding/sharded_model.h"

namespace sw {

namespace {

// Token id -> text. Ids < 256 are the bytes themselves (emitted as they are, so the output
// may not be valid UTF-8); larger ids (a model with a bigger vocabulary trained on bytes
// should not produce them) are shown as "<|id|>".
void append_token(std::string& out, int32_t tok) {
  if (tok >= 0 && tok < 256) {
    out.push_back(static_cast<char>(static_cast<unsigned char>(tok)));
  } else {
    out += "<|" + std::to_string(tok) + "|>";
  }
}

// Picks the next token from (V) logits: argmax when temperature == 0 (the lowest id on ties),
// else softmax(logits / temperature) restricted to the top_k largest logits (all when
// top_k == 0 or top_k >= V; ties with the k-th value are kept), sampled by inverse CDF.
int32_t pick(const float* logits, int V, float temperature, int top_k, Rng& rng) {
  if (temperature == 0.f) {
    int best = 0;
    for (int i = 1; i < V; i++)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  float cutoff = -INFINITY;
  if (top_k > 0 && top_k < V) {
    std::vector<float> sorted(logits, logits + V);
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                     std::greater<float>());
    cutoff = sorted[static_cast<size_t>(top_k - 1)];
  }
  float maxv = -INFINITY;
  for (int i = 0; i < V; i++) maxv = std::max(maxv, logits[i]);
  std::vector<double> p(static_cast<size_t>(V), 0.0);
  double sum = 0.0;
  for (int i = 0; i < V; i++) {
    if (logits[i] < cutoff) continue;
    p[static_cast<size_t>(i)] = std::exp(static_cast<double>(logits[i] - maxv) / temperature);
    sum += p[static_cast<size_t>(i)];
  }
  const double u = rng.uniform() * sum;
  double acc = 0.0;
  int last = 0;
  for (int i = 0; i < V; i++) {
    if (p[static_cast<size_t>(i)] == 0.0) continue;
    acc += p[static_cast<size_t>(i)];
    last = i;
    if (u < acc) return i;
  }
  return last;  // rounding: u landed at the very top
}

}  // namespace

std::string sample_text(ShardedModel& model, const SampleOptions& opts) {
  const ModelConfig& mc = model.model().config;
  const int V = mc.vocab_size;
  const int ctx = mc.seq_len;
  if (opts.tokens < 0) fail("sample", "tokens must be >= 0, got " + std::to_string(opts.tokens));
  if (!(opts.temperature >= 0.f) || !std::isfinite(opts.temperature))
    fail("sample", "temperature must be a finite number >= 0");
  if (opts.top_k < 0) fail("sample", "top_k must be >= 0, got " + std::to_string(opts.top_k));
  SW_CHECK(ctx > 0, "model seq_len must be positive");

  const Tokenizer* tok = opts.tokenizer;
  std::vector<int32_t> toks;
  if (tok) {
    toks = tok->encode(opts.prompt);
    for (int32_t t : toks)
      if (t >= V)
        fail("sample", "the prompt's token " + std::to_string(t) +
                           " is outside the model's vocabulary (vocab_size " +
                           std::to_string(V) + ")");
    if (toks.empty()) {
      const int32_t start = tok->bos_id() >= 0 ? tok->bos_id() : tok->eot_id();
      toks.push_back(start >= 0 && start < V ? start : 0);
    }
  } else {
    toks.reserve(opts.prompt.size() + static_cast<size_t>(opts.tokens) + 1);
    for (unsigned char c : opts.prompt) {
      if (c >= V)
        fail("sample", "prompt byte " + std::to_string(c) + " is outside the model's vocabulary (" +
                           "vocab_size " + std::to_string(V) + ")");
      toks.push_back(c);
    }
    if (toks.empty()) toks.push_back(V > '\n' ? '\n' : 0);  // tiny vocabularies: token 0
  }
  const int32_t eot = tok ? tok->eot_id() : -1;

  Rng rng(opts.seed, rng_stream("sample"));
  std::vector<float> logits(static_cast<size_t>(V));
  std::string out;
  std::vector<int32_t> generated;
  for (int n = 0; n < opts.tokens; n++) {
    const int T = static_cast<int>(std::min<size_t>(toks.size(), static_cast<size_t>(ctx)));
    Batch b;
    b.tokens = toks.data() + (toks.size() - static_cast<size_t>(T));  // (1, T)
    b.targets = nullptr;
    b.B = 1;
    b.T = T;
    model.logits_last(b, logits.data());
    const int32_t next = pick(logits.data(), V, opts.temperature, opts.top_k, rng);
    if (next == eot) break;
    toks.push_back(next);
    generated.push_back(next);
  }
  if (!tok) {
    for (int32_t t : generated) append_token(out, t);
    return out;
  }
  // Decoded in runs of ids the tokenizer knows (so multi-byte characters split across tokens
  // come out whole); an id past its vocabulary as "<|id|>".
  size_t from = 0;
  for (size_t i = 0; i <= generated.size(); i++) {
    if (i < generated.size() && generated[i] < tok->vocab_size()) continue;
    out += tok->decode(generated.data() + from, i - from);
    if (i < generated.size()) out += "<|" + std::to_string(generated[i]) + "|>";
    from = i + 1;
  }
  return out;
}

}  // namespace sw
