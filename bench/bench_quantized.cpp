// The quantised collectives (sharding/comm/quantize.h) against full precision, under mpirun:
// per size (fp32 values per rank), the all-gather (fp32 ring/auto vs int8 / int4 packed) and
// the reduce-scatter (fp32 auto vs the quantised all-to-all with error feedback): time (the
// minimum over ITERS), bytes each rank sends (from CommStats), and on rank 0 the quantiser's own
// throughput. Run on one host it shows the compute cost; across a shaped link
// (bench/quantized_link.sh) the bytes saved.
//   mpirun -np N bench_quantized [MIN_FLOATS] [MAX_FLOATS] [ITERS] [BLOCK]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "sharding/comm/quantize.h"

using namespace sw;

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t lo = argc > 1 ? std::atoll(argv[1]) : 1 << 14;
  const int64_t hi = argc > 2 ? std::atoll(argv[2]) : 1 << 22;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 5;
  const int64_t block = argc > 4 ? std::atoll(argv[4]) : 256;
  GroupPtr g = mpi_world_group();
  PeerCommPtr pc = make_peer_comm(*g, "bench-q");
  const int P = g->size(), me = g->rank();
  if (me == 0)
    std::printf("# %d ranks, block %lld; time: min of %d (ms); sent: bytes each rank sends\n"
                "%-10s %-4s %-12s %10s %12s %12s %10s\n",
                P, (long long)block, iters, "floats", "op", "variant", "ms", "sent_B",
                "fp32_sent_B", "ratio");
  for (int64_t n = lo; n <= hi; n *= 4) {
    std::vector<float> x(static_cast<size_t>(n * P)), y(static_cast<size_t>(n * P)),
        err(static_cast<size_t>(n * P), 0.f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float((i * 2654435761u) % 2001) * 1e-3f - 1.f;
    const double fp32_sent = double(P - 1) * double(n) * 4;  // a ring's / all-to-all's
    auto report = [&](const char* op, const char* var, double t, double sent) {
      if (me == 0)
        std::printf("%-10lld %-4s %-12s %10.3f %12.0f %12.0f %10.3f\n", (long long)n, op, var,
                    t * 1e3, sent, fp32_sent, sent / fp32_sent);
    };
    // all-gather
    {
      double best = 1e30;
      for (int it = 0; it < iters; ++it) {
        g->barrier();
        const double t0 = now();
        g->all_gather(x.data(), y.data(), n);
        best = std::min(best, now() - t0);
      }
      report("ag", "fp32", best, fp32_sent);
    }
    for (int bits : {8, 4}) {
      const QuantSpec q{bits, block};
      Buffer wire;
      double best = 1e30;
      for (int it = 0; it < iters; ++it) {
        g->barrier();
        const double t0 = now();
        issue_quantized_all_gather(*g, x.data(), n, q, wire).wait();
        finish_quantized_all_gather(*g, wire, n, q, y.data());
        best = std::min(best, now() - t0);
      }
      report("ag", bits == 8 ? "int8" : "int4", best,
             double(P - 1) * double(quant_packed_bytes(n, q)));
    }
    // reduce-scatter
    {
      double best = 1e30;
      for (int it = 0; it < iters; ++it) {
        g->barrier();
        const double t0 = now();
        g->reduce_scatter(x.data(), y.data(), n, ReduceOp::Avg);
        best = std::min(best, now() - t0);
      }
      report("rs", "fp32", best, fp32_sent);
    }
    for (int bits : {8, 4}) {
      const QuantSpec q{bits, block};
      double best = 1e30;
      pc->reset_stats();
      for (int it = 0; it < iters; ++it) {
        g->barrier();
        const double t0 = now();
        quantized_reduce_scatter(*pc, x.data(), err.data(), y.data(), n, q, 1.f / float(P));
        best = std::min(best, now() - t0);
      }
      report("rs", bits == 8 ? "int8+ef" : "int4+ef", best, pc->stats().bytes / 2 / iters);
    }
  }
  if (me == 0) {  // the quantiser alone
    const int64_t n = hi;
    std::vector<float> x(static_cast<size_t>(n)), e(static_cast<size_t>(n), 0.f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float((i * 2654435761u) % 2001) * 1e-3f - 1.f;
    for (int bits : {8, 4}) {
      const QuantSpec q{bits, block};
      std::vector<uint8_t> w(static_cast<size_t>(quant_packed_bytes(n, q)));
      double tq = 1e30, td = 1e30, tef = 1e30;
      for (int it = 0; it < iters; ++it) {
        double t0 = now();
        quantize(x.data(), n, q, w.data());
        tq = std::min(tq, now() - t0);
        t0 = now();
        dequantize(w.data(), n, q, x.data());
        td = std::min(td, now() - t0);
        t0 = now();
        quantize_ef(x.data(), e.data(), n, q, w.data());
        tef = std::min(tef, now() - t0);
      }
      std::printf("# int%d, %lld floats: quantize %.2f GB/s, dequantize %.2f GB/s, quantize with "
                  "error feedback %.2f GB/s (fp32 bytes in)\n",
                  bits, (long long)n, n * 4 / tq / 1e9, n * 4 / td / 1e9, n * 4 / tef / 1e9);
    }
  }
  return 0;
}
