// The C++ facade (shardwise/trainer.h) at one rank, against `shardwise train` (the binary, run
// as a separate process on a JSON file written here by hand) and against itself:
//   - a RunConfig made in code trains to the losses, grad norms and validation losses the
//     binary writes for the same JSON, bitwise; the callback sees every step's values
//   - evaluate(), save_checkpoint() and export_weights() after train(): the last validation
//     loss, a checkpoint a new Trainer resumes to the same loss, the end-of-run export's bytes
//   - a stop request: the run ends after that step with a checkpoint; resumed from it, the
//     steps after equal the uninterrupted run's, bitwise
//   - bad input, each one line naming what is wrong and nothing saved lost: a callback that
//     throws (its text and the step; the checkpoint before still resumes), a unit declaring a
//     parameter twice, a tensor split that does not divide over the tensor ranks, an unknown
//     key of a RunConfig
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "models/model.h"
#include "shardwise/trainer.h"

using namespace sw;
using namespace sw::enginetest;
namespace fs = std::filesystem;

namespace {

struct Files {
  fs::path dir, train, val;
};

const Files& files() {
  static Files f = [] {
    Files x;
    x.dir = make_test_dir("sw_trainer_api");
    x.train = write_random_tokens(x.dir / "train.bin", 20000, 64, 11);
    x.val = write_random_tokens(x.dir / "val.bin", 4000, 64, 12);
    return x;
  }();
  return f;
}

// The run both sides train: written out by hand as a file, and made in code below.
std::string config_file(const fs::path& run_dir, int steps, int every_steps) {
  const Files& f = files();
  std::string text = R"({
  "model": {"type": "gpt2", "vocab_size": 64, "n_layer": 2, "n_head": 2, "d_model": 32,
            "seq_len": 16},
  "data": {"train": ")" + f.train.string() + R"(", "val": ")" + f.val.string() + R"("},
  "train_micro_batch_size_per_gpu": 4, "train_steps": )" + std::to_string(steps) + R"(,
  "eval_every_steps": 4, "eval_batches": 2, "threads": 1, "seed": 7,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.05}},
  "gradient_clipping": 1.0,
  "checkpoint": {"every_steps": )" + std::to_string(every_steps) + R"(},
  "run_dir": ")" + run_dir.string() + R"("
})";
  const fs::path path = run_dir.string() + ".json";
  std::ofstream(path) << text;
  return path.string();
}

RunConfig code_config(const fs::path& run_dir, int steps, int every_steps) {
  const Files& f = files();
  RunConfig c;
  c.set("model.type", "gpt2").set("model.vocab_size", 64).set("model.n_layer", 2)
      .set("model.n_head", 2).set("model.d_model", 32).set("model.seq_len", 16);
  c.set("data.train", f.train.string()).set("data.val", f.val.string());
  c.set("train_micro_batch_size_per_gpu", 4).set("train_steps", steps);
  c.set("eval_every_steps", 4).set("eval_batches", 2).set("threads", 1).set("seed", 7);
  c.set("optimizer.type", "AdamW").set("optimizer.params.lr", 0.003)
      .set("optimizer.params.weight_decay", 0.05).set("gradient_clipping", 1.0);
  c.set("checkpoint.every_steps", every_steps).set("run_dir", run_dir.string());
  return c;
}

TrainerOptions quiet() {
  TrainerOptions o;
  o.progress = false;
  return o;
}

std::vector<StepInfo> record_all(Trainer& t, int stop_at = -1) {
  auto seen = std::make_shared<std::vector<StepInfo>>();
  t.on_step([seen, stop_at](const StepInfo& s) {
    seen->push_back(s);
    return s.step == stop_at ? StepAction::Stop : StepAction::Continue;
  });
  t.train();
  return *seen;
}

// The uninterrupted facade run of `steps` steps (checkpoints every 2), once per process.
const std::vector<nlohmann::json>& uninterrupted() {
  static const std::vector<nlohmann::json> m = [] {
    const fs::path run = files().dir / "full";
    Trainer t(code_config(run, 8, 2), quiet());
    t.train();
    return read_metrics(run.string());
  }();
  return m;
}

