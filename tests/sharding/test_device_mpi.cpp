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

#include "common/settled_step.h"
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

TEST_CASE("sim device, several ranks: the recorder gives each gather and reduction its stream's "
          "interval", "[profile]") {
  // With device times (SHARDWISE_PROFILE_DEVICE_TIMES=1; a GPU's are always on) each gather's,
  // regather's and reduce-scatter's record is settled to the interval its collective ran on the
  // device group's own stream (here the staged group's thread, which stamps it: inside when the
  // group says it ran it, Work::started_at and done_at, a gather's and a reduction's host times
  // before the settle; a regather's after its issue), named "staged comm"; the activation copies
  // on their lanes and the compute actions on the compute stream; every interval inside the
  // recorded step. (A gather the step issues for the next one stays open, on the host's times,
  // until a later segment waits for it.)
  for (const ShardingStrategy st : {ShardingStrategy::FullShard, ShardingStrategy::ShardOptimizer}) {
  setenv("SHARDWISE_PROFILE_DEVICE_TIMES", "1", 1);
  const GroupPtr g = swtest::world();
  ShardingPolicy p = ShardingPolicy::for_strategy(st);
  p.activation_checkpointing.offload_cpu = true;
  const ModelConfig mc = swtest::tiny_config("gpt2");
  const int B = 2, T = mc.seq_len;
  Model m = build_model(mc);
  ShardedModel sm(m, ops_for(Device::sim(0)), 4242, g, p);
  swtest::Corpus corpus(mc.vocab_size);
  std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T);
  const Batch batch{in.data(), tg.data(), B, T};
  corpus.fill(0, int64_t{g->rank()} * B, B, T, in.data(), tg.data());
  sm.forward_backward(batch);  // warm-up
  sm.optimizer_step(AdamWParams{}, 1e-3f, 1.f, 1);
  sm.zero_grads();
  const auto [host, settled, before, after] =
      swtest::record_settled_step(sm, batch, 2, swtest::OnCountMismatch::Continue);
  unsetenv("SHARDWISE_PROFILE_DEVICE_TIMES");
  constexpr double kTie = swtest::kSimClockTie;
  std::map<std::string, int> on;  // "<kind> on <stream>" -> records
  int gathers = 0, regathers = 0, reductions = 0;
  for (size_t i = 0; i < host.size() && i < settled.size(); ++i) {
    const ActionRecord &h = host[i], &d = settled[i];
    const std::string kind = action_kind_name(d.kind);
    INFO(strategy_name(st) << ", rank " << g->rank() << " record " << i << " " << kind
                           << ": host " << h.t_begin << ".." << h.t_end << ", settled "
                           << d.t_begin << ".." << d.t_end << " on "
                           << (d.stream ? d.stream : "-"));
    if (h.t_end < 0) {  // a gather issued for the next step, open until it is waited for
      CHECK(d.kind == ActionKind::Gather);
      CHECK(d.stream == nullptr);
      continue;
    }
    gathers += d.kind == ActionKind::Gather;
    regathers += d.kind == ActionKind::Regather;
    reductions += d.kind == ActionKind::ReduceScatter;
    CHECK(d.t_begin >= before);
    CHECK(d.t_end <= after + kTie);
    CHECK(d.t_begin <= d.t_end);
    CHECK(d.stream != nullptr);
    if (!d.stream) continue;
    ++on[kind + " on " + d.stream];
    if (swtest::check_sim_stream_record(host, settled, i)) continue;
    if (d.kind == ActionKind::Regather) {
      CHECK(std::string(d.stream) == "staged comm");
      CHECK(d.t_begin >= h.t_begin);
    } else {
      CHECK(std::string(d.stream) == "sim");
    }
  }
  INFO(strategy_name(st));
  CHECK(gathers + regathers > 0);
  CHECK(reductions > 0);
  CHECK(on["gather on staged comm"] == gathers);
  CHECK(on["regather on staged comm"] == regathers);
  CHECK(on["reduce_scatter on staged comm"] == reductions);
  CHECK(on["evict_acts on sim copy d2h"] > 0);
  }
}
