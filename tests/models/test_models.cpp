// Model layer tests: Saved/Scratch, build_model (validation, counts, names), whole-model
// finite-difference gradient checks for tiny GPT-2 and Llama (GQA), the packed-GEMM fallback,
// and determinism (run to run, eval vs training, fused vs recomputed loss).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include <cstdio>
#include <cstdlib>

#include "core/env.h"
#include "core/error.h"
#include "tests/common/forwarding_ops.h"
#include "tests/common/gradcheck.h"
#include "tests/models/harness.h"

using namespace sw;
using swtest::Harness;
using swtest::TokenBatch;

namespace {

ModelConfig tiny_gpt2() {
  ModelConfig c;
  c.type = "gpt2";
  c.vocab_size = 40;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = 11;  // > T: wpe rows past T get no gradient
  return c;
}

ModelConfig tiny_llama() {
  ModelConfig c;
  c.type = "llama";
  c.tie_embeddings = false;
  c.vocab_size = 40;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;  // GQA
  c.d_model = 16;   // hd = 4
  c.d_ff = 24;
  c.seq_len = 16;
  c.rope_theta = 100.f;  // short context: make the rotation visible at small t
  c.norm_eps = 1e-5f;
  return c;
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const sw::Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

// ---- Saved / Scratch ------------------------------------------------------------------------

TEST_CASE("Saved keeps a buffer per typed slot, tracked as activations", "[models][saved]") {
  const size_t before = MemTracker::global().current(Mem::Activations);
  constexpr SavedSlot<float> kA{0, Keep::Always, "a"}, kMissing{5, Keep::Always, "missing"};
  constexpr SavedSlot<int32_t> kTok{1, Keep::Always, "tok"};
  constexpr SavedSlot<uint16_t> kA16{0, Keep::Always, "a"};
  constexpr SavedFlag kFlag{0, "fused"};
  {
    Saved s;
    float* a = s.put(kA, 100);
    int32_t* t = s.put(kTok, 10);
    REQUIRE(a != nullptr);
    REQUIRE(t != nullptr);
    REQUIRE(reinterpret_cast<uintptr_t>(a) % 64 == 0);
    a[99] = 3.f;
    CHECK(s.put(kA, 100) == a);  // same size: same allocation
    CHECK(s.get(kA) == a);
    CHECK(s.get(kA)[99] == 3.f);
    CHECK(s.has(kA));
    CHECK(!s.has(kMissing));
    CHECK(s.bytes() == 100 * 4 + 10 * 4);
    CHECK(MemTracker::global().current(Mem::Activations) == before + s.bytes());
    s.put(kA, 200);  // another size: reallocated
    CHECK(s.bytes() == 200 * 4 + 10 * 4);
    CHECK_THROWS_AS(s.get(kMissing), sw::Error);
    CHECK_THAT(what_of([&] { s.get(kMissing); }), Catch::Contains("missing"));
    CHECK_THROWS_AS(s.get(kA16), sw::Error);  // kept as fp32, read as 16-bit
    CHECK_THROWS_AS(s.flag(kFlag), sw::Error);
    s.set(kFlag, true);
    CHECK(s.flag(kFlag));
    s.clear();
    CHECK(s.bytes() == 0);
    CHECK(MemTracker::global().current(Mem::Activations) == before);
    CHECK_THROWS_AS(s.get(kA), sw::Error);
    CHECK_THROWS_AS(s.flag(kFlag), sw::Error);
  }
  CHECK(MemTracker::global().current(Mem::Activations) == before);
}

TEST_CASE("Scratch hands out aligned, disjoint regions that stay valid while it grows",
          "[models][scratch]") {
  const size_t before = MemTracker::global().current(Mem::Workspace);
  {
    Scratch s;
    std::vector<std::pair<float*, size_t>> regions;
    size_t sizes[] = {1, 17, 100, 5000, 3, 100000, 7};
    for (size_t k = 0; k < std::size(sizes); ++k) {
      float* p = s.f32(sizes[k]);
      REQUIRE(reinterpret_cast<uintptr_t>(p) % 64 == 0);
      for (size_t i = 0; i < sizes[k]; ++i) p[i] = static_cast<float>(k * 1000003 + i);
      regions.push_back({p, sizes[k]});
    }
    // Every earlier region still holds its pattern (no overlap, no move on growth).
    for (size_t k = 0; k < regions.size(); ++k)
      for (size_t i = 0; i < regions[k].second; ++i)
        REQUIRE(regions[k].first[i] == static_cast<float>(k * 1000003 + i));
    const size_t cap = s.capacity_bytes();
    CHECK(cap >= (1 + 17 + 100 + 5000 + 3 + 100000 + 7) * 4);
    CHECK(MemTracker::global().current(Mem::Workspace) == before + cap);
    // After reset the same total fits in one block without growing.
    s.reset();
    float* a = s.f32(100000);
    float* b = s.f32(5000);
    CHECK(b >= a + 100000);
    CHECK(s.capacity_bytes() == cap);
    s.reset();
    CHECK(s.f32(10) == a);  // reused from the start
  }
  CHECK(MemTracker::global().current(Mem::Workspace) == before);
}

// ---- build_model -----------------------------------------------------------------------------

TEST_CASE("build_model rejects bad configs naming the key", "[models][config]") {
  auto err = [](auto edit) {
    ModelConfig c = tiny_llama();
    edit(c);
    return what_of([&] { build_model(c); });
  };
  CHECK_THAT(err([](ModelConfig& c) { c.type = "bert"; }),
             Catch::Contains("model.type") && Catch::Contains("gpt2, llama") &&
                 Catch::StartsWith("model:"));
  CHECK_THAT(err([](ModelConfig& c) { c.n_head = 3; }),
             Catch::Contains("model.n_head") && Catch::Contains("does not divide"));
  CHECK_THAT(err([](ModelConfig& c) { c.n_kv_head = 3; }), Catch::Contains("model.n_kv_head"));
  CHECK_THAT(err([](ModelConfig& c) { c.n_kv_head = 8; }), Catch::Contains("model.n_kv_head"));
  CHECK_THAT(err([](ModelConfig& c) { c.d_model = 12; c.n_head = 4; }),  // hd = 3
             Catch::Contains("model.n_head") && Catch::Contains("even"));
  CHECK_THAT(err([](ModelConfig& c) { c.vocab_size = 0; }), Catch::Contains("model.vocab_size"));
  CHECK_THAT(err([](ModelConfig& c) { c.n_layer = -1; }), Catch::Contains("model.n_layer"));
  CHECK_THAT(err([](ModelConfig& c) { c.d_model = 0; }), Catch::Contains("model.d_model"));
  CHECK_THAT(err([](ModelConfig& c) { c.seq_len = 0; }), Catch::Contains("model.seq_len"));
  CHECK_THAT(err([](ModelConfig& c) { c.d_ff = -5; }), Catch::Contains("model.d_ff"));
  CHECK_THAT(err([](ModelConfig& c) { c.norm_eps = 0; }), Catch::Contains("model.norm_eps"));
  CHECK_THAT(err([](ModelConfig& c) { c.rope_theta = 0; }), Catch::Contains("model.rope_theta"));
  CHECK_THAT(err([](ModelConfig& c) { c.type = "gpt2"; c.n_kv_head = 1; }),
             Catch::Contains("model.n_kv_head"));
  // An odd head dimension is fine for GPT-2 (no RoPE).
  ModelConfig g = tiny_gpt2();
  g.d_model = 18;
  g.n_head = 2;
  CHECK_NOTHROW(build_model(g));
}

TEST_CASE("Parameter counts of real configurations", "[models][config]") {
  ModelConfig g;  // GPT-2 small: the well-known 124,439,808 (tied)
  g.type = "gpt2";
  g.vocab_size = 50257;
  g.n_layer = 12;
  g.n_head = 12;
  g.d_model = 768;
  g.seq_len = 1024;
  Model m = build_model(g);
  CHECK(m.num_params() == 124439808);
  CHECK(m.config.d_ff == 3072);
  g.tie_embeddings = false;
  CHECK(build_model(g).num_params() == 124439808 + 50257LL * 768);

  ModelConfig l;  // TinyLlama 1.1B: 1,100,048,384
  l.type = "llama";
  l.tie_embeddings = false;
  l.vocab_size = 32000;
  l.n_layer = 22;
  l.n_head = 32;
  l.n_kv_head = 4;
  l.d_model = 2048;
  l.d_ff = 5632;
  l.seq_len = 2048;
  CHECK(build_model(l).num_params() == 1100048384);

  ModelConfig d = l;  // default d_ff: ceil(8d/3) rounded up to 64; n_kv_head 0 -> n_head
  d.d_model = 4096;
  d.n_head = 32;
  d.n_kv_head = 0;
  d.d_ff = 0;
  Model dm = build_model(d);
  CHECK(dm.config.d_ff == 10944);
  CHECK(dm.config.n_kv_head == 32);
}

TEST_CASE("GPT-2 units, schedule, names and init", "[models][config]") {
  ModelConfig c = tiny_gpt2();
  c.n_layer = 3;
  Model m = build_model(c);
  REQUIRE(m.units.size() == 4);
  CHECK(m.units[0]->name() == "embed_head");
  CHECK(m.units[0]->num_calls() == 2);
  CHECK(m.units[2]->name() == "h.1");
  REQUIRE(m.schedule.size() == 5);
  CHECK(m.schedule.front().unit == 0);
  CHECK(m.schedule.front().call == 0);
  for (int l = 1; l <= 3; ++l) CHECK((m.schedule[l].unit == l && m.schedule[l].call == 0));
  CHECK((m.schedule.back().unit == 0 && m.schedule.back().call == 1));

  std::map<std::string, ParamSpec> by;
  std::set<std::string> hf;
  for (auto& u : m.units)
    for (auto& p : u->params()) {
      CHECK(by.count(p.name) == 0);
      by[p.name] = p;
      hf.insert(p.hf_name);
    }
  CHECK(hf.size() == by.size());
  const int64_t C = 16, V = 40;
  CHECK(by.at("wte").shape == Shape{V, C});
  CHECK(by.at("wte").hf_name == "wte.weight");
  CHECK(by.at("wpe").shape == Shape{11, C});
  CHECK(by.at("wpe").hf_name == "wpe.weight");
  CHECK(by.at("ln_f.bias").hf_name == "ln_f.bias");
  const ParamSpec& qkv = by.at("h.2.attn.c_attn.weight");
  CHECK(qkv.shape == Shape{3 * C, C});
  CHECK(qkv.hf_name == "h.2.attn.c_attn.weight");
  CHECK(qkv.hf_transpose);
  CHECK(qkv.std == 0.02f);
  CHECK(qkv.weight_decay);
  CHECK(by.at("h.0.mlp.c_fc.weight").shape == Shape{4 * C, C});
  CHECK(by.at("h.0.mlp.c_proj.weight").shape == Shape{C, 4 * C});
  CHECK(by.at("h.0.mlp.c_proj.weight").hf_transpose);
  CHECK(by.at("h.0.attn.c_proj.weight").hf_transpose);
  CHECK(by.at("h.0.mlp.c_proj.weight").std == Approx(0.02 / std::sqrt(6.0)));
  CHECK(by.at("h.0.attn.c_proj.weight").std == Approx(0.02 / std::sqrt(6.0)));
  CHECK_FALSE(by.at("h.0.attn.c_attn.bias").hf_transpose);
  CHECK(by.at("h.0.attn.c_attn.bias").init == Init::Zeros);
  CHECK_FALSE(by.at("h.0.attn.c_attn.bias").weight_decay);
  CHECK(by.at("h.0.ln_1.weight").init == Init::Ones);
  CHECK_FALSE(by.at("h.0.ln_1.weight").weight_decay);
  CHECK(by.at("wte").weight_decay);  // nanoGPT decays every 2-D parameter
  CHECK(by.count("lm_head.weight") == 0);
}

TEST_CASE("Llama units, schedule, names and packed declaration order", "[models][config]") {
  Model m = build_model(tiny_llama());
  REQUIRE(m.units.size() == 4);
  CHECK(m.units[0]->name() == "embed");
  CHECK(m.units[1]->name() == "layers.0");
  CHECK(m.units[3]->name() == "head");
  REQUIRE(m.schedule.size() == 4);
  for (int i = 0; i < 4; ++i) CHECK((m.schedule[i].unit == i && m.schedule[i].call == 0));
  auto blk = m.units[2]->params();
  std::vector<std::string> names;
  for (auto& p : blk) names.push_back(p.name);
  // q, k, v consecutive; gate, up consecutive (packed GEMMs depend on it).
  auto at = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), "layers.1." + n) - names.begin();
  };
  CHECK(at("self_attn.k_proj.weight") == at("self_attn.q_proj.weight") + 1);
  CHECK(at("self_attn.v_proj.weight") == at("self_attn.q_proj.weight") + 2);
  CHECK(at("mlp.up_proj.weight") == at("mlp.gate_proj.weight") + 1);
  for (auto& p : blk) {
    CHECK(p.hf_name == "model." + p.name);
    CHECK_FALSE(p.hf_transpose);
    CHECK(p.weight_decay == (p.shape.size() == 2));
  }
  CHECK(blk[static_cast<size_t>(at("self_attn.k_proj.weight"))].shape == Shape{8, 16});
  CHECK(blk[static_cast<size_t>(at("mlp.gate_proj.weight"))].shape == Shape{24, 16});
  CHECK(blk[static_cast<size_t>(at("mlp.down_proj.weight"))].shape == Shape{16, 24});
  CHECK(m.units[0]->params()[0].hf_name == "model.embed_tokens.weight");
  auto head = m.units[3]->params();
  CHECK(head[0].hf_name == "model.norm.weight");
  CHECK(head[1].hf_name == "lm_head.weight");
  CHECK(head[1].shape == Shape{40, 16});
}

