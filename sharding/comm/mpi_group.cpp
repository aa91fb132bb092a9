// The MPI backend: MpiGroup, its communication thread, the watchdog and the algorithm choice.
//
// Threads per group: the caller issues collectives into a FIFO; one communication thread
// executes them in issue order (the same order on every rank, so no collective can overtake
// another); one watchdog thread aborts the job when a collective runs longer than
// comm_timeout_s. The two threads call MPI concurrently, hence MPI_THREAD_MULTIPLE.
// Each group uses three duplicated communicators: data, the watchdog's side channel and the
// debug fingerprints, so none can match another's messages.
#include <mpi.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "core/launch.h"
#include "sharding/comm/mpi_algos.h"
#include "sharding/comm/mpi_backend.h"
#include "sharding/comm/reduce.h"
#include "sharding/comm/work.h"

namespace sw::comm {

namespace {

using Clock = std::chrono::steady_clock;
double secs_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// HIER_THRESHOLDS: with the group's ranks on several hosts (equally many, more than one each),
// all_gather and reduce_scatter of at least kHierMinBytes in total (size * per-rank bytes) and
// all_reduce of at least kHierMinBytesAR (size * buffer bytes) go hierarchical. Measured with
// bench/collectives_link.sh: 2 network-namespace hosts x 2 ranks, tc tbf 100 Mbit/s (burst
// 256 KB, so up to ~256 KB partly escapes the limit), every message over TCP, min of 3 on a
// loaded 2-core machine (bench/results/collectives_2026-11-29.md). ms, hierarchical / best other:
//   all_gather      16K 1.06 / 0.14 (ring)   64K 2.2 / 4.1 (ring)   1M 44 / 64 (ring)
//                   16M 712 / 1054 (ring)
//   reduce_scatter  16K 0.34 / 0.17 (direct)   1M 43 / 62 (ring)   16M 938 / 1054 (ring)
//   all_reduce      16K 12 / 0.35 (mpi)   64K 0.56 / 0.75 (hd), 16 (ring)
//                   1M 90 / 91 (mpi), 132 (ring)   16M 1961 / 2140 (mpi), 2270 (ring)
// Across the link hierarchical moves k B (h-1)/h per host and direction against the ring's
// k B (n-1)/n per crossing edge (k = 2 for all_reduce): 2 MB against 3 MB for a 2 MiB
// all_reduce here. Below the thresholds the one-host choice stays (latency-bound).
constexpr int64_t kHierMinBytes = int64_t(64) << 10;
constexpr int64_t kHierMinBytesAR = int64_t(256) << 10;

constexpr int kAbortCode = 70;  // exit status of every rank when the watchdog fires
constexpr int kTagQuery = 1, kTagReply = 2;

// ---- Algorithm choice ----------------------------------------------------------------------
//
// Measured with bench/bench_collectives on the project's 2-core VM: 2 ranks, OpenMPI 4.1.4 over
// shared memory (vader + CMA single copy), fp32, median of 50 iterations, chunk 512 KiB. The
// machine was shared with other jobs (load average 5-6 on 2 cores), so figures are +-20% below
// 8 MiB and meaningless above (preemption dominates). Time in us (busbw GB/s):
//
//   size   all_gather mpi/ring/direct    reduce_scatter mpi/ring/direct   all_reduce mpi/ring/direct/oneshot
//   4K     4.6 / 4.7 / 4.6                5.4 / 5.0 / 5.1                  8.9 /  8.4 /  8.5 /  8.8
//   16K    6.5 / 6.3 / 6.1                10.2 / 7.0 / 7.0                 16.4 / 14.5 / 15.4 / 10.7
//   64K    8.3 / 8.2 / 8.1                17.5 / 9.4 / 10.1                29.3 / 31.4 / 23.9 / 18.1
//   256K   15.1 / 15.2 / 15.2             54.3 / 19.0 / 22.5               76.3 / 47.1 / 67.8 / 46.5
//   1M     63.1 / 64.5 / 63.2 (8.3)       249 / 77.1 / 88.8 (2.1/6.8/5.9)  314 / 200 / 369 / 414
//   4M     332 / 336 / 418 (6.3)          1242 / 532 / 629 (1.7/3.9/3.3)   1156 / 877 / 1234 / 1262 (3.6/4.8/3.4/3.3)
//
// So: MPI_Reduce_scatter_block is 2-3x slower than the ring from 32 KiB up (as the issue
// said); MPI_Allgather equals our ring (both one message each way at 2 ranks); the one-shot
// all-reduce wins up to 256 KiB (one exchange instead of two), the ring above. Direct and
// ring are the same schedule at 2 ranks; at more ranks direct needs one round instead of
// size-1, so it takes the small sizes (latency-bound; not measurable on 2 cores).
// Tree and halving/doubling (bench/results/collectives_2026-11-29.md) are never picked: at 2
// ranks they are one exchange each way like the ring and measured no faster beyond noise; at 4
// ranks on these 2 cores (oversubscribed) the figures cannot separate them.
// The choice depends only on (collective, bytes, size, hosts), so it is the same on every rank.
// hosts > 1 (a regular two-level layout, MpiGroup::Topology): HIER_THRESHOLDS above.
CommAlgo choose_algo(CollKind kind, int64_t bytes, int n, int hosts) {
  constexpr int64_t KiB = 1024;
  if (hosts > 1 && (kind == CollKind::AllGather || kind == CollKind::ReduceScatter) &&
      bytes * n >= kHierMinBytes)
    return CommAlgo::Hierarchical;
  if (hosts > 1 && kind == CollKind::AllReduce && bytes * n >= kHierMinBytesAR)
    return CommAlgo::Hierarchical;
  switch (kind) {
    case CollKind::AllGather:  // bytes = per-rank contribution
      return bytes * n <= 64 * KiB ? CommAlgo::Direct : CommAlgo::Ring;
    case CollKind::ReduceScatter:  // bytes = per-rank output
      return bytes * n <= 16 * KiB ? CommAlgo::Direct : CommAlgo::Ring;
    case CollKind::AllReduce:  // bytes = the buffer; one-shot moves (n-1)x it per rank
      return bytes * n <= 512 * KiB ? CommAlgo::OneShot : CommAlgo::Ring;
    default: return CommAlgo::Mpi;
  }
}

class MpiGroup;

// Process-wide MPI state; leaked on purpose so it outlives every static destructor.
struct Runtime {
  std::mutex mu;
  bool we_initialized = false;
  bool finalized = false;
  std::set<MpiGroup*> groups;
};
Runtime& runtime() {
  static Runtime* r = new Runtime;
  return *r;
}

void finalize_at_exit();

void ensure_mpi() {
  Runtime& R = runtime();
  std::lock_guard<std::mutex> l(R.mu);
  if (R.finalized) fail("comm", "MPI was already finalized");
  int inited = 0;
  MPI_Initialized(&inited);
  int provided = 0;
  if (!inited) {
    SW_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    R.we_initialized = true;
    std::atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE)
    fail("comm", "this MPI library provides thread level " + std::to_string(provided) +
                     ", but Shardwise needs MPI_THREAD_MULTIPLE (its communication and watchdog "
                     "threads call MPI concurrently); use an MPI built with thread support");
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  set_error_rank(rank);
  create_mpi_ops();
}

// Fingerprint of one collective, exchanged in debug mode.
struct Fingerprint {
  int64_t seq, count;
  int32_t kind, dtype, op, root, color, algo;
};
uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  return h;
}

// What a rank tells a peer's watchdog about itself.
struct PeerStatus {
  int64_t active, seq, last_done, issued, count;
  int32_t kind, dtype, op, pad;
  double elapsed;
};

std::string fmt_seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", s);
  return b;
}

