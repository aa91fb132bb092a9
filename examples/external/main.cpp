// Trains a model of its own (two Unit subclasses) and a built-in Llama through Shardwise's
// installed C++ API only: <shardwise/shardwise.h>, linked as Shardwise::shardwise. Both in a
// loop of its own over sw::api::ShardedModel (the Llama saved, verified and loaded back too),
// and the Llama once more as a whole run of the Trainer on a token file it writes.
//
//   external_train [--steps N] [--dir D]
// Under `mpirun -np R` the models are sharded over the R ranks (FULL_SHARD). Exits non-zero
// unless each model's loss falls, a checkpoint saved and loaded gives the same evaluation
// loss, and the planner predicts a step. D: where the checkpoint, the token file and the
// Trainer's run go (default: external_train.out in the current folder; the same on every rank).
#include <shardwise/shardwise.h>

#include "tiny_units.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using tiny::kVocab;
using tiny::custom_model;

// A learnable sequence: each token is the previous one plus a step that each sequence draws.
struct Data {
  std::vector<int32_t> tok, tgt;
  sw::Batch batch(int B, int T, unsigned seed, int vocab) {
    std::mt19937 rng(seed);
    tok.resize(size_t(B) * T);
    tgt.resize(size_t(B) * T);
    for (int b = 0; b < B; ++b) {
      int t0 = int(rng() % unsigned(vocab)), step = 1 + int(rng() % 2u);
      for (int t = 0; t < T; ++t) {
        tok[size_t(b) * T + t] = (t0 + t * step) % vocab;
        tgt[size_t(b) * T + t] = (t0 + (t + 1) * step) % vocab;
      }
    }
    return {tok.data(), tgt.data(), B, T};
  }
};

// Trains `model` for `steps` steps; returns whether its loss fell below 70% of the first.
bool train(const char* what, sw::Model& model, int steps, float lr, const std::string& ckpt) {
  sw::api::ShardedOptions opt;
  opt.lr = lr;
  sw::api::ShardedModel sm(model, opt);
  const int B = 4, T = 16, V = model.config.vocab_size;
  Data d;
  double first = 0, last = 0;
  for (int s = 1; s <= steps; ++s) {
    // Each rank its own share of the step's batch (seeded by step and rank).
    const sw::api::StepResult r = sm.train_step(d.batch(B, T, unsigned(s * 1000 + sm.rank()), V));
    if (s == 1) first = r.loss;
    last = r.loss;
    if (sm.rank() == 0 && (s == 1 || s % 20 == 0 || s == steps))
      std::printf("%s: step %3d loss %.4f grad_norm %.3f\n", what, r.step, r.loss, r.grad_norm);
  }
  bool ok = last < 0.7 * first;
  if (!ckpt.empty()) {  // save, train on, load back: the evaluation loss is the saved one's
    Data held;  // the evaluation batch's memory, apart from the training batches'
    const sw::Batch eval = held.batch(B, T, 7u, V);
    const double before = sm.eval_loss(eval);
    sm.save(ckpt);
    sw::api::verify_checkpoint(ckpt);
    sm.train_step(d.batch(B, T, 99u, V));
    const double moved = sm.eval_loss(eval);
    sm.load(ckpt);
    const double after = sm.eval_loss(eval);
    if (sm.rank() == 0)
      std::printf("%s: checkpoint at step %d: eval loss %.6f (one more step: %.6f), after load %.6f\n",
                  what, sm.step(), before, moved, after);
    ok = ok && after == before && sm.step() == steps;
  }
  if (sm.rank() == 0)
    std::printf("%s: %lld parameters, loss %.4f -> %.4f: %s\n", what,
                static_cast<long long>(sm.num_params()), first, last, ok ? "ok" : "FAILED");
  return ok;
}

// Whether this process prints: rank 0 of mpirun (OpenMPI's or a PMI launcher's variable), or
// the only process.
bool lead() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* r = std::getenv(v)) return std::atoi(r) == 0;
  return true;
}

