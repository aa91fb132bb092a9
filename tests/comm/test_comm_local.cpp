// The one-rank LocalGroup (no MPI, no mpirun), names, options and the reduction kernels.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm_test_util.h"
#include "core/error.h"
#include "sharding/comm/group.h"
#include "sharding/comm/reduce.h"

using namespace sw;
using namespace sw::test;

TEST_CASE("world_group without a launcher is a LocalGroup") {
  REQUIRE_FALSE(launched_multi_rank());
  GroupPtr g = world_group();
  CHECK(std::string(g->backend()) == "local");
  CHECK(g->rank() == 0);
  CHECK(g->size() == 1);
  CHECK(world_group() == g);
  CHECK(world_rank() == 0);
}

TEST_CASE("LocalGroup collectives are copies, issued and completed at once") {
  GroupPtr g = make_local_group();
  std::vector<float> a = {1.5f, -2.f, 3.25f}, b(3, 0.f);
  Work w = g->issue_all_gather(a.data(), b.data(), 3);
  CHECK(w.test());
  w.wait();
  CHECK(b == a);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    std::fill(b.begin(), b.end(), 0.f);
    g->reduce_scatter(a.data(), b.data(), 3, op);
    CHECK(b == a);
    std::fill(b.begin(), b.end(), 0.f);
    g->all_reduce(a.data(), b.data(), 3, op);
    CHECK(b == a);
  }
  std::vector<float> c = a;
  g->all_reduce(c.data(), c.data(), 3, ReduceOp::Avg);  // in place
  CHECK(c == a);
  g->broadcast(c.data(), 3, 0);
  g->barrier();
  CHECK(g->issue_barrier().seq() > w.seq());
  CHECK_THROWS_WITH(g->broadcast(c.data(), 3, 1), Catch::Contains("root 1"));
  CHECK_THROWS_WITH(g->all_gather(a.data(), b.data(), -1), Catch::Contains("count must be >= 0"));
  CHECK_THROWS_AS(g->issue_all_gather(a.data(), b.data(), 3, DType::F32, CommAlgo::OneShot), Error);
  GroupPtr s = g->split(3, 0);
  REQUIRE(s);
  CHECK(s->size() == 1);
  CHECK_FALSE(g->split(-1, 0));
  CHECK(g->stats().ops >= 9);
  g->reset_stats();
  CHECK(g->stats().ops == 0);
}

TEST_CASE("names, descriptions and options") {
  CHECK(comm_algo_from_name("ring") == CommAlgo::Ring);
  CHECK(comm_algo_from_name("oneshot") == CommAlgo::OneShot);
  CHECK_THROWS_WITH(comm_algo_from_name("butterfly"), Catch::Contains("unknown algorithm 'butterfly'"));
  CHECK(comm_algo_from_name("halving_doubling") == CommAlgo::HalvingDoubling);
  // Auto's choice (mpi_group.cpp's measured thresholds): hierarchical only across hosts.
  CHECK(auto_comm_algo(CollKind::AllReduce, 64 << 20, 4) == CommAlgo::Ring);
  CHECK(auto_comm_algo(CollKind::AllReduce, 1024, 4) == CommAlgo::OneShot);
  CHECK(auto_comm_algo(CollKind::AllReduce, 64 << 20, 4, 2) == CommAlgo::Hierarchical);
  CHECK(auto_comm_algo(CollKind::ReduceScatter, 16 << 20, 4, 2) == CommAlgo::Hierarchical);
  CHECK(auto_comm_algo(CollKind::Broadcast, 64 << 20, 4, 2) == CommAlgo::Mpi);
  // The cost model: 1 GB/s inside a host, 10 MB/s across; 4 ranks on 2 hosts.
  const CommFit in{1e-5, 1e9}, out{1e-3, 1e7};
  const double B = 64e6;
  auto t = [&](CommAlgo a, CollKind k, int hosts) { return comm_algo_seconds(a, k, B, 4, hosts, in, out); };
  CHECK(t(CommAlgo::Ring, CollKind::AllReduce, 1) == Approx(1e-5 + 2 * B * 3 / 4 / 1e9));
  CHECK(t(CommAlgo::Ring, CollKind::AllReduce, 2) == Approx(1e-3 + 2 * B * 3 / 4 / 1e7));
  CHECK(t(CommAlgo::Hierarchical, CollKind::AllReduce, 2) ==
        Approx(1e-5 + 2 * B / 2 / 1e9 + 1e-3 + 2 * (B / 2) / 2 / 1e7));
  CHECK(t(CommAlgo::Auto, CollKind::AllReduce, 2) == t(CommAlgo::Hierarchical, CollKind::AllReduce, 2));
  CHECK(t(CommAlgo::Tree, CollKind::AllReduce, 1) > t(CommAlgo::Ring, CollKind::AllReduce, 1));
  CHECK(comm_algo_seconds(CommAlgo::HalvingDoubling, CollKind::ReduceScatter, B, 3, 1, in, out) ==
        Approx(1e-5 + (B * 2 / 3 + B) / 1e9));
  CHECK(comm_algo_seconds(CommAlgo::Ring, CollKind::AllGather, B, 1, 1, in, out) == 0);
  Collective c;
  c.kind = CollKind::ReduceScatter;
  c.count = 12;
  c.dtype = DType::BF16;
  c.op = ReduceOp::Avg;
  CHECK(describe(c) == "reduce_scatter(count=12,bf16,avg)");
  c.kind = CollKind::AllGather;
  CHECK(describe(c) == "all_gather(count=12,bf16)");
  ::setenv("SHARDWISE_COMM_TIMEOUT_S", "7.5", 1);
  ::setenv("SHARDWISE_COMM_DELAY_US", "100", 1);
  ::setenv("SHARDWISE_COMM_DEBUG", "1", 1);
  ::setenv("SHARDWISE_COMM_CHUNK_KB", "64", 1);
  CommOptions o = CommOptions::from_env();
  CHECK(o.timeout_s == 7.5);
  CHECK(o.delay_us == 100);
  CHECK(o.debug);
  CHECK(o.chunk_bytes == 64 * 1024);
  ::unsetenv("SHARDWISE_COMM_DEBUG");
  ::unsetenv("SHARDWISE_COMM_CHUNK_KB");
  CHECK_FALSE(CommOptions::from_env().debug);
  ::setenv("SHARDWISE_COMM_TIMEOUT_S", "soon", 1);
  CHECK_THROWS_WITH(CommOptions::from_env(), Catch::Contains("SHARDWISE_COMM_TIMEOUT_S"));
  ::unsetenv("SHARDWISE_COMM_TIMEOUT_S");
  ::unsetenv("SHARDWISE_COMM_DELAY_US");
  GroupPtr g = make_local_group();
  g->set_timeout(5);
  CHECK(g->options().timeout_s == 5);
  CHECK_THROWS_AS(g->set_timeout(0), Error);
}

