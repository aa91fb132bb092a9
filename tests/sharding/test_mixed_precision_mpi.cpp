// Mixed precision across ranks, run by ctest through `mpirun -np N` (label mpi). Every rank runs
// every TEST_CASE in the same order and only uses CHECK, so a failure never strands a peer.
//
// Parity: N ranks (micro-batch 2 each) train a tiny GPT-2 and a tiny Llama for 20 steps with a
// mixed-precision policy, and each rank also trains the same model alone on the same global
// batch with the same policy; losses, gradient norms and final fp32 masters must agree.
// Where the two differ: the one-rank run rounds the whole batch's gradient to reduce_dtype
// once, N ranks round each rank's gradient and then each hop of the reduction (fp32
// accumulation, rounding per hop), so gradients differ by a few reduce_dtype ulps; a master
// that moves across a rounding boundary then changes one gathered parameter by one ulp.
// Tolerances (relative; parameters relative to 1 + |p|), 20 steps at lr 3e-3, set from the
// worst values observed at 2 and 4 ranks with the real bf16/fp16 matrix products of
// ops_for(cpu, BF16/F16), whose operand rounding turns fp32-level differences of the reduction
// order into whole 16-bit ulps of activations:
//   reduce_dtype fp32: loss 3e-4, grad norm 5e-3 (observed 5e-5, 1.6e-3);
//   reduce_dtype bf16/fp16: loss 1e-3, grad norm 3e-2 (observed 2e-4, 8.4e-3);
//   parameters: RMS difference 2e-3 / 4e-3 (observed 6e-4 / 8e-4), and the worst single
//   parameter 5e-2 (observed 3.5e-2): Adam turns sign noise in near-zero gradients (GPT-2's
//   biases) into lr-sized steps, so one parameter may drift by a good part of 20 * lr = 0.06
//   while the RMS stays small.
// A wrong averaging factor or a lost gradient block moves the norms by far more.
// Bytes: parameters gathered in bf16 move exactly half the bytes of fp32 (CommStats), and so
// do bf16 reductions. Exactness: the parameters a unit sees are exactly the bf16 rounding of
// the fp32 masters, for sharded (FULL_SHARD), stage 1 and NO_SHARD layouts, after steps.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/env.h"
#include "core/rng.h"
#include "kernels/fp8_ops.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "tests/common/mpi_test_util.h"

using namespace sw;

namespace {

using swtest::Corpus;
using swtest::cpu;
using swtest::sum_doubles;
using swtest::world;

ModelConfig tiny(const std::string& type) { return swtest::tiny_config(type); }

MixedPrecisionPolicy mp(DType param, DType reduce) {
  MixedPrecisionPolicy m;
  m.param_dtype = param;
  m.reduce_dtype = reduce;
  return m;
}

struct RunResult {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> params;
};

// The trainer's loop in miniature (AdamW, clipping at 1). fp16 runs scale the loss by 1024
// and unscale through grad_mult, as the trainer does.
RunResult train(GroupPtr g, ShardingPolicy pol, const ModelConfig& mc, int B, int accum,
                int steps = 20) {
  const int W = g->size(), r = g->rank(), T = mc.seq_len;
  Model m = build_model(mc);
  ShardedModel sm(m, cpu(), 4242, g, pol);
  Corpus corpus(mc.vocab_size);
  std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T);
  const Batch batch{in.data(), tg.data(), B, T};
  const bool f16 = pol.mixed_precision.param_dtype == DType::F16 ||
                   pol.mixed_precision.reduce_dtype == DType::F16;
  const float scale = f16 ? 1024.f : 1.f;
  AdamWParams ap;
  RunResult res;
  for (int s = 0; s < steps; ++s) {
    sm.zero_grads();
    double loss = 0;
    for (int k = 0; k < accum; ++k) {
      corpus.fill(s, (int64_t{k} * W + r) * B, B, T, in.data(), tg.data());
      loss += sm.forward_backward(batch, scale / float(accum), k + 1 == accum);
    }
    res.losses.push_back(sum_doubles(*g, loss) / (W * accum));
    const double norm = sm.grad_norm() / scale;
    res.norms.push_back(norm);
    const float mult = static_cast<float>(std::min(1.0, 1.0 / (norm + 1e-6)) / scale);
    sm.optimizer_step(ap, 3e-3f, mult, s + 1);
  }
  sm.for_each_param([&](const ParamSpec& s, const float* p) {
    res.params[s.name].assign(p, p + numel(s.shape));
  });
  return res;
}

