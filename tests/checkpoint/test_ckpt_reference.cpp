// PyTorch reads what `ckpt export` writes: a tiny model is trained a few steps by Shardwise,
// saved as a sharded checkpoint and exported to HF safetensors, and a float64 PyTorch model
// written in tests/checkpoint/{gpt2,llama}_reference.py (own safetensors reader, HF names and
// layouts) must reproduce Shardwise's loss on a batch. A wrong name, transpose or layout
// anywhere changes the loss by far more than the tolerances (1e-4 GPT-2, 1e-6 Llama).
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "checkpoint/export.h"
#include "checkpoint/sharded_checkpoint.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"
#include "st_test_util.h"

using namespace sw;

namespace {

// Writes the batch as int32 B, T, tokens, targets (the scripts' BATCH.bin) and runs
// `script MODEL BATCH LOSS`; returns the script's exit status (-1 when it did not exit).
int run_reference(const std::string& script, const std::string& model_path,
                  const std::string& batch_path, const Batch& b, double loss) {
  {
    std::ofstream f(batch_path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(&b.B), 4);
    f.write(reinterpret_cast<const char*>(&b.T), 4);
    f.write(reinterpret_cast<const char*>(b.tokens), std::streamsize{b.B} * b.T * 4);
    f.write(reinterpret_cast<const char*>(b.targets), std::streamsize{b.B} * b.T * 4);
  }
  char expected[64];
  std::snprintf(expected, sizeof expected, "%.12f", loss);
  return sttest::run_python_script(script, model_path + " " + batch_path + " " + expected);
}

}  // namespace

TEST_CASE("checkpoint export: PyTorch GPT-2 reproduces Shardwise's loss", "[checkpoint][reference]") {
  sttest::TempDir dir("ckpt_reference");
  ModelConfig c;
  c.type = "gpt2";
  c.vocab_size = 64;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 32;
  c.seq_len = 16;
  Model m = build_model(c);
  ShardedModel sm(m, ops_for(Device::cpu()), 11);
  const int B = 3, T = 16;
  std::vector<int32_t> in(B * T), tg(B * T);
  auto fill = [&](int s) {
    for (int i = 0; i < B * T; ++i) {
      in[size_t(i)] = (i * 13 + s * 5) % 64;
      tg[size_t(i)] = (i % 7 == 3) ? -1 : (i * 11 + s) % 64;  // some ignored targets
    }
  };
  Batch b;
  b.B = B, b.T = T, b.tokens = in.data(), b.targets = tg.data();
  for (int s = 1; s <= 5; ++s) {
    fill(s);
    sm.zero_grads();
    sm.forward_backward(b);
    sm.optimizer_step(AdamWParams{}, 3e-2f, 1.f, s);
  }
  TrainState st;
  st.step = 5;
  save_checkpoint(sm, st, dir.file("step_5"));
  const std::string out = dir.file("model.safetensors");
  export_checkpoint(dir.file("step_5"), out);

  fill(99);
  const double loss = sm.eval_loss(b);
  CHECK(run_reference("gpt2_reference.py", out, dir.file("batch.bin"), b, loss) == 0);
}

// Llama with grouped-query attention (4 query heads over 2 kv heads), the default d_ff
// (8/3 * 64 rounded up to 192) and non-default rope_theta / norm_eps, so that each config field
// the HF layout depends on is exercised. Observed: |PyTorch - Shardwise| / loss ~ 6e-9 (fp32
// forward vs float64), so the script asserts 1e-6; it also asserts that three wrong conventions
// (interleaved RoPE pairs, kv head h % n_kv_head, no RoPE) miss by more than 1e-4 (observed
// 5e-4 to 7e-3 after these 20 steps; fewer steps leave attention too close to uniform).
TEST_CASE("checkpoint export: PyTorch Llama reproduces Shardwise's loss", "[checkpoint][reference]") {
  sttest::TempDir dir("ckpt_reference_llama");
  ModelConfig c;
  c.type = "llama";
  c.tie_embeddings = false;
  c.vocab_size = 100;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 64;
  c.seq_len = 16;
  c.rope_theta = 500000.f;
  c.norm_eps = 1e-6f;
  Model m = build_model(c);
  REQUIRE(m.config.d_ff == 192);
  ShardedModel sm(m, ops_for(Device::cpu()), 7);
  const int B = 3, T = 16, V = 100, kSteps = 20;
  std::vector<int32_t> in(B * T), tg(B * T);
  auto fill = [&](int s) {
    for (int i = 0; i < B * T; ++i) {
      in[size_t(i)] = (i * 37 + s * 11) % V;
      tg[size_t(i)] = (i % 5 == 2) ? -1 : (i * 23 + s * 3) % V;  // some ignored targets
    }
  };
  Batch b;
  b.B = B, b.T = T, b.tokens = in.data(), b.targets = tg.data();
  for (int s = 1; s <= kSteps; ++s) {
    fill(s);
    sm.zero_grads();
    sm.forward_backward(b);
    sm.optimizer_step(AdamWParams{}, 3e-2f, 1.f, s);
  }
  TrainState st;
  st.step = kSteps;
  save_checkpoint(sm, st, dir.file("step"));
  const std::string out = dir.file("model.safetensors");
  export_checkpoint(dir.file("step"), out);
  // The trainer-side export of the live model writes the same bytes.
  export_hf_safetensors(sm, dir.file("live.safetensors"));
  CHECK(sttest::read_all(out) == sttest::read_all(dir.file("live.safetensors")));

  fill(99);
  const double loss = sm.eval_loss(b);
  CHECK(run_reference("llama_reference.py", out, dir.file("batch.bin"), b, loss) == 0);
}
