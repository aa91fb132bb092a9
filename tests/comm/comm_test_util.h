// Deterministic inputs and locally computed references for the collective tests.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "sharding/comm/group.h"

namespace sw::test {

inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Small integers: every summation order gives the same exact result.
inline float int_val(int rank, int64_t i, int salt) {
  return static_cast<float>(static_cast<int64_t>(mix(static_cast<uint64_t>(rank) * 1000003u +
                                                     static_cast<uint64_t>(i) * 7919u +
                                                     static_cast<uint64_t>(salt)) %
                                                 33) -
                            16);
}
// Random magnitudes spanning 2^-8..2^8: the summation order shows in the last bits.
inline float rand_val(int rank, int64_t i, int salt) {
  const uint64_t h = mix(static_cast<uint64_t>(rank) * 1000003u + static_cast<uint64_t>(i) * 7919u +
                         static_cast<uint64_t>(salt) * 104729u + 17);
  const float u = static_cast<float>(h >> 40) / 16777216.0f - 0.5f;
  return std::ldexp(u, static_cast<int>(h & 15) - 7);
}

inline bool bits_equal(const float* a, const float* b, int64_t n) {
  return n == 0 || std::memcmp(a, b, static_cast<size_t>(n) * 4) == 0;
}

// Which grouping of the adds an algorithm uses for one output block.
enum class Order { RankOrder, Ring };

// Reference of op over ranks of x[q][i] for output block b of n, in the given order.
// x(q, i) gives rank q's input element i.
template <class X>
float reduce_ref(X x, int n, int b, int64_t i, ReduceOp op, Order order) {
  auto combine = [&](float a, float c) { return op == ReduceOp::Max ? (a < c ? c : a) : a + c; };
  float acc;
  if (order == Order::RankOrder) {
    acc = x(0, i);
    for (int q = 1; q < n; q++) acc = combine(acc, x(q, i));
  } else {
    acc = x((b + 1) % n, i);
    for (int k = 2; k <= n; k++) acc = combine(acc, x((b + k) % n, i));
  }
  if (op == ReduceOp::Avg) acc = acc / static_cast<float>(n);
  return acc;
}

// The same with a 16-bit payload rounded after every add (bf16/f16 reductions).
template <class X>
uint16_t reduce_ref16(X x, int n, int b, int64_t i, ReduceOp op, Order order, DType dt) {
  auto rnd = [&](float v) { return dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v); };
  auto wid = [&](uint16_t h) { return dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); };
  auto combine = [&](uint16_t a, uint16_t c) {
    const float fa = wid(a), fc = wid(c);
    return rnd(op == ReduceOp::Max ? (fa < fc ? fc : fa) : fa + fc);
  };
  uint16_t acc;
  if (order == Order::RankOrder) {
    acc = x(0, i);
    for (int q = 1; q < n; q++) acc = combine(acc, x(q, i));
  } else {
    acc = x((b + 1) % n, i);
    for (int k = 2; k <= n; k++) acc = combine(acc, x((b + k) % n, i));
  }
  if (op == ReduceOp::Avg) acc = rnd(wid(acc) / static_cast<float>(n));
  return acc;
}

inline Order order_of(CommAlgo a) {
  return a == CommAlgo::Ring ? Order::Ring : Order::RankOrder;
}

}  // namespace sw::test