TEST_CASE("reduction kernels: f32 exact, 16-bit rounded per add, aliasing") {
  const int64_t n = 1000;  // not a multiple of the kernel's tile
  const int k = 4;
  std::vector<std::vector<float>> x(k, std::vector<float>(n));
  for (int q = 0; q < k; q++)
    for (int64_t i = 0; i < n; i++) x[q][static_cast<size_t>(i)] = rand_val(q, i, 11);
  auto xf = [&](int q, int64_t i) { return x[static_cast<size_t>(q)][static_cast<size_t>(i)]; };
  std::vector<const void*> src;
  for (auto& v : x) src.push_back(v.data());
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
    std::vector<float> got(n), two(n);
    comm::reduce_n(got.data(), src.data(), k, n, DType::F32, op);
    comm::reduce2(two.data(), x[0].data(), x[1].data(), n, DType::F32, op);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
      if (got[static_cast<size_t>(i)] != reduce_ref(xf, k, 0, i, op, Order::RankOrder)) bad++;
      if (two[static_cast<size_t>(i)] != reduce_ref(xf, 2, 0, i, op, Order::RankOrder)) bad++;
    }
    CHECK(bad == 0);
    // dst aliasing a source (the in-place reduce_scatter case).
    std::vector<float> alias = x[2];
    std::vector<const void*> src2 = src;
    src2[2] = alias.data();
    comm::reduce_n(alias.data(), src2.data(), k, n, DType::F32, op);
    CHECK(bits_equal(alias.data(), got.data(), n));
  }
  // Order matters for random inputs: rank order differs from the ring grouping somewhere.
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++)
    differ += reduce_ref(xf, k, 0, i, ReduceOp::Sum, Order::RankOrder) !=
              reduce_ref(xf, k, 0, i, ReduceOp::Sum, Order::Ring);
  CHECK(differ > 0);
  for (DType dt : {DType::BF16, DType::F16}) {
    std::vector<std::vector<uint16_t>> h(k, std::vector<uint16_t>(n));
    for (int q = 0; q < k; q++)
      for (int64_t i = 0; i < n; i++)
        h[q][static_cast<size_t>(i)] = dt == DType::BF16 ? f32_to_bf16(xf(q, i) * 0.01f) : f32_to_f16(xf(q, i) * 0.01f);
    auto hx = [&](int q, int64_t i) { return h[static_cast<size_t>(q)][static_cast<size_t>(i)]; };
    std::vector<const void*> hs;
    for (auto& v : h) hs.push_back(v.data());
    std::vector<uint16_t> got(n);
    comm::reduce_n(got.data(), hs.data(), k, n, dt, ReduceOp::Sum);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
      if (got[static_cast<size_t>(i)] != reduce_ref16(hx, k, 0, i, ReduceOp::Sum, Order::RankOrder, dt)) bad++;
    CHECK(bad == 0);
    comm::divide(got.data(), n, dt, 3.f);
  }
  std::vector<float> d = {3.f, 1.f, -6.f};
  comm::divide(d.data(), 3, DType::F32, 3.f);
  CHECK(d[0] == 1.f);
  CHECK(d[1] == 1.f / 3.f);
  CHECK(d[2] == -2.f);
}
