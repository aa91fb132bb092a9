// Units declare their activation memory before running (models/unit.h, ActivationDecl), and
// the declarations are exact:
//   * per unit and call, run directly (models/activation_check.h): Saved::bytes() and
//     cheap_bytes() after the training forward, the Scratch high-water of forward,
//     recompute_cheap, backward and the inference passes, and the Saved peak of inference,
//     all EQUAL to the declaration; a full recompute (forward without grads on top of the
//     engine's y in scratch) keeps the same Saved and uses bytes_for(y) + scratch_fwd; with the
//     Scratch reserved once from the declarations no call allocates. GPT-2, Llama with GQA,
//     blocks_per_unit 1, 2 and 3, batch shapes with odd B and T;
//   * through ShardedModel: the Mem::Activations peak of forward_backward under activation
//     checkpointing off / selective / full, and of eval_loss, equal what the declarations
//     predict from the engine's schedule (unit inputs kept, Saved kept or dropped, rebuilt
//     before backward);
//   * Scratch: reserve, Hold, high_water; a unit without a declaration says known = false.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "core/alloc.h"
#include "core/rng.h"
#include "kernels/ops.h"
#include "models/activation_check.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/policy.h"
#include "sharding/sharded_model.h"
#include "sharding/wrap.h"
#include "tests/common/plan_util.h"

using namespace sw;

namespace {

const Ops& cpu() { return ops_for(Device::cpu()); }

ModelConfig gpt2_cfg() {
  ModelConfig c;
  c.type = "gpt2";
  c.vocab_size = 40;
  c.n_layer = 4;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = 13;
  return c;
}

ModelConfig llama_cfg() {
  ModelConfig c;
  c.type = "llama";
  c.tie_embeddings = false;
  c.vocab_size = 40;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_kv_head = 2;  // GQA
  c.d_model = 16;
  c.d_ff = 24;
  c.seq_len = 13;
  return c;
}

const BatchShape kShapes[] = {{1, 1}, {3, 5}, {2, 7}, {1, 13}, {5, 3}};

struct Tokens {
  std::vector<int32_t> tok, tgt;
  Batch batch;
  Tokens(BatchShape s, int V, uint64_t seed) {
    Rng r(seed);
    for (int i = 0; i < s.B * s.T; ++i) {
      tok.push_back(static_cast<int32_t>(r.below(uint64_t(V))));
      tgt.push_back(i % 4 == 3 ? -1 : static_cast<int32_t>(r.below(uint64_t(V))));
    }
    batch = {tok.data(), tgt.data(), s.B, s.T};
  }
};

// One unit's parameters and gradients at 16-float-aligned offsets, parameters small random.
struct UnitMem {
  Buffer pbuf, gbuf;
  std::vector<float*> p, g;
  UnitMem(const Unit& u, uint64_t seed) {
    const std::vector<ParamSpec> specs = u.params();
    std::vector<size_t> off;
    size_t total = 16;
    for (const ParamSpec& s : specs) {
      off.push_back(total);
      total += (size_t(numel(s.shape)) + 15) / 16 * 16;
    }
    pbuf = Buffer(total * 4, Mem::Params);
    gbuf = Buffer(total * 4, Mem::Grads);
    gbuf.zero();
    Rng r(seed);
    for (size_t i = 0; i < total; ++i) pbuf.f32()[i] = 0.1f * static_cast<float>(r.uniform() * 2 - 1);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].init == Init::Ones)
        for (int64_t k = 0; k < numel(specs[i].shape); ++k) pbuf.f32()[off[i] + size_t(k)] += 1.f;
      p.push_back(pbuf.f32() + off[i]);
      g.push_back(gbuf.f32() + off[i]);
    }
  }
};

void check_equal(const ActivationDecl& decl, const ActivationDecl& got) {
  CHECK(decl.known);
  CHECK(got.saved == decl.saved);
  CHECK(got.saved_cheap == decl.saved_cheap);
  CHECK(got.scratch_fwd == decl.scratch_fwd);
  CHECK(got.scratch_bwd == decl.scratch_bwd);
  CHECK(got.scratch_recompute == decl.scratch_recompute);
  CHECK(got.saved_eval == decl.saved_eval);
  CHECK(got.scratch_eval == decl.scratch_eval);
  CHECK(got.saved_logits == decl.saved_logits);
  CHECK(got.scratch_logits == decl.scratch_logits);
}

