// The parallelism block (engine/config.h ParallelismConfig, issue 36): the degrees read and
// written back; an impossible mesh is one line naming parallelism.tensor_parallel_degree and
// the model key it does not divide (a file and a TrainConfig built in code alike); the batch
// keys and HYBRID_SHARD's group are per data-parallel rank (world / tensor degree); what tensor
// parallelism does not do yet is refused in one line naming its key; train() refuses a world
// the degree does not divide. The parity of tensor-parallel training is engine_mpi_tensor's.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/config.h"
#include "engine/trainer.h"
#include "engine_test_util.h"

using namespace sw;
using sw::enginetest::error_of;
using sw::enginetest::parse;

namespace {

const std::string kTp = "parallelism.tensor_parallel_degree";

// What parsing `text` with tensor degree `t` (in the file) on `world` ranks says.
std::string mesh_error(const std::string& text, int t, int world = 0) {
  nlohmann::json j = nlohmann::json::parse(text);
  j["parallelism"]["tensor_parallel_degree"] = t;
  try {
    parse_config(j.dump(), "cfg.json", {}, world);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string refusal(const TrainConfig& c, const std::string& command) {
  try {
    refuse_tensor_parallel_gaps(c, command);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("parallelism: the degrees are read, default 1, and written in the resolved config") {
  const TrainConfig d = parse("{}");
  CHECK(d.parallelism.tensor == 1);
  CHECK(d.parallelism.pipeline == 1);
  const TrainConfig c = parse(R"({"parallelism": {"tensor_parallel_degree": 2}})");
  CHECK(c.parallelism.tensor == 2);
  const nlohmann::json r = nlohmann::json::parse(c.resolved_json);
  CHECK(r["parallelism"]["tensor_parallel_degree"] == 2);
  CHECK(r["parallelism"]["pipeline_parallel_degree"] == 1);
  CHECK(parse(c.resolved_json).parallelism.tensor == 2);
  CHECK(nlohmann::json::parse(config_json(c))["parallelism"]["tensor_parallel_degree"] == 2);
  CHECK(error_of(R"({"parallelism": {"tensor_parallel_degree": 0}})") ==
        "config: cfg.json: parallelism.tensor_parallel_degree: must be >= 1 (got 0)");
  CHECK(error_of(R"({"parallelism": {"tensor_degree": 2}})").find("tensor_parallel_degree") !=
        std::string::npos);  // the nearest key suggested
}

TEST_CASE("parallelism: an impossible mesh is one line naming the key") {
  const std::string pre = "config: cfg.json: " + kTp + ": ";
  // The default model: gpt2, n_head 4, d_model 128 (d_ff 512), vocab_size 256, seq_len 128.
  CHECK(mesh_error("{}", 2) == "(no error)");
  CHECK(mesh_error("{}", 4) == "(no error)");
  CHECK(mesh_error("{}", 3) ==
        pre + "3 does not divide model.n_head (4): each tensor rank holds whole attention heads");
  CHECK(mesh_error(R"({"model": {"d_ff": 130}})", 4) ==
        pre + "4 does not divide model.d_ff (130): each tensor rank holds a slice of the MLP's "
              "hidden width");
  // llama's default d_ff: 8/3 d_model rounded up to a multiple of 64 (256: 704).
  CHECK(mesh_error(R"({"model": {"type": "llama", "n_head": 128, "d_model": 256}})", 128) ==
        pre + "128 does not divide model.d_ff (704, its default): each tensor rank holds a slice "
              "of the MLP's hidden width");
  CHECK(mesh_error(R"({"model": {"vocab_size": 255}})", 2) ==
        pre + "2 does not divide model.vocab_size (255): the embedding and the LM head are split "
              "by vocabulary");
  CHECK(mesh_error(R"({"model": {"seq_len": 33}})", 2) ==
        pre + "2 does not divide model.seq_len (33): sequence parallelism splits each "
              "sequence's positions over the tensor ranks");
  // KV heads: split (t divides them) or replicated (they divide t); neither is an error.
  const std::string gqa = R"({"model": {"type": "llama", "n_head": 6, "n_kv_head": 3,
                                        "d_model": 96, "d_ff": 384, "vocab_size": 252,
                                        "seq_len": 96}})";
  CHECK(mesh_error(gqa, 2) ==
        pre + "2 and model.n_kv_head (3) must divide one another: KV heads are split over the "
              "tensor ranks or replicated on them");
  CHECK(mesh_error(gqa, 3) == "(no error)");
  CHECK(mesh_error(gqa, 6) == "(no error)");  // replicated: 6 % 3 == 0
  CHECK(mesh_error(R"({"model": {"type": "llama", "n_head": 4, "n_kv_head": 2,
                                 "d_model": 64}})", 4) == "(no error)");
  // gpt2 has no KV heads of its own.
  CHECK(mesh_error(R"({"model": {"n_head": 6, "d_model": 96, "d_ff": 384,
                                 "vocab_size": 252, "seq_len": 96}})", 6) == "(no error)");
  // Pipeline parallelism: its keys' rules between them (the world size is train()'s check).
  CHECK(error_of(R"({"parallelism": {"pipeline_parallel_degree": 2}})") == "(no error)");
  CHECK(error_of(R"({"parallelism": {"pipeline_parallel_degree": 2,
                                     "pipeline_parallel_virtual_stages": 2}})") ==
        "config: cfg.json: parallelism.pipeline_parallel_virtual_stages: more than one stage per "
        "rank needs an interleaved schedule (Interleaved1F1B, InterleavedZeroBubble), not 1F1B");
  CHECK(error_of(R"({"parallelism": {"pipeline_parallel_degree": 2,
                                     "pipeline_parallel_split_points": [2, 3]}})") ==
        "config: cfg.json: parallelism.pipeline_parallel_split_points: 2 stages need 1 split "
        "points, got 2");
  CHECK(error_of(R"({"gradient_accumulation_steps": 3,
                     "parallelism": {"pipeline_parallel_degree": 2,
                                     "pipeline_parallel_schedule": "Interleaved1F1B"}})") ==
        "config: cfg.json: gradient_accumulation_steps: an interleaved schedule runs "
        "micro-batches in groups of the pipeline degree (2), got 3");
  CHECK_THAT(error_of(R"({"parallelism": {"pipeline_parallel_split_points": [3, 2]}})"),
             Catch::Contains("pipeline_parallel_split_points[1]: split points must increase"));
  CHECK_THAT(error_of(R"({"parallelism": {"pipeline_parallel_schedule": "Zigzag"}})"),
             Catch::Contains("parallelism.pipeline_parallel_schedule"));
  // Local SGD: replica groups need HYBRID_SHARD or NO_SHARD; fragments divide the round.
  CHECK(error_of(R"({"local_sgd": {"sync_every": 4}})") ==
        "config: cfg.json: local_sgd.sync_every: replica groups train apart: needs "
        "sharding_strategy HYBRID_SHARD (replicas of shard_group_size ranks) or NO_SHARD (every "
        "rank a replica), not FULL_SHARD");
  CHECK(error_of(R"({"zero_optimization": {"stage": 0},
                     "local_sgd": {"sync_every": 4, "fragments": 3}})") ==
        "config: cfg.json: local_sgd.fragments: 3 does not divide sync_every (4)");
  CHECK(error_of(R"({"zero_optimization": {"stage": 0}, "local_sgd": {"sync_every": 4}})") ==
        "(no error)");
  // A TrainConfig built in code gets the same line.
  TrainConfig c;
  c.parallelism.tensor = 3;
  try {
    validate_config(c, 3);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          "config: TrainConfig: " + kTp +
              ": 3 does not divide model.n_head (4): each tensor rank holds whole attention heads");
  }
}