// Tolerances: see the file's header.
void check_close(const RunResult& a, const RunResult& ref, const std::string& what,
                 bool reduced_in_16) {
  INFO(what << " (rank " << world()->rank() << ")");
  // Every variant computes in bf16/fp16 (real rounding of the matrix products' operands), so
  // fp32-level differences in the reduction order flip some roundings and Adam turns the sign
  // noise of near-zero gradients into steps of the learning rate's size: the worst single
  // parameter may drift by a good part of 20 * lr = 0.06, while the RMS difference stays small.
  const double tol_loss = reduced_in_16 ? 1e-3 : 3e-4, tol_norm = reduced_in_16 ? 3e-2 : 5e-3,
               tol_param = 5e-2, tol_rms = reduced_in_16 ? 4e-3 : 2e-3;
  double ss = 0, nparam = 0;
  CHECK(a.losses.size() == ref.losses.size());
  double worst_loss = 0, worst_norm = 0, worst_param = 0;
  for (size_t i = 0; i < std::min(a.losses.size(), ref.losses.size()); ++i) {
    worst_loss =
        std::max(worst_loss, std::fabs(a.losses[i] - ref.losses[i]) / std::fabs(ref.losses[i]));
    worst_norm =
        std::max(worst_norm, std::fabs(a.norms[i] - ref.norms[i]) / std::fabs(ref.norms[i]));
  }
  for (const auto& [name, pr] : ref.params) {
    auto it = a.params.find(name);
    CHECK(it != a.params.end());
    if (it == a.params.end() || it->second.size() != pr.size()) continue;
    for (size_t i = 0; i < pr.size(); ++i) {
      const double d = double(it->second[i]) - pr[i];
      worst_param = std::max(worst_param, std::fabs(d) / (1.0 + std::fabs(pr[i])));
      ss += d * d, nparam += 1;
    }
  }
  const double rms = nparam > 0 ? std::sqrt(ss / nparam) : 0;
  INFO("worst relative loss error " << worst_loss << ", grad norm " << worst_norm
                                    << ", parameter " << worst_param << ", parameter rms " << rms);
  CHECK(std::isfinite(worst_loss));
  CHECK(worst_loss < tol_loss);
  CHECK(worst_norm < tol_norm);
  CHECK(worst_param < tol_param);
  CHECK(rms < tol_rms);
  if (sw::env_flag("SHARDWISE_TEST_PARITY_VERBOSE") && world()->rank() == 0)
    std::printf("%-56s loss %.2e  norm %.2e  param %.2e  rms %.2e\n", what.c_str(), worst_loss,
                worst_norm, worst_param, rms);
}

