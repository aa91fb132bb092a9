// Pipeline schedules as data (sharding/pipeline_schedule.h), without MPI or a model:
//  * every schedule's orders, for P in {1,2,3,4,8}, V in {1,2,3} (interleaved), M in 1..16
//    where valid, hold each (micro, chunk) op exactly once (counted here, independently of the
//    simulator) and run to the end in the simulator (no deadlock);
//  * the simulator against a timeline worked by hand (with and without comm);
//  * equal costs (f = 1, b = 2, no comm): GPipe's and 1F1B's bubble is (P-1)/(M+P-1),
//    Interleaved1F1B's (P-1)/(V*M+P-1) (Megatron's formula), the zero-bubble order's strictly
//    below Interleaved1F1B's for P >= 2 and ZB-H1's (P-1)/(3*V*M+P-1) (i = w = 1) for M >= P
//    (the figures are printed);
//  * activations in flight: GPipe M, 1F1B min(P - rank, M), zero-bubble <= interleaved, and
//    its live micro-batches (forward done, W not) <= the interleaved peak of rank 0;
//  * balance_stages against brute force on random small inputs;
//  * errors: one line naming the key or value; mutations of an order (swapped, dropped ops)
//    are reported by the simulator as deadlocks or malformed orders.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "sharding/pipeline_schedule.h"

using namespace sw;

namespace {

const PipeSchedule kAll[] = {PipeSchedule::GPipe, PipeSchedule::OneFOneB,
                             PipeSchedule::Interleaved1F1B, PipeSchedule::InterleavedZeroBubble};

std::vector<std::vector<PipeOp>> orders(PipeSchedule s, int P, int V, int M) {
  std::vector<std::vector<PipeOp>> o;
  for (int r = 0; r < P; ++r) o.push_back(pipe_order(s, P, V, M, r));
  return o;
}

// The valid (V, M) of a schedule at P.
std::vector<std::pair<int, int>> shapes(PipeSchedule s, int P) {
  std::vector<std::pair<int, int>> out;
  for (int V : {1, 2, 3}) {
    if (V > 1 && !pipe_schedule_interleaved(s)) continue;
    for (int M = 1; M <= 16; ++M)
      if (V == 1 || M % P == 0) out.push_back({V, M});
  }
  return out;
}

std::string what(PipeSchedule s, int P, int V, int M) {
  return std::string(pipe_schedule_name(s)) + " P=" + std::to_string(P) + " V=" +
         std::to_string(V) + " M=" + std::to_string(M);
}

// Error message of f(), "" if it does not throw sw::Error.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

PipeSim equal_costs(PipeSchedule s, int P, int V, int M) {
  return simulate_pipe(orders(s, P, V, M), P, V, PipeCosts{});
}

}  // namespace

TEST_CASE("pipeline schedule names are torchtitan's, an unknown one is a one-line config error",
          "[pipeline]") {
  for (PipeSchedule s : kAll) CHECK(pipe_schedule_from_name(pipe_schedule_name(s)) == s);
  CHECK(std::string(pipe_schedule_name(PipeSchedule::OneFOneB)) == "1F1B");
  CHECK(pipe_schedule_interleaved(PipeSchedule::Interleaved1F1B));
  CHECK(pipe_schedule_interleaved(PipeSchedule::InterleavedZeroBubble));
  CHECK_FALSE(pipe_schedule_interleaved(PipeSchedule::OneFOneB));
  CHECK(pipe_schedule_splits_backward(PipeSchedule::InterleavedZeroBubble));
  CHECK_FALSE(pipe_schedule_splits_backward(PipeSchedule::Interleaved1F1B));
  CHECK(error_of([] { pipe_schedule_from_name("1f1b"); }) ==
        "config: parallelism.pipeline_parallel_schedule: unknown schedule '1f1b' (choose GPipe, "
        "1F1B, Interleaved1F1B, InterleavedZeroBubble)");
}