TEST_CASE("parallelism: the batch and HYBRID_SHARD's group are per data-parallel rank") {
  // 8 ranks at tensor 2: 4 data-parallel ranks of micro-batch 2 -> 16 rows in 2 micro-steps.
  TrainConfig c = parse_config(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2})",
                               "cfg.json", {kTp + "=2"}, 8);
  CHECK(c.grad_accum == 2);
  c = parse_config(R"({"train_batch_size": 16, "gradient_accumulation_steps": 1})", "cfg.json",
                   {kTp + "=4"}, 8);
  CHECK(c.micro_batch == 8);
  CHECK(mesh_error(R"({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4})", 2, 4) ==
        "config: cfg.json: train_batch_size: 6 is not a multiple of "
        "train_micro_batch_size_per_gpu (4) * data-parallel size (2)");
  // The policy shards over the 2 data-parallel ranks of 4 at tensor 2.
  const std::string hybrid = R"({"sharding_strategy": "HYBRID_SHARD", "shard_group_size": 4})";
  CHECK(mesh_error(hybrid, 1, 4) == "(no error)");
  CHECK(mesh_error(hybrid, 2, 4) ==
        "config: cfg.json: shard_group_size: must divide the data-parallel size (world size / "
        "tensor degree = 2), got 4");
  CHECK(mesh_error(R"({"sharding_strategy": "HYBRID_SHARD", "shard_group_size": 2})", 2, 4) ==
        "(no error)");
  // A world the degree does not divide is train()'s error (the reader may run without the
  // launcher, as `shardwise plan` does).
  CHECK(mesh_error("{}", 2, 3) == "(no error)");
}

