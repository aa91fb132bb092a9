// Collectives over MPI, run by ctest under mpirun with 1, 2, 3 and 4 ranks (oversubscribed).
// Every rank runs the same test cases in the same order; checks use CHECK (not REQUIRE) so a
// failing rank keeps issuing the same collectives as the others. References are computed
// locally from deterministic inputs of every rank.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "comm_test_util.h"
#include "core/error.h"
#include "sharding/comm/group.h"

using namespace sw;
using namespace sw::test;

namespace {

GroupPtr world() {
  static GroupPtr g = [] {
    GroupPtr w = mpi_world_group();
    w->set_timeout(30);  // a bug hangs for 30 s at most, then the watchdog aborts
    return w;
  }();
  return g;
}

const std::vector<int64_t> kCounts = {0, 1, 3, 7, 100, 1001, 5000};
const std::vector<CommAlgo> kAlgos = {CommAlgo::Auto, CommAlgo::Mpi, CommAlgo::Ring,
                                      CommAlgo::Direct};
const std::vector<int64_t> kChunks = {64, 512 << 10};  // tiny chunks exercise the pipelines

void set_chunk(Group& g, int64_t bytes) {
  CommOptions o = g.options();
  o.chunk_bytes = bytes;
  g.set_options(o);
}

// Exact comparison for algorithms whose add order is known; tolerance otherwise.
void check_reduced(const float* got, const float* want, int64_t n, bool exact, const char* what) {
  if (exact) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
      if (std::memcmp(&got[i], &want[i], 4) != 0) bad++;
    INFO(what);
    CHECK(bad == 0);
  } else {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
      if (!(std::fabs(got[i] - want[i]) <= 1e-5f * (1.0f + std::fabs(want[i])))) bad++;
    INFO(what);
    CHECK(bad == 0);
  }
}

}  // namespace

TEST_CASE("world: rank, size, backend") {
  GroupPtr g = world();
  int size = 0;
  CHECK(std::string(g->backend()) == "mpi");
  CHECK(g->rank() >= 0);
  CHECK(g->rank() < g->size());
  CHECK(world_rank() == g->rank());
  CHECK(error_rank() == g->rank());
  // world_group() picks MPI exactly when more than one rank was launched.
  GroupPtr w = world_group();
  size = g->size();
  CHECK(std::string(w->backend()) == (size > 1 ? "mpi" : "local"));
  CHECK(w->size() == size);
}

TEST_CASE("all_gather: every algorithm, count, dtype and the in-place form") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank();
  for (int64_t chunk : kChunks) {
    set_chunk(*g, chunk);
    for (CommAlgo a : kAlgos)
      for (int64_t count : kCounts) {
        const std::string what = std::string(comm_algo_name(a)) + " count=" +
                                 std::to_string(count) + " chunk=" + std::to_string(chunk);
        // f32, separate buffers.
        std::vector<float> send(static_cast<size_t>(count)), out(static_cast<size_t>(count * n), -1.f);
        for (int64_t i = 0; i < count; i++) send[static_cast<size_t>(i)] = rand_val(r, i, 1);
        g->all_gather(send.data(), out.data(), count, DType::F32, a);
        std::vector<float> want(out.size());
        for (int q = 0; q < n; q++)
          for (int64_t i = 0; i < count; i++) want[static_cast<size_t>(q * count + i)] = rand_val(q, i, 1);
        INFO(what);
        CHECK(bits_equal(out.data(), want.data(), count * n));
        // In place: this rank's block already sits in the output.
        std::vector<float> inpl(static_cast<size_t>(count * n), -2.f);
        if (count > 0)  // (count 0: null pointers, which memcpy may not be given)
          std::memcpy(inpl.data() + r * count, send.data(), static_cast<size_t>(count) * 4);
        g->all_gather(inpl.data() + r * count, inpl.data(), count, DType::F32, a);
        CHECK(bits_equal(inpl.data(), want.data(), count * n));
        // bf16 and f16 move as raw 16-bit data (NaN payloads and all).
        for (DType dt : {DType::BF16, DType::F16}) {
          std::vector<uint16_t> s16(static_cast<size_t>(count)), o16(static_cast<size_t>(count * n), 0);
          for (int64_t i = 0; i < count; i++)
            s16[static_cast<size_t>(i)] = static_cast<uint16_t>(mix(static_cast<uint64_t>(r * 77 + i + static_cast<int>(dt))));
          g->all_gather(s16.data(), o16.data(), count, dt, a);
          int64_t bad = 0;
          for (int q = 0; q < n; q++)
            for (int64_t i = 0; i < count; i++)
              if (o16[static_cast<size_t>(q * count + i)] != static_cast<uint16_t>(mix(static_cast<uint64_t>(q * 77 + i + static_cast<int>(dt))))) bad++;
          CHECK(bad == 0);
        }
      }
  }
  set_chunk(*g, CommOptions{}.chunk_bytes);
}

