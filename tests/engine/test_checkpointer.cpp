// Checkpoints in the trainer (one process): resume bit-identity with sync and async saves,
// metrics.jsonl on resume, --init-from, the `latest` pointer, keep_last pruning, stale
// temporary directories, the resume path's errors, and the checkpoint config keys.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/checkpointer.h"
#include "engine/config.h"
#include "engine/data.h"
#include "engine/trainer.h"
#include "engine_test_util.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"

using namespace sw;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

fs::path test_dir() { return enginetest::make_test_dir("sw_test_checkpointer"); }

std::string random_tokens(const std::string& name, size_t n, int vocab, uint64_t seed) {
  return enginetest::write_random_tokens(test_dir() / name, n, vocab, seed);
}

// total_num_steps is fixed at 8 so that a run of train_steps 4 follows the same LR schedule as
// the first half of a run of 8 (the in-process stand-in for "stopped at step 4").
TrainConfig tiny(const std::string& data, const std::string& run,
                 std::vector<std::string> extra = {}) {
  const fs::path dir = test_dir() / run;
  std::vector<std::string> ov = {"data.train=" + data, "run_dir=" + dir.string()};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return parse_config(R"({
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR",
                  "params": {"warmup_num_steps": 2, "total_num_steps": 8, "cos_min_ratio": 0.1}},
    "gradient_clipping": 1.0,
    "model": {"type": "gpt2", "vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16},
    "train_steps": 8, "seed": 1234, "threads": 2
  })",
                      "tiny.json", ov);
}

TrainOptions quiet(bool export_weights = true) {
  return enginetest::quiet_options(export_weights);
}

using enginetest::read_bytes;
using enginetest::read_metrics;

void fresh(const std::string& run) { fs::remove_all(test_dir() / run); }

// The training numbers of two metrics files agree exactly, line by line. (A run stopped at
// its last step also validated there: val_loss presence is compared after `resume_step`.)
void check_same_training(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b,
                         int resume_step) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("line " << i);
    CHECK(a[i]["step"] == b[i]["step"]);
    CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
    CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
    CHECK(a[i]["lr"] == b[i]["lr"]);
    if (a[i].contains("val_loss") && b[i].contains("val_loss"))
      CHECK(a[i]["val_loss"].get<double>() == b[i]["val_loss"].get<double>());
    if (static_cast<int>(i) >= resume_step)
      CHECK(a[i].contains("val_loss") == b[i].contains("val_loss"));
  }
}

}  // namespace

TEST_CASE("checkpointer: train 8 vs train 4 + resume to 8 are bit-identical (sync and async)") {
  const std::string data = random_tokens("resume.bin", 6000, 32, 11);
  const std::string val = random_tokens("resume_val.bin", 800, 32, 12);
  for (const bool async : {false, true}) {
    const std::string a = async ? "async" : "sync";
    INFO(a);
    const std::vector<std::string> ck = {
        "data.val=" + val, "eval_every_steps=3", "checkpoint.every_steps=2",
        std::string("checkpoint.async=") + (async ? "true" : "false")};
    fresh("full_" + a);
    fresh("half_" + a);
    const TrainConfig full = tiny(data, "full_" + a, ck);
    const TrainSummary sf = train(full, quiet());
    CHECK(sf.checkpoints_saved == 4);  // steps 2, 4, 6, 8
    CHECK(read_latest(full.checkpoint.dir) == (fs::path(full.checkpoint.dir) / "step_8").string());

    std::vector<std::string> ck4 = ck;
    ck4.push_back("train_steps=4");
    const TrainConfig half = tiny(data, "half_" + a, ck4);
    const TrainSummary sh = train(half, quiet(false));
    CHECK(sh.last_checkpoint == 4);
    // A killed run may have logged past its checkpoint, and cut a line short.
    {
      std::ofstream m(fs::path(half.run_dir) / "metrics.jsonl", std::ios::app);
      m << R"({"step": 5, "loss": 99.0})"
        << "\n"
        << R"({"step": 6, "lo)";
    }
    std::vector<std::string> ck8 = ck;
    ck8.push_back("checkpoint.resume=auto");
    const TrainConfig resumed = tiny(data, "half_" + a, ck8);
    const TrainSummary sr = train(resumed, quiet());
    CHECK(sr.start_step == 4);
    CHECK(sr.resumed_from == (fs::path(half.checkpoint.dir) / "step_4").string());
    CHECK(sr.last_loss == sf.last_loss);
    CHECK(sr.last_val_loss == sf.last_val_loss);
    check_same_training(read_metrics(full.run_dir), read_metrics(resumed.run_dir), 4);
    CHECK(read_bytes(sf.weights_path) == read_bytes(sr.weights_path));
    // keep_last 3 (the default) left step_4 .. step_8 of the resumed run.
    std::vector<int64_t> steps;
    for (const auto& [n, p] : list_checkpoints(resumed.checkpoint.dir)) steps.push_back(n);
    CHECK(steps == std::vector<int64_t>{4, 6, 8});
  }
}