TEST_CASE("every order holds each (micro, chunk) once and runs without deadlock", "[pipeline]") {
  int cases = 0;
  for (PipeSchedule s : kAll)
    for (int P : {1, 2, 3, 4, 8})
      for (auto [V, M] : shapes(s, P)) {
        INFO(what(s, P, V, M));
        const auto o = orders(s, P, V, M);
        const bool split = pipe_schedule_splits_backward(s);
        for (int r = 0; r < P; ++r) {
          // (kind, micro, chunk) -> position in the order.
          std::map<std::tuple<int, int, int>, int> at;
          for (int k = 0; k < int(o[size_t(r)].size()); ++k) {
            const PipeOp& op = o[size_t(r)][size_t(k)];
            REQUIRE(at.emplace(std::make_tuple(int(op.kind), op.micro, op.chunk), k).second);
          }
          REQUIRE(int(at.size()) == M * V * (split ? 3 : 2));
          for (int m = 0; m < M; ++m)
            for (int c = 0; c < V; ++c) {
              auto pos = [&](PipeOpKind k) {
                auto it = at.find(std::make_tuple(int(k), m, c));
                REQUIRE(it != at.end());
                return it->second;
              };
              const int f = pos(PipeOpKind::Forward);
              if (split) {
                REQUIRE(f < pos(PipeOpKind::BackwardInput));
                REQUIRE(pos(PipeOpKind::BackwardInput) < pos(PipeOpKind::BackwardWeight));
              } else {
                REQUIRE(f < pos(PipeOpKind::Backward));
              }
            }
        }
        const PipeSim sim = simulate_pipe(o, P, V, PipeCosts{});
        INFO(sim.problem);
        REQUIRE(sim.ok);
        // Each rank's spans follow its order without overlap.
        for (int r = 0; r < P; ++r)
          for (size_t k = 1; k < sim.spans[size_t(r)].size(); ++k)
            REQUIRE(sim.spans[size_t(r)][k].first >= sim.spans[size_t(r)][k - 1].second);
        // Safe whatever the costs (the zero-bubble order was placed on unit costs).
        REQUIRE(simulate_pipe(o, P, V, PipeCosts{1.3, 2.1, 0.9, 1.2, 0.25}).ok);
        ++cases;
      }
  CHECK(cases > 300);
}

TEST_CASE("the simulator's timeline equals one worked by hand", "[pipeline]") {
  // 1F1B, P = 2, M = 2: rank 0 runs F0 F1 B0 B1, rank 1 F0 B0 F1 B1.
  const auto o = orders(PipeSchedule::OneFOneB, 2, 1, 2);
  using K = PipeOpKind;
  CHECK(o[0] == std::vector<PipeOp>{{K::Forward, 0, 0}, {K::Forward, 1, 0}, {K::Backward, 0, 0},
                                    {K::Backward, 1, 0}});
  CHECK(o[1] == std::vector<PipeOp>{{K::Forward, 0, 0}, {K::Backward, 0, 0}, {K::Forward, 1, 0},
                                    {K::Backward, 1, 0}});
  using Spans = std::vector<std::pair<double, double>>;
  PipeSim a = simulate_pipe(o, 2, 1, PipeCosts{});
  REQUIRE(a.ok);
  CHECK(a.spans[0] == Spans{{0, 1}, {1, 2}, {4, 6}, {7, 9}});
  CHECK(a.spans[1] == Spans{{1, 2}, {2, 4}, {4, 5}, {5, 7}});
  CHECK(a.makespan == 9);
  CHECK(a.busy == std::vector<double>{6, 6});
  CHECK(a.bubble == Approx(1 - 12.0 / 18).epsilon(1e-15));
  // comm = 0.5 on each crossing: F1 on rank 1 waits for 2 + 0.5 but rank 1 is busy until 4.5.
  PipeCosts c;
  c.comm = 0.5;
  PipeSim b = simulate_pipe(o, 2, 1, c);
  REQUIRE(b.ok);
  CHECK(b.spans[0] == Spans{{0, 1}, {1, 2}, {5, 7}, {8, 10}});
  CHECK(b.spans[1] == Spans{{1.5, 2.5}, {2.5, 4.5}, {4.5, 5.5}, {5.5, 7.5}});
  CHECK(b.makespan == 10);
  // Chunks of one rank pass activations without comm: P = 1, V = 2 is one busy rank.
  PipeSim one = simulate_pipe(orders(PipeSchedule::Interleaved1F1B, 1, 2, 3), 1, 2, c);
  REQUIRE(one.ok);
  CHECK(one.makespan == 3 * 2 * 3);
  CHECK(one.bubble == 0);
}