void parity(ShardingPolicy pol) {
  const GroupPtr g = world();
  const int W = g->size(), B = 2;
  struct Variant {
    DType param, reduce;
    const char* name;
  };
  for (const Variant v : {Variant{DType::BF16, DType::F32, "bf16/fp32"},
                          Variant{DType::BF16, DType::BF16, "bf16/bf16"},
                          Variant{DType::F16, DType::F16, "fp16/fp16"}}) {
    for (const std::string type : {"gpt2", "llama"}) {
      ShardingPolicy p = pol;
      p.mixed_precision = mp(v.param, v.reduce);
      ShardingPolicy one = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
      one.mixed_precision = p.mixed_precision;
      const std::string base = std::string(strategy_name(pol.strategy)) +
                               " W=" + std::to_string(W) + " " + type + " " + v.name;
      const bool r16 = v.reduce != DType::F32;
      check_close(train(g, p, tiny(type), B, 1), train(make_local_group(), one, tiny(type), W * B, 1),
                  base + " accum=1", r16);
      if (type == "gpt2") {  // accumulation, in the strategy's non-default mode
        p.accum = p.accum == GradAccumMode::ReduceOnce ? GradAccumMode::ReduceEachMicroStep
                                                       : GradAccumMode::ReduceOnce;
        one.accum = p.accum;
        check_close(train(g, p, tiny(type), B, 2),
                    train(make_local_group(), one, tiny(type), W * B, 2),
                    base + " accum=2 " + accum_mode_name(p.accum), r16);
      }
    }
  }
}

// Records the parameters a unit computes with (its forward's ctx.params), per name.
struct Recorder : Unit {
  std::unique_ptr<Unit> inner;
  std::map<std::string, std::vector<float>>* out;
  Recorder(std::unique_ptr<Unit> u, std::map<std::string, std::vector<float>>* o)
      : inner(std::move(u)), out(o) {}
  std::string name() const override { return inner->name(); }
  std::vector<ParamSpec> params() const override { return inner->params(); }
  int num_calls() const override { return inner->num_calls(); }
  void forward(UnitCtx& ctx, int call, const float* x, float* y) override {
    const std::vector<ParamSpec> specs = inner->params();
    // A product's weight may be held 16-bit only (MixedPrecisionPolicy::weights16: the CPU's
    // oneDNN bf16 path, a device): its values widened.
    const DType dt = ctx.ops->compute();
    for (size_t i = 0; i < specs.size(); ++i) {
      const Operand w = ctx.weight(i);
      std::vector<float>& v = (*out)[specs[i].name];
      const size_t n = size_t(numel(specs[i].shape));
      if (w.f32) {
        v.assign(w.f32, w.f32 + n);
        continue;
      }
      v.resize(n);
      for (size_t j = 0; j < n; ++j)
        v[j] = dt == DType::BF16 ? bf16_to_f32(w.lp[j]) : f16_to_f32(w.lp[j]);
    }
    inner->forward(ctx, call, x, y);
  }
  void backward(UnitCtx& ctx, int call, const float* x, const float* dy, float* dx) override {
    inner->backward(ctx, call, x, dy, dx);
  }
};

ShardingPolicy hybrid_policy() {
  ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::HybridShard);
  p.shard_group_size = world()->size() % 2 == 0 && world()->size() > 2 ? 2 : 1;
  return p;
}

}  // namespace

TEST_CASE("mixed precision FULL_SHARD matches one rank", "[mp_full_shard]") {
  parity(ShardingPolicy::for_strategy(ShardingStrategy::FullShard));
  // Prefetch changes when data moves, never the arithmetic: bit-identical runs.
  ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  p.mixed_precision = mp(DType::BF16, DType::BF16);
  const RunResult a = train(world(), p, tiny("gpt2"), 2, 2, 6);
  p.forward_prefetch = 0, p.backward_prefetch = 0;
  const RunResult b = train(world(), p, tiny("gpt2"), 2, 2, 6);
  p.forward_prefetch = 3, p.backward_prefetch = 3, p.max_live_units = 2;
  const RunResult c = train(world(), p, tiny("gpt2"), 2, 2, 6);
  CHECK((a.losses == b.losses && a.norms == b.norms && a.params == b.params));
  CHECK((a.losses == c.losses && a.norms == c.norms && a.params == c.params));
}