// Steps first..8 of `m` (1-based step numbers) equal the uninterrupted run's, bitwise.
void check_tail_equal(const std::vector<nlohmann::json>& m, int first) {
  const std::vector<nlohmann::json>& ref = uninterrupted();
  REQUIRE(ref.size() == 8);
  int compared = 0;
  for (const nlohmann::json& line : m) {
    const int step = line["step"].get<int>();
    if (step < first) continue;
    INFO("step " << step);
    const nlohmann::json& r = ref[size_t(step - 1)];
    CHECK(line["loss"].get<double>() == r["loss"].get<double>());
    CHECK(line["grad_norm"].get<double>() == r["grad_norm"].get<double>());
    CHECK(line.contains("val_loss") == r.contains("val_loss"));
    if (r.contains("val_loss")) CHECK(line["val_loss"].get<double>() == r["val_loss"].get<double>());
    ++compared;
  }
  CHECK(compared == 8 - first + 1);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- A user's model for the bad-input cases -----------------------------------------------------

// One parameter per unit, a name given by the caller (a duplicate is the mistake under test);
// with `split_rows`, the matrix's rows split over the tensor ranks as a careless unit would:
// rows / t each, which leaves rows uncovered when t does not divide them.
class Plain final : public Unit {
 public:
  Plain(std::string unit, std::string param, int64_t rows, TensorSlice s = {})
      : unit_(std::move(unit)), param_(std::move(param)), rows_(rows), s_(s) {}
  std::string name() const override { return unit_; }
  std::vector<ParamSpec> params() const override {
    ParamSpec p{.name = param_, .shape = {rows_, 8}};
    if (s_.size > 1) {
      const int64_t r = rows_ / s_.size;
      p.split.logical = p.shape;
      p.split.rows = {{s_.rank * r, (s_.rank + 1) * r}};
      p.shape[0] = r;
    }
    return {p};
  }
  void forward(UnitCtx&, int, const float*, float*) override {}
  void backward(UnitCtx&, int, const float*, const float*, float*) override {}

 private:
  std::string unit_, param_;
  int64_t rows_;
  TensorSlice s_;
};

Model two_units(const std::string& second_param, int64_t rows, TensorSlice s) {
  Model m;
  m.config.type = "custom";
  m.config.vocab_size = 64;
  m.tensor = s;
  m.units.push_back(std::make_unique<Plain>("embed", "embed.weight", 64));
  m.units.push_back(std::make_unique<Plain>("blocks.0", second_param, rows, s));
  m.schedule = {{0, 0}, {1, 0}};
  return m;
}

}  // namespace

TEST_CASE("trainer facade: a RunConfig made in code trains as shardwise train on the same JSON "
          "file, bitwise") {
  const fs::path cli_run = files().dir / "cli", api_run = files().dir / "api";
  const std::string file = config_file(cli_run, 8, 0);
  const std::string cmd = std::string(SHARDWISE_BIN) + " train " + file + " --quiet > " +
                          (files().dir / "cli.log").string() + " 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const std::vector<nlohmann::json> cli = read_metrics(cli_run.string());
  REQUIRE(cli.size() == 8);

  Trainer t(code_config(api_run, 8, 0), quiet());
  const std::vector<StepInfo> seen = record_all(t);
  const std::vector<nlohmann::json> api = read_metrics(api_run.string());
  REQUIRE(api.size() == 8);
  REQUIRE(seen.size() == 8);
  int vals = 0;
  for (size_t i = 0; i < 8; ++i) {
    INFO("step " << i + 1);
    CHECK(seen[i].step == int(i) + 1);
    CHECK(seen[i].total_steps == 8);
    CHECK(seen[i].loss == cli[i]["loss"].get<double>());
    CHECK(seen[i].grad_norm == cli[i]["grad_norm"].get<double>());
    CHECK(float(seen[i].lr) == cli[i]["lr"].get<float>());
    CHECK(api[i]["loss"].get<double>() == cli[i]["loss"].get<double>());
    CHECK(seen[i].has_val_loss == cli[i].contains("val_loss"));
    if (seen[i].has_val_loss) {
      ++vals;
      CHECK(seen[i].val_loss == cli[i]["val_loss"].get<double>());
    }
  }
  CHECK(vals == 2);  // steps 4 and 8
  const RunSummary& s = t.summary();
  CHECK(s.steps == 8);
  CHECK(!s.stopped);
  CHECK(s.last_loss == cli[7]["loss"].get<double>());
  CHECK(s.weights_path == (api_run / "hf").string());
  CHECK(fs::exists(api_run / "hf" / "model.safetensors"));
  // The exported weights: the binary's, byte for byte (the same tensors, the same metadata).
  CHECK(read_bytes(api_run / "hf" / "model.safetensors") ==
        read_bytes(cli_run / "hf" / "model.safetensors"));
  // evaluate() after training: the last step's validation loss (the same weights and batches).
  CHECK(t.evaluate() == cli[7]["val_loss"].get<double>());
  CHECK(t.summary_text().find("shardwise: trained 8 steps in ") == 0);
  // save_checkpoint() (no checkpoint block: into checkpoint.dir all the same): a run resumed
  // from it evaluates to the same loss; export_weights(dir): the end-of-run export's bytes.
  const std::string saved = t.save_checkpoint();
  CHECK(saved == (api_run / "checkpoints" / "step_8").string());
  CHECK(t.summary().last_checkpoint == 8);
  const fs::path again = files().dir / "export_again";
  CHECK(t.export_weights(again.string()) == again.string());
  CHECK(read_bytes(again / "model.safetensors") ==
        read_bytes(api_run / "hf" / "model.safetensors"));
  Trainer r(code_config(files().dir / "from_saved", 8, 0), quiet());
  r.resume(saved);
  CHECK(r.evaluate() == cli[7]["val_loss"].get<double>());
  CHECK(r.step() == 8);
}

