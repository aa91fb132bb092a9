// The tree, recursive halving/doubling and hierarchical collectives (sharding/comm/group.h),
// run by ctest under mpirun with 1-4 ranks, and at 4 and 3 ranks with a fake two-level layout
// (OMPI_COMM_WORLD_LOCAL_SIZE overridden: hosts of 2 or 1 consecutive ranks, or an irregular
// one that hierarchical must refuse). Each result is compared bit for bit with a local
// reference that adds in the algorithm's documented order (f32, and bf16 rounded after every
// add), for counts 0, 1, odd and large, sum/avg/max, separate and in place; all_reduce results
// must also be identical on every rank.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm_test_util.h"
#include "core/error.h"
#include "core/launch.h"
#include "sharding/comm/group.h"

using namespace sw;
using namespace sw::test;

namespace {

GroupPtr world() {
  static GroupPtr g = [] {
    GroupPtr w = mpi_world_group();
    w->set_timeout(60);
    return w;
  }();
  return g;
}

void set_chunk(Group& g, int64_t bytes) {
  CommOptions o = g.options();
  o.chunk_bytes = bytes;
  g.set_options(o);
}

// The fake (or real) two-level layout the group sees: hosts of launch_env().local_size
// consecutive ranks; 0 when they are not equally many (hierarchical refuses those).
int ranks_per_host(int n) {
  const int L = launch_env().local_size;
  if (L <= 0) return n;
  const int l = std::min(L, n);
  return n % l == 0 ? l : 0;
}

// op over ranks of element values v(q), in `a`'s order; T = float (f32) or uint16_t (16-bit,
// rounded after every add by comb).
template <class T>
T ref_order(CommAlgo a, int n, int l, const std::function<T(int)>& v,
            const std::function<T(T, T)>& comb) {
  if (a == CommAlgo::Tree) {
    std::function<T(int)> sub = [&](int r) {
      T acc = v(r);
      for (int k : {2 * r + 1, 2 * r + 2})
        if (k < n) acc = comb(acc, sub(k));
      return acc;
    };
    return sub(0);
  }
  if (a == CommAlgo::HalvingDoubling) {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    const int rem = n - p;
    std::vector<T> u(static_cast<size_t>(p));
    for (int w = 0; w < p; w++) u[static_cast<size_t>(w)] = w < rem ? comb(v(2 * w), v(2 * w + 1)) : v(w + rem);
    for (int len = p; len > 1; len /= 2)
      for (int w = 0; w < len / 2; w++)
        u[static_cast<size_t>(w)] = comb(u[static_cast<size_t>(w)], u[static_cast<size_t>(w + len / 2)]);
    return u[0];
  }
  // Hierarchical: each host's ranks in order, then the hosts in order.
  T total{};
  for (int H = 0; H < n / l; H++) {
    T part = v(H * l);
    for (int j = 1; j < l; j++) part = comb(part, v(H * l + j));
    total = H == 0 ? part : comb(total, part);
  }
  return total;
}

float ref32(CommAlgo a, int n, int l, ReduceOp op, const std::function<float(int)>& v) {
  float s = ref_order<float>(a, n, l, v, [&](float x, float y) {
    return op == ReduceOp::Max ? (x < y ? y : x) : x + y;
  });
  return op == ReduceOp::Avg ? s / static_cast<float>(n) : s;
}

uint16_t ref16(CommAlgo a, int n, int l, ReduceOp op, DType dt, const std::function<uint16_t(int)>& v) {
  auto rnd = [&](float x) { return dt == DType::BF16 ? f32_to_bf16(x) : f32_to_f16(x); };
  auto wid = [&](uint16_t h) { return dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); };
  uint16_t s = ref_order<uint16_t>(a, n, l, v, [&](uint16_t x, uint16_t y) {
    const float fx = wid(x), fy = wid(y);
    return rnd(op == ReduceOp::Max ? (fx < fy ? fy : fx) : fx + fy);
  });
  return op == ReduceOp::Avg ? rnd(wid(s) / static_cast<float>(n)) : s;
}

std::vector<CommAlgo> algos_here(int n) {
  std::vector<CommAlgo> a = {CommAlgo::Tree, CommAlgo::HalvingDoubling};
  if (ranks_per_host(n) > 0) a.push_back(CommAlgo::Hierarchical);
  return a;
}

const std::vector<int64_t> kCounts = {0, 1, 3, 7, 100, 1001, 5000};

}  // namespace

TEST_CASE("algos: names round-trip") {
  for (CommAlgo a : {CommAlgo::Tree, CommAlgo::HalvingDoubling, CommAlgo::Hierarchical})
    CHECK(comm_algo_from_name(comm_algo_name(a)) == a);
}

