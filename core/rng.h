// Counter-based random numbers: every value is a pure function of (seed, stream, index), so
// N ranks initialising disjoint slices of a parameter produce exactly what one rank would,
// and any element can be regenerated without replaying a sequence.
#pragma once
#include <cmath>
#include <cstdint>

namespace sw {

inline uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t rng_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(seed ^ mix64(stream)) + index);
}

// Uniform in (0, 1): never 0, so log() is safe.
inline double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<double>(rng_bits(seed, stream, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal (Box-Muller on two independent counters).
inline float rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = rng_uniform(seed, stream, 2 * index);
  const double u2 = rng_uniform(seed, stream, 2 * index + 1);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// Stream id from a name (FNV-1a), e.g. the global parameter name.
inline uint64_t rng_stream(const char* name) {
  uint64_t h = 1469598103934665603ull;
  for (; *name; ++name) h = (h ^ static_cast<unsigned char>(*name)) * 1099511628211ull;
  return h;
}

// A small sequential generator for data sampling and token sampling.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t stream = 0) : seed_(seed), stream_(stream) {}
  uint64_t next() { return rng_bits(seed_, stream_, counter_++); }
  double uniform() { return rng_uniform(seed_, stream_, counter_++); }
  uint64_t below(uint64_t n) { return next() % n; }  // bias negligible for n << 2^64
  uint64_t counter() const { return counter_; }
  void set_counter(uint64_t c) { counter_ = c; }
  uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_, stream_, counter_ = 0;
};

}  // namespace sw