// ---- Whole-model gradient checks -------------------------------------------------------------
// L = mean token loss (eval forward, fp32, read in double); analytic gradients from the
// engine-style forward/backward. Every parameter tensor is sampled (16 elements each, all of
// them for small tensors). The fp32 loss carries ~1e-7 noise, i.e. ~1e-5 absolute noise in a
// difference quotient at h = 3e-2, so errors are judged against a floor of 1e-3 (gradients
// here are 1e-4..1e-1). Measured worst errors are ~9e-3 (matrices) and ~8e-3 (1-D params);
// a wrong term or layout gives O(1) (a sign error gives 2). Set SHARDWISE_TEST_GRADCHECK_VERBOSE=1 to print
// every tensor's result.

namespace {

struct Tol {
  double err;    // bound on |analytic - numeric| / max(|analytic|, |numeric|, floor)
  double floor;  // gradient magnitude below which the error is judged absolutely
};

// Central differences with one Richardson step, (4 D(h/2) - D(h)) / 3, which cancels the h^2
// term: the tiny models are curved enough (softmax, norms) that plain D(h) at an h large
// enough to rise above fp32 noise is off by ~1e-2 relative.
swtest::GradCheck fd_check(const std::function<double()>& f, float* x, const float* analytic,
                           size_t n, size_t samples, float h, double floor) {
  swtest::GradCheck r;
  sw::Rng rng(4321, n);
  for (size_t s = 0; s < std::min(n, samples); ++s) {
    const size_t i = n <= samples ? s : rng.below(n);
    const float x0 = x[i];
    auto central = [&](float step) {
      x[i] = x0 + step;
      const double lp = f();
      x[i] = x0 - step;
      const double lm = f();
      x[i] = x0;
      // The step actually taken in fp32, not the one asked for.
      const double taken = (double(x0 + step) - double(x0 - step));
      return (lp - lm) / taken;
    };
    const double num = (4.0 * central(h / 2) - central(h)) / 3.0;
    const double a = analytic[i];
    const double err = std::fabs(a - num) / std::max({std::fabs(a), std::fabs(num), floor});
    ++r.checked;
    if (r.checked == 1 || err > r.max_err) {
      r.max_err = err;
      r.worst = i;
      r.analytic = a;
      r.numeric = num;
    }
  }
  return r;
}

void gradcheck_model(Harness& H, const sw::Batch& b, size_t samples,
                     const std::function<Tol(const std::string&)>& tol) {
  H.forward_backward(b);
  // Keep a copy: the finite-difference evaluations run eval forwards only.
  std::vector<std::vector<float>> grads;
  auto params = H.all_params();
  for (auto& r : params) grads.emplace_back(r.g, r.g + r.n);
  for (size_t i = 0; i < params.size(); ++i) {
    auto& r = params[i];
    const Tol t = tol(r.spec->name);
    auto f = [&] { return H.eval_loss(b); };
    swtest::GradCheck gc = fd_check(f, r.p, grads[i].data(), r.n, samples, 3e-2f, t.floor);
    INFO(r.spec->name << " " << shape_str(r.spec->shape) << ": " << gc.str());
    if (sw::env_flag("SHARDWISE_TEST_GRADCHECK_VERBOSE")) std::printf("%-40s %s\n", r.spec->name.c_str(), gc.str().c_str());
    CHECK(gc.max_err < t.err);
    // Sanity: the gradient is not identically zero (every tensor is used).
    double ss = 0;
    for (float v : grads[i]) ss += double(v) * v;
    CHECK(ss > 0);
  }
}

// Matrices (deeper products of noisy terms) get a little more room than biases and norm
// weights, whose gradients sum over every row.
Tol per_tensor_tol(const std::string& name) {
  const bool one_d = name.find("bias") != std::string::npos ||
                     name.find("norm") != std::string::npos || name.find("ln_") != std::string::npos;
  return one_d ? Tol{1.5e-2, 1e-3} : Tol{2e-2, 1e-3};
}

}  // namespace