// ---- MpiGroup ------------------------------------------------------------------------------

struct Op {
  Collective c;
  std::shared_ptr<detail::WorkState> work;
  MPI_Comm split_comm = MPI_COMM_NULL;  // Split's result
};

class MpiGroup final : public Group {
 public:
  // Takes ownership of `comm` when own is true; duplicates it otherwise.
  MpiGroup(MPI_Comm comm, bool own, const CommOptions& opts);
  ~MpiGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  std::shared_ptr<Group> split(int color, int key) override;
  // split's communicator without a group around it (the caller frees it); MPI_COMM_NULL for
  // color < 0.
  MPI_Comm split_comm(int color, int key);
  Work issue(const Collective& c) override;
  void set_options(const CommOptions& o) override {
    std::lock_guard<std::mutex> l(opt_mu_);
    opts_ = o;
  }
  CommOptions options() const override {
    std::lock_guard<std::mutex> l(opt_mu_);
    return opts_;
  }
  CommStats stats() const override { return stats_->get(); }
  void reset_stats() override { stats_->reset(); }

  void shutdown();  // idempotent; joins the threads and frees the communicators

 private:
  std::shared_ptr<Op> enqueue(const Collective& c);
  void comm_loop();
  void watchdog_loop();
  void execute(Op& op, const CommOptions& o);
  void check_same_collective(const Op& op);
  void run_all_gather(const Collective& c, const P2P& p, CommAlgo a, int64_t slice);
  void run_reduce_scatter(const Collective& c, const P2P& p, CommAlgo a, int64_t slice);
  void run_all_reduce(const Collective& c, const P2P& p, CommAlgo a, int64_t slice);
  void run_hierarchical(const Collective& c, const P2P& p);
  void* scratch(size_t bytes);
  void serve_queries(MPI_Request* qreq, int* qbuf);
  PeerStatus my_status();
  [[noreturn]] void on_timeout(MPI_Request* qreq, int* qbuf);
  std::string world_rank_str(int group_rank) const {
    return std::to_string(world_ranks_[static_cast<size_t>(group_rank)]);
  }

  MPI_Comm comm_ = MPI_COMM_NULL, hb_comm_ = MPI_COMM_NULL, dbg_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;  // group rank -> MPI_COMM_WORLD rank
  // Two-level layout for Hierarchical: host of a world rank = rank / launch_env().local_size
  // (consecutive ranks per host, as mpirun maps by slot; one host when unknown). Regular when
  // the group's ranks of each host are consecutive and every host has `local` of them; then
  // group rank r is local rank r % local of host r / local.
  struct Topology {
    bool regular = false;
    int hosts = 1, local = 1;
  } topo_;
  MPI_Comm intra_ = MPI_COMM_NULL, inter_ = MPI_COMM_NULL;  // comm thread; made on first use
  std::shared_ptr<detail::StatsBlock> stats_;

  mutable std::mutex opt_mu_;
  CommOptions opts_;

  // Queue (caller -> comm thread).
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> queue_;
  bool stopping_ = false;
  uint64_t issued_ = 0;

  // What the comm thread is doing (read by the watchdog).
  std::mutex st_mu_;
  bool active_ = false;
  uint64_t active_seq_ = 0, last_done_ = 0;
  Collective active_c_;
  Clock::time_point active_start_;

  std::string failed_;  // comm thread only: first error; the group is unusable after it
  Buffer scratch_;      // comm thread only
  std::mt19937_64 delay_rng_;

  std::mutex wd_mu_;
  std::condition_variable wd_cv_;
  bool wd_stop_ = false;
  std::deque<PeerStatus> reply_bufs_;  // watchdog only; stable addresses for Isend

  std::thread comm_thread_, watchdog_thread_;
  bool shut_ = false;
};