TEST_CASE("reduce_scatter: sum/avg/max against order-exact references") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank();
  for (int64_t chunk : kChunks) {
    set_chunk(*g, chunk);
    for (CommAlgo a : kAlgos)
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max})
        for (int64_t count : kCounts)
          for (bool integers : {true, false}) {
            const std::string what = std::string(comm_algo_name(a)) + " " + reduce_op_name(op) +
                                     " count=" + std::to_string(count) + " chunk=" +
                                     std::to_string(chunk) + (integers ? " int" : " rand");
            auto x = [&](int q, int64_t i) { return integers ? int_val(q, i, 2) : rand_val(q, i, 2); };
            std::vector<float> send(static_cast<size_t>(count * n)), out(static_cast<size_t>(count), -7.f);
            for (int64_t i = 0; i < count * n; i++) send[static_cast<size_t>(i)] = x(r, i);
            g->reduce_scatter(send.data(), out.data(), count, op, DType::F32, a);
            std::vector<float> want(static_cast<size_t>(count));
            const Order order = order_of(a);
            for (int64_t i = 0; i < count; i++)
              want[static_cast<size_t>(i)] = reduce_ref(x, n, r, r * count + i, op, order);
            // Integer sums are exact in any order (Avg divides exactly only sometimes, but the
            // division is the same single rounding everywhere); random inputs are exact for the
            // algorithms whose order we know.
            const bool exact = integers || op == ReduceOp::Max || a == CommAlgo::Ring ||
                               a == CommAlgo::Direct || n <= 2;
            check_reduced(out.data(), want.data(), count, exact, what.c_str());
            // In place: the result overwrites this rank's block of the input.
            std::vector<float> inpl = send;
            g->reduce_scatter(inpl.data(), inpl.data() + r * count, count, op, DType::F32, a);
            check_reduced(inpl.data() + r * count, out.data(), count, true, (what + " in place").c_str());
          }
  }
  set_chunk(*g, CommOptions{}.chunk_bytes);
}

TEST_CASE("all_reduce: any count, every algorithm, identical on every rank") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank();
  std::vector<CommAlgo> algos = kAlgos;
  algos.push_back(CommAlgo::OneShot);
  std::vector<int64_t> counts = kCounts;
  counts.push_back(n * 97 + 1);
  for (int64_t chunk : kChunks) {
    set_chunk(*g, chunk);
    for (CommAlgo a : algos)
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max})
        for (int64_t count : counts)
          for (bool integers : {true, false}) {
            const std::string what = std::string(comm_algo_name(a)) + " " + reduce_op_name(op) +
                                     " count=" + std::to_string(count) + " chunk=" +
                                     std::to_string(chunk) + (integers ? " int" : " rand");
            auto x = [&](int q, int64_t i) { return integers ? int_val(q, i, 3) : rand_val(q, i, 3); };
            std::vector<float> send(static_cast<size_t>(count)), out(static_cast<size_t>(count), -7.f);
            for (int64_t i = 0; i < count; i++) send[static_cast<size_t>(i)] = x(r, i);
            g->all_reduce(send.data(), out.data(), count, op, DType::F32, a);
            const int64_t L = (count + n - 1) / n;  // ring/direct blocks
            std::vector<float> want(static_cast<size_t>(count));
            for (int64_t i = 0; i < count; i++) {
              const int b = L ? static_cast<int>(i / L) : 0;
              want[static_cast<size_t>(i)] = reduce_ref(x, n, b, i, op, order_of(a));
            }
            const bool exact = integers || op == ReduceOp::Max || a == CommAlgo::Ring ||
                               a == CommAlgo::Direct || a == CommAlgo::OneShot || n <= 2;
            check_reduced(out.data(), want.data(), count, exact, what.c_str());
            // Identical on every rank: rank 0's result broadcast and compared bitwise.
            std::vector<float> r0 = out;
            g->broadcast(r0.data(), count, 0);
            INFO(what);
            CHECK(bits_equal(r0.data(), out.data(), count));
            // In place.
            std::vector<float> inpl = send;
            g->all_reduce(inpl.data(), inpl.data(), count, op, DType::F32, a);
            CHECK(bits_equal(inpl.data(), out.data(), count));
          }
  }
  set_chunk(*g, CommOptions{}.chunk_bytes);
}