TEST_CASE("GPT-2 whole-model gradients match finite differences", "[models][gradcheck]") {
  // Tied head (the untied variant is covered by the PyTorch cross-check).
  ModelConfig c = tiny_gpt2();
  Harness H(c);
  H.init_random(11, 3.f);
  TokenBatch tb(2, 8, c.vocab_size, 5);
  gradcheck_model(H, tb.batch, 16, per_tensor_tol);
}

TEST_CASE("Llama (GQA) whole-model gradients match finite differences", "[models][gradcheck]") {
  ModelConfig c = tiny_llama();
  Harness H(c);
  H.init_random(12, 3.f);
  TokenBatch tb(2, 8, c.vocab_size, 6);
  gradcheck_model(H, tb.batch, 16, per_tensor_tol);
}

// ---- Packed GEMM fallback ----------------------------------------------------------------------

TEST_CASE("Llama packed q|k|v and gate|up GEMMs equal the per-matrix fallback",
          "[models][llama]") {
  ModelConfig c = tiny_llama();
  Harness packed(c, false), gapped(c, true);
  // The tiny shapes are multiples of 16 floats: the normal layout is contiguous, the gapped one
  // is not, so the two runs take different code paths.
  {
    auto q = packed.find("layers.0.self_attn.q_proj.weight");
    auto k = packed.find("layers.0.self_attn.k_proj.weight");
    REQUIRE(q.p + q.n == k.p);
    auto q2 = gapped.find("layers.0.self_attn.q_proj.weight");
    auto k2 = gapped.find("layers.0.self_attn.k_proj.weight");
    REQUIRE(q2.p + q2.n != k2.p);
  }
  packed.init_random(3);
  gapped.init_random(3);
  TokenBatch tb(2, 8, c.vocab_size, 9);
  const double l1 = packed.forward_backward(tb.batch);
  const double l2 = gapped.forward_backward(tb.batch);
  CHECK(l1 == Approx(l2).epsilon(1e-6));
  auto a = packed.all_params(), b = gapped.all_params();
  for (size_t i = 0; i < a.size(); ++i) {
    double num = 0, den = 0;
    for (size_t k = 0; k < a[i].n; ++k) {
      num += std::pow(double(a[i].g[k]) - b[i].g[k], 2);
      den += std::pow(double(a[i].g[k]), 2);
    }
    INFO(a[i].spec->name);
    CHECK(std::sqrt(num / std::max(den, 1e-30)) < 1e-5);
  }
}

