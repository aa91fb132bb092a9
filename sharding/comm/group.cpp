// Backend-independent parts of the communication layer: names, Work, argument checks, the
// one-rank LocalGroup and world-group selection.
#include "sharding/comm/group.h"

#include <algorithm>
#include <chrono>
#include <vector>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "core/launch.h"
#include "sharding/comm/mpi_backend.h"
#include "sharding/comm/work.h"

namespace sw {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

const char* coll_name(CollKind k) {
  switch (k) {
    case CollKind::AllGather: return "all_gather";
    case CollKind::ReduceScatter: return "reduce_scatter";
    case CollKind::AllReduce: return "all_reduce";
    case CollKind::Broadcast: return "broadcast";
    case CollKind::Barrier: return "barrier";
    case CollKind::Split: return "split";
  }
  return "?";
}

const char* comm_algo_name(CommAlgo a) {
  switch (a) {
    case CommAlgo::Auto: return "auto";
    case CommAlgo::Mpi: return "mpi";
    case CommAlgo::Ring: return "ring";
    case CommAlgo::Direct: return "direct";
    case CommAlgo::OneShot: return "oneshot";
    case CommAlgo::Tree: return "tree";
    case CommAlgo::HalvingDoubling: return "halving_doubling";
    case CommAlgo::Hierarchical: return "hierarchical";
  }
  return "?";
}

CommAlgo comm_algo_from_name(const std::string& s) {
  for (CommAlgo a : {CommAlgo::Auto, CommAlgo::Mpi, CommAlgo::Ring, CommAlgo::Direct,
                     CommAlgo::OneShot, CommAlgo::Tree, CommAlgo::HalvingDoubling,
                     CommAlgo::Hierarchical})
    if (s == comm_algo_name(a)) return a;
  fail("comm", "unknown algorithm '" + s + "' (expected auto, mpi, ring, direct, oneshot, tree, "
               "halving_doubling or hierarchical)");
}

double comm_algo_seconds(CommAlgo a, CollKind kind, double bytes, int size, int hosts,
                         const CommFit& inside, const CommFit& across_in) {
  const int n = size;
  if (n <= 1 || bytes <= 0) return 0;
  const double k = kind == CollKind::AllReduce ? 2.0 : 1.0;
  const int h = std::max(1, hosts), l = std::max(1, n / h);
  const CommFit across = across_in.busbw > 0 ? across_in : inside;
  const CommFit& f = h > 1 ? across : inside;  // a flat algorithm's slowest edge: the link
  if (a == CommAlgo::Auto) {
    const double per = kind == CollKind::AllReduce ? bytes : bytes / n;
    a = auto_comm_algo(kind, static_cast<int64_t>(per), n, h > 1 && l > 1 ? h : 1);
  }
  const double ring = k * bytes * (n - 1) / n;
  switch (a) {
    case CommAlgo::OneShot: return f.latency_s + (n - 1) * bytes / f.busbw;
    case CommAlgo::Tree:
      return f.latency_s + (kind == CollKind::AllReduce ? 3.0 : 2.0) * bytes / f.busbw;
    case CommAlgo::HalvingDoubling:
      return f.latency_s + (ring + ((n & (n - 1)) != 0 ? k * bytes : 0.0)) / f.busbw;
    case CommAlgo::Hierarchical: {
      double t = 0;
      if (l > 1) t += inside.latency_s + k * bytes * (l - 1) / l / inside.busbw;
      if (h > 1) t += across.latency_s + k * (bytes / l) * (h - 1) / h / across.busbw;
      return t;
    }
    default: return f.latency_s + ring / f.busbw;
  }
}

std::string describe(const Collective& c) {
  std::string s = coll_name(c.kind);
  switch (c.kind) {
    case CollKind::Barrier: return s + "()";
    case CollKind::Split:
      return s + "(color=" + std::to_string(c.color) + ",key=" + std::to_string(c.key) + ")";
    default: break;
  }
  s += "(count=" + std::to_string(c.count) + "," + dtype_name(c.dtype);
  if (c.kind == CollKind::ReduceScatter || c.kind == CollKind::AllReduce)
    s += std::string(",") + reduce_op_name(c.op);
  if (c.kind == CollKind::Broadcast) s += ",root=" + std::to_string(c.root);
  return s + ")";
}

namespace detail {
double collective_bytes(const Collective& c, int world) {
  const double e = static_cast<double>(c.count) * static_cast<double>(dtype_size(c.dtype));
  switch (c.kind) {
    case CollKind::AllGather:
    case CollKind::ReduceScatter: return e * world;
    case CollKind::AllReduce:
    case CollKind::Broadcast: return e;
    default: return 0;
  }
}
}  // namespace detail

// ---- Work ----------------------------------------------------------------------------------

void Work::block(bool exposed) const {
  if (!s_) return;
  const auto t0 = std::chrono::steady_clock::now();
  bool waited = false;
  if (s_->native) {
    waited = !s_->native->query();
    s_->native->synchronize();
  } else if (!s_->done.load(std::memory_order_acquire)) {
    waited = true;
    std::unique_lock<std::mutex> l(s_->mu);
    s_->cv.wait(l, [&] { return s_->done.load(std::memory_order_acquire); });
  }
  if (exposed && waited && s_->stats)
    s_->stats->add_exposed(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (!s_->native && !s_->error.empty()) throw Error(s_->error);
}

bool Work::test() {
  if (s_ && s_->native) return s_->native->query();
  return !s_ || s_->done.load(std::memory_order_acquire);
}

void* Work::native_handle() const { return s_ && s_->native ? s_->native->native_handle() : nullptr; }

Event::TimedSpan Work::timed_span() {
  if (!s_ || !s_->timed_begin || !s_->timed_end) return {};
  return {s_->timed_begin.get(), s_->timed_end.get(), s_->stream};
}
uint64_t Work::seq() const { return s_ ? s_->seq : 0; }
double sum_over_ranks(Group& g, double x) {
  if (g.size() == 1) return x;
  std::vector<double> all(static_cast<size_t>(g.size()));
  g.all_gather(&x, all.data(), 2, DType::F32);
  double s = 0;
  for (double v : all) s += v;
  return s;
}

double Work::started_at() const { return s_ ? s_->t_start : 0; }
double Work::done_at() const { return s_ ? s_->t_done : 0; }

// ---- Options -------------------------------------------------------------------------------

// Each checked against its declared range (core/env.cpp).
CommOptions CommOptions::from_env() {
  CommOptions o;
  o.timeout_s = env_number("SHARDWISE_COMM_TIMEOUT_S").value_or(o.timeout_s);
  o.debug = env_int("SHARDWISE_COMM_DEBUG").value_or(0) != 0;
  o.delay_us = static_cast<int>(env_int("SHARDWISE_COMM_DELAY_US").value_or(0));
  o.chunk_bytes = env_int("SHARDWISE_COMM_CHUNK_KB").value_or(o.chunk_bytes >> 10) << 10;
  o.spin_us = static_cast<int>(env_int("SHARDWISE_COMM_SPIN_US").value_or(o.spin_us));
  return o;
}

// ---- Group convenience forms ---------------------------------------------------------------

void Group::set_timeout(double seconds) {
  if (!(seconds > 0)) fail("comm", "comm_timeout_s must be > 0, got " + std::to_string(seconds));
  CommOptions o = options();
  o.timeout_s = seconds;
  set_options(o);
}

void Group::set_debug(bool on) {
  CommOptions o = options();
  o.debug = on;
  set_options(o);
}

namespace {
void check_count(const char* what, int64_t count) {
  if (count < 0) fail("comm", std::string(what) + ": count must be >= 0, got " + std::to_string(count));
}
void check_bufs(const char* what, int64_t count, const void* a, const void* b) {
  if (count > 0 && (!a || !b)) fail("comm", std::string(what) + ": null buffer with count > 0");
}
}  // namespace

Work Group::issue_all_gather(const void* send, void* recv, int64_t count, DType dt, CommAlgo algo) {
  check_count("all_gather", count);
  check_bufs("all_gather", count, send, recv);
  if (algo == CommAlgo::OneShot) fail("comm", "all_gather: algorithm 'oneshot' is all_reduce only");
  if (algo == CommAlgo::Tree)
    fail("comm", "all_gather: algorithm 'tree' is all_reduce and reduce_scatter only");
  Collective c;
  c.kind = CollKind::AllGather;
  c.send = send, c.recv = recv, c.count = count, c.dtype = dt, c.algo = algo;
  return issue(c);
}

Work Group::issue_reduce_scatter(const void* send, void* recv, int64_t count, ReduceOp op, DType dt,
                                 CommAlgo algo) {
  check_count("reduce_scatter", count);
  check_bufs("reduce_scatter", count, send, recv);
  if (algo == CommAlgo::OneShot)
    fail("comm", "reduce_scatter: algorithm 'oneshot' is all_reduce only");
  Collective c;
  c.kind = CollKind::ReduceScatter;
  c.send = send, c.recv = recv, c.count = count, c.dtype = dt, c.op = op, c.algo = algo;
  return issue(c);
}

Work Group::issue_all_reduce(const void* send, void* recv, int64_t count, ReduceOp op, DType dt,
                             CommAlgo algo) {
  check_count("all_reduce", count);
  check_bufs("all_reduce", count, send, recv);
  Collective c;
  c.kind = CollKind::AllReduce;
  c.send = send, c.recv = recv, c.count = count, c.dtype = dt, c.op = op, c.algo = algo;
  return issue(c);
}

Work Group::issue_all_reduce_after(const Work& after, const void* send, void* recv, int64_t count,
                                   ReduceOp op, DType dt) {
  check_count("all_reduce", count);
  check_bufs("all_reduce", count, send, recv);
  Collective c;
  c.kind = CollKind::AllReduce;
  c.send = send, c.recv = recv, c.count = count, c.dtype = dt, c.op = op;
  c.after = after;
  return issue(c);
}

Work Group::issue_broadcast(void* buf, int64_t count, int root, DType dt) {
  check_count("broadcast", count);
  check_bufs("broadcast", count, buf, buf);
  if (root < 0 || root >= size())
    fail("comm", "broadcast: root " + std::to_string(root) + " is not a rank of a group of size " +
                     std::to_string(size()));
  Collective c;
  c.kind = CollKind::Broadcast;
  c.send = buf, c.recv = buf, c.count = count, c.dtype = dt, c.root = root;
  return issue(c);
}

Work Group::issue_barrier() {
  Collective c;
  c.kind = CollKind::Barrier;
  return issue(c);
}

// ---- LocalGroup ----------------------------------------------------------------------------

namespace {

class LocalGroup final : public Group {
 public:
  LocalGroup() : stats_(std::make_shared<detail::StatsBlock>()), opts_(CommOptions::from_env()) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "local"; }
  std::shared_ptr<Group> split(int color, int key) override {
    ++seq_;
    if (color < 0) return nullptr;
    return std::make_shared<LocalGroup>();
  }
  Work issue(const Collective& c) override {
    c.after.wait_done();
    // With one rank every collective is a copy (Avg divides by 1: exact, so a copy too).
    const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
    if ((c.kind == CollKind::AllGather || c.kind == CollKind::ReduceScatter ||
         c.kind == CollKind::AllReduce) &&
        bytes > 0 && c.send != c.recv)
      std::memmove(c.recv, c.send, bytes);
    auto s = std::make_shared<detail::WorkState>();
    s->seq = ++seq_;
    s->stats = stats_;
    s->t_start = s->t_done = std::chrono::duration<double>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count();
    s->done.store(true);
    stats_->add_op(detail::collective_bytes(c, 1), 0.0);
    return Work(std::move(s));
  }
  void set_options(const CommOptions& o) override { opts_ = o; }
  CommOptions options() const override { return opts_; }
  CommStats stats() const override { return stats_->get(); }
  void reset_stats() override { stats_->reset(); }

 private:
  std::shared_ptr<detail::StatsBlock> stats_;
  CommOptions opts_;
  uint64_t seq_ = 0;
};

}  // namespace

GroupPtr make_local_group() { return std::make_shared<LocalGroup>(); }


bool launched_multi_rank() {
  return launch_env().world_size > 1;
}

namespace {
std::mutex g_world_mu;
GroupPtr g_world, g_mpi_world;
}  // namespace

GroupPtr mpi_world_group() {
  std::lock_guard<std::mutex> l(g_world_mu);
  if (!g_mpi_world) g_mpi_world = comm::make_mpi_world();
  return g_mpi_world;
}

GroupPtr world_group() {
  if (launched_multi_rank()) return mpi_world_group();
  std::lock_guard<std::mutex> l(g_world_mu);
  if (!g_world) g_world = make_local_group();
  return g_world;
}

int world_rank() {
  const int r = comm::mpi_rank_if_initialized();
  return r < 0 ? 0 : r;
}

void comm_abort(int code) {
  comm::mpi_abort_if_initialized(code);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace sw