TEST_CASE("bf16/f16 reductions round after every hop, like a local chain") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank();
  set_chunk(*g, 64);
  for (DType dt : {DType::BF16, DType::F16})
    for (CommAlgo a : {CommAlgo::Ring, CommAlgo::Direct, CommAlgo::Mpi, CommAlgo::OneShot})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        const int64_t count = 301;
        auto xf = [&](int q, int64_t i) { return rand_val(q, i, 4) * 0.01f; };
        auto x = [&](int q, int64_t i) { return dt == DType::BF16 ? f32_to_bf16(xf(q, i)) : f32_to_f16(xf(q, i)); };
        auto wid = [&](uint16_t h) { return dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); };
        const std::string what = std::string(dtype_name(dt)) + " " + comm_algo_name(a) + " " + reduce_op_name(op);
        INFO(what);
        const bool exact_order = a != CommAlgo::Mpi || n <= 2;
        // MPI's own order: each of the n-1 roundings errs by at most half an ulp of a partial
        // sum, bounded by eps * sum over ranks of |x|.
        const float eps = dt == DType::BF16 ? 1.f / 256 : 1.f / 2048;
        auto tol = [&](int64_t i) {
          float s = 0;
          for (int q = 0; q < n; q++) s += std::fabs(wid(x(q, i)));
          return static_cast<float>(n) * eps * s;
        };
        if (a != CommAlgo::OneShot) {
          std::vector<uint16_t> send(static_cast<size_t>(count * n)), out(static_cast<size_t>(count));
          for (int64_t i = 0; i < count * n; i++) send[static_cast<size_t>(i)] = x(r, i);
          g->reduce_scatter(send.data(), out.data(), count, op, dt, a);
          int64_t bad = 0;
          for (int64_t i = 0; i < count; i++) {
            const uint16_t w = reduce_ref16(x, n, r, r * count + i, op, order_of(a), dt);
            const bool ok = exact_order ? out[static_cast<size_t>(i)] == w
                                        : std::fabs(wid(out[static_cast<size_t>(i)]) - wid(w)) <= tol(r * count + i);
            if (!ok) bad++;
          }
          CHECK(bad == 0);
        }
        std::vector<uint16_t> ar(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; i++) ar[static_cast<size_t>(i)] = x(r, i);
        g->all_reduce(ar.data(), ar.data(), count, op, dt, a);
        const int64_t L = (count + n - 1) / n;
        int64_t bad = 0;
        for (int64_t i = 0; i < count; i++) {
          const uint16_t w = reduce_ref16(x, n, static_cast<int>(i / L), i, op, order_of(a), dt);
          const bool ok = exact_order ? ar[static_cast<size_t>(i)] == w
                                      : std::fabs(wid(ar[static_cast<size_t>(i)]) - wid(w)) <= tol(i);
          if (!ok) bad++;
        }
        CHECK(bad == 0);
      }
  set_chunk(*g, CommOptions{}.chunk_bytes);
}