MpiGroup::MpiGroup(MPI_Comm comm, bool own, const CommOptions& opts)
    : stats_(std::make_shared<detail::StatsBlock>()), opts_(opts) {
  if (own) {
    comm_ = comm;
  } else {
    SW_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  }
  SW_MPI_CHECK(MPI_Comm_dup(comm_, &hb_comm_));
  SW_MPI_CHECK(MPI_Comm_dup(comm_, &dbg_comm_));
  for (MPI_Comm c : {comm_, hb_comm_, dbg_comm_}) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  world_ranks_ = world_ranks_of(comm_, size_);
  {
    const int L = launch_env().local_size;
    std::vector<int> host(static_cast<size_t>(size_));
    for (int i = 0; i < size_; i++) host[static_cast<size_t>(i)] = L > 0 ? world_ranks_[static_cast<size_t>(i)] / L : 0;
    int runs = 1;
    for (int i = 1; i < size_; i++) runs += host[static_cast<size_t>(i)] != host[static_cast<size_t>(i - 1)];
    const int l = size_ / runs;
    bool ok = size_ % runs == 0;
    for (int i = 0; ok && i < size_; i++) ok = host[static_cast<size_t>(i)] == host[static_cast<size_t>(i / l * l)];
    std::set<int> distinct(host.begin(), host.end());
    ok = ok && static_cast<int>(distinct.size()) == runs;
    topo_ = {ok, ok ? runs : 1, ok ? l : size_};
  }
  delay_rng_.seed(0x5eedull * 1000003ull + static_cast<uint64_t>(world_ranks_[static_cast<size_t>(rank_)]));
  {
    std::lock_guard<std::mutex> l(runtime().mu);
    runtime().groups.insert(this);
  }
  comm_thread_ = std::thread([this] { comm_loop(); });
  watchdog_thread_ = std::thread([this] { watchdog_loop(); });
}

MpiGroup::~MpiGroup() {
  shutdown();
  std::lock_guard<std::mutex> l(runtime().mu);
  runtime().groups.erase(this);
}

void MpiGroup::shutdown() {
  if (shut_) return;
  shut_ = true;
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (comm_thread_.joinable()) comm_thread_.join();  // drains the queue; the watchdog still guards it
  {
    std::lock_guard<std::mutex> l(wd_mu_);
    wd_stop_ = true;
  }
  wd_cv_.notify_all();
  if (watchdog_thread_.joinable()) watchdog_thread_.join();
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin)
    for (MPI_Comm* c : {&comm_, &hb_comm_, &dbg_comm_, &intra_, &inter_})
      if (*c != MPI_COMM_NULL) SW_MPI(MPI_Comm_free(c));
}

std::shared_ptr<Op> MpiGroup::enqueue(const Collective& c) {
  auto op = std::make_shared<Op>();
  op->c = c;
  op->work = std::make_shared<detail::WorkState>();
  op->work->stats = stats_;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) fail("comm", std::string(coll_name(c.kind)) + " issued on a group that was shut down");
    op->work->seq = ++issued_;
    queue_.push_back(op);
  }
  cv_.notify_one();
  return op;
}

Work MpiGroup::issue(const Collective& c) { return Work(enqueue(c)->work); }

std::shared_ptr<Group> MpiGroup::split(int color, int key) {
  MPI_Comm c = split_comm(color, key);
  if (c == MPI_COMM_NULL) return nullptr;
  return std::make_shared<MpiGroup>(c, true, options());
}

MPI_Comm MpiGroup::split_comm(int color, int key) {
  Collective c;
  c.kind = CollKind::Split;
  c.color = color;
  c.key = key;
  auto op = enqueue(c);
  Work(op->work).wait();
  return op->split_comm;
}

void* MpiGroup::scratch(size_t bytes) {
  if (scratch_.bytes() < bytes) {
    scratch_.release();
    scratch_ = Buffer(bytes, Mem::Communication);
  }
  return scratch_.data();
}

// ---- The communication thread ------------------------------------------------------------

void MpiGroup::comm_loop() {
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 us, so the poller's short naps stay short
#endif
  for (;;) {
    std::shared_ptr<Op> op;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    // Another group's collective it must follow (Collective::after): waited for before this
    // one counts as started (that group's watchdog watches it); its failure fails this one.
    std::string before;
    try {
      op->c.after.wait_done();
    } catch (const std::exception& e) {
      before = e.what();
    }
    const CommOptions o = options();
    const auto t0 = Clock::now();
    {
      std::lock_guard<std::mutex> l(st_mu_);
      active_ = true;
      active_seq_ = op->work->seq;
      active_c_ = op->c;
      active_start_ = t0;
    }
    op->work->t_start = std::chrono::duration<double>(t0.time_since_epoch()).count();
    std::string err;
    try {
      if (!failed_.empty())
        throw Error("comm: " + describe(op->c) + " on a group that failed earlier (" + failed_ + ")");
      if (!before.empty())
        throw Error("comm: " + describe(op->c) + " after a collective that failed (" + before + ")");
      if (o.delay_us > 0) {
        const auto us = static_cast<int64_t>(delay_rng_() % static_cast<uint64_t>(o.delay_us + 1));
        std::this_thread::sleep_for(std::chrono::microseconds(us));
      }
      if (o.debug) check_same_collective(*op);
      execute(*op, o);
    } catch (const std::exception& e) {
      err = e.what();
      if (failed_.empty()) failed_ = err;
    }
    const double dt = secs_since(t0);
    {
      std::lock_guard<std::mutex> l(st_mu_);
      active_ = false;
      last_done_ = op->work->seq;
    }
    if (err.empty()) stats_->add_op(detail::collective_bytes(op->c, size_), dt);
    op->work->complete(std::move(err));
  }
}

