// PyTorch reads what `ckpt export` writes: a tiny GPT-2 is trained a few steps by Shardwise
// on 2 ranks' worth of state (FULL_SHARD over one process is not needed: the checkpoint path
// is the same), saved as a sharded checkpoint, exported to HF safetensors, and
// tests/checkpoint/gpt2_reference.py (its own safetensors reader, its own GPT-2 in float64)
// must reproduce Shardwise's loss on a batch within 1e-4 relative. A wrong name, transpose or
// layout anywhere changes the loss by far more.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "checkpoint/sharded_checkpoint.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"
#include "st_test_util.h"

using namespace sw;

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
  {
    std::ofstream f(dir.file("batch.bin"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(&B), 4);
    f.write(reinterpret_cast<const char*>(&T), 4);
    f.write(reinterpret_cast<const char*>(in.data()), B * T * 4);
    f.write(reinterpret_cast<const char*>(tg.data()), B * T * 4);
  }
  char expected[64];
  std::snprintf(expected, sizeof expected, "%.10f", loss);
  const std::string cmd = std::string(SW_PYTHON) + " " + SW_SOURCE_DIR +
                          "/tests/checkpoint/gpt2_reference.py " + out + " " +
                          dir.file("batch.bin") + " " + expected;
  INFO(cmd);
  const int rc = std::system(cmd.c_str());
  CHECK(WIFEXITED(rc));
  CHECK(WEXITSTATUS(rc) == 0);
}
