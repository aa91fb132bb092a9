// Collective benchmark in the nccl-tests style (see nccl-tests doc/PERFORMANCE.md):
//   mpirun --allow-run-as-root -np 2 bench_collectives [--min 1K] [--max 256M] [--step 4]
//       [--iters 20] [--warmup 3] [--ops ag,rs,ar]
//       [--algos mpi,ring,direct,oneshot,tree,halving_doubling,hierarchical,auto]
//       [--chunk-kb 512] [--stat median|min] [--json out.json]
// size = nccl-tests' size: all_gather output bytes, reduce_scatter input bytes, all_reduce
// buffer bytes. time = median over iterations of the slowest rank's time for one blocking
// call (issue + wait, as the engine sees it), each iteration started by a barrier
// (--stat min: the fastest iteration instead, for machines shared with other jobs).
// algbw = size / time; busbw = algbw * (n-1)/n for all_gather/reduce_scatter and
// algbw * 2(n-1)/n for all_reduce. #wrong counts elements that differ from the exact
// expected value (integer-valued inputs, so any summation order is exact). Algorithms that do
// not apply print "-": oneshot outside all_reduce, tree for all_gather, hierarchical where the
// hosts (launch_env().local_size; e.g. `mpirun -np 4 env OMPI_COMM_WORLD_LOCAL_SIZE=2 ...` for
// two fake hosts of 2) do not hold equally many consecutive ranks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/launch.h"
#include "sharding/comm/group.h"

using namespace sw;