TEST_CASE("parallelism: what tensor parallelism does not do yet is refused, one line each") {
  TrainConfig c = parse("{}", {kTp + "=2"});
  const std::string pre = "config: cfg.json: ";
  const std::string tp = " with parallelism.tensor_parallel_degree 2 is not implemented yet; ";
  CHECK(refusal(c, "train") == "(no error)");
  // sample and eval run the whole model on one rank (a note; engine_mpi_tensor checks them).
  CHECK(refusal(c, "sample") == "(no error)");
  CHECK(refusal(c, "eval") == "(no error)");
  // Starting from weights works on logical tensors (engine_mpi_tensor checks it).
  TrainConfig init = c;
  init.checkpoint.init_from = "w.safetensors";
  CHECK(refusal(init, "train") == "(no error)");
  struct Case {
    const char* name;
    void (*set)(TrainConfig&);
    std::string message;
  };
  // Checkpoints save and resume across mesh shapes (tp_ckpt_np4, tp_ckpt_train).
  TrainConfig ck = c;
  ck.checkpoint.every_steps = 10;
  ck.checkpoint.resume = "auto";
  CHECK(refusal(ck, "train") == "(no error)");
  const std::vector<Case> cases = {
      {"device", [](TrainConfig& k) { k.device = "cuda"; },
       "device: 'cuda' (not yet run on a GPU)" + tp + "use cpu"},
      {"offload_param", [](TrainConfig& k) {
         k.sharding.offload_param.device = OffloadDevice::Nvme;
       },
       "zero_optimization.offload_param.device: nvme" + tp + "use none or cpu"}};
  // "auto" keys: the planner models tensor parallelism (engine_mpi_tensor's auto runs).
  TrainConfig au = c;
  au.autoplan.checkpointing = true;
  CHECK(refusal(au, "train") == "(no error)");
  for (const Case& k : cases) {
    INFO(k.name);
    TrainConfig x = c;
    k.set(x);
    CHECK(refusal(x, "train") == pre + k.message);
    x.parallelism.tensor = 1;  // nothing is refused at degree 1
    CHECK(refusal(x, "train") == "(no error)");
    CHECK(refusal(x, "sample") == "(no error)");
  }
}

TEST_CASE("parallelism: train() refuses a world the tensor degree does not divide") {
  // One process (no launcher): a world of 1 rank; refused before any data is read.
  TrainConfig c = parse(R"({"data": {"train": "no_such_file.bin"}})", {kTp + "=2"});
  try {
    train(c, enginetest::quiet_options(false));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "config: cfg.json: " + kTp +
                                       ": 2 does not divide the world size (1 rank)");
  }
  // What is not implemented comes first: refused before the world is looked at.
  c.device = "cuda";
  try {
    train(c, enginetest::quiet_options(false));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("device: 'cuda' (not yet run on a GPU) with parallelism"));
  }
}