TEST_CASE("mixed precision keeps the fp32 model state: a split master costs what it says",
          "[mp_memory]") {
  const GroupPtr g = world();
  const int W = g->size();
  MemTracker& mt = MemTracker::global();
  const ModelConfig mc = tiny("gpt2");
  Model probe = build_model(mc);
  int64_t full = 0, shard = 0;  // floats summed over units: padded for one rank, shard for W
  // Where units keep 16-bit weight copies (MixedPrecisionPolicy::weights16: the CPU's oneDNN
  // bf16 path), a persistent full compute copy is the compact fp32 buffer (FlatLayout::compact)
  // plus the 16-bit copy (2 bytes a value: padded / 2 floats); a sharded unit's gathered copy
  // stays transient.
  int64_t compact1 = 0, fullW = 0, compactW = 0;
  for (auto& u : probe.units) {
    const FlatLayout l1 = FlatLayout::build(u->params(), 1), lW = FlatLayout::build(u->params(), W);
    full += l1.padded, compact1 += l1.compact;
    shard += lW.shard_size(), fullW += lW.padded, compactW += lW.compact;
  }
  const bool w16 = mp(DType::BF16, DType::BF16).weights16(false);
  const int64_t copy1 = w16 ? compact1 + full / 2 : full;    // a one-rank-layout compute copy
  const int64_t copyW = w16 ? compactW + fullW / 2 : fullW;  // a W-rank-layout one
  struct Expect {
    ShardingStrategy s;
    int64_t params, grads, optim;  // floats; sharing the fp32 table's except where noted
  };
  const bool one = W == 1;
  for (const Expect& e : {
           // sharded: unchanged (the gathered copy is transient Communication)
           Expect{ShardingStrategy::FullShard, one ? full + copy1 : shard, one ? full : shard,
                  one ? 2 * full : 2 * shard},
           // stage 1: the master gets its own shard buffer beside the full compute copy
           Expect{ShardingStrategy::ShardOptimizer, one ? full + copy1 : copyW + shard,
                  one ? full : shard * W + shard, one ? 2 * full : 2 * shard},
           // NO_SHARD / one rank: master + rounded compute copy
           Expect{ShardingStrategy::NoShard, full + copy1, full, 2 * full}}) {
    INFO(strategy_name(e.s) << " W=" << W);
    const size_t p0 = mt.current(Mem::Params), g0 = mt.current(Mem::Grads),
                 o0 = mt.current(Mem::Optimizer);
    ShardingPolicy p = ShardingPolicy::for_strategy(e.s);
    p.mixed_precision = mp(DType::BF16, DType::BF16);
    Model m = build_model(mc);
    ShardedModel sm(m, cpu(), 1, g, p);
    CHECK(mt.current(Mem::Params) - p0 == size_t(e.params) * 4);
    CHECK(mt.current(Mem::Grads) - g0 == size_t(e.grads) * 4);
    CHECK(mt.current(Mem::Optimizer) - o0 == size_t(e.optim) * 4);
  }
}

TEST_CASE("mixed precision SHARD_GRAD_OP matches one rank", "[mp_shard_grad_op]") {
  parity(ShardingPolicy::for_strategy(ShardingStrategy::ShardGradOp));
}

TEST_CASE("mixed precision SHARD_OPTIMIZER matches one rank", "[mp_shard_optimizer]") {
  parity(ShardingPolicy::for_strategy(ShardingStrategy::ShardOptimizer));
}

TEST_CASE("mixed precision NO_SHARD matches one rank", "[mp_no_shard]") {
  ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::NoShard);
  p.bucket_bytes = 16 << 10;  // several buckets
  parity(p);
}

TEST_CASE("mixed precision HYBRID_SHARD matches one rank", "[mp_hybrid_shard]") {
  parity(hybrid_policy());
}