// ---- Determinism -------------------------------------------------------------------------------

namespace {

void check_determinism(const ModelConfig& c) {
  Harness H(c);
  H.init_random(21);
  TokenBatch tb(2, 8, c.vocab_size, 4);
  const double l1 = H.forward_backward(tb.batch);
  std::vector<std::vector<float>> g1;
  for (auto& r : H.all_params()) g1.emplace_back(r.g, r.g + r.n);
  auto same_grads = [&] {
    auto ps = H.all_params();
    for (size_t i = 0; i < ps.size(); ++i)
      if (std::memcmp(g1[i].data(), ps[i].g, ps[i].n * 4) != 0) {
        UNSCOPED_INFO("gradient differs: " << ps[i].spec->name);
        return false;
      }
    return true;
  };
  SECTION("two forward/backward passes are bit-identical") {
    const double l2 = H.forward_backward(tb.batch);
    CHECK(same_bits(l1, l2));
    CHECK(same_grads());
  }
  SECTION("eval forward gives the training loss bit for bit") {
    const double le = H.eval_loss(tb.batch);
    CHECK(same_bits(l1, le));
  }
  SECTION("a loss forward without grads (recompute) defers the LM-head gradient to backward") {
    H.fused_loss = false;
    const double l2 = H.forward_backward(tb.batch);
    CHECK(same_bits(l1, l2));
    CHECK(same_grads());
  }
  SECTION("re-running forward before backward (activation recompute) changes nothing") {
    H.zero_grads();
    H.fused_loss = false;
    H.forward(tb.batch, true);
    const double l2 = H.forward(tb.batch, true);
    H.backward(tb.batch);
    CHECK(same_bits(l1, l2));
    CHECK(same_grads());
  }
  SECTION("backward in place (dx == dy) where a unit allows it gives the same bits") {
    size_t n_in_place = 0;
    for (auto& u : H.model.units) n_in_place += u->backward_in_place() ? 1 : 0;
    CHECK(n_in_place == static_cast<size_t>(c.n_layer));  // the blocks
    H.in_place = true;
    const double l2 = H.forward_backward(tb.batch);
    CHECK(same_bits(l1, l2));
    CHECK(same_grads());
  }
  SECTION("accumulation: a second backward adds the same gradients") {
    H.forward(tb.batch, true);
    H.backward(tb.batch);
    auto ps = H.all_params();
    for (size_t i = 0; i < ps.size(); ++i)
      for (size_t k = 0; k < ps[i].n; ++k)
        REQUIRE(ps[i].g[k] == Approx(2.0 * g1[i][k]).margin(1e-7));
  }
}

}  // namespace