void MpiGroup::check_same_collective(const Op& op) {
  Fingerprint f{};
  f.seq = static_cast<int64_t>(op.work->seq);
  f.count = op.c.count;
  f.kind = static_cast<int32_t>(op.c.kind);
  f.dtype = static_cast<int32_t>(op.c.dtype);
  f.op = op.c.kind == CollKind::ReduceScatter || op.c.kind == CollKind::AllReduce
             ? static_cast<int32_t>(op.c.op) : -1;
  f.root = op.c.kind == CollKind::Broadcast ? op.c.root : -1;
  f.color = 0;  // split colors legitimately differ
  f.algo = static_cast<int32_t>(op.c.algo);
  if (op.c.kind == CollKind::Barrier || op.c.kind == CollKind::Split) f.count = 0, f.dtype = 0;
  const auto h = static_cast<int64_t>(fnv1a(&f, sizeof f) >> 1);
  int64_t v[2] = {h, -h}, mn[2];
  SW_MPI_CHECK(MPI_Allreduce(v, mn, 2, MPI_INT64_T, MPI_MIN, dbg_comm_));
  if (mn[0] == -mn[1]) return;  // min == max: every rank issued the same collective
  std::vector<Fingerprint> all(static_cast<size_t>(size_));
  SW_MPI_CHECK(MPI_Allgather(&f, sizeof f, MPI_BYTE, all.data(), sizeof f, MPI_BYTE, dbg_comm_));
  std::string msg = "comm: collective sequence diverged at #" + std::to_string(op.work->seq) +
                    " (first divergence; every rank must issue the same collectives in the same "
                    "order):";
  for (int q = 0; q < size_; q++) {
    const Fingerprint& g = all[static_cast<size_t>(q)];
    Collective c;
    c.kind = static_cast<CollKind>(g.kind);
    c.count = g.count;
    c.dtype = static_cast<DType>(g.dtype);
    c.op = g.op >= 0 ? static_cast<ReduceOp>(g.op) : ReduceOp::Sum;
    c.root = g.root;
    msg += std::string(q ? "," : "") + " rank " + world_rank_str(q) + ": #" + std::to_string(g.seq) +
           " " + describe(c);
    if (g.algo != f.algo) msg += std::string(" algo=") + comm_algo_name(static_cast<CommAlgo>(g.algo));
  }
  // Every rank throws the same message from wait(); the group's first rank also prints it, in
  // case the caller swallows the exception.
  if (rank_ == 0) {
    std::fprintf(stderr, "shardwise: rank %s: %s\n", world_rank_str(0).c_str(), msg.c_str());
    std::fflush(stderr);
  }
  throw Error(msg);
}

void MpiGroup::execute(Op& op, const CommOptions& o) {
  const Collective& c = op.c;
  P2P p;
  p.comm = comm_;
  p.rank = rank_;
  p.size = size_;
  p.chunk_bytes = o.chunk_bytes;
  p.poll.spin_us = o.spin_us;
  p.tag = 16 + 4 * static_cast<int>(c.kind);
  const size_t es = dtype_size(c.dtype);
  // Slices bound the scratch memory and the number of requests in flight: 16 chunks.
  const int64_t slice = 16 * p.chunk_elems(c.dtype);
  CommAlgo a = c.algo;
  const int64_t bytes = c.count * static_cast<int64_t>(es);
  if (a == CommAlgo::Auto)
    a = choose_algo(c.kind, bytes, size_, topo_.regular && topo_.local > 1 ? topo_.hosts : 1);
  if (a == CommAlgo::Hierarchical &&
      (c.kind == CollKind::AllGather || c.kind == CollKind::ReduceScatter ||
       c.kind == CollKind::AllReduce))
    return run_hierarchical(c, p);
  switch (c.kind) {
    case CollKind::AllGather: return run_all_gather(c, p, a, slice);
    case CollKind::ReduceScatter: return run_reduce_scatter(c, p, a, slice);
    case CollKind::AllReduce: return run_all_reduce(c, p, a, slice);
    case CollKind::Broadcast: {
      // In pieces of at most 1 GiB (MPI counts are int).
      constexpr int64_t kPiece = int64_t(1) << 30;
      for (int64_t off = 0; off < bytes; off += kPiece) {
        MPI_Request r;
        SW_MPI_CHECK(MPI_Ibcast(static_cast<char*>(c.recv) + off,
                                static_cast<int>(std::min(kPiece, bytes - off)), MPI_BYTE, c.root,
                                comm_, &r));
        p.poll.wait(&r);
      }
      return;
    }
    case CollKind::Barrier: {
      MPI_Request r;
      SW_MPI_CHECK(MPI_Ibarrier(comm_, &r));
      p.poll.wait(&r);
      return;
    }
    case CollKind::Split:
      SW_MPI_CHECK(MPI_Comm_split(comm_, c.color < 0 ? MPI_UNDEFINED : c.color, c.key, &op.split_comm));
      return;
  }
}

namespace {
inline bool fits_int(int64_t n) { return n <= static_cast<int64_t>(1 << 30); }
}  // namespace

