// Shared by the bf16 GEMM benchmarks (bench_gemm_bf16, bench_gemm16): their options, timing
// helpers and shapes. The shapes: the matrix products of a GPT-2 block's four Linears and of
// one 512-row LM-head chunk, forward, input gradient and weight gradient of each; rows = the
// step's tokens, C = d_model, V = the vocabulary.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

struct GemmShape {
  const char* name;
  int M, N, K;
  bool ta, tb;
};

inline std::vector<GemmShape> gpt2_gemm_shapes(int R, int C, int V) {
  return {
      {"qkv fwd      x@W^T", R, 3 * C, C, false, true},
      {"attproj fwd  x@W^T", R, C, C, false, true},
      {"fc fwd       x@W^T", R, 4 * C, C, false, true},
      {"proj fwd     x@W^T", R, C, 4 * C, false, true},
      {"qkv dinp     dy@W", R, C, 3 * C, false, false},
      {"attproj dinp dy@W", R, C, C, false, false},
      {"fc dinp      dy@W", R, C, 4 * C, false, false},
      {"proj dinp    dy@W", R, 4 * C, C, false, false},
      {"qkv dW       dy^T@x", 3 * C, C, R, true, false},
      {"attproj dW   dy^T@x", C, C, R, true, false},
      {"fc dW        dy^T@x", 4 * C, C, R, true, false},
      {"proj dW      dy^T@x", C, 4 * C, R, true, false},
      {"lmhead fwd   x@w^T", 512, V, C, false, true},
      {"lmhead dx    dl@w", 512, C, V, false, false},
      {"lmhead dw    dl^T@x", V, C, 512, true, false},
  };
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Seconds one call of f takes.
template <class F>
double timed(F&& f) {
  const double t0 = now_s();
  f();
  return now_s() - t0;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct GemmBenchArgs {
  int threads = 2, reps = 5, rows = 1024, d = 768, vocab = 50257;
};

// Parses [--threads N] [--reps N] [--rows N] [--d N] [--vocab N] over the defaults in a; on
// anything else prints the usage line for `name` and returns false.
inline bool parse_gemm_bench_args(int argc, char** argv, const char* name, GemmBenchArgs& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (k == "--threads") a.threads = next();
    else if (k == "--reps") a.reps = next();
    else if (k == "--rows") a.rows = next();
    else if (k == "--d") a.d = next();
    else if (k == "--vocab") a.vocab = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads %d] [--reps %d] [--rows %d] [--d %d] [--vocab %d]\n", name,
                   a.threads, a.reps, a.rows, a.d, a.vocab);
      return false;
    }
  }
  return true;
}