TEST_CASE("bubbles with equal costs match the formulas, zero bubble beats interleaved",
          "[pipeline]") {
  for (int P : {1, 2, 3, 4, 8})
    for (int M = 1; M <= 16; ++M) {
      INFO("P=" << P << " M=" << M);
      const double want = double(P - 1) / (M + P - 1);
      CHECK(std::abs(equal_costs(PipeSchedule::GPipe, P, 1, M).bubble - want) < 1e-12);
      CHECK(std::abs(equal_costs(PipeSchedule::OneFOneB, P, 1, M).bubble - want) < 1e-12);
      for (int V : {1, 2, 3}) {
        if (V > 1 && M % P != 0) continue;
        INFO("V=" << V);
        const PipeSim il = equal_costs(PipeSchedule::Interleaved1F1B, P, V, M);
        CHECK(std::abs(il.bubble - double(P - 1) / (V * M + P - 1)) < 1e-12);
        // The split (i = w = 1, so F+I+W = 3 per op like F+B): ZB-H1's idle time (P-1)
        // per rank, a third of the interleaved one's, once there are W's enough (M >= P).
        const PipeSim zb = equal_costs(PipeSchedule::InterleavedZeroBubble, P, V, M);
        if (P >= 2) CHECK(zb.bubble < il.bubble);
        if (M >= P) CHECK(std::abs(zb.bubble - double(P - 1) / (3 * V * M + P - 1)) < 1e-12);
      }
    }
  std::printf("bubble, f=1 b=2 (i=1 w=1), comm=0:   P  V   M  1F1B/GPipe  Interleaved1F1B  "
              "InterleavedZeroBubble  (theory 1F1B, interleaved, ZB-H1)\n");
  for (int P : {2, 4, 8})
    for (int V : {1, 2})
      for (int M : {P, 2 * P, 4 * P, 8 * P}) {
        const double f1b = equal_costs(PipeSchedule::OneFOneB, P, 1, M).bubble;
        const double il = equal_costs(PipeSchedule::Interleaved1F1B, P, V, M).bubble;
        const double zb = equal_costs(PipeSchedule::InterleavedZeroBubble, P, V, M).bubble;
        std::printf("%38d %2d %3d  %10.4f  %15.4f  %21.4f  (%.4f, %.4f, %.4f)\n", P, V, M, f1b, il,
                    zb, double(P - 1) / (M + P - 1), double(P - 1) / (V * M + P - 1),
                    double(P - 1) / (3 * V * M + P - 1));
      }
}