void MpiGroup::run_all_gather(const Collective& c, const P2P& p, CommAlgo a, int64_t slice) {
  const size_t es = dtype_size(c.dtype);
  const int n = size_;
  if (c.count == 0) return;
  char* out = static_cast<char*>(c.recv);
  char* own = out + static_cast<size_t>(c.count * rank_) * es;
  const bool in_place = c.send == own;
  if (a == CommAlgo::Mpi && fits_int(c.count * n)) {
    SW_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : c.send, static_cast<int>(c.count),
                               mpi_type(c.dtype), out, static_cast<int>(c.count), mpi_type(c.dtype),
                               comm_));
    return;
  }
  if (n == 1) {
    if (!in_place) std::memcpy(own, c.send, static_cast<size_t>(c.count) * es);
    return;
  }
  // The own block travels from the input; its local copy is made after the transfer (both only
  // read the input).
  const Blocks bl{c.count, c.count * n};
  if (a == CommAlgo::HalvingDoubling) {
    // Rank 2i's block travels to 2i+1 first (the fold), then the doubling runs in place.
    const Fold f(n);
    if (!in_place) std::memcpy(own, c.send, static_cast<size_t>(c.count) * es);
    if (rank_ < 2 * f.rem) {
      char* blk = out + static_cast<size_t>(c.count * (rank_ / 2 * 2)) * es;  // rank 2i's block
      if (rank_ % 2) exchange_with(p, rank_ - 1, nullptr, 0, blk, c.count, c.dtype);
      else exchange_with(p, rank_ + 1, blk, c.count, nullptr, 0, c.dtype);
    }
    std::vector<int64_t> voff(static_cast<size_t>(f.pof2 + 1));
    for (int v = 0; v <= f.pof2; v++)
      voff[static_cast<size_t>(v)] = (v < f.rem ? 2 * v : v + f.rem) * c.count;
    P2P q = p;
    q.tag = p.tag + 1;
    return doubling_all_gather(q, f, out, voff, c.dtype);
  }
  if (a == CommAlgo::Direct) {
    direct_all_gather(p, out, c.send, bl, c.dtype);
  } else {
    for (int64_t c0 = 0; c0 < c.count; c0 += slice)
      ring_all_gather(p, out, c.send, bl, c0, std::min(c.count, c0 + slice), c.dtype);
  }
  if (!in_place) std::memcpy(own, c.send, static_cast<size_t>(c.count) * es);
}

void MpiGroup::run_reduce_scatter(const Collective& c, const P2P& p, CommAlgo a, int64_t slice) {
  const size_t es = dtype_size(c.dtype);
  const int n = size_;
  if (c.count == 0) return;
  const size_t bytes = static_cast<size_t>(c.count) * es;
  if (n == 1) {
    if (c.send != c.recv) std::memcpy(c.recv, c.send, bytes);
    return;
  }
  if (a == CommAlgo::Mpi && fits_int(c.count * n)) {
    const char* own = static_cast<const char*>(c.send) + static_cast<size_t>(rank_) * bytes;
    const bool alias = own == c.recv;
    void* dst = alias ? scratch(bytes) : c.recv;
    SW_MPI_CHECK(MPI_Reduce_scatter_block(c.send, dst, static_cast<int>(c.count), mpi_type(c.dtype),
                                          mpi_op(c.dtype, c.op), comm_));
    if (alias) std::memcpy(c.recv, dst, bytes);
    if (c.op == ReduceOp::Avg) divide(c.recv, c.count, c.dtype, static_cast<float>(n));
    return;
  }
  const Blocks bl{c.count, c.count * n};
  const int64_t total = c.count * n;
  if (a == CommAlgo::Tree) {
    // The whole buffer reduced to rank 0 (acc: its subtree sums), then scattered from there.
    const int64_t w = std::min(slice, total);
    char* acc = static_cast<char*>(scratch(static_cast<size_t>(total + 2 * w) * es));
    char* tmp = acc + static_cast<size_t>(total) * es;
    for (int64_t e0 = 0; e0 < total; e0 += slice)
      tree_reduce(p, c.send, acc, e0, std::min(total, e0 + slice), c.dtype, c.op, tmp);
    if (rank_ == 0 && c.op == ReduceOp::Avg) divide(acc, total, c.dtype, static_cast<float>(n));
    P2P q = p;
    q.tag = p.tag + 1;
    return scatter_from_root(q, acc, c.recv, c.count, c.dtype);
  }
  if (a == CommAlgo::HalvingDoubling) {
    // Virtual block v: the blocks of the ranks folded into it (2v, 2v+1 or v + rem).
    const Fold f(n);
    std::vector<int64_t> voff(static_cast<size_t>(f.pof2 + 1));
    for (int v = 0; v <= f.pof2; v++)
      voff[static_cast<size_t>(v)] = (v < f.rem ? 2 * v : v + f.rem) * c.count;
    char* acc = static_cast<char*>(scratch(static_cast<size_t>(2 * total) * es));
    char* tmp = acc + static_cast<size_t>(total) * es;
    const bool in_core = halving_reduce_scatter(p, f, c.send, acc, voff, c.dtype, c.op, tmp);
    // Rank 2i+1 holds blocks 2i and 2i+1: it sends 2i to rank 2i.
    if (rank_ < 2 * f.rem) {
      P2P q = p;
      q.tag = p.tag + 1;
      if (rank_ % 2)
        exchange_with(q, rank_ - 1, acc + static_cast<size_t>((rank_ - 1) * c.count) * es, c.count,
                      nullptr, 0, c.dtype);
      else exchange_with(q, rank_ + 1, nullptr, 0, c.recv, c.count, c.dtype);
    }
    if (in_core) std::memcpy(c.recv, acc + static_cast<size_t>(rank_ * c.count) * es, bytes);
    if (c.op == ReduceOp::Avg) divide(c.recv, c.count, c.dtype, static_cast<float>(n));
    return;
  }
  if (a == CommAlgo::Direct) {
    void* tmp = scratch(static_cast<size_t>(2 * n * p.chunk_elems(c.dtype)) * es);
    return direct_reduce_scatter(p, c.send, c.recv, bl, c.dtype, c.op, tmp);
  }
  void* tmp = scratch(static_cast<size_t>(2 * std::min(slice, c.count)) * es);
  for (int64_t c0 = 0; c0 < c.count; c0 += slice)
    ring_reduce_scatter(p, c.send, c.recv, bl, c0, std::min(c.count, c0 + slice), c.dtype, c.op, tmp);
}