TEST_CASE("checkpointer: on a device (sim), resume is bit-identical, from and to the CPU too") {
  // device=sim: the simulated accelerator (tests/common/sim_device.h), whose memory faults on a
  // host access and whose arithmetic is the CPU's: saves (sync, async snapshot) copy the state
  // out of device memory, loads copy it in.
  const std::string data = random_tokens("dev_resume.bin", 6000, 32, 21);
  for (const char* mp : {"fp32", "bf16"}) {
    INFO(mp);
    const std::string m = mp;
    const std::vector<std::string> base = {"checkpoint.every_steps=2",
                                           "mixed_precision.param_dtype=" + m};
    auto with = [&](std::vector<std::string> v, std::initializer_list<std::string> more) {
      v.insert(v.end(), more);
      return v;
    };
    const std::vector<std::string> sim = with(base, {"device=sim"});
    fresh("dev_full_" + m);
    const TrainConfig full = tiny(data, "dev_full_" + m, sim);
    REQUIRE(full.device == "sim");
    const TrainSummary sf = train(full, quiet());
    CHECK(sf.checkpoints_saved == 4);
    const auto mf = read_metrics(full.run_dir);
    // The uninterrupted run on the CPU: the same numbers.
    fresh("dev_cpu_full_" + m);
    const TrainSummary sc = train(tiny(data, "dev_cpu_full_" + m, base), quiet());
    CHECK(read_bytes(sc.weights_path) == read_bytes(sf.weights_path));
    // (first half's device, resumed half's device, async)
    struct Leg {
      bool sim_first, sim_then, async;
    };
    for (const Leg& g : {Leg{true, true, false}, Leg{true, true, true}, Leg{false, true, false},
                         Leg{true, false, true}}) {
      const std::string name = std::string("dev_") + (g.sim_first ? "sim" : "cpu") + "_" +
                               (g.sim_then ? "sim" : "cpu") + (g.async ? "_async_" : "_sync_") + m;
      INFO(name);
      fresh(name);
      const std::string as = std::string("checkpoint.async=") + (g.async ? "true" : "false");
      const TrainConfig half =
          tiny(data, name, with(g.sim_first ? sim : base, {as, "train_steps=4"}));
      CHECK(train(half, quiet(false)).last_checkpoint == 4);
      const TrainConfig resumed =
          tiny(data, name, with(g.sim_then ? sim : base, {as, "checkpoint.resume=auto"}));
      const TrainSummary sr = train(resumed, quiet());
      CHECK(sr.start_step == 4);
      CHECK(sr.last_loss == sf.last_loss);
      check_same_training(mf, read_metrics(resumed.run_dir), 4);
      CHECK(read_bytes(sf.weights_path) == read_bytes(sr.weights_path));
      // The resumed run's last checkpoint is the uninterrupted run's, byte for byte.
      for (const char* f : {"rank_0.safetensors"})
        CHECK(read_bytes((fs::path(resumed.checkpoint.dir) / "step_8" / f).string()) ==
              read_bytes((fs::path(full.checkpoint.dir) / "step_8" / f).string()));
    }
    // --init-from on the device: set_param uploads the exported weights.
    auto init_from = [&](const std::string& name, const std::vector<std::string>& on) {
      fresh(name);
      return train(tiny(data, name,
                        with(on, {"train_steps=1", "checkpoint.every_steps=0",
                                  "checkpoint.init_from=" + sf.weights_path,
                                  "optimizer.params.lr=1e-30", "scheduler.type=Constant",
                                  "scheduler.params={}"})),
                   quiet());
    };
    const TrainSummary di = init_from("dev_init_" + m, sim);
    if (m == "fp32") CHECK(read_bytes(di.weights_path) == read_bytes(sf.weights_path));
    const TrainSummary ci = init_from("dev_init_cpu_" + m, base);
    CHECK(read_bytes(di.weights_path) == read_bytes(ci.weights_path));
  }
}