TEST_CASE("bf16 gathers and reductions move half the bytes of fp32", "[mp_bytes]") {
  const GroupPtr g = world();
  const ModelConfig mc = tiny("gpt2");
  std::vector<int32_t> tok(2 * 16, 5);
  const Batch batch{tok.data(), tok.data(), 2, 16};
  for (ShardingStrategy st : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                              ShardingStrategy::NoShard}) {
    INFO(strategy_name(st));
    double eval_bytes[2], fb_bytes[2];
    for (int half = 0; half < 2; ++half) {
      ShardingPolicy p = ShardingPolicy::for_strategy(st);
      if (half) p.mixed_precision = mp(DType::BF16, DType::BF16);
      Model m = build_model(mc);
      ShardedModel sm(m, cpu(), 7, g, p);
      sm.reset_comm_stats();
      sm.eval_loss(batch);  // only parameter gathers
      eval_bytes[half] = sm.comm_stats().bytes;
      sm.reset_comm_stats();
      sm.forward_backward(batch);  // gathers and gradient reductions
      fb_bytes[half] = sm.comm_stats().bytes;
    }
    if (st == ShardingStrategy::NoShard) {
      CHECK(eval_bytes[0] == 0);  // nothing to gather
      CHECK(eval_bytes[1] == 0);
    } else {
      CHECK(eval_bytes[0] > 0);
      CHECK(eval_bytes[1] * 2 == eval_bytes[0]);
    }
    CHECK(fb_bytes[0] > 0);
    CHECK(fb_bytes[1] * 2 == fb_bytes[0]);
  }
}

TEST_CASE("units compute with exactly the bf16 / fp16 rounding of the fp32 masters",
          "[mp_exact]") {
  const GroupPtr g = world();
  const ModelConfig mc = tiny("gpt2");
  Corpus corpus(mc.vocab_size);
  for (DType dt : {DType::BF16, DType::F16})
    for (ShardingStrategy st : {ShardingStrategy::FullShard, ShardingStrategy::ShardOptimizer,
                                ShardingStrategy::NoShard}) {
      INFO(strategy_name(st) << " " << dtype_name(dt));
      ShardingPolicy p = ShardingPolicy::for_strategy(st);
      p.mixed_precision = mp(dt, dt);
      std::map<std::string, std::vector<float>> seen;
      Model m = build_model(mc);
      for (auto& u : m.units) u = std::make_unique<Recorder>(std::move(u), &seen);
      ShardedModel sm(m, cpu(), 11, g, p);
      std::vector<int32_t> in(2 * 16), tg(2 * 16);
      const Batch batch{in.data(), tg.data(), 2, 16};
      const float scale = dt == DType::F16 ? 256.f : 1.f;
      for (int s = 0; s < 3; ++s) {  // after optimizer steps too: the refreshed copies
        corpus.fill(s, g->rank() * 2, 2, 16, in.data(), tg.data());
        sm.zero_grads();
        sm.forward_backward(batch, scale);
        sm.optimizer_step(AdamWParams{}, 1e-2f, 1.f / scale, s + 1);
      }
      for (int round = 0; round < 2; ++round) {
        if (round == 1) {  // set_param (checkpoint import) refreshes master and copy alike
          std::vector<float> w;
          sm.for_each_param([&](const ParamSpec& spec, const float* master) {
            if (spec.name == "h.0.mlp.c_fc.weight") w.assign(master, master + numel(spec.shape));
          });
          REQUIRE(!w.empty());
          for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * w[i] + 1e-4f * float(i % 7);
          sm.set_param("h.0.mlp.c_fc.weight", w.data(), int64_t(w.size()));
        }
        seen.clear();
        sm.eval_loss(batch);
        size_t checked = 0, wrong = 0, moved = 0;
        sm.for_each_param([&](const ParamSpec& spec, const float* master) {
          const auto it = seen.find(spec.name);
          CHECK(it != seen.end());
          if (it == seen.end()) return;
          for (int64_t i = 0; i < numel(spec.shape); ++i) {
            const float r = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(master[i]))
                                              : f16_to_f32(f32_to_f16(master[i]));
            wrong += it->second[size_t(i)] != r;
            moved += r != master[i];
            ++checked;
          }
        });
        CHECK(checked == size_t(sm.num_params()));
        CHECK(wrong == 0);
        CHECK(moved > checked / 2);  // the masters really carry more precision than the copies
      }
    }
}