TEST_CASE("algos: reduce_scatter and all_reduce equal the order-exact reference, f32") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank(), l = ranks_per_host(n);
  for (int64_t chunk : {int64_t(64), int64_t(512) << 10})
    for (CommAlgo a : algos_here(n)) {
      set_chunk(*g, chunk);
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        std::vector<int64_t> counts = kCounts;
        counts.push_back(n * 97 + 1);
        for (int64_t count : counts) {
          const std::string what = std::string(comm_algo_name(a)) + " " + reduce_op_name(op) +
                                   " count=" + std::to_string(count) + " chunk=" + std::to_string(chunk);
          INFO(what);
          auto x = [&](int q, int64_t i) { return rand_val(q, i, 11); };
          // reduce_scatter: block r of every rank's buffer.
          std::vector<float> send(static_cast<size_t>(count * n)), out(static_cast<size_t>(count), -7.f);
          for (int64_t i = 0; i < count * n; i++) send[static_cast<size_t>(i)] = x(r, i);
          g->reduce_scatter(send.data(), out.data(), count, op, DType::F32, a);
          int64_t bad = 0;
          for (int64_t i = 0; i < count; i++) {
            const float w = ref32(a, n, l, op, [&](int q) { return x(q, r * count + i); });
            bad += std::memcmp(&w, &out[static_cast<size_t>(i)], 4) != 0;
          }
          CHECK(bad == 0);
          std::vector<float> inpl = send;
          g->reduce_scatter(inpl.data(), inpl.data() + r * count, count, op, DType::F32, a);
          CHECK(bits_equal(inpl.data() + r * count, out.data(), count));
          // all_reduce of `count` elements.
          std::vector<float> ar(static_cast<size_t>(count)), arout(ar.size(), -7.f);
          for (int64_t i = 0; i < count; i++) ar[static_cast<size_t>(i)] = x(r, i + 3);
          g->all_reduce(ar.data(), arout.data(), count, op, DType::F32, a);
          bad = 0;
          for (int64_t i = 0; i < count; i++) {
            const float w = ref32(a, n, l, op, [&](int q) { return x(q, i + 3); });
            bad += std::memcmp(&w, &arout[static_cast<size_t>(i)], 4) != 0;
          }
          CHECK(bad == 0);
          std::vector<float> r0 = arout;
          g->broadcast(r0.data(), count, 0);
          CHECK(bits_equal(r0.data(), arout.data(), count));
          g->all_reduce(ar.data(), ar.data(), count, op, DType::F32, a);
          CHECK(bits_equal(ar.data(), arout.data(), count));
        }
      }
    }
  set_chunk(*g, CommOptions{}.chunk_bytes);
}

TEST_CASE("algos: bf16 and f16 reductions round after every add, in the algorithm's order") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank(), l = ranks_per_host(n);
  set_chunk(*g, 64);
  for (DType dt : {DType::BF16, DType::F16})
    for (CommAlgo a : algos_here(n))
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max})
        for (int64_t count : {int64_t(1), int64_t(301)}) {
          const std::string what = std::string(dtype_name(dt)) + " " + comm_algo_name(a) + " " +
                                   reduce_op_name(op) + " count=" + std::to_string(count);
          INFO(what);
          auto x = [&](int q, int64_t i) {
            const float f = rand_val(q, i, 12) * 0.01f;
            return dt == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f);
          };
          std::vector<uint16_t> send(static_cast<size_t>(count * n)), out(static_cast<size_t>(count));
          for (int64_t i = 0; i < count * n; i++) send[static_cast<size_t>(i)] = x(r, i);
          g->reduce_scatter(send.data(), out.data(), count, op, dt, a);
          int64_t bad = 0;
          for (int64_t i = 0; i < count; i++)
            bad += out[static_cast<size_t>(i)] != ref16(a, n, l, op, dt, [&](int q) { return x(q, r * count + i); });
          CHECK(bad == 0);
          std::vector<uint16_t> ar(send.begin(), send.begin() + count);
          g->all_reduce(ar.data(), ar.data(), count, op, dt, a);
          bad = 0;
          for (int64_t i = 0; i < count; i++)
            bad += ar[static_cast<size_t>(i)] != ref16(a, n, l, op, dt, [&](int q) { return x(q, i); });
          CHECK(bad == 0);
        }
  set_chunk(*g, CommOptions{}.chunk_bytes);
}