void MpiGroup::run_all_reduce(const Collective& c, const P2P& p, CommAlgo a, int64_t slice) {
  const size_t es = dtype_size(c.dtype);
  const int n = size_;
  if (c.count == 0) return;
  if (n == 1) {
    if (c.send != c.recv) std::memcpy(c.recv, c.send, static_cast<size_t>(c.count) * es);
    return;
  }
  if (a == CommAlgo::Mpi && fits_int(c.count)) {
    SW_MPI_CHECK(MPI_Allreduce(c.send == c.recv ? MPI_IN_PLACE : c.send, c.recv,
                               static_cast<int>(c.count), mpi_type(c.dtype), mpi_op(c.dtype, c.op),
                               comm_));
    if (c.op == ReduceOp::Avg) divide(c.recv, c.count, c.dtype, static_cast<float>(n));
    return;
  }
  if (a == CommAlgo::OneShot) {
    void* tmp = scratch(static_cast<size_t>(c.count * n) * es);
    return oneshot_all_reduce(p, c.send, c.recv, c.count, c.dtype, c.op, tmp);
  }
  if (a == CommAlgo::Tree) {
    const int64_t w = std::min(slice, c.count);
    void* tmp = scratch(static_cast<size_t>(2 * w) * es);
    P2P q = p;
    q.tag = p.tag + 1;
    for (int64_t e0 = 0; e0 < c.count; e0 += slice) {
      const int64_t e1 = std::min(c.count, e0 + slice);
      tree_reduce(p, c.send, c.recv, e0, e1, c.dtype, c.op, tmp);
      if (rank_ == 0 && c.op == ReduceOp::Avg)
        divide(static_cast<char*>(c.recv) + static_cast<size_t>(e0) * es, e1 - e0, c.dtype,
               static_cast<float>(n));
      tree_broadcast(q, c.recv, e0, e1, c.dtype);
    }
    return;
  }
  if (a == CommAlgo::HalvingDoubling) {
    // 2^k virtual blocks of ceil(count / 2^k); the sum accumulates in recv.
    const Fold f(n);
    const int64_t L = (c.count + f.pof2 - 1) / f.pof2;
    std::vector<int64_t> voff(static_cast<size_t>(f.pof2 + 1));
    for (int v = 0; v <= f.pof2; v++) voff[static_cast<size_t>(v)] = std::min(v * L, c.count);
    void* tmp = scratch(static_cast<size_t>(c.count) * es);
    if (halving_reduce_scatter(p, f, c.send, c.recv, voff, c.dtype, c.op, tmp) &&
        c.op == ReduceOp::Avg) {
      const int v = f.vrank(rank_);
      divide(static_cast<char*>(c.recv) + static_cast<size_t>(voff[static_cast<size_t>(v)]) * es,
             voff[static_cast<size_t>(v + 1)] - voff[static_cast<size_t>(v)], c.dtype,
             static_cast<float>(n));
    }
    P2P q = p;
    q.tag = p.tag + 1;
    return doubling_all_gather(q, f, c.recv, voff, c.dtype);
  }
  // Reduce-scatter into this rank's block of recv, then all-gather the blocks in place.
  const Blocks bl{(c.count + n - 1) / n, c.count};
  char* mine = static_cast<char*>(c.recv) + static_cast<size_t>(bl.off(rank_)) * es;
  P2P q = p;
  if (a == CommAlgo::Direct) {
    void* tmp = scratch(static_cast<size_t>(2 * n * p.chunk_elems(c.dtype)) * es);
    direct_reduce_scatter(p, c.send, mine, bl, c.dtype, c.op, tmp);
    q.tag = p.tag + 1;
    return direct_all_gather(q, c.recv, mine, bl, c.dtype);
  }
  void* tmp = scratch(static_cast<size_t>(2 * std::min(slice, bl.L)) * es);
  for (int64_t c0 = 0; c0 < bl.L; c0 += slice)
    ring_reduce_scatter(p, c.send, mine, bl, c0, std::min(bl.L, c0 + slice), c.dtype, c.op, tmp);
  q.tag = p.tag + 1;
  for (int64_t c0 = 0; c0 < bl.L; c0 += slice)
    ring_all_gather(q, c.recv, mine, bl, c0, std::min(bl.L, c0 + slice), c.dtype);
}