// fp8.all_gather (sharding/unit_state.h): the weights a unit computes with are exactly
// fp8(bf16(master) * s) / s with s the power-of-two scale of the whole tensor's amax (computed
// here from the gathered masters), the other parameters exactly bf16(master); training is
// bit-identical to the bf16 gather's with the same fp8 recipe; the gathers move about half the
// bytes.
TEST_CASE("fp8 all-gather: the fp8 rounding of the masters, bit-identical training, half the "
          "bytes", "[mp_fp8_gather]") {
  const GroupPtr g = world();
  const int W = g->size();
  auto fp8_policy = [](bool gather, ShardingStrategy st) {
    ShardingPolicy p = st == ShardingStrategy::HybridShard ? hybrid_policy()
                                                           : ShardingPolicy::for_strategy(st);
    p.mixed_precision = mp(DType::BF16, DType::BF16);
    p.mixed_precision.fp8 = true;
    p.mixed_precision.fp8_pow2 = true;
    p.mixed_precision.fp8_all_gather = gather;
    return p;
  };
  REQUIRE(fp8_policy(true, ShardingStrategy::FullShard).mixed_precision.weights16(false));
  for (const std::string type : {"gpt2", "llama"}) {
    const ModelConfig mc = tiny(type);
    const Corpus corpus(mc.vocab_size);
    INFO(type << " W=" << W);
    // (1) the values units compute with, after optimizer steps
    std::map<std::string, std::vector<float>> seen;
    Model m = build_model(mc);
    for (auto& u : m.units) u = std::make_unique<Recorder>(std::move(u), &seen);
    ShardedModel sm(m, cpu(), 11, g, fp8_policy(true, ShardingStrategy::FullShard));
    std::vector<int32_t> in(2 * 16), tg(2 * 16);
    const Batch batch{in.data(), tg.data(), 2, 16};
    for (int s = 0; s < 3; ++s) {
      corpus.fill(s, g->rank() * 2, 2, 16, in.data(), tg.data());
      sm.zero_grads();
      sm.forward_backward(batch);
      sm.optimizer_step(AdamWParams{}, 1e-2f, 1.f, s + 1);
    }
    seen.clear();
    sm.eval_loss(batch);
    // Each Linear weight's amax, taken with the weights it is packed with (the Llama's q|k|v,
    // gate|up: one tensor to the product, their sizes here keep them contiguous).
    std::vector<float> amax;
    std::vector<int> group;
    sm.for_each_param([&](const ParamSpec& spec, const float* master) {
      float am = 0;
      for (int64_t i = 0; i < numel(spec.shape); ++i) am = std::max(am, std::fabs(master[i]));
      const bool joins = spec.linear && spec.packed_with_previous && !group.empty();
      group.push_back(joins ? group.back() : int(amax.size()));
      if (joins)
        amax[size_t(group.back())] = std::max(amax[size_t(group.back())], am);
      amax.push_back(am);
    });
    size_t checked = 0, wrong = 0, fp8_vals = 0, coarser = 0, k = 0;
    sm.for_each_param([&](const ParamSpec& spec, const float* master) {
      const float am = amax[size_t(group[k++])];
      const auto it = seen.find(spec.name);
      CHECK(it != seen.end());
      if (it == seen.end()) return;
      const float sc = sw::fp8_scale(bf16_to_f32(f32_to_bf16(am)), sw::Fp8Format::E4M3, true);
      for (int64_t i = 0; i < numel(spec.shape); ++i) {
        const float b = bf16_to_f32(f32_to_bf16(master[i]));
        const float want = spec.linear ? sw::round_fp8(b * sc, sw::Fp8Format::E4M3) / sc : b;
        wrong += it->second[size_t(i)] != want;
        fp8_vals += spec.linear;
        coarser += spec.linear && want != b;
        ++checked;
      }
    });
    CHECK(checked == size_t(sm.num_params()));
    CHECK(wrong == 0);
    CHECK(fp8_vals > checked / 2);  // the blocks' weights went fp8
    CHECK(coarser > fp8_vals / 2);  // and fp8 is coarser than bf16
    // (2) bit-identical to the bf16 gather with the same recipe, FULL_SHARD, SHARD_GRAD_OP and
    // HYBRID_SHARD (at 4 ranks: shard groups of 2, so the gather runs inside each)
    for (ShardingStrategy st : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                                ShardingStrategy::HybridShard}) {
      INFO(strategy_name(st));
      for (int accum : {1, 2}) {  // (2: the gathers of several micro-steps reuse the scales)
        const RunResult a = train(g, fp8_policy(false, st), mc, 2, accum, 6);
        const RunResult b = train(g, fp8_policy(true, st), mc, 2, accum, 6);
        CHECK(a.losses == b.losses);
        CHECK(a.norms == b.norms);
        CHECK(a.params == b.params);
      }
    }
    // (3) bytes of an evaluation's gathers: a Linear weight's values 1 byte, the rest of the
    // padded buffer 2, plus every slot's rounding to 4 bytes, the amaxes' all-reduce (4 bytes
    // a tensor) and the slots' imbalance (each is as large as the largest rank's: within 2%
    // here); against the bf16 gather's 2 bytes a value
    double bytes[2];
    int64_t lower = 0, slack = 0;
    for (auto& u : build_model(mc).units) {
      const FlatLayout l = FlatLayout::build(u->params(), W);
      int64_t lin = 0, tensors = 0;
      for (const ParamSpec& ps : l.specs) lin += ps.linear ? numel(ps.shape) : 0;
      for (const ParamSpec& ps : l.specs) tensors += ps.linear;
      lower += lin + 2 * (l.padded - lin);
      slack += lin > 0 ? 4 * W + 4 * tensors : 0;
    }
    for (int gather = 0; gather < 2; ++gather) {
      Model mm = build_model(mc);
      ShardedModel s2(mm, cpu(), 7, g, fp8_policy(gather == 1, ShardingStrategy::FullShard));
      s2.reset_comm_stats();
      s2.eval_loss(batch);
      bytes[gather] = s2.comm_stats().bytes;
    }
    INFO("bf16 gather " << bytes[0] << " bytes, fp8 " << bytes[1] << ", lower bound " << lower);
    if (W > 1) {
      CHECK(bytes[1] >= double(lower));
      CHECK(bytes[1] <= double(lower + slack) + 0.02 * double(lower));
      CHECK(bytes[1] < 0.6 * bytes[0]);
      if (g->rank() == 0 && sw::env_flag("SHARDWISE_TEST_PARITY_VERBOSE"))
        std::printf("%s W=%d: fp8 gather %.0f bytes, bf16 %.0f (%.3f)\n", type.c_str(), W,
                    bytes[1], bytes[0], bytes[1] / bytes[0]);
    } else {
      CHECK(bytes[1] == bytes[0]);
    }
  }
}

