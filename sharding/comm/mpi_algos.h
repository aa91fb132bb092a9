// Collective algorithms on MPI point-to-point messages (internal to sharding/comm).
//
// Every algorithm moves the data in chunks of P2P::chunk_bytes with non-blocking sends and
// receives, so a chunk's reduction overlaps the transfer of the next one. Messages between a
// pair of ranks are matched in posting order (MPI's non-overtaking rule), which every
// algorithm below keeps: each rank posts its sends to, and receives from, a given peer in
// (step, chunk) order.
//
// Buffers are raw bytes of `dt` elements; the `Blocks` layout says where block b of a flat
// buffer lives, so the same code serves reduce_scatter/all_gather (equal blocks of count)
// and all_reduce (blocks of ceil(count/size), the last ones shorter or empty).
#pragma once
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "sharding/comm/group.h"

namespace sw::comm {

// ---- Calls into MPI, and ThreadSanitizer ---------------------------------------------------
//
// OpenMPI progresses every pending request in whichever thread is inside an MPI call. So the
// data of a receive that one thread posted may be copied into its buffer (process_vm_readv or
// memcpy, inside the dlopen'ed btl/pml components) by another thread's call: the watchdog's
// MPI_Test, or the communication thread of another group over the same ranks. What orders that
// copy before the MPI_Test of the poster that reports the receive complete are OpenMPI's own
// atomics, which TSan does not see (the library is not instrumented); TSan then reports the
// poster's reads of its buffer as racing with the copy, and the copying thread's stack is
// usually lost by the time the read comes. Every MPI call that can progress requests goes
// through SW_MPI (or SW_MPI_CHECK), and under TSan a thread's memory accesses are ignored
// while it is inside one: the only accesses TSan sees there are those of the interceptors
// MPI's code calls (and of the bf16/f16 MPI_Op callbacks, on MPI's buffers). This is what
// scripts/sanitizers/tsan.supp's called_from_lib lines do for libmpi and libopen-pal; the
// components cannot be named there (MPI_Finalize dlcloses them, and TSan kills a process when
// a called_from_lib library is unloaded). Synchronisation inside MPI calls is still tracked.
// Outside TSan builds MpiCall is empty and SW_MPI(expr) is expr.
#if defined(__SANITIZE_THREAD__)
#define SW_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SW_TSAN 1
#endif
#endif
#ifdef SW_TSAN
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

struct MpiCall {
#ifdef SW_TSAN
  MpiCall() { __tsan_ignore_thread_begin(); }
  ~MpiCall() { __tsan_ignore_thread_end(); }
#else
  MpiCall() = default;
#endif
  MpiCall(const MpiCall&) = delete;
  MpiCall& operator=(const MpiCall&) = delete;
};

template <class F>
decltype(auto) mpi_call(F&& f) {
  [[maybe_unused]] MpiCall scope;
  return f();
}
#define SW_MPI(expr) (::sw::comm::mpi_call([&]() { return (expr); }))

[[noreturn]] void mpi_error(const char* expr, int rc, const char* file, int line);
#define SW_MPI_CHECK(expr)                                               \
  do {                                                                   \
    const int sw_mpi_rc_ = SW_MPI(expr);                                 \
    if (sw_mpi_rc_ != MPI_SUCCESS)                                       \
      ::sw::comm::mpi_error(#expr, sw_mpi_rc_, __FILE__, __LINE__);      \
  } while (0)

// How the communication thread waits: busy-polls MPI for spin_us (lowest latency), then
// sleeps with a growing nap (up to 200 us) between polls, so a late peer does not cost a core
// that compute could use.
struct Poller {
  int spin_us = 50;
  void wait(MPI_Request* r) const;
  void wait_all(std::vector<MPI_Request>& rs) const;
};

struct P2P {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  int64_t chunk_bytes = 512 << 10;
  int tag = 0;
  Poller poll;
  int64_t chunk_elems(DType dt) const;
};

// n blocks of at most L elements in a flat buffer of `total`: block b starts at min(b*L, total).
struct Blocks {
  int64_t L = 0, total = 0;
  int64_t off(int b) const { return std::min<int64_t>(static_cast<int64_t>(b) * L, total); }
  int64_t len(int b) const { return std::min<int64_t>(L, total - off(b)); }
};

// Ring reduce-scatter over the block-local columns [c0, c1) of every block:
// out[c] (c in [c0,c1)) := op over ranks of block `rank` of send. Rank r's block b is the
// sum, in this grouping, ((x[b+1] + x[b+2]) + ...) + x[b] (ranks mod size): fixed by
// (rank, size) only. out may alias send's block `rank`. tmp: 2*(c1-c0) elements.
void ring_reduce_scatter(const P2P& p, const void* send, void* out, const Blocks& bl, int64_t c0,
                         int64_t c1, DType dt, ReduceOp op, void* tmp);
// Ring all-gather over columns [c0, c1) of every block of buf. This rank's block is sent from
// `own` (its input; a buffer the caller did not just write is measurably faster to send from
// under CMA) and must be in buf's block `rank` by the time the caller reads buf.
void ring_all_gather(const P2P& p, void* buf, const void* own, const Blocks& bl, int64_t c0,
                     int64_t c1, DType dt);
// Direct (pairwise) reduce-scatter: every rank sends block q to rank q and adds what it
// receives in rank order x0 + x1 + ... . out may alias send's block `rank`.
// tmp: 2*size*chunk_elems elements.
void direct_reduce_scatter(const P2P& p, const void* send, void* out, const Blocks& bl, DType dt,
                           ReduceOp op, void* tmp);
// Direct all-gather: every rank sends its block (from `own`) to every other rank at once.
void direct_all_gather(const P2P& p, void* buf, const void* own, const Blocks& bl, DType dt);
// One-shot all-reduce: every rank receives every other rank's whole buffer and adds in rank
// order. recv may equal send. tmp: size*count elements.
void oneshot_all_reduce(const P2P& p, const void* send, void* recv, int64_t count, DType dt,
                        ReduceOp op, void* tmp);

// ---- Tree (binary tree over ranks 0..n-1: parent (r-1)/2, children 2r+1, 2r+2) ----------
// Reduce of elements [e0, e1) to rank 0: node r computes acc = (x_r op S(2r+1)) op S(2r+2)
// (S = a child's subtree result) chunk by chunk and sends it to its parent as soon as a chunk
// is complete, so chunks flow up the tree in a pipeline. Rank 0's acc holds the result (not
// divided for Avg). acc may alias send; a leaf sends straight from send and leaves acc alone.
// tmp: 2*(e1-e0) elements.
void tree_reduce(const P2P& p, const void* send, void* acc, int64_t e0, int64_t e1, DType dt,
                 ReduceOp op, void* tmp);
// Broadcast of buf's elements [e0, e1) from rank 0 down the same tree, chunk by chunk.
void tree_broadcast(const P2P& p, void* buf, int64_t e0, int64_t e1, DType dt);

// ---- Recursive halving / doubling (Thakur, Rabenseifner and Gropp 2005, MPICH) -------------
// 2^k = the largest power of two <= size, rem = size - 2^k. Ranks 2i, 2i+1 (i < rem) fold into
// one virtual rank i (held by the odd rank; the even one sits the core out); rank r >= 2*rem
// is virtual rank r - rem. The buffer is cut into 2^k virtual blocks at voff[0..2^k].
struct Fold {
  int pof2 = 1, rem = 0;
  explicit Fold(int n);
  int vrank(int r) const { return r < 2 * rem ? (r % 2 ? r / 2 : -1) : r - rem; }
  int real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
};
// Reduce-scatter: `in` is this rank's whole buffer (voff[2^k] elements). Fold: rank 2i sends
// its buffer to 2i+1, which adds x(2i) + x(2i+1). Then for d = 2^k/2 .. 1, virtual ranks v and
// v^d exchange halves of the virtual blocks they still own and add lower rank's partial first.
// Virtual rank v ends with the sum of its block in acc[voff[v], voff[v+1]) (acc: a whole-buffer
// work area that may alias in). Returns false on a rank that sat out. tmp: voff[2^k] elements.
bool halving_reduce_scatter(const P2P& p, const Fold& f, const void* in, void* acc,
                            const std::vector<int64_t>& voff, DType dt, ReduceOp op, void* tmp);
// All-gather: virtual rank v holds block v of buf in place; for d = 1 .. 2^k/2, v and v^d
// exchange everything they hold. Then rank 2i+1 sends the whole buffer to rank 2i.
void doubling_all_gather(const P2P& p, const Fold& f, void* buf, const std::vector<int64_t>& voff,
                         DType dt);

// With one peer: send sn elements of sbuf, receive rn into rbuf (in chunks, both at once).
void exchange_with(const P2P& p, int peer, const void* sbuf, int64_t sn, void* rbuf, int64_t rn,
                   DType dt);
// Rank 0 sends block q (count elements) of `full` to rank q; rank 0's own block is copied to
// out; other ranks receive theirs into out.
void scatter_from_root(const P2P& p, const void* full, void* out, int64_t count, DType dt);

// The MPI_COMM_WORLD rank of each of the `size` ranks of `comm`, in comm's rank order.
std::vector<int> world_ranks_of(MPI_Comm comm, int size);

MPI_Datatype mpi_type(DType dt);
// MPI_SUM/MPI_MAX for f32; user-defined ops (fp32 arithmetic) for bf16/f16. Avg maps to sum.
MPI_Op mpi_op(DType dt, ReduceOp op);
void create_mpi_ops();  // once, after MPI_Init
void free_mpi_ops();    // before MPI_Finalize

}  // namespace sw::comm