TEST_CASE("trainer facade: a stop request saves a checkpoint, and resumed from it the steps after equal "
          "the uninterrupted run's") {
  const fs::path run = files().dir / "stopped";
  {
    Trainer t(code_config(run, 8, 5), quiet());
    const std::vector<StepInfo> seen = record_all(t, 3);
    CHECK(seen.size() == 3);
    const RunSummary& s = t.summary();
    CHECK(s.stopped);
    CHECK(s.steps == 3);
    CHECK(s.last_checkpoint == 3);
    CHECK(t.step() == 3);
    CHECK(fs::exists(run / "checkpoints" / "step_3" / "metadata.json"));
    CHECK(read_metrics(run.string()).size() == 3);
  }
  const fs::path resumed = files().dir / "resumed";
  Trainer t(code_config(resumed, 8, 0), quiet());
  t.resume((run / "checkpoints").string());
  t.train();
  CHECK(t.summary().start_step == 3);
  CHECK(t.summary().steps == 8);
  check_tail_equal(read_metrics(resumed.string()), 4);
  // resume() once the run is set up: refused in one line.
  const std::string e = error_of([&] { t.resume((run / "checkpoints").string()); });
  CHECK(e.find("resume(") != std::string::npos);
  CHECK(e.find("already set up") != std::string::npos);
}

TEST_CASE("trainer facade: a callback that throws stops the run in one line naming the step, "
          "the checkpoint saved before still resumes") {
  const fs::path run = files().dir / "throws";
  {
    Trainer t(code_config(run, 8, 2), quiet());
    t.on_step([](const StepInfo& s) {
      if (s.step == 3) throw std::runtime_error("metrics sink full\nsecond line");
      return StepAction::Continue;
    });
    const std::string e = error_of([&] { t.train(); });
    INFO(e);
    CHECK(e.find("metrics sink full second line") != std::string::npos);
    CHECK(e.find("step 3") != std::string::npos);
    CHECK(e.find('\n') == std::string::npos);
  }
  // step_2 is intact: `latest` names it, and resuming from it continues the uninterrupted run.
  CHECK(read_bytes(run / "checkpoints" / "latest") == "step_2\n");
  CHECK(!fs::exists(run / "checkpoints" / "step_3"));
  const fs::path resumed = files().dir / "throws_resumed";
  Trainer t(code_config(resumed, 8, 0), quiet());
  t.resume((run / "checkpoints").string());
  t.train();
  CHECK(t.summary().start_step == 2);
  check_tail_equal(read_metrics(resumed.string()), 3);
}

TEST_CASE("trainer facade: a unit declaring a parameter another unit declares is refused in one "
          "line naming both units and the parameter") {
  const fs::path run = files().dir / "dup";
  RunConfig c = code_config(run, 2, 0);
  const std::string e = error_of([&] {
    Trainer t(c, [](const TensorSlice& s) { return two_units("embed.weight", 16, s); }, quiet());
    t.train();
  });
  INFO(e);
  CHECK(e.find("unit 'blocks.0'") != std::string::npos);
  CHECK(e.find("parameter 'embed.weight' is declared twice") != std::string::npos);
  CHECK(e.find("unit 'embed' declares it too") != std::string::npos);
  CHECK(e.find('\n') == std::string::npos);
  CHECK(!fs::exists(run));  // refused before anything was written
}

