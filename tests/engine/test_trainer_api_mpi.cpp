// The facade under mpirun (label mpi; tests/engine/mpi_trainer_api.sh runs it beside
// `mpirun -np 2 shardwise train` on the same JSON): every rank builds the same RunConfig in
// code, the tiny GPT of tests/common/text_run.sh's tiny_gpt_config, and trains it.
//   test_trainer_api_mpi WORK RUN_DIR [stop|throw RANK STEP]
// WORK holds train.bin and val.bin. Each rank r writes RUN_DIR.steps_rank<r>: one line per
// step its callback saw, "step loss grad_norm" (%.17g). stop / throw: that rank alone asks to
// stop at that step (every rank must stop there) / throws there (the job must end in one line
// naming the step); a checkpoint block is on (every 2 steps).
// Exit 0 after the run; an error exits 1 (one rank: the message; several: as shardwise train).
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "core/launch.h"
#include "shardwise/trainer.h"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 6) {
    std::fprintf(stderr, "usage: %s WORK RUN_DIR [stop|throw RANK STEP]\n", argv[0]);
    return 2;
  }
  const std::string work = argv[1], run = argv[2], mode = argc == 6 ? argv[3] : "";
  const int stop_rank = argc == 6 ? std::atoi(argv[4]) : -1;
  const int stop_step = argc == 6 ? std::atoi(argv[5]) : -1;
  const int rank = sw::launch_env().rank;
  try {
    sw::RunConfig c;
    c.set("model.type", "gpt2").set("model.vocab_size", 256).set("model.n_layer", 2)
        .set("model.n_head", 2).set("model.d_model", 32).set("model.seq_len", 16);
    c.set("data.train", work + "/train.bin").set("data.val", work + "/val.bin");
    c.set("train_micro_batch_size_per_gpu", 4).set("train_steps", 8).set("eval_every_steps", 4);
    c.set("eval_batches", 3).set("log_every_steps", 4).set("threads", 1);
    c.set("optimizer.params.lr", 0.003).set("gradient_clipping", 1.0).set("run_dir", run);
    if (stop_rank >= 0) c.set("checkpoint.every_steps", 2);
    sw::TrainerOptions o;
    o.progress = false;
    sw::Trainer t(c, o);
    FILE* f = std::fopen((run + ".steps_rank" + std::to_string(rank)).c_str(), "w");
    if (!f) sw::fail("test", "cannot write the steps file");
    t.on_step([&](const sw::StepInfo& s) {
      std::fprintf(f, "%d %.17g %.17g\n", s.step, s.loss, s.grad_norm);
      std::fflush(f);
      const bool here = rank == stop_rank && s.step == stop_step;
      if (here && mode == "throw") throw std::runtime_error("rank " + std::to_string(rank) + " gave up");
      return here ? sw::StepAction::Stop : sw::StepAction::Continue;
    });
    const sw::RunSummary& r = t.train();
    std::fclose(f);
    if (rank == 0) std::printf("%s", t.summary_text().c_str());
    return r.stopped == (stop_rank >= 0) ? 0 : 1;
  } catch (const sw::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