namespace {

int64_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string u = end ? end : "";
  if (u == "K" || u == "k") v *= 1024;
  else if (u == "M" || u == "m") v *= 1024 * 1024;
  else if (u == "G" || u == "g") v *= 1024.0 * 1024 * 1024;
  else if (!u.empty()) fail("bench_collectives", "bad size '" + s + "'");
  return static_cast<int64_t>(v);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p <= s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    if (q > p) out.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

float val(int rank, int64_t i) { return static_cast<float>((rank * 7 + i * 13) % 31 - 15); }

std::string human(int64_t b) {
  char buf[32];
  if (b >= (1 << 20)) std::snprintf(buf, sizeof buf, "%lldM", static_cast<long long>(b >> 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%lldK", static_cast<long long>(b >> 10));
  else std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(b));
  return buf;
}

// Column headers: halving_doubling as "hd", hierarchical as "hier".
const char* short_name(CommAlgo a) {
  return a == CommAlgo::HalvingDoubling ? "hd" : a == CommAlgo::Hierarchical ? "hier" : comm_algo_name(a);
}

struct Result {
  std::string op, algo;
  int64_t size = 0, count = 0;
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;
};

}  // namespace

int main(int argc, char** argv) try {
  int64_t min_b = 1024, max_b = 256 << 20, step = 4;
  int iters = 20, warmup = 3;
  std::string ops_s = "ag,rs,ar", json_path;
  std::string algos_s = "mpi,ring,direct,oneshot,tree,halving_doubling,hierarchical,auto";
  int64_t chunk_kb = 0;
  std::string stat = "median";
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail("bench_collectives", "missing value after " + a);
      return argv[++i];
    };
    if (a == "--min") min_b = parse_size(next());
    else if (a == "--max") max_b = parse_size(next());
    else if (a == "--step") step = std::stoll(next());
    else if (a == "--iters") iters = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--ops") ops_s = next();
    else if (a == "--algos") algos_s = next();
    else if (a == "--chunk-kb") chunk_kb = std::stoll(next());
    else if (a == "--json") json_path = next();
    else if (a == "--stat") stat = next();
    else fail("bench_collectives", "unknown flag '" + a + "' (see the comment at the top of bench/bench_collectives.cpp)");
  }
  if (step < 2) fail("bench_collectives", "--step must be >= 2");
  if (stat != "median" && stat != "min") fail("bench_collectives", "--stat must be median or min");
  GroupPtr g = mpi_world_group();
  const int n = g->size(), r = g->rank();
  if (chunk_kb > 0) {
    CommOptions o = g->options();
    o.chunk_bytes = chunk_kb << 10;
    g->set_options(o);
  }
  // The layout Hierarchical needs (as MpiGroup sees it for the world: hosts of local_size
  // consecutive ranks, equally many).
  const int L = launch_env().local_size;
  const bool hier_ok = L <= 0 || n % std::min(L, n) == 0;
  std::vector<CommAlgo> algos;
  for (const auto& s : split_list(algos_s)) algos.push_back(comm_algo_from_name(s));

  // One allocation per role, sized for the largest case.
  const int64_t max_elems = max_b / 4 + n;
  std::vector<float> in(static_cast<size_t>(max_elems)), out(static_cast<size_t>(max_elems));
  for (int64_t i = 0; i < max_elems; i++) in[static_cast<size_t>(i)] = val(r, i);

  std::vector<Result> results;
  if (r == 0)
    std::printf("# bench_collectives: %d ranks (%d per host), f32, %s of %d iterations after %d warm-up, "
                "chunk %lld KiB; GB/s = 1e9 B/s\n",
                n, L > 0 ? std::min(L, n) : n, stat.c_str(), iters, warmup, static_cast<long long>(g->options().chunk_bytes >> 10));
  for (const std::string& op : split_list(ops_s)) {
    if (op != "ag" && op != "rs" && op != "ar") fail("bench_collectives", "unknown op '" + op + "'");
    const char* opname = op == "ag" ? "all_gather" : op == "rs" ? "reduce_scatter" : "all_reduce";
    const double busf = op == "ar" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
    if (r == 0) {
      std::printf("\n# %s\n# %8s %10s", opname, "size", "count");
      for (CommAlgo a : algos) std::printf(" | %7s %9s %6s", short_name(a), "time(us)", "busbw");
      std::printf(" | #wrong\n");
    }
    for (int64_t size = min_b; size <= max_b; size *= step) {
      // count: elements per rank for AG/RS, total for AR.
      const int64_t count = op == "ar" ? size / 4 : size / 4 / n;
      if (count == 0) continue;
      const int64_t bytes = op == "ar" ? count * 4 : count * n * 4;
      if (r == 0) std::printf("  %8s %10lld", human(bytes).c_str(), static_cast<long long>(count));
      int64_t wrong_total = 0;
      for (CommAlgo a : algos) {
        if ((a == CommAlgo::OneShot && op != "ar") || (a == CommAlgo::Tree && op == "ag") ||
            (a == CommAlgo::Hierarchical && !hier_ok)) {
          if (r == 0) std::printf(" | %7s %9s %6s", "", "-", "-");
          continue;
        }
        auto run = [&] {
          if (op == "ag") g->all_gather(in.data(), out.data(), count, DType::F32, a);
          else if (op == "rs") g->reduce_scatter(in.data(), out.data(), count, ReduceOp::Sum, DType::F32, a);
          else g->all_reduce(in.data(), out.data(), count, ReduceOp::Sum, DType::F32, a);
        };
        for (int w = 0; w < warmup; w++) run();
        std::vector<double> t(static_cast<size_t>(iters)), tmax(static_cast<size_t>(iters));
        for (int it = 0; it < iters; it++) {
          g->barrier();
          const auto t0 = std::chrono::steady_clock::now();
          run();
          t[static_cast<size_t>(it)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        std::vector<double> tf(t.begin(), t.end());
        std::vector<float> tf32(tf.begin(), tf.end()), tm32(tf32.size());
        g->all_reduce(tf32.data(), tm32.data(), iters, ReduceOp::Max);
        std::sort(tm32.begin(), tm32.end());
        const double med = stat == "min" ? tm32.front() : tm32[tm32.size() / 2];
        // Verify once more on fresh output.
        std::fill(out.begin(), out.begin() + (op == "rs" ? count : op == "ag" ? count * n : count), NAN);
        run();
        int64_t wrong = 0;
        if (op == "ag") {
          for (int q = 0; q < n; q++)
            for (int64_t i = 0; i < count; i++)
              wrong += out[static_cast<size_t>(q * count + i)] != val(q, i);
        } else {
          const int64_t base = op == "rs" ? r * count : 0;
          for (int64_t i = 0; i < count; i++) {
            float s = 0;
            for (int q = 0; q < n; q++) s += val(q, base + i);
            wrong += out[static_cast<size_t>(i)] != s;
          }
        }
        int64_t wsum = 0;
        {
          float wf = static_cast<float>(wrong), ws = 0;
          g->all_reduce(&wf, &ws, 1, ReduceOp::Sum);
          wsum = static_cast<int64_t>(ws);
        }
        wrong_total += wsum;
        Result res;
        res.op = opname;
        res.algo = comm_algo_name(a);
        res.size = bytes;
        res.count = count;
        res.time_us = med * 1e6;
        res.algbw = bytes / med / 1e9;
        res.busbw = res.algbw * busf;
        res.wrong = wsum;
        results.push_back(res);
        if (r == 0) std::printf(" | %7s %9.1f %6.2f", "", res.time_us, res.busbw);
        std::fflush(stdout);
      }
      if (r == 0) std::printf(" | %lld\n", static_cast<long long>(wrong_total));
    }
  }
  if (r == 0 && !json_path.empty()) {
    nlohmann::json j;
    j["ranks"] = n;
    j["iters"] = iters;
    j["warmup"] = warmup;
    j["stat"] = stat;
    j["chunk_bytes"] = g->options().chunk_bytes;
    for (const Result& x : results)
      j["results"].push_back({{"op", x.op}, {"algo", x.algo}, {"size", x.size}, {"count", x.count},
                              {"time_us", x.time_us}, {"algbw_GBps", x.algbw},
                              {"busbw_GBps", x.busbw}, {"wrong", x.wrong}});
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) fail("bench_collectives", "cannot write --json file '" + json_path + "'");
    std::fputs(j.dump(1).c_str(), f);
    std::fclose(f);
  }
  int64_t bad = 0;
  for (const Result& x : results) bad += x.wrong;
  return bad ? 1 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  comm_abort(1);
}
