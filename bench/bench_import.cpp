// Peak memory of importing a Hugging Face directory (checkpoint/hf_import.h), per rank, against
// the rank's shards: each rank reads only the tensors it holds part of, one at a time, so the
// import should hold at most one tensor (fp32) beyond what the rank already holds.
//
//   bench_import write DIR [--layers 2] [--d 4096] [--ff 11008] [--heads 32] [--vocab 32000]
//       writes DIR/config.json (LlamaForCausalLM, Llama-2-7B widths by default) and
//       DIR/model.safetensors in BF16 with our SafeTensorsWriter (constant values: only the
//       sizes matter here)
//   mpirun -np 2 bench_import import DIR
//       each rank: builds the model from config.json, shards it (FULL_SHARD), resets the peak
//       RSS (/proc/self/clear_refs 5), imports, and prints its RSS before, its peak during
//       the import, the difference, its shard bytes (fp32 master), the largest tensor (fp32)
//       and how many tensors it read.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/export.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/safetensors.h"
#include "core/dtype.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"

using namespace sw;

namespace {

// A /proc/self/status field in bytes (VmRSS, VmHWM).
int64_t status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key) + 1) * 1024;
  return -1;
}

double gib(int64_t b) { return double(b) / double(1 << 30); }

int write_dir(const std::string& dir, int argc, char** argv) {
  int layers = 2, d = 4096, ff = 11008, heads = 32, vocab = 32000;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--layers") layers = v;
    else if (a == "--d") d = v;
    else if (a == "--ff") ff = v;
    else if (a == "--heads") heads = v;
    else if (a == "--vocab") vocab = v;
  }
  std::string cmd = "mkdir -p '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) return 1;
  std::ofstream(dir + "/config.json")
      << "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": " << d
      << ", \"intermediate_size\": " << ff << ", \"num_hidden_layers\": " << layers
      << ", \"num_attention_heads\": " << heads << ", \"num_key_value_heads\": " << heads
      << ", \"vocab_size\": " << vocab
      << ", \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
         " \"tie_word_embeddings\": false, \"hidden_act\": \"silu\", \"torch_dtype\": "
         "\"bfloat16\"}\n";
  Model m = build_model(read_hf_config(dir).model);
  std::vector<StTensorDesc> descs;
  int64_t total = 0;
  for (const auto& u : m.units)
    for (const ParamSpec& p : u->params()) {
      descs.push_back({p.hf_name, StDType::BF16, p.shape});
      total += numel(p.shape);
    }
  SafeTensorsWriter w(dir + "/model.safetensors", descs, {{"format", "pt"}});
  std::vector<uint16_t> chunk(size_t(1) << 22, f32_to_bf16(0.01f));
  for (int64_t done = 0; done < total;) {
    const int64_t k = std::min<int64_t>(int64_t(chunk.size()), total - done);
    w.append(chunk.data(), size_t(k) * 2);
    done += k;
    if ((done >> 22) % 64 == 0) w.start_writeback();
  }
  w.finish();
  std::printf("wrote %s: %d layers, %.2f B parameters, %.2f GiB (bf16)\n", dir.c_str(), layers,
              double(total) / 1e9, gib(total * 2));
  return 0;
}

int import_dir(const std::string& dir) {
  const GroupPtr world = world_group();
  const int W = world->size(), rank = world->rank();
  Model m = build_model(read_hf_config(dir).model);
  ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  ShardedModel sm(m, ops_for(Device::cpu()), 1, world, pol);
  int64_t shard = 0, largest = 0;
  int held = 0, all = 0;  // held: the tensors the import read on this rank
  for (int u = 0; u < sm.num_units(); ++u) {
    shard += sm.unit_layout(u).padded / W * int64_t(sizeof(float));
    for (const ParamSpec& p : sm.unit_layout(u).specs) {
      largest = std::max<int64_t>(largest, numel(p.shape) * int64_t(sizeof(float)));
      ++all;
    }
  }
  const int64_t before = status_bytes("VmRSS:");
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
  const int64_t reset = status_bytes("VmHWM:");
  import_hf_weights(sm, dir, &held);
  const int64_t peak = status_bytes("VmHWM:");
  for (int r = 0; r < W; ++r) {
    world->barrier();
    if (r != rank) continue;
    std::printf(
        "rank %d/%d: RSS before import %.3f GiB (peak reset to %.3f), peak during import %.3f "
        "GiB, +%.3f GiB; shard (fp32 master) %.3f GiB; largest tensor (fp32) %.3f GiB; read %d "
        "of %d tensors\n",
        rank, W, gib(before), gib(reset), gib(peak), gib(peak - before), gib(shard), gib(largest),
        held, all);
    std::fflush(stdout);
  }
  world->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "write") == 0) return write_dir(argv[2], argc, argv);
  if (argc >= 3 && std::strcmp(argv[1], "import") == 0) return import_dir(argv[2]);
  std::fprintf(stderr, "usage: bench_import write DIR [--layers N] | import DIR\n");
  return 2;
}