TEST_CASE("broadcast from every root, barrier") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank();
  for (int root = 0; root < n; root++)
    for (int64_t count : {int64_t(0), int64_t(5), int64_t(100000)}) {
      std::vector<float> buf(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; i++) buf[static_cast<size_t>(i)] = rand_val(r, i, 5);
      g->broadcast(buf.data(), count, root);
      int64_t bad = 0;
      for (int64_t i = 0; i < count; i++)
        if (buf[static_cast<size_t>(i)] != rand_val(root, i, 5)) bad++;
      CHECK(bad == 0);
    }
  g->barrier();
  CHECK_THROWS_AS(g->broadcast(nullptr, 0, n), Error);
  CHECK_THROWS_AS(g->all_reduce(nullptr, nullptr, -1, ReduceOp::Sum), Error);
}

TEST_CASE("reruns are bit-identical, with and without injected delays") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank();
  const int64_t count = 4099;
  std::vector<float> send(static_cast<size_t>(count * n));
  for (int64_t i = 0; i < count * n; i++) send[static_cast<size_t>(i)] = rand_val(r, i, 6);
  for (CommAlgo a : {CommAlgo::Auto, CommAlgo::Mpi, CommAlgo::Ring, CommAlgo::Direct}) {
    std::vector<float> rs1(static_cast<size_t>(count)), rs2(rs1.size()), ar1(send.size()), ar2(send.size());
    g->reduce_scatter(send.data(), rs1.data(), count, ReduceOp::Sum, DType::F32, a);
    g->all_reduce(send.data(), ar1.data(), count * n, ReduceOp::Sum, DType::F32, a);
    CommOptions o = g->options();
    o.delay_us = 2000;
    g->set_options(o);
    for (int rep = 0; rep < 3; rep++) {
      g->reduce_scatter(send.data(), rs2.data(), count, ReduceOp::Sum, DType::F32, a);
      g->all_reduce(send.data(), ar2.data(), count * n, ReduceOp::Sum, DType::F32, a);
      INFO(comm_algo_name(a));
      CHECK(bits_equal(rs1.data(), rs2.data(), count));
      CHECK(bits_equal(ar1.data(), ar2.data(), count * n));
    }
    o.delay_us = 0;
    g->set_options(o);
  }
}

TEST_CASE("split: groups by color, ordered by key, nested, and none for color < 0") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank();
  // Two groups: even and odd world ranks, ranked in reverse world order.
  GroupPtr sub = g->split(r % 2, n - r);
  REQUIRE(sub);
  int members = 0;
  for (int q = 0; q < n; q++) members += (q % 2 == r % 2);
  CHECK(sub->size() == members);
  int expect_rank = 0;  // members with a larger world rank come first
  for (int q = r + 1; q < n; q++) expect_rank += (q % 2 == r % 2);
  CHECK(sub->rank() == expect_rank);
  // A sum over the subgroup: its members' world ranks.
  float v = static_cast<float>(r + 1), s = 0;
  sub->all_reduce(&v, &s, 1, ReduceOp::Sum);
  float want = 0;
  for (int q = 0; q < n; q++)
    if (q % 2 == r % 2) want += static_cast<float>(q + 1);
  CHECK(s == want);
  // All-gather on the subgroup puts members in subgroup-rank order.
  std::vector<float> all(static_cast<size_t>(sub->size()));
  sub->all_gather(&v, all.data(), 1);
  for (int i = 0; i < sub->size(); i++) {
    // subgroup rank i has the i-th largest world rank of this parity
    int q = n - 1;
    for (int seen = -1;; q--) {
      if (q % 2 == r % 2) seen++;
      if (seen == i) break;
    }
    CHECK(all[static_cast<size_t>(i)] == static_cast<float>(q + 1));
  }
  // Nested split and the color < 0 case.
  GroupPtr one = sub->split(sub->rank(), 0);
  REQUIRE(one);
  CHECK(one->size() == 1);
  GroupPtr none = g->split(r == 0 ? -1 : 0, r);
  if (r == 0) {
    CHECK(!none);
  } else {
    REQUIRE(none);
    CHECK(none->size() == n - 1);
    none->barrier();
  }
}

