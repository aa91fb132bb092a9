// Sharded training on a device at several ranks, on the simulated accelerator
// (tests/common/sim_device.h): every strategy's run on sim:0 (unit buffers on the device, their
// collectives through device groups — the MPI group over host staging buffers, since the sim
// has no native collectives) must equal the same run on the CPU bit for bit. Several ranks on
// one simulated device is what two ranks sharing one GPU do. Launched by mpirun (label mpi);
// every rank runs every TEST_CASE in the same order and uses CHECK only.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "common/sim_device.h"
#include "common/temp_dir.h"
#include "core/alloc.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "tests/common/mpi_test_util.h"

using namespace sw;

namespace {

struct Result {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> params;
  bool operator==(const Result& o) const {
    return losses == o.losses && norms == o.norms && params == o.params;
  }
};

Result train(const Ops& ops, const ShardingPolicy& pol, const std::string& type, int steps = 8) {
  const GroupPtr g = swtest::world();
  const int W = g->size(), r = g->rank(), B = 2, accum = 2;
  const ModelConfig mc = swtest::tiny_config(type);
  const int T = mc.seq_len;
  Model m = build_model(mc);
  ShardedModel sm(m, ops, 4242, g, pol);
  swtest::Corpus corpus(mc.vocab_size);
  std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T);
  const Batch batch{in.data(), tg.data(), B, T};
  AdamWParams ap;
  ap.weight_decay = 0.1f;
  Result res;
  for (int s = 0; s < steps; ++s) {
    sm.zero_grads();
    double loss = 0;
    for (int k = 0; k < accum; ++k) {
      corpus.fill(s, (int64_t{k} * W + r) * B, B, T, in.data(), tg.data());
      loss += sm.forward_backward(batch, 1.f / float(accum), k + 1 == accum);
    }
    res.losses.push_back(swtest::sum_doubles(*g, loss) / (W * accum));
    const double norm = sm.grad_norm();
    res.norms.push_back(norm);
    sm.optimizer_step(ap, 3e-3f, static_cast<float>(std::min(1.0, 1.0 / (norm + 1e-6))), s + 1);
  }
  sm.for_each_param([&](const ParamSpec& s, const float* p) {
    res.params[s.name].assign(p, p + numel(s.shape));
  });
  return res;
}

void same_on_device(ShardingPolicy pol) {
  for (const std::string type : {"gpt2", "llama"})
    for (DType pdt : {DType::F32, DType::BF16}) {
      for (int offload = 0; offload < 5; ++offload) {
        // 0: none; 1: activations to the host between forward and backward; 2: the AdamW
        // moments of every unit on the host (updated on the CPU); 3: the parameter and
        // gradient shards too; 4: the moments and the activations in NVMe files (fp32 with a
        // sharded strategy: the master and gradient shards too).
        ShardingPolicy p = pol;
        p.mixed_precision.param_dtype = pdt;
        p.mixed_precision.reduce_dtype = pdt;
        p.activation_checkpointing.offload_cpu = offload == 1;
        if (offload >= 2) p.offload_optimizer.device = OffloadDevice::Cpu;
        if (offload == 3) p.offload_param.device = OffloadDevice::Cpu;
        swtest::TempDir dir("device_mpi_nvme");  // one per process
        if (offload == 4) {
          p.offload_optimizer.device = OffloadDevice::Nvme;
          p.offload_optimizer.nvme_path = dir.path.string();
          p.offload_optimizer.piece_floats = 1000;
          p.activation_checkpointing.offload_nvme = true;
          p.activation_checkpointing.nvme_path = dir.path.string();
          const ShardingStrategy st = p.strategy;
          if (pdt == DType::F32 && (st == ShardingStrategy::FullShard ||
                                    st == ShardingStrategy::ShardGradOp ||
                                    st == ShardingStrategy::HybridShard)) {
            // and the master and gradient shards (ZeRO-Infinity; sharded strategies only)
            p.offload_param.device = OffloadDevice::Nvme;
            p.offload_param.nvme_path = dir.path.string();
          }
        }
        INFO(type << " " << strategy_name(p.strategy) << " " << dtype_name(pdt) << " offload case "
                  << offload << " rank " << swtest::world()->rank());
        const Result cpu = train(ops_for(Device::cpu()), p, type);
        // Host updates start late: a unit touched before its update settled reads stale values.
        setenv("SHARDWISE_HOST_UPDATE_DELAY_US", "1000", 1);
        const Result dev = train(ops_for(Device::sim(0)), p, type);
        unsetenv("SHARDWISE_HOST_UPDATE_DELAY_US");
        CHECK(cpu.losses == dev.losses);
        CHECK(cpu.norms == dev.norms);
        CHECK(cpu.params == dev.params);
        CHECK(swtest::sim_device_bytes_in_use() == 0);
      }
    }
}

}  // namespace

TEST_CASE("sim device, several ranks: FULL_SHARD equals the CPU", "[full_shard]") {
  same_on_device(ShardingPolicy::for_strategy(ShardingStrategy::FullShard));
}
TEST_CASE("sim device, several ranks: SHARD_GRAD_OP equals the CPU", "[shard_grad_op]") {
  same_on_device(ShardingPolicy::for_strategy(ShardingStrategy::ShardGradOp));
}
TEST_CASE("sim device, several ranks: SHARD_OPTIMIZER equals the CPU", "[shard_optimizer]") {
  same_on_device(ShardingPolicy::for_strategy(ShardingStrategy::ShardOptimizer));
}
TEST_CASE("sim device, several ranks: NO_SHARD equals the CPU", "[no_shard]") {
  same_on_device(ShardingPolicy::for_strategy(ShardingStrategy::NoShard));
}
TEST_CASE("sim device, several ranks: HYBRID_SHARD equals the CPU", "[hybrid_shard]") {
  ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::HybridShard);
  p.shard_group_size = swtest::world()->size() % 2 == 0 ? 2 : 1;
  same_on_device(p);
}
TEST_CASE("sim device: a device group refuses native collectives it does not have", "[errors]") {
  CHECK_THROWS_WITH(device_group(swtest::world(), Device::sim(0), DeviceComm::Native),
                    Catch::Contains("no native collectives for device sim:0"));
}
