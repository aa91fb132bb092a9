// Communication groups: the only place Shardwise talks to the network.
//
// A Group is a set of ranks that run collectives together. Every collective has an issue form
// returning a Work handle (compute overlaps communication until wait()) and a blocking form
// (issue + wait). Backends:
//   * LocalGroup (make_local_group): one rank, no MPI; collectives are copies, done at issue.
//   * MpiGroup (world_group under mpirun/srun, mpi_world_group): OpenMPI. Each group owns a
//     communication thread that executes its collectives one at a time in issue order (so
//     the collective sequence is the same on every rank and progress is asynchronous), and a
//     watchdog thread that aborts the job when a collective does not complete in time.
//
// Buffers are contiguous CPU memory. They must stay valid, and the caller must neither read
// the output nor write the input, until the Work completes. Collectives on one group must be
// issued in the same order on every rank, from one thread at a time.
//
// Counts: all_gather and reduce_scatter move `count` elements PER RANK (the full buffer has
// size*count elements, rank order); callers whose totals do not divide by size() pad (the
// flat-parameter layout already pads to world * kAlign). all_reduce and broadcast take any
// count, including 0.
//
// Element types: all_gather and broadcast move f32, bf16 and f16 as raw data. Reductions on
// bf16/f16 accumulate each step in fp32 and round back to the payload type after each hop
// (what NCCL does); tests compare them with a hop-by-hop local reference.
//
// Memory: each MpiGroup keeps one scratch buffer (tracked as Mem::Communication), grown on
// demand and never shrunk: at most 32 chunks (16 MiB at the default chunk) for the ring,
// 2*size chunks for direct, size*count elements for one-shot (Auto picks it only while
// size * buffer bytes <= 512 KiB), count elements for the Mpi reduce_scatter in place; tree:
// 32 chunks (+ the whole size*count input for reduce_scatter); halving_doubling: the buffer
// (all_reduce) or twice the size*count input (reduce_scatter); hierarchical: hosts*count
// elements + 2*max(hosts, local) chunks.
//
// Determinism: every algorithm adds in an order fixed by (rank, size, count) only, so results
// are bit-identical run to run and never depend on timing; all_reduce results are identical
// on every rank. Ring and MPI algorithms add in a different grouping than a one-rank sequential
// sum x0 + x1 + ... (they agree with it only to rounding when size > 2); Direct and OneShot add
// exactly x0 + x1 + ... + x(n-1) left to right. Tree adds x_r + S(2r+1) + S(2r+2) at each node
// r (S = a subtree's sum); HalvingDoubling adds pairs lower rank first, the pairs of each step
// (r, r + 2^k / 2^s) after the fold; Hierarchical adds each host's ranks in order, then the
// hosts in order (tests/comm/comm_test_util.h has each reference).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "core/stream.h"
#include "sharding/comm/device_comm.h"