TEST_CASE("GPT-2 is deterministic", "[models][determinism]") { check_determinism(tiny_gpt2()); }
TEST_CASE("Llama is deterministic", "[models][determinism]") { check_determinism(tiny_llama()); }

TEST_CASE("Sequences longer than seq_len are refused", "[models][config]") {
  for (ModelConfig c : {tiny_gpt2(), tiny_llama()}) {
    Harness H(c);
    H.init_random(1);
    TokenBatch tb(1, c.seq_len + 1, c.vocab_size, 1);
    CHECK_THAT(what_of([&] { H.eval_loss(tb.batch); }), Catch::Contains("model.seq_len"));
  }
}

// ---- Products' inputs and gradients kept 16-bit (models/unit.h's ProductIn) -------------------

namespace {

// The same Ops reporting fp32 compute, so the blocks take their fp32-operand path. Its
// attention backward reads the output rounded to the compute precision, as the 16-bit path's
// attention's 16-bit backward does (the one place where the two paths' values differ: the
// backward's row dot products of dout with the output, fp32 sums, not products). The
// gradients the 16-bit path keeps 16-bit for a non-product reader are read rounded too: the
// input gradients of the products before the SwiGLU / GELU and attention (as autocast's
// backward gives a linear's), attention's dqkv (the Llama's inverse rotation and GPT-2's qkv
// bias gradient read it rounded) and the GELU's (GPT-2's fc bias gradient): where the blocks
// write those gradients (GradIn::set), they are rounded.
class HideCompute final : public swtest::ForwardingOps {
 public:
  explicit HideCompute(const Ops& base) : ForwardingOps(base), base_(base) {}
  DType compute() const override { return DType::F32; }
  // (compute() F32: the blocks hand every op fp32 forms)
  void attention_backward(GradIn dqkv, Operand dout, Operand qkv, Operand out, const float* lse,
                          int B, int T, int H, int KVH, int hd) const override {
    const std::vector<float> o = rounded(out.f32, size_t(B) * T * H * hd);
    const std::vector<float> d = rounded(dout.f32, size_t(B) * T * H * hd);
    base_.attention_backward(dqkv, d.data(), qkv, o.data(), lse, B, T, H, KVH, hd);
    if (dqkv.write)
      base_.round_to(base_.compute(), dqkv.f32, size_t(B) * T * (H + 2 * KVH) * hd);
  }
  // The Llama's qkv product is kept 16-bit too (its rotation reads it rounded).
  void rope_forward(Out out, Operand qkv, int B, int T, int H, int KVH, int hd,
                    const RopeSpec& spec) const override {
    base_.round_to(base_.compute(), out.f32, size_t(B) * T * (H + 2 * KVH) * hd);
    base_.rope_forward(out, qkv, B, T, H, KVH, hd, spec);
  }
  // GPT-2's fch and Llama's gate|up, products' outputs only the GELU / SwiGLU read, are kept
  // 16-bit (as autocast keeps a linear's output): those read them rounded, forward and
  // backward.
  void gelu_forward(Out out, Operand inp, size_t n) const override {
    const std::vector<float> x = rounded(inp.f32, n);
    base_.gelu_forward(out, x.data(), n);
  }
  void gelu_backward(GradIn dinp, Operand inp, Operand dout, size_t n) const override {
    const std::vector<float> x = rounded(inp.f32, n), d = rounded(dout.f32, n);
    base_.gelu_backward(dinp, x.data(), d.data(), n);
    if (dinp.write) base_.round_to(base_.compute(), dinp.f32, n);
  }
  void swiglu_forward(Out out, Operand gu, int N, int F) const override {
    const std::vector<float> g = rounded(gu.f32, 2 * size_t(N) * F);
    base_.swiglu_forward(out, g.data(), N, F);
  }
  void swiglu_backward(GradIn dgu, Operand dout, Operand gu, int N, int F) const override {
    const std::vector<float> g = rounded(gu.f32, 2 * size_t(N) * F);
    const std::vector<float> d = rounded(dout.f32, size_t(N) * F);
    base_.swiglu_backward(dgu, d.data(), g.data(), N, F);
  }