// Every schedule position of `cfg` wrapped by `bpu`, run directly at every shape.
// compute: the Ops' precision (BF16 / F16: the blocks keep their products' inputs 16-bit).
void check_units(const ModelConfig& cfg, int bpu, DType compute = DType::F32) {
  const Ops& ops = ops_for(Device::cpu(), compute);
  Model m = build_model(cfg);
  wrap_blocks(m, bpu);
  std::vector<std::unique_ptr<UnitMem>> mem;
  for (size_t u = 0; u < m.units.size(); ++u) mem.push_back(std::make_unique<UnitMem>(*m.units[u], 11 + u));
  const size_t P = m.schedule.size();
  for (BatchShape s : kShapes) {
    s.compute = compute;
    const size_t n = size_t(s.B) * size_t(s.T) * size_t(m.d_model());
    Tokens tk(s, cfg.vocab_size, uint64_t(s.B * 100 + s.T));
    // Reserve once from the declarations: the most any call or full recompute asks for.
    size_t most = 0;
    for (const Call& c : m.schedule) {
      const ActivationDecl d = m.units[size_t(c.unit)]->declare_activations(c.call, s);
      most = std::max({most, d.scratch_fwd, d.scratch_bwd, d.scratch_recompute, d.scratch_eval,
                       d.scratch_logits, Scratch::bytes_for(n) + d.scratch_fwd});
    }
    Scratch scratch;
    scratch.reserve(most);
    const size_t cap = scratch.capacity_bytes();
    CHECK(cap >= most);
    std::vector<float> x(n);
    Rng r(5);
    for (size_t p = 0; p < P; ++p) {
      const Call& c = m.schedule[p];
      Unit& unit = *m.units[size_t(c.unit)];
      UnitMem& um = *mem[size_t(c.unit)];
      INFO(cfg.type << " blocks_per_unit " << bpu << " B " << s.B << " T " << s.T << " compute "
                    << dtype_name(compute) << " position " << p << " " << unit.name()
                    << " call " << c.call);
      for (float& v : x) v = static_cast<float>(r.uniform() * 2 - 1);
      ActivationProbe pr;
      pr.ops = &ops;
      pr.batch = &tk.batch;
      pr.params = &um.p;
      pr.grads = &um.g;
      pr.x = p > 0 ? x.data() : nullptr;
      pr.d_model = m.d_model();
      pr.loss_call = p + 1 == P;
      pr.vocab = cfg.vocab_size;
      const ActivationDecl decl = unit.declare_activations(c.call, s);
      check_equal(decl, measure_activations(unit, c.call, pr, scratch));
      if (pr.loss_call) continue;
      // Full recompute as the engine runs it (sharding/sharded_model.cpp, rebuild).
      Saved saved;
      UnitCtx ctx;
      ctx.ops = &ops;
      ctx.batch = &tk.batch;
      ctx.params = &um.p;
      ctx.saved = &saved;
      ctx.scratch = &scratch;
      scratch.reset();
      scratch.reset_high_water();
      float* y = scratch.f32(n);
      {
        Scratch::Hold keep_y(scratch);
        unit.forward(ctx, c.call, pr.x, y);
      }
      CHECK(saved.bytes() == decl.saved);
      CHECK(saved.cheap_bytes() == decl.saved_cheap);
      CHECK(scratch.high_water() == Scratch::bytes_for(n) + decl.scratch_fwd);
      scratch.reset();
    }
    CHECK(scratch.capacity_bytes() == cap);  // reserved once, never grown
  }
}