TEST_CASE("checkpointer: metrics.jsonl records checkpoint saves and their stall") {
  const std::string data = random_tokens("metrics.bin", 4000, 32, 13);
  fresh("metrics");
  const TrainConfig c =
      tiny(data, "metrics", {"checkpoint.every_steps=3", "checkpoint.async=true"});
  const TrainSummary s = train(c, quiet(false));
  const auto m = read_metrics(c.run_dir);
  REQUIRE(m.size() == 8);
  // The save after step 3 is reported on the next lines: started after 3, committed by step 6.
  CHECK(!m[2].contains("ckpt_stall_s"));
  CHECK(m[3].contains("ckpt_stall_s"));
  CHECK(m[3]["ckpt_stall_s"].get<double>() >= 0);
  // When an async save commits depends on the disk; what is certain: the save of step 3 is
  // committed at the latest when the save of step 6 starts (one save in flight), so a line up
  // to step 7 reports it; the one of step 6 is reported by step 8's line or, if it completes
  // only at the end, in the summary; the final save (step 8) is in the summary only.
  int64_t saved = -1;
  bool saw3 = false;
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i].contains("ckpt_saved")) {
      const int64_t v = m[i]["ckpt_saved"].get<int64_t>();
      saved = std::max(saved, v);
      if (v == 3) saw3 = i <= 6;
    }
  CHECK(saw3);
  CHECK((saved == 3 || saved == 6));
  CHECK(s.last_checkpoint == 8);
  CHECK(s.checkpoints_saved == 3);
  CHECK(s.ckpt_stall_s > 0);
}

TEST_CASE("checkpointer: --init-from starts from exported weights") {
  const std::string data = random_tokens("init.bin", 4000, 32, 14);
  fresh("init_src");
  fresh("init_dst");
  const TrainSummary src = train(tiny(data, "init_src", {"train_steps=3"}), quiet());
  // With a negligible learning rate the imported weights come out unchanged.
  const TrainSummary dst =
      train(tiny(data, "init_dst",
                 {"train_steps=1", "checkpoint.init_from=" + src.weights_path,
                  "optimizer.params.lr=1e-30", "scheduler.type=Constant", "scheduler.params={}"}),
            quiet());
  CHECK(read_bytes(dst.weights_path) == read_bytes(src.weights_path));
  CHECK_THROWS_WITH(
      train(tiny(data, "init_dst", {"checkpoint.init_from=" + (test_dir() / "nope.st").string()}),
            quiet()),
      Contains("nope.st"));
}

TEST_CASE("checkpointer: latest pointer, keep_last pruning, stale temporary directories") {
  Model model = build_model(tiny("x", "unused").model);
  ShardedModel sm(model, ops_for(Device::cpu()), 7);
  const GroupPtr g = make_local_group();
  const fs::path dir = test_dir() / "prune";
  fs::remove_all(dir);
  {
    Checkpointer c(dir.string(), 2, false, *g);
    for (int s = 1; s <= 5; ++s) {
      TrainState st;
      st.step = s;
      st.seed = 7;
      const CkptEvents ev = c.save(sm, st);
      CHECK(ev.committed == s);
      CHECK(ev.failed == -1);
      CHECK(read_latest(dir.string()) == (dir / ("step_" + std::to_string(s))).string());
    }
  }
  auto steps = [&] {
    std::vector<int64_t> v;
    for (const auto& [n, p] : list_checkpoints(dir.string())) v.push_back(n);
    return v;
  };
  CHECK(steps() == std::vector<int64_t>{4, 5});
  CHECK(read_bytes(dir / "latest") == "step_5\n");
  CHECK(!fs::exists(dir / ".latest.tmp"));
  // Never the checkpoint `latest` names, even when it is not among the newest.
  write_latest(dir.string(), "step_4");
  fs::create_directories(dir / "step_6");  // (a newer directory; prune only renames/deletes)
  CHECK(prune_checkpoints(dir.string(), 1) == std::vector<std::string>{"step_5"});
  CHECK(steps() == std::vector<int64_t>{4, 6});
  fs::remove_all(dir / "step_6");
  // Leftovers of killed saves, prunes and commits are removed by the next Checkpointer.
  for (const char* d : {".step_9.tmp", "step_3.tmp", ".step_2.deleting", "step_4.old"})
    fs::create_directories(dir / d / "x");
  std::ofstream(dir / ".latest.tmp") << "step_9\n";
  { Checkpointer c(dir.string(), 2, true, *g); }
  for (const char* d :
       {".step_9.tmp", "step_3.tmp", ".step_2.deleting", "step_4.old", ".latest.tmp"})
    CHECK(!fs::exists(dir / d));
  CHECK(steps() == std::vector<int64_t>{4});
  CHECK(read_bytes(dir / "latest") == "step_4\n");
  // A malformed `latest` names the file.
  std::ofstream(dir / "latest") << "../../etc\n";
  CHECK_THROWS_WITH(read_latest(dir.string()),
                    Contains((dir / "latest").string() + ": expected a line 'step_<N>'"));
}