TEST_CASE("activations in flight per schedule", "[pipeline]") {
  for (int P : {1, 2, 3, 4, 8})
    for (int M = 1; M <= 16; ++M)
      for (int r = 0; r < P; ++r) {
        INFO("P=" << P << " M=" << M << " rank=" << r);
        const auto g = pipe_order(PipeSchedule::GPipe, P, 1, M, r);
        CHECK(pipe_peak_in_flight(g) == M);
        CHECK(pipe_peak_weight_pending(g) == 0);
        CHECK(pipe_peak_in_flight(pipe_order(PipeSchedule::OneFOneB, P, 1, M, r)) ==
              std::min(P - r, M));
        for (int V : {1, 2, 3}) {
          if (V > 1 && M % P != 0) continue;
          INFO("V=" << V);
          const auto il = pipe_order(PipeSchedule::Interleaved1F1B, P, V, M, r);
          const auto zb = pipe_order(PipeSchedule::InterleavedZeroBubble, P, V, M, r);
          CHECK(pipe_peak_in_flight(zb) <= pipe_peak_in_flight(il));
          // Forward done and W not (what the split keeps): no more than the interleaved
          // order's largest peak over the ranks, rank 0's (ZB-H1: 1F1B's pipeline peak).
          const int cap = pipe_peak_in_flight(pipe_order(PipeSchedule::Interleaved1F1B, P, V, M, 0));
          int live = 0, peak_live = 0;
          for (const PipeOp& o : zb) {
            if (o.kind == PipeOpKind::Forward) peak_live = std::max(peak_live, ++live);
            if (o.kind == PipeOpKind::BackwardWeight) --live;
          }
          CHECK(peak_live <= cap);
          CHECK(pipe_peak_weight_pending(zb) >= 1);
        }
      }
}

TEST_CASE("balance_stages equals brute force on random small inputs", "[pipeline]") {
  std::mt19937 rng(37);
  // The smallest largest stage sum over every split of cost into k non-empty runs.
  auto brute = [](const std::vector<double>& cost, int k) {
    const int n = int(cost.size());
    double best = 1e300;
    for (unsigned mask = 0; mask < (1u << (n - 1)); ++mask) {  // bit i: a boundary after i
      if (__builtin_popcount(mask) != k - 1) continue;
      double worst = 0, cur = 0;
      for (int i = 0; i < n; ++i) {
        cur += cost[size_t(i)];
        if (i == n - 1 || (mask >> i & 1u)) worst = std::max(worst, cur), cur = 0;
      }
      best = std::min(best, worst);
    }
    return best;
  };
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + int(rng() % 10);
    const int k = 1 + int(rng() % unsigned(n));
    std::vector<double> cost(static_cast<size_t>(n));
    for (double& x : cost) x = trial % 2 ? double(rng() % 10) : std::uniform_real_distribution<>(0, 5)(rng);
    const std::vector<int> b = balance_stages(cost, k);
    INFO("trial " << trial << " n=" << n << " k=" << k);
    REQUIRE(int(b.size()) == k + 1);
    REQUIRE(b.front() == 0);
    REQUIRE(b.back() == n);
    double worst = 0;
    for (int j = 0; j < k; ++j) {
      REQUIRE(b[size_t(j)] < b[size_t(j) + 1]);
      double s = 0;
      for (int i = b[size_t(j)]; i < b[size_t(j) + 1]; ++i) s += cost[size_t(i)];
      worst = std::max(worst, s);
    }
    CHECK(worst == Approx(brute(cost, k)).epsilon(1e-12));
  }
  CHECK(balance_stages({1, 1, 1, 1}, 2) == std::vector<int>{0, 2, 4});
  CHECK(balance_stages({5, 1, 1, 1, 1, 1}, 2) == std::vector<int>{0, 1, 6});
}

TEST_CASE("pipeline errors are one line naming the key or value", "[pipeline]") {
  auto one_line = [](const std::string& m, const std::string& needle) {
    INFO(m);
    CHECK(m.find('\n') == std::string::npos);
    CHECK(m.find(needle) != std::string::npos);
  };
  one_line(error_of([] { pipe_order(PipeSchedule::OneFOneB, 0, 1, 4, 0); }),
           "parallelism.pipeline_parallel_degree: P must be >= 1, got 0");
  one_line(error_of([] { pipe_order(PipeSchedule::OneFOneB, 2, 1, 0, 0); }),
           "gradient_accumulation_steps: micro-batches M must be >= 1, got 0");
  one_line(error_of([] { pipe_order(PipeSchedule::OneFOneB, 2, 2, 4, 0); }),
           "1F1B: V=2 virtual stages per rank need an interleaved schedule");
  one_line(error_of([] { pipe_order(PipeSchedule::Interleaved1F1B, 4, 2, 6, 0); }),
           "micro-batches M=6 must be a multiple of parallelism.pipeline_parallel_degree P=4");
  one_line(error_of([] { pipe_order(PipeSchedule::GPipe, 2, 1, 4, 2); }),
           "rank 2 is outside the pipeline of P=2");
  one_line(error_of([] { pipe_order(PipeSchedule::Interleaved1F1B, 2, 0, 4, 0); }),
           "V must be >= 1, got 0");
  one_line(error_of([] { balance_stages({1, 2}, 3); }), "2 units cannot fill 3 stages");
  one_line(error_of([] { balance_stages({1, -2}, 1); }), "cost of unit 1 must be >= 0");
  one_line(error_of([] { simulate_pipe({{}}, 2, 1, PipeCosts{}); }), "1 orders for P=2");
}