 private:
  std::vector<float> rounded(const float* x, size_t n) const {
    std::vector<float> r(x, x + n);
    base_.round_to(base_.compute(), r.data(), n);
    return r;
  }
  const Ops& base_;
};

// The products read a weight's (and a gradient's) 16-bit form alone wherever a unit hands both
// (as the CUDA backend does; the CPU's ops would take the fp32 form), and count the products
// that got a weight so.
class ReadWeights16 final : public swtest::ForwardingOps {
 public:
  explicit ReadWeights16(const Ops& base) : ForwardingOps(base), base_(base) {}
  mutable int with16 = 0, dout_with16 = 0;
  void linear_forward(Out out, Operand inp, Operand w, const float* b, const float* res, int N,
                      int C, int OC) const override {
    base_.linear_forward(out, inp, only16(w), b, res, N, C, OC);
  }
  void linear_backward(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp, Operand w,
                       int N, int C, int OC) const override {
    if (dout.f32 && dout.lp) {  // (GPT-2's biased products: the bias gradient sums the fp32 form)
      ++dout_with16;
      base_.linear_backward(dinp, dw, nullptr, dout.lp, inp, only16(w), N, C, OC);
      if (db) base_.linear_backward(nullptr, nullptr, db, dout.f32, inp, w, N, C, OC);
      return;
    }
    base_.linear_backward(dinp, dw, db, dout, inp, only16(w), N, C, OC);
  }
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, Operand A, int lda, Operand B,
            int ldb, float beta, float* C, int ldc) const override {
    base_.gemm(ta, tb, M, N, K, alpha, only16(A), lda, only16(B), ldb, beta, C, ldc);
  }
  double lmhead_xent(float* loss, float* dx, float* dw, const float* x, Operand w,
                     const int32_t* targets, int N, int C, int V,
                     float grad_scale) const override {
    return base_.lmhead_xent(loss, dx, dw, x, only16(w), targets, N, C, V, grad_scale);
  }