// What the engine's Mem::Activations peak of one forward_backward should be, from the
// declarations alone: the forward keeps each call's input (B*T*d floats, positions 1..P-1,
// allocated before the call that writes it) and its Saved, less what checkpointing drops;
// backward rebuilds a call's Saved right before its backward and frees it and the input after.
size_t predict_training_peak(const Model& m, BatchShape s, const ActivationCheckpointing& ac) {
  const size_t P = m.schedule.size();
  const size_t in_bytes = size_t(s.B) * size_t(s.T) * size_t(m.d_model()) * sizeof(float);
  std::vector<size_t> full(P), kept(P);
  for (size_t p = 0; p < P; ++p) {
    const Call& c = m.schedule[p];
    const Unit& u = *m.units[size_t(c.unit)];
    const ActivationDecl d = u.declare_activations(c.call, s);
    CheckpointMode mode = p + 1 == P ? CheckpointMode::Off : ac.mode_for(c.unit);
    if (mode == CheckpointMode::Selective && !u.selective_recompute()) mode = CheckpointMode::Full;
    full[p] = d.saved;
    kept[p] = mode == CheckpointMode::Full        ? 0
              : mode == CheckpointMode::Selective ? d.saved - d.saved_cheap
                                                  : d.saved;
  }
  size_t peak = 0, kept_before = 0;
  for (size_t p = 0; p < P; ++p) {  // forward, during call p
    const size_t inputs = std::min(p + 1, P - 1) * in_bytes;
    peak = std::max(peak, kept_before + inputs + full[p]);
    kept_before += kept[p];
  }
  for (size_t q = P; q-- > 0;) {  // backward of q, after its rebuild
    kept_before -= kept[q];
    peak = std::max(peak, kept_before + q * in_bytes + full[q]);
  }
  return peak;
}

size_t predict_eval_peak(const Model& m, BatchShape s) {
  size_t peak = 0;
  for (const Call& c : m.schedule)
    peak = std::max(peak, m.units[size_t(c.unit)]->declare_activations(c.call, s).saved_eval);
  return peak;
}

ActivationCheckpointing ac_of(CheckpointMode mode) {
  ActivationCheckpointing a;
  a.mode = mode;
  return a;
}

class Undeclared final : public Unit {
 public:
  std::string name() const override { return "undeclared"; }
  std::vector<ParamSpec> params() const override { return {}; }
  void forward(UnitCtx&, int, const float*, float*) override {}
  void backward(UnitCtx&, int, const float*, const float*, float*) override {}
};

}  // namespace

TEST_CASE("activation declarations: GPT-2 units and calls are exact", "[models][activations]") {
  for (int bpu : {1, 2, 3}) check_units(gpt2_cfg(), bpu);
  // 16-bit products: ln1, ln2 and fch_gelu at 2 bytes a value.
  for (DType dt : {DType::BF16, DType::F16}) check_units(gpt2_cfg(), 2, dt);
}

TEST_CASE("activation declarations: Llama (GQA) units are exact", "[models][activations]") {
  for (int bpu : {1, 2, 3}) check_units(llama_cfg(), bpu);
  // 16-bit products: xn, xn2 and hmlp at 2 bytes a value, dgu and a copy of dqkv 16-bit.
  for (DType dt : {DType::BF16, DType::F16}) check_units(llama_cfg(), 1, dt);
}

TEST_CASE("activation declarations: ShardedModel's activation peak is what they predict",
          "[models][activations][sharding]") {
  MemTracker& mt = MemTracker::global();
  for (const ModelConfig& cfg : {gpt2_cfg(), llama_cfg()})
    for (int bpu : {1, 2, 3})
      for (CheckpointMode mode :
           {CheckpointMode::Off, CheckpointMode::Selective, CheckpointMode::Full})
      for (DType dt : {DType::F32, DType::BF16}) {  // BF16: 16-bit products' inputs
        if (dt != DType::F32 && bpu == 3) continue;
        Model m = build_model(cfg);
        wrap_blocks(m, bpu);
        ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
        pol.activation_checkpointing = ac_of(mode);
        pol.mixed_precision.param_dtype = dt;
        ShardedModel sm(m, cpu(), 3, make_local_group(), pol);
        for (BatchShape s : {BatchShape{3, 5}, BatchShape{2, 13}}) {
          s.compute = dt;
          INFO(cfg.type << " blocks_per_unit " << bpu << " " << checkpoint_mode_name(mode)
                        << " " << dtype_name(dt) << " B " << s.B << " T " << s.T);
          Tokens tk(s, cfg.vocab_size, 9);
          const size_t base = mt.current(Mem::Activations);
          mt.reset_peaks();
          sm.zero_grads();
          sm.forward_backward(tk.batch);
          CHECK(mt.current(Mem::Activations) == base);
          CHECK(mt.peak(Mem::Activations) - base ==
                predict_training_peak(m, s, pol.activation_checkpointing));
          mt.reset_peaks();
          sm.eval_loss(tk.batch);
          CHECK(mt.peak(Mem::Activations) - base == predict_eval_peak(m, s));
        }
      }
}