TEST_CASE("mutated orders are caught by the simulator", "[pipeline]") {
  using K = PipeOpKind;
  // GPipe, P = 2: rank 0 running B0 before its last F waits for rank 1's B0, which comes after
  // rank 1's last F, which waits for rank 0's last F: a cycle.
  auto g = orders(PipeSchedule::GPipe, 2, 1, 3);
  std::swap(g[0][2], g[0][3]);
  PipeSim s = simulate_pipe(g, 2, 1, PipeCosts{});
  CHECK_FALSE(s.ok);
  CHECK(s.problem ==
        "deadlock: rank 0 op 2 B(m0,c0) waits for B/I(m0, stage 1) on rank 1, which is stuck at "
        "op 2 F(m2,c0)");
  // 1F1B: a backward before its own forward.
  auto f = orders(PipeSchedule::OneFOneB, 4, 1, 8);
  auto it = std::find(f[1].begin(), f[1].end(), PipeOp{K::Backward, 0, 0});
  std::iter_swap(it, std::find(f[1].begin(), f[1].end(), PipeOp{K::Forward, 0, 0}));
  s = simulate_pipe(f, 4, 1, PipeCosts{});
  CHECK_FALSE(s.ok);
  CHECK(s.problem.rfind("deadlock: rank 1 op 0 B(m0,c0) waits for F(m0, stage 1) on rank 1", 0) == 0);
  // Zero bubble: a W before its I.
  auto z = orders(PipeSchedule::InterleavedZeroBubble, 2, 2, 4);
  auto w = std::find_if(z[0].begin(), z[0].end(), [](const PipeOp& o) { return o.kind == K::BackwardWeight; });
  auto i = std::find(z[0].begin(), z[0].end(), PipeOp{K::BackwardInput, w->micro, w->chunk});
  std::iter_swap(w, i);
  s = simulate_pipe(z, 2, 2, PipeCosts{});
  CHECK_FALSE(s.ok);
  CHECK(s.problem.find("deadlock: rank 0") == 0);
  // A dropped op and a duplicated one: malformed, named.
  auto d = orders(PipeSchedule::OneFOneB, 2, 1, 2);
  d[1].pop_back();
  s = simulate_pipe(d, 2, 1, PipeCosts{});
  CHECK(s.problem == "rank 1: micro 1 chunk 0 has 1 F, 0 B, 0 I, 0 W (want one F and one B, or "
                     "one F, one I and one W)");
  d = orders(PipeSchedule::OneFOneB, 2, 1, 2);
  d[0].push_back(d[0][0]);
  CHECK_FALSE(simulate_pipe(d, 2, 1, PipeCosts{}).ok);
  // Interleaved: chunk 1's forward before chunk 0's on rank 0 (a cycle through rank 1).
  auto il = orders(PipeSchedule::Interleaved1F1B, 2, 2, 2);
  auto f1 = std::find(il[0].begin(), il[0].end(), PipeOp{K::Forward, 0, 1});
  std::iter_swap(il[0].begin(), f1);
  CHECK_FALSE(simulate_pipe(il, 2, 2, PipeCosts{}).ok);
}