 private:
  Operand only16(Operand x) const {
    if (!x.f32 || !x.lp) return x;
    ++with16;
    return x.lp;
  }
  const Ops& base_;
};

}  // namespace

// A unit's weights with their 16-bit copy (ctx.params16, as the engine keeps it on a device):
// every product that reads a weight reads that copy, and the run gives the bits of the fp32
// path on the same rounded parameters. Llama also with its q/k/v and gate/up weights apart
// (gapped: the packed products' per-matrix fallback, gemm with the weight's offset).
TEST_CASE("weights' 16-bit copies give the bits of the fp32 path (BF16 and F16 Ops)",
          "[models][lowp]") {
  for (const ModelConfig& c : {tiny_gpt2(), tiny_llama()})
    for (int gapped = 0; gapped < (c.type == "llama" ? 2 : 1); ++gapped)
      for (DType dt : {DType::BF16, DType::F16}) {
        INFO(c.type << " " << dtype_name(dt) << " gapped " << gapped);
        const Ops& ops = ops_for(Device::cpu(), dt);
        const ReadWeights16 w16(ops);
        const HideCompute hide(ops);
        Harness lp(c, gapped), f32in(c, gapped);
        lp.ops = &w16;
        f32in.ops = &hide;
        lp.init_random(7);
        f32in.init_random(7);
        lp.keep_weights16(dt);
        f32in.round_params(dt);
        TokenBatch tb(2, 8, c.vocab_size, 9);
        const double l1 = lp.forward_backward(tb.batch);
        const double l2 = f32in.forward_backward(tb.batch);
        CHECK(same_bits(l1, l2));
        // Every block's products read the copy, forward and backward: four weights a layer
        // (GPT-2: qkv, proj, fc, fcproj; Llama: packed qkv, o, packed gate|up, down), 8 reads;
        // gapped, Llama's q, k, v and gate, up one product each: 7 forward, 7 backward (the
        // weight gradients' products read no weight); and the fused LM head once (GPT-2's
        // tied wte, the Llama's lm_head).
        const int per_layer = gapped ? 14 : 8;
        CHECK(w16.with16 == c.n_layer * per_layer + 1);
        // No product is handed a gradient in both forms (GPT-2's dfch and dqkv are 16-bit
        // alone since; their bias gradients sum the widened values)
        CHECK(w16.dout_with16 == 0);
        auto a = lp.all_params(), b = f32in.all_params();
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); ++i) {
          INFO(a[i].spec->name);
          CHECK(std::memcmp(a[i].p, b[i].p, a[i].n * sizeof(float)) == 0);
          CHECK(std::memcmp(a[i].g, b[i].g, a[i].n * sizeof(float)) == 0);
        }
      }
}