TEST_CASE("trainer facade: a tensor split that does not divide over the tensor ranks is refused "
          "in one line naming the unit and the parameter") {
  const fs::path run = files().dir / "split";
  RunConfig c = code_config(run, 2, 0);
  c.set("parallelism.tensor_parallel_degree", 2);
  auto factory = [](int64_t rows) {
    return [rows](const TensorSlice& s) { return two_units("blocks.0.w", rows, s); };
  };
  // 15 rows over 2 ranks: 7 each, row 14 held by none.
  const std::string e = error_of([&] { Trainer t(c, factory(15), quiet()); });
  INFO(e);
  CHECK(e.find("unit 'blocks.0': parameter 'blocks.0.w' (logical shape 15 x 8) does not divide "
               "over 2 tensor ranks") != std::string::npos);
  CHECK(e.find("112 of its 120") != std::string::npos);
  CHECK(!fs::exists(run));
  // 16 rows divide: the check passes (the run itself then needs 2 ranks) when nothing asks
  // what a split model of one's own cannot do yet: the export, checkpoints (refused up front).
  TrainerOptions no_export = quiet();
  no_export.export_at_end = false;
  CHECK(error_of([&] { Trainer t(c, factory(16), no_export); }) == "(no error)");
  CHECK(error_of([&] { Trainer t(c, factory(16), quiet()); })
            .find("TrainerOptions::export_at_end: the export of a model of your own with "
                  "parallelism.tensor_parallel_degree 2 is not implemented yet") !=
        std::string::npos);
  c.set("checkpoint.every_steps", 4);
  CHECK(error_of([&] { Trainer t(c, factory(16), no_export); })
            .find("checkpoint.every_steps: checkpoints of a model of your own") !=
        std::string::npos);
}

TEST_CASE("trainer facade: RunConfig errors name the key as a config file's do") {
  const fs::path run = files().dir / "keys";
  RunConfig c = code_config(run, 2, 0);
  c.set("optimizer.params.lrr", 0.1);
  const std::string e = error_of([&] { Trainer t(c, quiet()); });
  INFO(e);
  CHECK(e.find("config: RunConfig: ") == 0);
  CHECK(e.find("optimizer.params.lrr") != std::string::npos);
  RunConfig d = code_config(run, 2, 0);
  d.set("train_steps", "many");
  CHECK(error_of([&] { Trainer t(d, quiet()); }).find("train_steps") != std::string::npos);
  // from_json + set / set_json: the document a file holds, keys overridden, reads as the file
  // with the same --set overrides does.
  const std::string text = read_bytes(config_file(run, 2, 0));
  RunConfig j = RunConfig::from_json(text);
  j.set("seed", uint64_t{99}).set_json("optimizer.params.betas", "[0.8, 0.9]");
  Trainer a(j, quiet());
  Trainer b = Trainer::from_file(run.string() + ".json",
                                 {"seed=99", "optimizer.params.betas=[0.8, 0.9]"}, quiet());
  CHECK(a.config_json() == b.config_json());
  CHECK(a.config_json().find("99") != std::string::npos);
  CHECK(error_of([&] { Trainer t(RunConfig::from_json("[1]"), quiet()); })
            .find("config: RunConfig: from_json: not a JSON object") == 0);
  // The file reader: the same message for the same mistake.
  const std::string file = config_file(run, 2, 0);
  const std::string f = error_of([&] { Trainer::from_file(file, {"optimizer.params.lrr=0.1"}); });
  CHECK(f.find("optimizer.params.lrr") != std::string::npos);
}

// A model of one's own (its config's type "custom"): its checkpoint reads back, and the run
// resumed from step 4 equals the uninterrupted one from there on (checkpoint/hf_layout.h any_type).
TEST_CASE("trainer facade: a custom model's checkpoint resumes bit for bit") {
  auto custom = [](const TensorSlice& s) {
    ModelConfig mc;
    mc.type = "gpt2", mc.vocab_size = 64, mc.n_layer = 2, mc.n_head = 2, mc.d_model = 32;
    mc.seq_len = 16;
    Model m = build_model(mc, s);
    m.config.type = "custom";
    return m;
  };
  TrainerOptions o = quiet();
  o.export_at_end = false;
  const fs::path full = files().dir / "custom_full", part = files().dir / "custom_part";
  {
    Trainer t(code_config(full, 8, 4), custom, o);
    t.train();
  }
  Trainer t(code_config(part, 8, 0), custom, o);
  t.resume((full / "checkpoints" / "step_4").string());
  t.train();
  CHECK(t.summary().start_step == 4);
  const std::vector<nlohmann::json> a = read_metrics(full.string()), b = read_metrics(part.string());
  REQUIRE(a.size() == 8);
  REQUIRE(b.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    INFO("step " << b[i]["step"]);
    CHECK(b[i]["loss"] == a[i + 4]["loss"]);
    CHECK(b[i]["grad_norm"] == a[i + 4]["grad_norm"]);
  }
}