// bench_step --compute bf16 hands ShardedModel 16-bit Ops under an fp32 policy: the units then
// keep 16-bit product inputs, and the step plan must declare them so (PlanInput::compute, from
// the Ops; it took the policy's param_dtype, and the plan's activations were the fp32 ones).
TEST_CASE("activation declarations: the plan follows the Ops' precision, not only the policy's",
          "[models][activations]") {
  MemTracker& mt = MemTracker::global();
  for (const ModelConfig& cfg : {gpt2_cfg(), llama_cfg()}) {
    INFO(cfg.type);
    Model m = build_model(cfg);
    const ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    ShardedModel sm(m, ops_for(Device::cpu(), DType::BF16), 3, make_local_group(), pol);
    const BatchShape s{2, 13, DType::BF16};
    Tokens tk(s, cfg.vocab_size, 9);
    sm.forward_backward(tk.batch);  // warm-up
    sm.zero_grads();
    const StepPlan plan = sm.step_plan(s.B, s.T, 1);
    const size_t base = mt.current(Mem::Activations);
    mt.reset_peaks();
    sm.forward_backward(tk.batch);
    CHECK(int64_t(mt.peak(Mem::Activations) - base) ==
          swtest::replay(plan).peak[size_t(Mem::Activations)]);
    CHECK(mt.peak(Mem::Activations) - base ==
          predict_training_peak(m, s, pol.activation_checkpointing));
  }
}

TEST_CASE("Scratch: reserve, high-water mark and Hold", "[models][scratch]") {
  Scratch s;
  CHECK(Scratch::bytes_for(0) == 64);
  CHECK(Scratch::bytes_for(1) == 64);
  CHECK(Scratch::bytes_for(16) == 64);
  CHECK(Scratch::bytes_for(17) == 128);
  s.reserve(1000);
  CHECK(s.capacity_bytes() == 1024);
  s.reserve(500);  // already large enough: kept
  CHECK(s.capacity_bytes() == 1024);
  s.reset_high_water();
  float* a = s.f32(100);  // 448 bytes
  float* b = s.f32(10);   // 64
  CHECK(b == a + 112);
  CHECK(s.live_bytes() == 512);
  s.reset();
  CHECK(s.live_bytes() == 0);
  CHECK(s.f32(3) == a);
  CHECK(s.high_water() == 512);
  s.reset();
  s.reset_high_water();
  CHECK(s.high_water() == 0);
  {
    float* y = s.f32(32);  // held across reset()
    Scratch::Hold hold(s);
    float* t = s.f32(16);
    CHECK(t == y + 32);
    s.reset();
    CHECK(s.f32(16) == t);  // back to the hold, not to zero
    CHECK(s.high_water() == 128 + 64);
  }
  s.reset();
  CHECK(s.f32(1) == a);
  // Under-declaration: more than reserved grows (still works) and shows in high_water().
  s.reset();
  s.reset_high_water();
  s.f32(200);
  s.f32(200);
  CHECK(s.capacity_bytes() > 1024);
  CHECK(s.high_water() == 2 * Scratch::bytes_for(200));
  // A reserve between calls merges into one block of the requested size.
  s.reset();
  s.reserve(4096);
  CHECK(s.capacity_bytes() >= 4096);
}

TEST_CASE("a unit without a declaration reports known = false", "[models][activations]") {
  Undeclared u;
  CHECK_FALSE(u.declare_activations(0, {2, 3}).known);
  Model m = build_model(gpt2_cfg());
  for (const Call& c : m.schedule) CHECK(m.units[size_t(c.unit)]->declare_activations(c.call, {2, 3}).known);
}