// With 16-bit products the blocks keep their products' inputs 16-bit (norm outputs, qkv,
// attention's output, the MLP's activation) and hand Llama's dgu and dqkv to the products
// 16-bit: the same bits as the fp32 path, whose products round those values the same way
// (HideCompute: its attention backward reads the rounded output, as the 16-bit path's does,
// and its SwiGLU the rounded gate|up, which the 16-bit path keeps as its product writes it).
TEST_CASE("16-bit products' inputs give the bits of the fp32 path (BF16 and F16 Ops)",
          "[models][lowp]") {
  for (const ModelConfig& c : {tiny_gpt2(), tiny_llama()})
    for (DType dt : {DType::BF16, DType::F16}) {
      INFO(c.type << " " << dtype_name(dt));
      const Ops& ops = ops_for(Device::cpu(), dt);
      const HideCompute hide(ops);
      Harness lp(c), f32in(c);
      lp.ops = &ops;
      f32in.ops = &hide;
      lp.init_random(5);
      f32in.init_random(5);
      TokenBatch tb(2, 8, c.vocab_size, 6);
      const double l1 = lp.forward_backward(tb.batch);
      const double l2 = f32in.forward_backward(tb.batch);
      CHECK(same_bits(l1, l2));
      auto a = lp.all_params(), b = f32in.all_params();
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        INFO(a[i].spec->name);
        CHECK(std::memcmp(a[i].g, b[i].g, a[i].n * sizeof(float)) == 0);
      }
      // A second forward before backward (as a full recompute runs it) changes nothing.
      lp.zero_grads();
      lp.fused_loss = false;
      lp.forward(tb.batch, true);
      const double l3 = lp.forward(tb.batch, true);
      lp.backward(tb.batch);
      CHECK(same_bits(l1, l3));
    }
}