// The learnable sequences above as a token file (llm.c's format: 256 int32 of header, magic
// 20240520, version 1, the count; then uint16 ids), for the Trainer's data.train.
std::string write_tokens(const std::string& path, int sequences, int T) {
  Data d;
  const sw::Batch b = d.batch(sequences, T, 5u, kVocab);
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = sequences * T;
  std::vector<uint16_t> ids(b.tokens, b.tokens + size_t(sequences) * T);
  // Every rank writes the same bytes: each its own file, renamed into place (atomic), so no
  // rank reads a file another is still writing.
  const std::string tmp = path + "." + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) sw::fail("external", tmp + ": cannot create");
  std::fwrite(header.data(), sizeof(int32_t), header.size(), f);
  std::fwrite(ids.data(), sizeof(uint16_t), ids.size(), f);
  if (std::fclose(f) != 0) sw::fail("external", tmp + ": cannot write");
  std::filesystem::rename(tmp, path);
  return path;
}

// A whole run of a built-in Llama with the Trainer (shardwise/trainer.h): the config made in
// code, a callback per step. Returns whether its loss fell below 70% of the first step's.
bool train_llama_run(const std::string& dir, int steps) {
  sw::RunConfig c;
  c.set("model.type", "llama").set("model.vocab_size", kVocab).set("model.n_layer", 2)
      .set("model.n_head", 4).set("model.n_kv_head", 2).set("model.d_model", 64)
      .set("model.seq_len", 16);
  c.set("data.train", write_tokens(dir + "/train.bin", 512, 16));
  c.set("train_micro_batch_size_per_gpu", 4).set("train_steps", steps).set("threads", 1);
  c.set("optimizer.type", "AdamW").set("optimizer.params.lr", 3e-3).set("gradient_clipping", 1.0);
  c.set("run_dir", dir + "/run");
  sw::TrainerOptions o;
  o.progress = false;
  o.export_at_end = false;
  sw::Trainer t(c, o);
  double first = 0;
  t.on_step([&](const sw::StepInfo& s) {
    if (s.step == 1) first = s.loss;
    if (lead() && (s.step == 1 || s.step % 20 == 0)) std::printf("trainer llama: step %3d loss %.4f\n", s.step, s.loss);
    return sw::StepAction::Continue;
  });
  const sw::RunSummary& r = t.train();
  const bool ok = r.steps == steps && r.last_loss < 0.7 * first;
  if (lead()) std::printf("trainer llama: %d steps, loss %.4f -> %.4f: %s\n", r.steps, first, r.last_loss,
              ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 60;
  std::string dir = "external_train.out";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else {
      std::fprintf(stderr, "external_train: unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  std::filesystem::create_directories(dir);
  if (lead()) std::printf("Shardwise %s (%d.%d.%d)\n", SHARDWISE_VERSION_STRING, SHARDWISE_VERSION_MAJOR,
              SHARDWISE_VERSION_MINOR, SHARDWISE_VERSION_PATCH);
  int bad = 0;
  try {
    sw::api::PlanRequest req;
    req.world = 4;
    req.micro_batch = 4;
    const sw::api::PlanFigures f = sw::api::predict_step(custom_model(), req);
    if (lead()) std::printf("plan: custom model on 4 ranks: peak %lld bytes per rank (activations %lld)\n",
                static_cast<long long>(f.device_peak), static_cast<long long>(f.activations));
    bad += f.device_peak <= 0;

    sw::Model mine = custom_model();
    bad += !train("custom", mine, steps, 1e-2f, "");

    sw::ModelConfig cfg;  // a tiny Llama
    cfg.type = "llama";
    cfg.vocab_size = kVocab;
    cfg.n_layer = 2;
    cfg.n_head = 4;
    cfg.n_kv_head = 2;
    cfg.d_model = 64;
    cfg.seq_len = 16;
    sw::Model llama = sw::build_model(cfg);
    bad += !train("llama", llama, steps, 3e-3f, dir + "/llama");
    bad += !train_llama_run(dir, steps);
  } catch (const sw::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    bad = 1;
  }
  return bad ? 1 : 0;
}