namespace sw {

enum class ReduceOp : uint8_t { Sum, Avg, Max };  // Avg = Sum / size()
enum class CollKind : uint8_t { AllGather, ReduceScatter, AllReduce, Broadcast, Barrier, Split };
// Algorithms (see docs/ARCHITECTURE.md "Collectives" and bench/bench_collectives.cpp):
//   Mpi     MPI's own collective (MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce)
//   Ring    pipelined ring on point-to-point messages (bandwidth-optimal)
//   Direct  every rank exchanges with every other rank at once (AG/RS; AR = RS + AG)
//   OneShot all_reduce only: gather every rank's whole buffer, add locally in rank order
//   Tree    all_reduce: binary-tree reduce to rank 0, then binary-tree broadcast (chunked);
//           reduce_scatter: the same reduce, then rank 0 sends each rank its block
//   HalvingDoubling  recursive halving reduce-scatter, recursive doubling all-gather
//           (all_reduce = both, Rabenseifner); any size: a non-power-of-two size first folds
//           rank 2i into rank 2i+1 for i < size - 2^k, as MPICH does
//   Hierarchical  inside each host (Direct), then across hosts among the ranks of one local
//           index (Direct), then inside again. Hosts: consecutive ranks, launch_env().
//           local_size per host; needs every host to hold the same number of the group's ranks
//   Auto    chosen from (collective, bytes, size, hosts) by the measured thresholds in
//           mpi_group.cpp
enum class CommAlgo : uint8_t { Auto, Mpi, Ring, Direct, OneShot, Tree, HalvingDoubling, Hierarchical };

const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max"
const char* coll_name(CollKind k);        // "all_gather", ...
const char* comm_algo_name(CommAlgo a);   // "auto", "mpi", "ring", "direct", "oneshot", "tree",
                                          // "halving_doubling", "hierarchical"
CommAlgo comm_algo_from_name(const std::string& s);  // throws sw::Error naming the value
// What Auto runs on the MPI backend for a collective of `bytes` (all_gather, reduce_scatter:
// per rank; all_reduce: the buffer) over `size` ranks on `hosts` hosts (1 unless the group's
// ranks sit on several hosts, equally many and more than one on each): for cost models.
CommAlgo auto_comm_algo(CollKind kind, int64_t bytes, int size, int hosts = 1);
// Cost model of one all_gather/reduce_scatter/all_reduce by algorithm, for the planner's time
// model: `bytes` = nccl-tests' size (the whole buffer), `size` ranks on `hosts` hosts (equally
// many each). `inside`: latency and busbw (the ring's bus bytes per second) as calibrated on one
// host; `across`: the same for one rank per host over the link between hosts (busbw 0: as
// inside). Bus bytes per rank, B = bytes, n = size, k = 2 for all_reduce, 1 otherwise:
//   mpi, ring, direct   k B (n-1)/n (the ring's; across hosts each crossing edge carries it)
//   oneshot             (n-1) B
//   tree                3 B (all_reduce: an inner node takes 2 B up, sends B up and 2 B down),
//                       2 B (reduce_scatter)
//   halving_doubling    k B (n-1)/n, + k B when n is not a power of two (the fold)
//   hierarchical        inside: k B (l-1)/l; across: k (B/l) (h-1)/h over `across`
// Time = latency + bus bytes / busbw; Auto is resolved with auto_comm_algo.
struct CommFit {
  double latency_s = 0, busbw = 0;
};
double comm_algo_seconds(CommAlgo a, CollKind kind, double bytes, int size, int hosts,
                         const CommFit& inside, const CommFit& across);


namespace detail {
struct WorkState;
}

// Completion handle of an issued collective: the event its Group (a communication stream,
// core/stream.h) records after it. Copyable; a default Work is already complete. Dropping a
// Work without waiting is allowed: the collective still runs (buffers must live).
class Work final : public Event {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> s) : s_(std::move(s)) {}
  // blocks until complete; throws sw::Error("comm: ...") if the collective failed
  void wait() { block(true); }
  // As wait(), not counted as the caller's exposed communication (a group's own thread waiting
  // for another group's collective: Collective::after).
  void wait_done() const { block(false); }
  bool test();  // true once complete (never blocks; errors surface in wait())
  bool query() override { return test(); }
  void synchronize() override { wait(); }
  void* native_handle() const override;  // the device event of a device-stream collective
  TimedSpan timed_span() override;        // where the backend timed it (stream_timing())
  uint64_t seq() const;  // the group's sequence number of this collective (0 for a no-op)
  // Once complete: when the backend started and finished executing it (steady clock seconds,
  // sw::trace_clock's; 0 for a default Work).
  double started_at() const;
  double done_at() const;

 private:
  void block(bool exposed) const;  // wait(): exposed time counted in the group's stats
  std::shared_ptr<detail::WorkState> s_;
};

// One collective call. Which fields matter depends on kind (see the Group methods).
struct Collective {
  CollKind kind = CollKind::Barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  CommAlgo algo = CommAlgo::Auto;
  int color = 0, key = 0;  // Split only
  // Starts only once this collective of another group has completed (default: at once), its
  // failure failing this one: HYBRID's all-reduce of a unit's reduced block after that block's
  // reduce-scatter, issued at once behind it so every rank issues both groups' collectives in
  // one order. NCCL makes its stream wait for the event (the host does not); the MPI and
  // staged groups' threads wait for it before they start this one.
  Work after;
};
std::string describe(const Collective& c);  // "all_gather(count=10,f32)"

// Tunables. Defaults come from the environment (read once per group at creation):
//   SHARDWISE_COMM_TIMEOUT_S  watchdog limit per collective, seconds (default 300)
//   SHARDWISE_COMM_DEBUG=1    check before each collective that all ranks issue the same one
//   SHARDWISE_COMM_DELAY_US=N sleep a random 0..N us before each collective (exposes missing waits)
//   SHARDWISE_COMM_CHUNK_KB   pipeline chunk of the ring/direct algorithms (default 512)
//   SHARDWISE_COMM_SPIN_US    how long the comm thread busy-polls before sleeping (default 50)
// debug and chunk_bytes must be equal on all ranks of a group (debug adds a collective; the
// chunk size fixes the message grid both ends of a transfer expect).
struct CommOptions {
  double timeout_s = 300.0;
  bool debug = false;
  int delay_us = 0;
  int64_t chunk_bytes = 512 << 10;
  int spin_us = 50;
  static CommOptions from_env();
};