TEST_CASE("the gradient norm is the parameters' gradients' alone, step after step", "[mp_gaps]") {
  // The norm sums whole gradient shards, alignment gaps and padding included, which must stay
  // zero: a 16-bit reduction packs the gradients in place, and gradients zeroed lazily
  // (FlatUnit's unwritten gradients) keep whatever a range held until it is written. Three
  // steps, each norm against the sum over for_each_grad's parameters. d_model 24: every norm
  // weight and bias is followed by a gap of 8 floats.
  const GroupPtr g = world();
  for (ShardingStrategy st : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                              ShardingStrategy::ShardOptimizer, ShardingStrategy::NoShard,
                              ShardingStrategy::HybridShard})
    for (const std::string type : {"gpt2", "llama"}) {
      ShardingPolicy p = st == ShardingStrategy::HybridShard ? hybrid_policy()
                                                             : ShardingPolicy::for_strategy(st);
      p.mixed_precision = mp(DType::BF16, DType::BF16);
      ModelConfig mc = tiny(type);
      mc.d_model = 24;
      mc.n_head = 2;
      mc.n_kv_head = type == "llama" ? 1 : 0;
      Model m = build_model(mc);
      ShardedModel sm(m, cpu(), 7, g, p);
      Corpus corpus(mc.vocab_size);
      const int B = 2, T = mc.seq_len;
      std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T);
      for (int step = 0; step < 3; ++step) {
        INFO(strategy_name(st) << " " << type << " step " << step);
        sm.zero_grads();
        corpus.fill(step, int64_t{g->rank()} * B, B, T, in.data(), tg.data());
        sm.forward_backward(Batch{in.data(), tg.data(), B, T});
        double ss = 0;
        sm.for_each_grad([&](const ParamSpec& sp, const float* gr) {
          for (int64_t i = 0; i < numel(sp.shape); ++i) ss += double(gr[i]) * gr[i];
        });
        const double norm = sm.grad_norm();
        CHECK(ss > 0);
        CHECK(norm == Approx(std::sqrt(ss)).epsilon(1e-9));
        sm.optimizer_step(AdamWParams{}, 1e-3f, 1.f, step + 1);
      }
    }
}

