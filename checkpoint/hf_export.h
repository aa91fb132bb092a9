// Hugging Face model directories out (issue 35): what `transformers.AutoModelForCausalLM
// .from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load with no code.
//
//   DIR/config.json                        the HF config (GPT2LMHeadModel, LlamaForCausalLM,
//                                          MistralForCausalLM, Qwen2ForCausalLM), fp32
//   DIR/model.safetensors                  the weights, when they fit in one file; else
//   DIR/model-0000k-of-0000n.safetensors   tensors in export order cut by size as transformers'
//   DIR/model.safetensors.index.json       max_shard_size does, with {metadata: {total_size},
//                                          weight_map: {tensor: file}}
//   DIR/tokenizer.json | tokenizer.model   the run's tokenizer (data.tokenizer), copied
//   DIR/tokenizer_config.json              (and special_tokens_map.json) for AutoTokenizer
//
// Each weights file is written by one rank (file k by rank k mod W), tensor by tensor as the
// model's parameters are gathered one unit at a time, so no rank holds more than one unit's
// parameters beyond what training holds; rank 0 writes the rest. The directory is written as
// DIR.tmp and renamed, so DIR exists complete or not at all (a previous DIR is replaced). Ranks
// on several hosts need DIR on a shared filesystem once the weights take several files (as
// sharded checkpoints do); in one file, rank 0 alone writes.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "models/model.h"

namespace sw {

class Group;
class ShardedModel;

// Collective: true on every rank when `v` is true on any (export_hf_dir's and
// commit_checkpoint's agreement on failure).
bool any_rank(Group& g, bool v);
// Collective: every rank's string, in rank order (commit_checkpoint's file entries, the
// pipeline stages' unit descriptions).
std::vector<std::string> all_gather_strings(Group& g, const std::string& mine);

// transformers' default max_shard_size ("5GB", decimal).
constexpr int64_t kHfDefaultShardBytes = 5'000'000'000;

struct HfExportOptions {
  int64_t max_shard_bytes = kHfDefaultShardBytes;  // checkpoint.export_shard_bytes
  std::string tokenizer;  // data.tokenizer: "" or "bytes" = no tokenizer files
};

// config.json of a model: the architecture from hf_architecture (or the type's own; Qwen2 for
// a Llama with q/k/v biases), rope_scaling as transformers 4.46 reads it, torch_dtype float32.
// Throws sw::Error("export: <where>: model.<key>: ...") for what the architecture cannot hold.
nlohmann::ordered_json hf_config_json(const ModelConfig& c, const std::string& where);

// The name a tensor (ParamSpec::hf_name) has in a directory export: the same, except that an
// untied GPT-2's base-model tensors get transformers' `transformer.` prefix (with lm_head.weight
// beside unprefixed ones, from_pretrained refuses the file as corrupted). Tied GPT-2 keeps the
// hub's own unprefixed names.
std::string hf_dir_tensor_name(const ModelConfig& c, const std::string& hf_name);

// Tensors (in file layout, F32) in export order, cut into files: a new file starts when the
// next tensor would take the current one past max_shard_bytes (a tensor larger than that gets
// a file of its own), as transformers' shard_checkpoint does.
struct HfShardPlan {
  std::vector<StTensorDesc> tensors;
  std::vector<int> file_of;        // per tensor
  std::vector<std::string> files;  // model.safetensors, or model-0000k-of-0000n.safetensors
  std::vector<size_t> first;       // per file, its first tensor (files are runs of tensors)
  uint64_t total_size = 0;         // tensor bytes, what the index's metadata says
};
HfShardPlan plan_hf_shards(std::vector<StTensorDesc> tensors, int64_t max_shard_bytes);
// The rank that writes file f of a plan, on W ranks.
inline int hf_file_rank(int f, int W) { return f % W; }

// Writes the files of `plan` that `rank` of `world` owns into `dir`, as the tensors arrive in
// plan order (put(i, data) for every i, or only those wanted(i); the others are skipped). At
// most one file is open at a time. finish() checks that every owned file was completed.
class HfShardWriter {
 public:
  HfShardWriter(const std::string& dir, const HfShardPlan& plan, int rank, int world,
                std::map<std::string, std::string> metadata);
  ~HfShardWriter();
  bool wanted(size_t i) const;
  // data: tensor i's floats in file layout.
  void put(size_t i, const float* data);
  void finish();
  // Bytes of tensor data this rank wrote.
  uint64_t bytes_written() const { return bytes_; }

 private:
  std::string dir_;
  const HfShardPlan& plan_;
  int rank_, world_;
  std::map<std::string, std::string> meta_;
  std::unique_ptr<SafeTensorsWriter> w_;
  int open_ = -1;
  size_t next_ = 0;
  uint64_t bytes_ = 0;
};

// Rank 0's part, into `dir`: config.json, the index (several files), the tokenizer's files.
void write_hf_dir_extras(const std::string& dir, const ModelConfig& c, const HfShardPlan& plan,
                         const std::string& tokenizer);

// What one rank wrote in export_hf_dir.
struct HfExportStats {
  int files = 0;       // weights files
  uint64_t bytes = 0;  // their tensor bytes
};

// Collective. Writes the HF directory `dir` of the live model (see the top of this file).
// Throws sw::Error on every rank when any rank failed (the directory then does not exist).
// Pipeline parallelism (the model is one stage, Model::stage): collective over `world`, every
// rank of the mesh (required then). The files are those of the whole model, as one rank would
// cut them; a file's tensors come from the stages holding them, each stage's part written in
// place (pwrite at the tensors' offsets) by the stage's rank that writes that file when the
// model is not split (file k: data rank k mod D), after the rank writing the file's first
// tensor has created it with its header. A unit two stages hold is written by the lower.
void export_hf_dir(const ShardedModel& model, const std::string& dir, const HfExportOptions& o,
                   HfExportStats* stats = nullptr, Group* world = nullptr);

}  // namespace sw