TEST_CASE("overlap: several collectives in flight, waited in any order, on two groups") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank();
  GroupPtr sub = g->split(0, r);  // a second group over the same ranks: its own thread
  const int64_t count = 20000;
  std::vector<float> a_in(static_cast<size_t>(count)), a_out(static_cast<size_t>(count * n));
  std::vector<float> b_in(static_cast<size_t>(count * n)), b_out(static_cast<size_t>(count));
  std::vector<float> c_buf(static_cast<size_t>(count)), d_buf(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; i++) a_in[static_cast<size_t>(i)] = int_val(r, i, 7);
  for (int64_t i = 0; i < count * n; i++) b_in[static_cast<size_t>(i)] = int_val(r, i, 8);
  for (int64_t i = 0; i < count; i++) c_buf[static_cast<size_t>(i)] = int_val(r, i, 9);
  for (int64_t i = 0; i < count; i++) d_buf[static_cast<size_t>(i)] = int_val(r, i, 10);
  const uint64_t seq0 = g->issue_barrier().seq();
  Work wa = g->issue_all_gather(a_in.data(), a_out.data(), count);
  Work wb = g->issue_reduce_scatter(b_in.data(), b_out.data(), count, ReduceOp::Sum);
  Work wd = sub->issue_all_reduce(d_buf.data(), d_buf.data(), count, ReduceOp::Max);
  Work wc = g->issue_all_reduce(c_buf.data(), c_buf.data(), count, ReduceOp::Sum);
  CHECK(wa.seq() == seq0 + 1);
  CHECK(wc.seq() == seq0 + 3);
  // "Compute" while communication runs.
  volatile double acc = 0;
  for (int i = 0; i < 2000000; i++) acc = acc + i * 1e-9;
  wc.wait();
  wd.wait();
  wb.wait();
  wa.wait();
  CHECK(wa.test());
  CHECK(Work().test());
  int64_t bad = 0;
  for (int q = 0; q < n; q++)
    for (int64_t i = 0; i < count; i++)
      if (a_out[static_cast<size_t>(q * count + i)] != int_val(q, i, 7)) bad++;
  for (int64_t i = 0; i < count; i++) {
    float s = 0, c = 0, d = int_val(0, i, 10);
    for (int q = 0; q < n; q++) s += int_val(q, r * count + i, 8), c += int_val(q, i, 9), d = std::max(d, int_val(q, i, 10));
    if (b_out[static_cast<size_t>(i)] != s) bad++;
    if (c_buf[static_cast<size_t>(i)] != c) bad++;
    if (d_buf[static_cast<size_t>(i)] != d) bad++;
  }
  CHECK(bad == 0);
  const CommStats st = g->stats();
  CHECK(st.ops >= 4);
  CHECK(st.comm_s >= 0);
}

TEST_CASE("debug mode names a divergent collective on every rank") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank();
  GroupPtr sub = g->split(0, r);
  sub->set_debug(true);
  std::vector<float> buf(static_cast<size_t>(10 * n), 1.f), out(static_cast<size_t>(10 * n));
  sub->all_reduce(buf.data(), out.data(), 10, ReduceOp::Sum);  // same op everywhere: fine
  CHECK(out[0] == static_cast<float>(n));
  if (n < 2) return;
  // Rank 1 issues an all_reduce where the others issue an all_gather.
  Work w = r == 1 ? sub->issue_all_reduce(buf.data(), out.data(), 10, ReduceOp::Sum)
                  : sub->issue_all_gather(buf.data(), out.data(), 10);
  std::string msg;
  try {
    w.wait();
  } catch (const Error& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("diverged at #2") != std::string::npos);
  CHECK(msg.find("rank 0: #2 all_gather(count=10,f32)") != std::string::npos);
  CHECK(msg.find("rank 1: #2 all_reduce(count=10,f32,sum)") != std::string::npos);
  // The group is unusable afterwards; the world group is not affected.
  CHECK_THROWS_WITH(sub->barrier(), Catch::Contains("failed earlier"));
  g->barrier();
}