TEST_CASE("fp16 reductions overflow where one rank would, not earlier", "[mp_fp16_range]") {
  // The largest |gradient| of the mean loss over the global batch (fp32, one rank) sets a
  // grad_scale that puts it at 75% or 150% of fp16's largest value (65504). N ranks must agree
  // with one rank: finite at 75% (a sum of N rank gradients divided at the end would reach
  // N x 75% and overflow), non-finite at 150%. Parameters in bf16, so only the reduction is
  // fp16.
  const GroupPtr g = world();
  const int W = g->size(), B = 2;
  const ModelConfig mc = tiny("gpt2");
  Corpus corpus(mc.vocab_size);
  const int T = mc.seq_len;
  std::vector<int32_t> in(size_t(W * B) * T), tg(size_t(W * B) * T);
  corpus.fill(0, 0, W * B, T, in.data(), tg.data());
  double gmax = 0;
  {
    Model m = build_model(mc);
    ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    p.mixed_precision = mp(DType::BF16, DType::F32);
    ShardedModel sm(m, cpu(), 3, make_local_group(), p);
    sm.forward_backward(Batch{in.data(), tg.data(), W * B, T});
    sm.for_each_grad([&](const ParamSpec& s, const float* gr) {
      for (int64_t i = 0; i < numel(s.shape); ++i) gmax = std::max(gmax, double(std::fabs(gr[i])));
    });
  }
  REQUIRE(gmax > 0);
  for (ShardingStrategy st : {ShardingStrategy::FullShard, ShardingStrategy::NoShard,
                              ShardingStrategy::HybridShard})
    for (double frac : {0.75, 1.5}) {
      INFO(strategy_name(st) << " at " << frac << " of the fp16 range");
      const float scale = static_cast<float>(frac * 65504.0 / gmax);
      ShardingPolicy p = ShardingPolicy::for_strategy(st);
      if (st == ShardingStrategy::HybridShard) p = hybrid_policy();
      p.mixed_precision = mp(DType::BF16, DType::F16);
      bool finite[2];
      for (int multi = 0; multi < 2; ++multi) {
        ShardingPolicy one = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
        one.mixed_precision = p.mixed_precision;
        Model m = build_model(mc);
        ShardedModel sm(m, cpu(), 3, multi ? g : make_local_group(), multi ? p : one);
        const int b = multi ? B : W * B;
        const size_t off = multi ? size_t(g->rank()) * B * T : 0;
        sm.forward_backward(Batch{in.data() + off, tg.data() + off, b, T}, scale);
        finite[multi] = std::isfinite(sm.grad_norm());
      }
      CHECK(finite[0] == (frac < 1));
      CHECK(finite[1] == finite[0]);
    }
}
