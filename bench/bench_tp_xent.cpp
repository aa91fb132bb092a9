// The vocabulary-parallel cross-entropy (kernels/ops.h xent_shard_*) against the fused LM head
// it replaces under tensor parallelism: one rank's work on its V/t rows of the head (stats,
// combine over t ranks' stats, backward) next to lmhead_xent on the same V/t rows (what one
// rank's head would cost if one pass sufficed) and lmhead_xent on all V rows divided by t.
//
//   bench_tp_xent [--N 1024] [--C 768] [--V 50257] [--t 2] [--reps 3] [--threads 1] [--bf16]
//
// Times are the process's CPU clock (run with --threads 1 on a shared machine: then CPU time is
// the work's time), median of --reps after one warm-up. The shard runs the forward product
// twice (stats, then again in backward) where lmhead_xent runs it once: four products against
// three, so ~4/3 is the expected ratio.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/ops.h"

namespace {

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median_time(int reps, const std::function<void()>& f) {
  f();  // warm-up (workspace growth, per-shape choices)
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = cpu_now();
    f();
    t.push_back(cpu_now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> randv(size_t n, uint64_t seed, float scale) {
  sw::Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float((r.uniform() * 2 - 1) * scale);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int N = 1024, C = 768, V = 50257, t = 2, reps = 3, threads = 1;
  bool bf16 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--N") N = next();
    else if (a == "--C") C = next();
    else if (a == "--V") V = next();
    else if (a == "--t") t = next();
    else if (a == "--reps") reps = next();
    else if (a == "--threads") threads = next();
    else if (a == "--bf16") bf16 = true;
    else {
      std::fprintf(stderr, "bench_tp_xent: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (N <= 0 || C <= 0 || V < t || t < 1 || reps < 1 || threads < 1) {
    std::fprintf(stderr, "bench_tp_xent: bad sizes\n");
    return 2;
  }
  omp_set_num_threads(threads);
  const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), bf16 ? sw::DType::BF16 : sw::DType::F32);
  const int Vs = (V + t - 1) / t;  // rank 0's rows (the largest shard)
  const std::vector<float> h = randv(size_t(N) * C, 1, 1.f), w = randv(size_t(V) * C, 2, 0.05f);
  std::vector<int32_t> tg(N);
  sw::Rng r(3);
  for (auto& x : tg) x = int32_t(r.next() % uint64_t(V));
  std::vector<float> loss(N), dx(size_t(N) * C), dw(size_t(V) * C), lse(N);
  std::vector<float> stats(size_t(t) * N * 3, 0.f);
  // The other ranks' stats: a copy of this rank's (the combine's cost is O(t N) either way).
  const double t_shard = median_time(reps, [&] {
    ops.xent_shard_stats(stats.data(), h.data(), w.data(), tg.data(), 0, N, C, Vs);
    for (int k = 1; k < t; ++k)
      std::memcpy(stats.data() + size_t(k) * N * 3, stats.data(), sizeof(float) * N * 3);
    double total = 0;
    ops.xent_shard_combine(&total, lse.data(), loss.data(), stats.data(), tg.data(), t, N);
    ops.xent_shard_backward(dx.data(), sw::GradOut(dw.data(), true), h.data(), w.data(),
                            lse.data(), tg.data(), 0, N, C, Vs, 1.f / N);
  });
  std::vector<int32_t> tgs(tg);
  for (auto& x : tgs) x = x < Vs ? x : x % Vs;  // lmhead_xent's targets must lie in its rows
  const double t_head_shard = median_time(reps, [&] {
    ops.lmhead_xent(loss.data(), dx.data(), dw.data(), h.data(), w.data(), tgs.data(), N, C, Vs,
                    1.f / N);
  });
  const double t_head_full = median_time(reps, [&] {
    ops.lmhead_xent(loss.data(), dx.data(), dw.data(), h.data(), w.data(), tg.data(), N, C, V,
                    1.f / N);
  });
  std::printf("bench_tp_xent N=%d C=%d V=%d t=%d (shard rows %d) %s threads=%d reps=%d (CPU s)\n",
              N, C, V, t, Vs, bf16 ? "bf16" : "fp32", threads, reps);
  std::printf("  shard stats + combine + backward   %8.4f s\n", t_shard);
  std::printf("  lmhead_xent on the shard's rows    %8.4f s   ratio %.3f\n", t_head_shard,
              t_shard / t_head_shard);
  std::printf("  lmhead_xent on all rows / t        %8.4f s   ratio %.3f\n", t_head_full / t,
              t_shard / (t_head_full / t));
  return 0;
}