// Time accounting for metrics (comm_s, exposed_comm_s).
struct CommStats {
  uint64_t ops = 0;        // collectives completed
  double bytes = 0;        // per-rank payload bytes (nccl-tests "size")
  double comm_s = 0;       // time the comm thread spent executing collectives
  double exposed_s = 0;    // time callers spent blocked in Work::wait()
};

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "local" or "mpi"

  // Collective: ranks passing the same color form a new group, ranked by (key, old rank).
  // color < 0: this rank joins no group and gets nullptr.
  virtual std::shared_ptr<Group> split(int color, int key) = 0;

  // Enqueues a collective (the convenience forms below build the Collective).
  virtual Work issue(const Collective& c) = 0;

  virtual void set_options(const CommOptions& o) = 0;
  virtual CommOptions options() const = 0;
  void set_timeout(double seconds);  // comm_timeout_s
  void set_debug(bool on);           // call on every rank of the group

  virtual CommStats stats() const = 0;
  virtual void reset_stats() = 0;

  // recv (size*count) := every rank's send (count), in rank order. In place when
  // send == recv + rank*count elements.
  Work issue_all_gather(const void* send, void* recv, int64_t count, DType dt = DType::F32,
                        CommAlgo algo = CommAlgo::Auto);
  // recv (count) := op over ranks of block `rank` of send (size*count). recv may be exactly
  // that block of send (in place); otherwise the buffers must not overlap.
  Work issue_reduce_scatter(const void* send, void* recv, int64_t count, ReduceOp op,
                            DType dt = DType::F32, CommAlgo algo = CommAlgo::Auto);
  // recv (count) := op over ranks of send (count); send == recv is allowed (in place).
  Work issue_all_reduce(const void* send, void* recv, int64_t count, ReduceOp op,
                        DType dt = DType::F32, CommAlgo algo = CommAlgo::Auto);
  // The same, started once `after` (another group's collective) has completed
  // (Collective::after).
  Work issue_all_reduce_after(const Work& after, const void* send, void* recv, int64_t count,
                              ReduceOp op, DType dt = DType::F32);
  // buf (count) := root's buf on every rank.
  Work issue_broadcast(void* buf, int64_t count, int root, DType dt = DType::F32);
  Work issue_barrier();

  void all_gather(const void* send, void* recv, int64_t count, DType dt = DType::F32,
                  CommAlgo algo = CommAlgo::Auto) {
    issue_all_gather(send, recv, count, dt, algo).wait();
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, ReduceOp op,
                      DType dt = DType::F32, CommAlgo algo = CommAlgo::Auto) {
    issue_reduce_scatter(send, recv, count, op, dt, algo).wait();
  }
  void all_reduce(const void* send, void* recv, int64_t count, ReduceOp op,
                  DType dt = DType::F32, CommAlgo algo = CommAlgo::Auto) {
    issue_all_reduce(send, recv, count, op, dt, algo).wait();
  }
  void broadcast(void* buf, int64_t count, int root, DType dt = DType::F32) {
    issue_broadcast(buf, count, root, dt).wait();
  }
  void barrier() { issue_barrier().wait(); }
};

using GroupPtr = std::shared_ptr<Group>;

// Collective: the sum of one double per rank, added in rank order, so identical on every rank
// and independent of timing (a raw all-gather of the 8 bytes; Group's reductions are fp32).
double sum_over_ranks(Group& g, double x);

// A single-rank group; needs no MPI.
GroupPtr make_local_group();
// The process's world: an MpiGroup when launched by mpirun/srun with more than one rank
// (core/launch.h: launch_env().world_size > 1), a LocalGroup otherwise.
// Initialises MPI on first use (MPI_THREAD_MULTIPLE), sets sw::set_error_rank, and finalises
// MPI at exit. Returns the same group on every call.
GroupPtr world_group();
// Always MPI (also with one rank); used by tests and benchmarks.
GroupPtr mpi_world_group();
// True when the environment says this process is one of several launched ranks.
bool launched_multi_rank();
// The rank of this process in MPI_COMM_WORLD (0 without MPI).
int world_rank();
// ---- Collectives on device memory (docs/ARCHITECTURE.md, "Collectives on devices").
// A backend that runs collectives on a device's memory itself (NCCL for CUDA,
// sharding/comm/nccl/) registers a factory. It is called collectively on every rank of `host`
// and returns a group with the same ranks whose buffers are on `dev`, or nullptr on every rank
// when it cannot serve them all (two ranks on one GPU); a collective call on `host`.
using DeviceGroupFactory = GroupPtr (*)(Group& host, Device dev);
void register_device_group_factory(DeviceKind kind, DeviceGroupFactory f);
// The group the engine gives device buffers to. `host` itself for a CPU device. Collective.
GroupPtr device_group(const GroupPtr& host, Device dev, DeviceComm mode = DeviceComm::Auto);
// `host`'s collectives on buffers of `dev`: each collective's input is copied to a host
// staging buffer (copy_bytes), `host` runs it there, and the result is copied back, on a
// thread of the group's own, in issue order; the Work completes after the copy back. The
// staging buffers (Tier::Host, Mem::Communication; pinned where the backend pins host memory)
// live while their collective does. Works with any number of ranks per device.
GroupPtr make_staged_group(GroupPtr host, Device dev);

// Ends every rank of the job with `code` (MPI_Abort under MPI, _Exit otherwise). For main()'s
// error path: a rank that returns normally after an error would block in MPI_Finalize while
// its peers wait for it in a collective (until their watchdogs fire).
[[noreturn]] void comm_abort(int code);

}  // namespace sw
