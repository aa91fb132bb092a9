// Vocabularies whose tables hold more than 2^31 floats (vocab x d_model): the CPU kernels
// index rows past float 2^31 correctly (the embedding's lookup and gradient, the LM head's
// loss and input gradient), and the config accepts model.vocab_size up to 2^31 - 1. The
// 8.6 GB table is an untouched anonymous mapping: rows never written read as zeros from the
// shared zero page, so the test needs ~0.6 GB of memory (the logits row and the touched rows).
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "engine/config.h"
#include "engine/data.h"
#include "kernels/cpu/cpu_kernels.h"

using namespace sw;
using Catch::Matchers::Contains;

namespace {
struct Mapping {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Mapping(size_t b) : bytes(b) {
    p = ::mmap(nullptr, b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
               -1, 0);
    if (p == MAP_FAILED) p = nullptr;
  }
  ~Mapping() {
    if (p) ::munmap(p, bytes);
  }
  float* f() const { return static_cast<float*>(p); }
};
}  // namespace

TEST_CASE("data: model.vocab_size up to 2^31 - 1 is accepted, beyond it refused") {
  const auto parse = [](const std::string& v) {
    return parse_config(R"({"model": {"vocab_size": )" + v + "}}", "cfg.json", {});
  };
  CHECK(parse("151936").model.vocab_size == 151936);
  CHECK(parse("2147483647").model.vocab_size == 2147483647);
  CHECK_THROWS_WITH(parse("2147483648"),
                    Contains("model.vocab_size: must be <= 2147483647 (got 2147483648)"));
}

TEST_CASE("data: kernels index a vocab x d_model table beyond 2^31 floats") {
  const int C = 16;
  const int V = (1 << 27) + 5;  // V * C = 2^31 + 80 floats
  const int64_t last = int64_t{V - 1} * C;  // row V-1 starts past float 2^31
  REQUIRE(last > INT32_MAX);
  Mapping w(size_t(V) * C * sizeof(float));
  REQUIRE(w.p != nullptr);
  for (int c = 0; c < C; ++c) w.f()[last + c] = 0.25f * float(c % 5) - 0.5f;  // row V-1

  // Embedding lookup and gradient of token V-1.
  const int32_t tokens[2] = {V - 1, 3};
  std::vector<float> out(2 * C);
  cpu::embedding_forward(out.data(), tokens, w.f(), nullptr, 1, 2, C);
  for (int c = 0; c < C; ++c) {
    CHECK(out[c] == w.f()[last + c]);
    CHECK(out[C + c] == 0.f);
  }
  Mapping dw(size_t(V) * C * sizeof(float));
  REQUIRE(dw.p != nullptr);
  std::vector<float> dout(2 * C, 1.5f);
  cpu::embedding_backward(dw.f(), nullptr, dout.data(), tokens, 1, 2, C);
  CHECK(dw.f()[last] == 1.5f);
  CHECK(dw.f()[last + C - 1] == 1.5f);
  CHECK(dw.f()[3 * C] == 1.5f);
  CHECK(dw.f()[(int64_t{V} / 2) * C] == 0.f);

  // LM head on one row x = e_0 + 2 e_1 with target V-1: every other logit is 0, the target's
  // is l = w[V-1] . x, so loss = log(V - 1 + e^l) - l and dx = (p - 1) w[V-1], p = e^l / sum.
  std::vector<float> x(C, 0.f), dx(C, 0.f);
  x[0] = 1.f, x[1] = 2.f;
  const int32_t target = V - 1;
  float loss = 0;
  const double total = cpu::lmhead_xent(&loss, dx.data(), nullptr, x.data(), w.f(), &target, 1,
                                        C, V, 1.f);
  const double l = double(w.f()[last]) + 2.0 * w.f()[last + 1];
  const double want = std::log(double(V - 1) + std::exp(l)) - l;
  CHECK(total == Approx(want).epsilon(1e-5));
  const double p = std::exp(l) / (double(V - 1) + std::exp(l));
  for (int c = 0; c < C; ++c) CHECK(dx[c] == Approx((p - 1.0) * w.f()[last + c]).margin(1e-6));
}