// Hierarchical: Direct inside each host (shared memory: one round), Direct across hosts among
// the ranks of one local index (one message per peer host), Direct inside again. Sums are
// each host's ranks in order, then the hosts in order; Avg divides once, before the last
// phase, so every rank ends with the same bits. Scratch: hosts * count elements for
// reduce_scatter/all_gather plus Direct's 2 * max(hosts, local) chunks.
void MpiGroup::run_hierarchical(const Collective& c, const P2P& p) {
  const int n = size_;
  if (c.count == 0) return;
  if (!topo_.regular)
    fail("comm", describe(c) + ": algorithm 'hierarchical' needs the group's ranks of each host "
                 "to be consecutive and equally many per host (hosts: launch_env().local_size)");
  const int l = topo_.local, h = topo_.hosts, H = rank_ / l, j = rank_ % l;
  if (intra_ == MPI_COMM_NULL) {  // every rank of the group gets here at the same collective
    SW_MPI_CHECK(MPI_Comm_split(comm_, H, j, &intra_));
    SW_MPI_CHECK(MPI_Comm_split(comm_, j, H, &inter_));
  }
  const size_t es = dtype_size(c.dtype);
  P2P pi = p, pe = p;
  pi.comm = intra_, pi.rank = j, pi.size = l;
  pe.comm = inter_, pe.rank = H, pe.size = h;
  const ReduceOp op = c.op == ReduceOp::Avg ? ReduceOp::Sum : c.op;
  const int64_t dchunks = static_cast<int64_t>(2 * std::max(l, h)) * p.chunk_elems(c.dtype);
  auto el = [&](void* b, int64_t i) { return static_cast<char*>(b) + static_cast<size_t>(i) * es; };
  auto cel = [&](const void* b, int64_t i) { return static_cast<const char*>(b) + static_cast<size_t>(i) * es; };
  auto finish_avg = [&](void* b, int64_t k) {
    if (c.op == ReduceOp::Avg) divide(b, k, c.dtype, static_cast<float>(n));
  };
  const int64_t cnt = c.count;
  if (c.kind == CollKind::AllReduce) {
    void* dtmp = scratch(static_cast<size_t>(dchunks) * es);
    const Blocks bl{(cnt + l - 1) / l, cnt};
    char* mine = el(c.recv, bl.off(j));
    const int64_t len = bl.len(j);
    if (l > 1) direct_reduce_scatter(pi, c.send, mine, bl, c.dtype, op, dtmp);
    else if (c.send != c.recv) std::memcpy(c.recv, c.send, static_cast<size_t>(cnt) * es);
    const Blocks be{(len + h - 1) / h, len};
    if (h > 1 && len > 0) {
      char* part = el(mine, be.off(H));
      direct_reduce_scatter(pe, mine, part, be, c.dtype, op, dtmp);
      finish_avg(part, be.len(H));
      P2P q = pe;
      q.tag = pe.tag + 1;
      direct_all_gather(q, mine, part, be, c.dtype);
    } else {
      finish_avg(mine, len);
    }
    P2P q = pi;
    q.tag = pi.tag + 1;
    if (l > 1) direct_all_gather(q, c.recv, mine, bl, c.dtype);
    return;
  }
  // reduce_scatter and all_gather on one level (one host, or one rank per host): Direct.
  if (h == 1 || l == 1) {
    const P2P& p1 = h == 1 ? pi : pe;
    const Blocks bl{cnt, n * cnt};
    if (c.kind == CollKind::AllGather) {
      char* own = el(c.recv, rank_ * cnt);
      direct_all_gather(p1, c.recv, c.send, bl, c.dtype);
      if (own != c.send) std::memcpy(own, c.send, static_cast<size_t>(cnt) * es);
    } else {
      direct_reduce_scatter(p1, c.send, c.recv, bl, c.dtype, op,
                            scratch(static_cast<size_t>(dchunks) * es));
      finish_avg(c.recv, cnt);
    }
    return;
  }
  // reduce_scatter and all_gather: T holds block (H', j) of every host H' (h * count).
  char* T = static_cast<char*>(scratch(static_cast<size_t>(h * cnt + dchunks) * es));
  void* dtmp = el(T, h * cnt);
  const Blocks hb{cnt, l * cnt}, xb{cnt, h * cnt};
  if (c.kind == CollKind::ReduceScatter) {
    for (int g = 0; g < h; g++) {
      if (l > 1) direct_reduce_scatter(pi, cel(c.send, g * l * cnt), el(T, g * cnt), hb, c.dtype, op, dtmp);
      else std::memcpy(el(T, g * cnt), cel(c.send, g * cnt), static_cast<size_t>(cnt) * es);
    }
    if (h > 1) direct_reduce_scatter(pe, T, c.recv, xb, c.dtype, op, dtmp);
    else std::memcpy(c.recv, T, static_cast<size_t>(cnt) * es);
    finish_avg(c.recv, cnt);
    return;
  }
  // all_gather: across hosts first (this rank's block to the same local index elsewhere), then
  // inside each host, once per host's slice.
  std::memcpy(el(T, H * cnt), c.send, static_cast<size_t>(cnt) * es);
  if (h > 1) direct_all_gather(pe, T, c.send, xb, c.dtype);
  for (int g = 0; g < h; g++) {
    char* slice = el(c.recv, g * l * cnt);
    if (l > 1) direct_all_gather(pi, slice, el(T, g * cnt), hb, c.dtype);
    std::memmove(el(slice, j * cnt), el(T, g * cnt), static_cast<size_t>(cnt) * es);
  }
}

// ---- The watchdog ------------------------------------------------------------------------
//
// Every tick it answers peers' status queries on the side channel and checks the running
// collective's age. On timeout it asks every peer what it is doing (grace period of up to 2 s
// for answers), prints one line naming the collective, its sequence number and the ranks that
// never reached it, waits one more grace period (so that the ranks whose deadlines fall within
// it print theirs) and calls MPI_Abort so every rank exits non-zero.

PeerStatus MpiGroup::my_status() {
  PeerStatus s{};
  std::lock_guard<std::mutex> l(st_mu_);
  s.active = active_ ? 1 : 0;
  s.seq = static_cast<int64_t>(active_seq_);
  s.last_done = static_cast<int64_t>(last_done_);
  s.kind = static_cast<int32_t>(active_c_.kind);
  s.dtype = static_cast<int32_t>(active_c_.dtype);
  s.op = static_cast<int32_t>(active_c_.op);
  s.count = active_c_.count;
  s.elapsed = active_ ? secs_since(active_start_) : 0.0;
  {
    std::lock_guard<std::mutex> q(mu_);
    s.issued = static_cast<int64_t>(issued_);
  }
  return s;
}

void MpiGroup::serve_queries(MPI_Request* qreq, int* qbuf) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (SW_MPI(MPI_Test(qreq, &flag, &st)) != MPI_SUCCESS || !flag) return;
    reply_bufs_.push_back(my_status());
    MPI_Request r;
    if (SW_MPI(MPI_Isend(&reply_bufs_.back(), sizeof(PeerStatus), MPI_BYTE, st.MPI_SOURCE,
                         kTagReply, hb_comm_, &r)) == MPI_SUCCESS)
      SW_MPI(MPI_Request_free(&r));
    SW_MPI(MPI_Irecv(qbuf, 1, MPI_INT, MPI_ANY_SOURCE, kTagQuery, hb_comm_, qreq));
  }
}

