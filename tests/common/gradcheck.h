// Finite-difference gradient checks shared by the kernel and model tests.
//
// The scalar under test is L(x) = f(x), evaluated in fp32 by the code under test and summed in
// double. The analytic gradient dL/dx[i] is compared with the central difference
// (L(x + h e_i) - L(x - h e_i)) / 2h on a deterministic sample of indices. The error metric is
// |analytic - numeric| / max(|analytic|, |numeric|, floor): relative where the gradient is
// large, absolute (scaled by floor) where it is near zero. Tolerances are chosen per op by the
// caller, never one global number.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"

namespace swtest {

struct GradCheck {
  double max_err = 0;    // worst normalised error over the checked indices
  size_t worst = 0;      // index of the worst element
  double analytic = 0;   // its analytic value
  double numeric = 0;    // its finite-difference value
  size_t checked = 0;
  std::string str() const {
    return "max_err=" + std::to_string(max_err) + " at [" + std::to_string(worst) +
           "] analytic=" + std::to_string(analytic) + " numeric=" + std::to_string(numeric) +
           " (" + std::to_string(checked) + " checked)";
  }
};

// f() recomputes the loss from the current contents of x. Checks up to `samples` indices
// (all of them when n <= samples).
inline GradCheck check_grad(const std::function<double()>& f, float* x, const float* analytic,
                            size_t n, size_t samples = 64, float h = 1e-2f,
                            double floor = 1e-2) {
  GradCheck r;
  std::vector<size_t> idx;
  if (n <= samples) {
    for (size_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    sw::Rng rng(1234, n);
    for (size_t s = 0; s < samples; ++s) idx.push_back(rng.below(n));
  }
  for (size_t i : idx) {
    const float x0 = x[i];
    x[i] = x0 + h;
    const double lp = f();
    x[i] = x0 - h;
    const double lm = f();
    x[i] = x0;
    const double num = (lp - lm) / (2.0 * static_cast<double>(h));
    const double a = analytic[i];
    const double err = std::fabs(a - num) / std::max({std::fabs(a), std::fabs(num), floor});
    ++r.checked;
    if (err > r.max_err || r.checked == 1) {
      r.max_err = std::max(err, r.max_err);
      if (err >= r.max_err) {
        r.worst = i;
        r.analytic = a;
        r.numeric = num;
      }
    }
  }
  return r;
}

// Fills v with N(0, stddev) values from (seed, stream).
inline void randn(std::vector<float>& v, uint64_t seed, float stddev = 1.f, uint64_t stream = 0) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = stddev * sw::rng_normal(seed, stream, i);
}

// sum_i a[i] * b[i] in double: the projection used to turn an output into a scalar loss.
inline double dot(const float* a, const float* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace swtest