TEST_CASE("checkpointer: resume paths: step dir, checkpoint dir, auto, and the errors") {
  Model model = build_model(tiny("x", "unused").model);
  ShardedModel sm(model, ops_for(Device::cpu()), 7);
  const GroupPtr g = make_local_group();
  const fs::path dir = test_dir() / "paths";
  fs::remove_all(dir);
  CHECK(resolve_resume("auto", dir.string()).empty());  // nothing yet: start fresh
  {
    Checkpointer c(dir.string(), 0, false, *g);
    TrainState st;
    st.step = 3;
    c.save(sm, st);
  }
  const std::string s3 = (dir / "step_3").string();
  CHECK(resolve_resume("auto", dir.string()) == s3);
  CHECK(resolve_resume(dir.string(), "elsewhere") == s3);
  CHECK(resolve_resume(s3, "elsewhere") == s3);
  const std::string missing = (dir / "nope").string();
  CHECK_THROWS_WITH(resolve_resume(missing, dir.string()),
                    Contains("resume: " + missing + ": no such checkpoint"));
  std::ofstream(dir / "a_file") << "x";
  CHECK_THROWS_WITH(resolve_resume((dir / "a_file").string(), ""), Contains("is a file"));
  fs::create_directories(dir / "empty");
  CHECK_THROWS_WITH(resolve_resume((dir / "empty").string(), ""),
                    Contains("not a checkpoint (no metadata.json and no 'latest' file)"));
  // A seed that differs from the checkpoint's is refused.
  const std::string data = random_tokens("seed.bin", 3000, 32, 15);
  fresh("seed");
  train(tiny(data, "seed", {"train_steps=2", "checkpoint.every_steps=2"}), quiet(false));
  CHECK_THROWS_WITH(train(tiny(data, "seed", {"seed=5", "checkpoint.resume=auto"}), quiet(false)),
                    Contains("saved by a run with seed 1234, this config has seed 5"));
  CHECK_THROWS_WITH(train(tiny(data, "seed", {"checkpoint.resume=" + missing}), quiet(false)),
                    Contains("resume: " + missing + ": no such checkpoint"));
}

TEST_CASE("checkpointer: the checkpoint config keys") {
  const TrainConfig d = parse_config("{}", "c.json");
  CHECK(d.checkpoint.dir == (fs::path("runs/default") / "checkpoints").string());
  CHECK(d.checkpoint.every_steps == 0);
  CHECK(d.checkpoint.keep_last == 3);
  CHECK(!d.checkpoint.async);
  CHECK(d.checkpoint.save_final);
  CHECK(d.checkpoint.resume.empty());
  const TrainConfig c = parse_config(R"({"run_dir": "r", "checkpoint": {"every_steps": 10,
      "keep_last": 0, "async": true, "save_final": false, "resume": "auto", "dir": "/ck"}})",
                                     "c.json");
  CHECK(c.checkpoint.dir == "/ck");
  CHECK(c.checkpoint.every_steps == 10);
  CHECK(c.checkpoint.keep_last == 0);
  CHECK(c.checkpoint.async);
  CHECK(!c.checkpoint.save_final);
  CHECK(c.checkpoint.resume == "auto");
  const TrainConfig b = parse_config(config_json(c), "x");
  CHECK(config_json(b) == config_json(c));
  CHECK(b.checkpoint.resume == "auto");
  CHECK(parse_config(c.resolved_json, "r").resolved_json == c.resolved_json);
  CHECK(parse_config(R"({"run_dir": "r"})", "c").checkpoint.dir ==
        (fs::path("r") / "checkpoints").string());
  auto error_of = [](const std::string& text) {
    try {
      parse_config(text, "cfg.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK_THAT(
      error_of(R"({"checkpoint": {"every_step": 5}})"),
      Contains("unknown key 'checkpoint.every_step' (did you mean 'checkpoint.every_steps'?)"));
  CHECK_THAT(error_of(R"({"checkpoint": {"keep_last": -1}})"),
             Contains("cfg.json: checkpoint.keep_last: must be >= 0"));
  CHECK_THAT(error_of(R"({"checkpoint": {"async": "yes"}})"),
             Contains("checkpoint.async: expected true or false"));
  CHECK_THAT(error_of(R"({"checkpoint": {"dir": ""}})"),
             Contains("checkpoint.dir: must not be empty"));
  CHECK_THAT(error_of(R"({"checkpoint": {"resume": "auto", "init_from": "m.safetensors"}})"),
             Contains("checkpoint.init_from: conflicts with checkpoint.resume"));
}