void MpiGroup::watchdog_loop() {
  int qbuf = 0;
  MPI_Request qreq = MPI_REQUEST_NULL;
  SW_MPI(MPI_Irecv(&qbuf, 1, MPI_INT, MPI_ANY_SOURCE, kTagQuery, hb_comm_, &qreq));
  for (;;) {
    const double timeout = options().timeout_s;
    const double tick = std::clamp(timeout / 20, 0.005, 0.1);
    {
      std::unique_lock<std::mutex> l(wd_mu_);
      wd_cv_.wait_for(l, std::chrono::duration<double>(tick), [&] { return wd_stop_; });
      if (wd_stop_) break;
    }
    serve_queries(&qreq, &qbuf);
    bool late = false;
    {
      std::lock_guard<std::mutex> l(st_mu_);
      late = active_ && secs_since(active_start_) > timeout;
    }
    if (late) on_timeout(&qreq, &qbuf);
  }
  if (qreq != MPI_REQUEST_NULL) {
    SW_MPI(MPI_Cancel(&qreq));
    SW_MPI(MPI_Wait(&qreq, MPI_STATUS_IGNORE));
  }
}

void MpiGroup::on_timeout(MPI_Request* qreq, int* qbuf) {
  Collective c;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> l(st_mu_);
    c = active_c_;
    seq = active_seq_;
  }
  const double timeout = options().timeout_s;
  const auto n = static_cast<size_t>(size_);
  std::vector<PeerStatus> got(n);
  std::vector<MPI_Request> rr(n, MPI_REQUEST_NULL), sr(n, MPI_REQUEST_NULL);
  std::vector<int> answered(n, 0);
  int one = 1;
  for (int q = 0; q < size_; q++) {
    if (q == rank_) continue;
    SW_MPI(MPI_Irecv(&got[static_cast<size_t>(q)], sizeof(PeerStatus), MPI_BYTE, q, kTagReply,
                     hb_comm_, &rr[static_cast<size_t>(q)]));
    SW_MPI(MPI_Isend(&one, 1, MPI_INT, q, kTagQuery, hb_comm_, &sr[static_cast<size_t>(q)]));
  }
  const double grace = std::clamp(timeout / 4, 0.5, 2.0);
  const auto t0 = Clock::now();
  for (;;) {
    serve_queries(qreq, qbuf);
    bool all = true;
    for (int q = 0; q < size_; q++) {
      const auto i = static_cast<size_t>(q);
      if (q == rank_ || answered[i]) continue;
      int flag = 0;
      if (SW_MPI(MPI_Test(&rr[i], &flag, MPI_STATUS_IGNORE)) == MPI_SUCCESS && flag) answered[i] = 1;
      else all = false;
    }
    if (all || secs_since(t0) > grace) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string missing, detail;
  for (int q = 0; q < size_; q++) {
    if (q == rank_) continue;
    const auto i = static_cast<size_t>(q);
    const PeerStatus& s = got[i];
    bool reached = false;
    detail += "; rank " + world_rank_str(q) + ": ";
    if (!answered[i]) {
      detail += "no answer";
    } else if (s.active) {
      Collective pc;
      pc.kind = static_cast<CollKind>(s.kind);
      pc.count = s.count;
      pc.dtype = static_cast<DType>(s.dtype);
      pc.op = static_cast<ReduceOp>(s.op);
      // A peer in #seq running a different collective diverged: it never reaches ours.
      reached = s.seq > static_cast<int64_t>(seq) ||
                (s.seq == static_cast<int64_t>(seq) && describe(pc) == describe(c));
      detail += "in #" + std::to_string(s.seq) + " " + describe(pc) + " for " +
                fmt_seconds(std::round(s.elapsed * 10) / 10) + " s";
    } else {
      reached = s.last_done >= static_cast<int64_t>(seq);
      detail += "idle after #" + std::to_string(s.last_done) + " (issued " +
                std::to_string(s.issued) + ")";
    }
    if (!reached) missing += (missing.empty() ? "" : ", ") + world_rank_str(q);
  }
  std::fprintf(stderr,
               "shardwise: rank %s: collective #%llu %s did not complete within %s s; ranks not "
               "reached: [%s] (a peer died or diverged)%s\n",
               world_rank_str(rank_).c_str(), static_cast<unsigned long long>(seq),
               describe(c).c_str(), fmt_seconds(timeout).c_str(), missing.c_str(), detail.c_str());
  std::fflush(stderr);
  // Linger one grace period (still answering queries) before the abort: MPI_Abort makes the
  // launcher kill every rank, and a rank whose own deadline fell within a grace period of
  // ours is still waiting for its answers; after a partition that is every rank on this side
  // of it, and each should get to print its own line.
  const auto t1 = Clock::now();
  while (secs_since(t1) < grace) {
    serve_queries(qreq, qbuf);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  MPI_Abort(MPI_COMM_WORLD, kAbortCode);
  std::_Exit(kAbortCode);
}

void finalize_at_exit() {
  Runtime& R = runtime();
  std::vector<MpiGroup*> gs;
  {
    std::lock_guard<std::mutex> l(R.mu);
    gs.assign(R.groups.begin(), R.groups.end());
  }
  for (MpiGroup* g : gs) g->shutdown();
  std::lock_guard<std::mutex> l(R.mu);
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && R.we_initialized) {
    free_mpi_ops();
    SW_MPI(MPI_Finalize());
  }
  R.finalized = true;
}

}  // namespace

GroupPtr make_mpi_world() {
  ensure_mpi();
  return std::make_shared<MpiGroup>(MPI_COMM_WORLD, false, CommOptions::from_env());
}

int mpi_dup_comm_of(Group& g) {
  auto* m = dynamic_cast<MpiGroup*>(&g);
  if (!m) return -1;
  return static_cast<int>(MPI_Comm_c2f(m->split_comm(0, m->rank())));
}

int mpi_rank_if_initialized() {
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (!inited || fin) return -1;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void mpi_abort_if_initialized(int code) {
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (inited && !fin) MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace sw::comm

namespace sw {
CommAlgo auto_comm_algo(CollKind kind, int64_t bytes, int size, int hosts) {
  return comm::choose_algo(kind, bytes, size, hosts);
}
}  // namespace sw