TEST_CASE("algos: all_gather (halving_doubling, hierarchical) moves every block, in place too") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank();
  for (int64_t chunk : {int64_t(64), int64_t(512) << 10}) {
    set_chunk(*g, chunk);
    for (CommAlgo a : algos_here(n)) {
      if (a == CommAlgo::Tree) continue;
      for (int64_t count : kCounts)
        for (DType dt : {DType::F32, DType::BF16}) {
          const size_t es = dtype_size(dt);
          INFO(std::string(comm_algo_name(a)) + " " + dtype_name(dt) + " count=" + std::to_string(count));
          auto byte = [&](int q, int64_t i) { return static_cast<uint8_t>(mix(static_cast<uint64_t>(q * 131 + i))); };
          std::vector<uint8_t> send(static_cast<size_t>(count) * es), out(static_cast<size_t>(count * n) * es, 0xee);
          for (size_t i = 0; i < send.size(); i++) send[i] = byte(r, static_cast<int64_t>(i));
          g->all_gather(send.data(), out.data(), count, dt, a);
          int64_t bad = 0;
          for (int q = 0; q < n; q++)
            for (size_t i = 0; i < send.size(); i++) bad += out[q * send.size() + i] != byte(q, static_cast<int64_t>(i));
          CHECK(bad == 0);
          std::vector<uint8_t> inpl(out.size(), 0xdd);
          if (count > 0) std::memcpy(inpl.data() + r * send.size(), send.data(), send.size());
          g->all_gather(inpl.data() + r * send.size(), inpl.data(), count, dt, a);
          CHECK(inpl == out);
        }
    }
  }
  set_chunk(*g, CommOptions{}.chunk_bytes);
}

TEST_CASE("algos: a large buffer, several slices and many chunks, and Auto") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank(), l = ranks_per_host(n);
  const int64_t count = (int64_t(1) << 20) + 3;  // 4 MiB of f32: more than one 16-chunk slice
  std::vector<float> in(static_cast<size_t>(count)), out(in.size());
  for (int64_t i = 0; i < count; i++) in[static_cast<size_t>(i)] = rand_val(r, i, 13);
  std::vector<CommAlgo> as = algos_here(n);
  as.push_back(CommAlgo::Auto);
  for (CommAlgo a : as) {
    INFO(comm_algo_name(a));
    g->all_reduce(in.data(), out.data(), count, ReduceOp::Sum, DType::F32, a);
    int64_t bad = 0;
    for (int64_t i = 0; i < count; i += 7) {  // every 7th element (the reference is slow)
      auto v = [&](int q) { return rand_val(q, i, 13); };
      if (a == CommAlgo::Auto) {
        float s = 0;
        for (int q = 0; q < n; q++) s += v(q);
        bad += !(std::fabs(out[static_cast<size_t>(i)] - s) <= 1e-5f * (1 + std::fabs(s)));
      } else {
        const float w = ref32(a, n, l, ReduceOp::Sum, v);
        bad += std::memcmp(&w, &out[static_cast<size_t>(i)], 4) != 0;
      }
    }
    CHECK(bad == 0);
    std::vector<float> r0 = out;
    g->broadcast(r0.data(), count, 0);
    CHECK(bits_equal(r0.data(), out.data(), count));
  }
}

TEST_CASE("algos: reruns are bit-identical with injected delays") {
  GroupPtr g = world();
  const int n = g->size(), r = g->rank();
  const int64_t count = 4099;
  std::vector<float> send(static_cast<size_t>(count * n));
  for (int64_t i = 0; i < count * n; i++) send[static_cast<size_t>(i)] = rand_val(r, i, 14);
  for (CommAlgo a : algos_here(n)) {
    INFO(comm_algo_name(a));
    std::vector<float> rs1(static_cast<size_t>(count)), rs2(rs1.size()), ar1(send.size()), ar2(send.size());
    g->reduce_scatter(send.data(), rs1.data(), count, ReduceOp::Sum, DType::F32, a);
    g->all_reduce(send.data(), ar1.data(), count * n, ReduceOp::Sum, DType::F32, a);
    CommOptions o = g->options();
    o.delay_us = 2000;
    g->set_options(o);
    for (int rep = 0; rep < 2; rep++) {
      g->reduce_scatter(send.data(), rs2.data(), count, ReduceOp::Sum, DType::F32, a);
      g->all_reduce(send.data(), ar2.data(), count * n, ReduceOp::Sum, DType::F32, a);
      CHECK(bits_equal(rs1.data(), rs2.data(), count));
      CHECK(bits_equal(ar1.data(), ar2.data(), count * n));
    }
    o.delay_us = 0;
    g->set_options(o);
  }
}

TEST_CASE("algos: tree refuses all_gather, hierarchical an irregular layout") {
  GroupPtr g = world();
  const int n = g->size();
  float a = 1, b[8];
  CHECK_THROWS_WITH(g->all_gather(&a, b, 1, DType::F32, CommAlgo::Tree),
                    Catch::Contains("'tree' is all_reduce and reduce_scatter only"));
  if (ranks_per_host(n) > 0) return;
  GroupPtr sub = g->split(0, g->rank());  // it fails for good; the world group must not
  CHECK_THROWS_WITH(sub->all_reduce(&a, b, 1, ReduceOp::Sum, DType::F32, CommAlgo::Hierarchical),
                    Catch::Contains("equally many per host"));
  g->all_reduce(&a, b, 1, ReduceOp::Sum);  // Auto never picks it there
  CHECK(b[0] == static_cast<float>(n));
}
