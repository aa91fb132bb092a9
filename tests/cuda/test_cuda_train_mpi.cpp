// Two ranks sharing one GPU (label cuda; launched by mpirun with 2 ranks; exit 77 without a
// GPU): every rank uses the same device (SHARDWISE_CUDA_DEVICE=0), NCCL refuses a shared GPU,
// so device_comm auto stages the collectives through MPI over pinned host memory. Each
// strategy's run at 2 ranks on the GPU must match the same run at 2 ranks on the CPU (fp32:
// 1e-4 relative per step; the data each rank sees and the reduction order are the same, only
// the kernels' summation orders differ), and repeat bit for bit.
#include <algorithm>
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_runtime.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "tests/common/mpi_test_util.h"

using namespace sw;

namespace {

struct Run {
  std::vector<double> losses, norms;
};

Run train(const Ops& ops, const ShardingPolicy& pol, const std::string& type) {
  const GroupPtr g = swtest::world();
  const int W = g->size(), r = g->rank(), B = 2;
  const ModelConfig mc = swtest::tiny_config(type);
  const int T = mc.seq_len;
  Model m = build_model(mc);
  ShardedModel sm(m, ops, 4242, g, pol);
  swtest::Corpus corpus(mc.vocab_size);
  std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T);
  const Batch batch{in.data(), tg.data(), B, T};
  AdamWParams ap;
  Run res;
  for (int s = 0; s < 10; ++s) {
    sm.zero_grads();
    corpus.fill(s, int64_t{r} * B, B, T, in.data(), tg.data());
    const double loss = sm.forward_backward(batch);
    res.losses.push_back(swtest::sum_doubles(*g, loss) / W);
    const double norm = sm.grad_norm();
    res.norms.push_back(norm);
    sm.optimizer_step(ap, 3e-3f, static_cast<float>(std::min(1.0, 1.0 / (norm + 1e-6))), s + 1);
  }
  return res;
}

}  // namespace

TEST_CASE("cuda, two ranks on one GPU: every strategy matches the CPU and repeats") {
  const Device gpu = Device::cuda(cuda_current_device());
  for (ShardingStrategy st : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                              ShardingStrategy::NoShard, ShardingStrategy::HybridShard})
    for (const char* type : {"gpt2", "llama"}) {
      ShardingPolicy pol = ShardingPolicy::for_strategy(st);
      if (st == ShardingStrategy::HybridShard) pol.shard_group_size = 1;
      INFO(strategy_name(st) << " " << type << " rank " << swtest::world()->rank());
      const Run cpu = train(ops_for(Device::cpu()), pol, type);
      const Run a = train(ops_for(gpu), pol, type);
      const Run b = train(ops_for(gpu), pol, type);
      double w = 0;
      for (size_t i = 0; i < cpu.losses.size(); ++i)
        w = std::max(w, std::fabs(a.losses[i] - cpu.losses[i]) / std::fabs(cpu.losses[i]));
      INFO("worst relative loss difference " << w);
      CHECK(w < 1e-4);
      CHECK(a.losses == b.losses);
      CHECK(a.norms == b.norms);
    }
}

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device: skipping the shared-GPU training tests\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
