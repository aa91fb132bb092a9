#include "sharding/comm/mpi_algos.h"

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "core/error.h"
#include "sharding/comm/reduce.h"

namespace sw::comm {

void mpi_error(const char* expr, int rc, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) std::snprintf(msg, sizeof msg, "error %d", rc);
  throw Error("comm: MPI call failed on rank " + std::to_string(error_rank()) + ": " + expr +
              ": " + msg + " (" + file + ":" + std::to_string(line) + ")");
}

// ---- Waiting -------------------------------------------------------------------------------

namespace {
using Clock = std::chrono::steady_clock;

template <class TestFn>
void poll_until(int spin_us, TestFn done) {
  if (done()) return;
  const auto t0 = Clock::now();
  int nap_us = 2;
  while (!done()) {
    if (std::chrono::duration<double, std::micro>(Clock::now() - t0).count() >= spin_us) {
      std::this_thread::sleep_for(std::chrono::microseconds(nap_us));
      nap_us = std::min(nap_us * 2, 200);
    }
  }
}
}  // namespace

void Poller::wait(MPI_Request* r) const {
  if (*r == MPI_REQUEST_NULL) return;
  poll_until(spin_us, [&] {
    int flag = 0;
    SW_MPI_CHECK(MPI_Test(r, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  });
}

void Poller::wait_all(std::vector<MPI_Request>& rs) const {
  if (rs.empty()) return;
  poll_until(spin_us, [&] {
    int flag = 0;
    SW_MPI_CHECK(MPI_Testall(static_cast<int>(rs.size()), rs.data(), &flag, MPI_STATUSES_IGNORE));
    return flag != 0;
  });
}

int64_t P2P::chunk_elems(DType dt) const {
  return std::max<int64_t>(1, chunk_bytes / static_cast<int64_t>(dtype_size(dt)));
}

// ---- Helpers -------------------------------------------------------------------------------

namespace {

inline int mod(int x, int n) { return ((x % n) + n) % n; }

inline char* at(void* base, int64_t elem, size_t es) {
  return static_cast<char*>(base) + static_cast<size_t>(elem) * es;
}
inline const char* at(const void* base, int64_t elem, size_t es) {
  return static_cast<const char*>(base) + static_cast<size_t>(elem) * es;
}

void isend(const P2P& p, const void* buf, int64_t n, size_t es, int to, MPI_Request* r) {
  SW_MPI_CHECK(MPI_Isend(buf, static_cast<int>(n * static_cast<int64_t>(es)), MPI_BYTE, to, p.tag,
                         p.comm, r));
}
void irecv(const P2P& p, void* buf, int64_t n, size_t es, int from, MPI_Request* r) {
  SW_MPI_CHECK(MPI_Irecv(buf, static_cast<int>(n * static_cast<int64_t>(es)), MPI_BYTE, from,
                         p.tag, p.comm, r));
}

// Length of chunk j (chunks of C from column c0, clipped to c1 and to the block length).
inline int64_t chunk_len(int64_t blen, int64_t c0, int64_t c1, int64_t C, int64_t j) {
  const int64_t lo = c0 + j * C;
  const int64_t hi = std::min({c0 + (j + 1) * C, c1, blen});
  return std::max<int64_t>(0, hi - lo);
}

}  // namespace

// ---- Ring ----------------------------------------------------------------------------------
//
// Reduce-scatter, step s = 0..n-2: rank r sends the partial of block (r-s-1) to its right
// neighbour and receives the partial of block (r-s-2) from its left one, adding its own
// contribution. After n-1 steps it holds block r complete. Partials received at step s sit in
// buf[s%2] and are sent on at step s+1; so the receive of (s+1, chunk j) reuses the region
// that send (s, j) read from and is posted only once that send completed. Chunks that fall
// beyond a short block are sent as empty messages, keeping the chunk grid the same each step.

void ring_reduce_scatter(const P2P& p, const void* send, void* out, const Blocks& bl, int64_t c0,
                         int64_t c1, DType dt, ReduceOp op, void* tmp) {
  const int n = p.size, r = p.rank;
  const size_t es = dtype_size(dt);
  const int64_t C = p.chunk_elems(dt);
  const int64_t W = c1 - c0;
  if (W <= 0) return;
  const int m = static_cast<int>((W + C - 1) / C);
  const int left = mod(r - 1, n), right = mod(r + 1, n);
  char* buf[2] = {static_cast<char*>(tmp), static_cast<char*>(tmp) + static_cast<size_t>(W) * es};
  std::vector<MPI_Request> sreq(static_cast<size_t>((n - 1) * m), MPI_REQUEST_NULL);
  std::vector<MPI_Request> rreq(sreq.size(), MPI_REQUEST_NULL);
  auto send_blk = [&](int s) { return mod(r - s - 1, n); };
  auto recv_blk = [&](int s) { return mod(r - s - 2, n); };
  auto len = [&](int b, int j) { return chunk_len(bl.len(b), c0, c1, C, j); };
  auto post_recv = [&](int s, int j) {
    irecv(p, buf[s % 2] + static_cast<size_t>(j * C) * es, len(recv_blk(s), j), es, left,
          &rreq[static_cast<size_t>(s * m + j)]);
  };
  auto post_send = [&](int s, int j, const char* src) {
    isend(p, src, len(send_blk(s), j), es, right, &sreq[static_cast<size_t>(s * m + j)]);
  };

  for (int j = 0; j < m; j++) post_recv(0, j);
  for (int j = 0; j < m; j++) post_send(0, j, at(send, bl.off(send_blk(0)) + c0 + j * C, es));
  for (int s = 0; s <= n - 2; s++) {
    const int b = recv_blk(s);
    for (int j = 0; j < m; j++) {
      p.poll.wait(&rreq[static_cast<size_t>(s * m + j)]);
      const int64_t nl = len(b, j);
      char* part = buf[s % 2] + static_cast<size_t>(j * C) * es;
      const char* own = at(send, bl.off(b) + c0 + j * C, es);
      if (s == n - 2) {
        char* dst = at(out, c0 + j * C, es);
        reduce2(dst, part, own, nl, dt, op);
        if (op == ReduceOp::Avg) divide(dst, nl, dt, static_cast<float>(n));
      } else {
        reduce2(part, part, own, nl, dt, op);
        post_send(s + 1, j, part);
        if (s >= 1) p.poll.wait(&sreq[static_cast<size_t>(s * m + j)]);
        post_recv(s + 1, j);
      }
    }
  }
  p.poll.wait_all(sreq);
}

// All-gather, step s: send block (r-s), receive block (r-s-1) straight into its place; the
// block received at step s is forwarded at step s+1. All receives are posted up front.
void ring_all_gather(const P2P& p, void* buf, const void* own, const Blocks& bl, int64_t c0,
                     int64_t c1, DType dt) {
  const int n = p.size, r = p.rank;
  const size_t es = dtype_size(dt);
  const int64_t C = p.chunk_elems(dt);
  const int64_t W = c1 - c0;
  if (W <= 0) return;
  const int m = static_cast<int>((W + C - 1) / C);
  const int left = mod(r - 1, n), right = mod(r + 1, n);
  std::vector<MPI_Request> sreq(static_cast<size_t>((n - 1) * m), MPI_REQUEST_NULL);
  std::vector<MPI_Request> rreq(sreq.size(), MPI_REQUEST_NULL);
  auto recv_blk = [&](int s) { return mod(r - s - 1, n); };
  auto len = [&](int b, int j) { return chunk_len(bl.len(b), c0, c1, C, j); };
  auto where = [&](int b, int j) { return at(buf, bl.off(b) + c0 + j * C, es); };
  for (int s = 0; s <= n - 2; s++)
    for (int j = 0; j < m; j++)
      irecv(p, where(recv_blk(s), j), len(recv_blk(s), j), es, left,
            &rreq[static_cast<size_t>(s * m + j)]);
  for (int j = 0; j < m; j++)
    isend(p, at(own, c0 + j * C, es), len(r, j), es, right, &sreq[static_cast<size_t>(j)]);
  for (int s = 0; s <= n - 2; s++)
    for (int j = 0; j < m; j++) {
      p.poll.wait(&rreq[static_cast<size_t>(s * m + j)]);
      if (s + 1 <= n - 2) {
        const int b = recv_blk(s);
        isend(p, where(b, j), len(b, j), es, right, &sreq[static_cast<size_t>((s + 1) * m + j)]);
      }
    }
  p.poll.wait_all(sreq);
}

// ---- Direct --------------------------------------------------------------------------------

void direct_reduce_scatter(const P2P& p, const void* send, void* out, const Blocks& bl, DType dt,
                           ReduceOp op, void* tmp) {
  const int n = p.size, r = p.rank;
  const size_t es = dtype_size(dt);
  const int64_t C = p.chunk_elems(dt);
  if (bl.L <= 0) return;
  const int m = static_cast<int>((bl.L + C - 1) / C);
  auto len = [&](int b, int k) { return chunk_len(bl.len(b), 0, bl.L, C, k); };
  auto slot = [&](int k, int q) {
    return static_cast<char*>(tmp) + static_cast<size_t>(((k % 2) * n + q) * C) * es;
  };
  std::vector<MPI_Request> sreq(static_cast<size_t>(m * n), MPI_REQUEST_NULL);
  std::vector<MPI_Request> rreq(sreq.size(), MPI_REQUEST_NULL);
  auto post = [&](int k) {
    for (int i = 1; i < n; i++) {
      const int q = mod(r - i, n);  // receive from left-ish ranks first, send to right-ish
      irecv(p, slot(k, q), len(r, k), es, q, &rreq[static_cast<size_t>(k * n + q)]);
    }
    for (int i = 1; i < n; i++) {
      const int q = mod(r + i, n);
      isend(p, at(send, bl.off(q) + k * C, es), len(q, k), es, q, &sreq[static_cast<size_t>(k * n + q)]);
    }
  };
  post(0);
  if (m > 1) post(1);
  std::vector<const void*> src(static_cast<size_t>(n));
  for (int k = 0; k < m; k++) {
    for (int q = 0; q < n; q++) {
      if (q == r) {
        src[static_cast<size_t>(q)] = at(send, bl.off(r) + k * C, es);
      } else {
        p.poll.wait(&rreq[static_cast<size_t>(k * n + q)]);
        src[static_cast<size_t>(q)] = slot(k, q);
      }
    }
    char* dst = at(out, k * C, es);
    const int64_t nl = len(r, k);
    reduce_n(dst, src.data(), n, nl, dt, op);
    if (op == ReduceOp::Avg) divide(dst, nl, dt, static_cast<float>(n));
    if (k + 2 < m) post(k + 2);
  }
  p.poll.wait_all(sreq);
}

void direct_all_gather(const P2P& p, void* buf, const void* own, const Blocks& bl, DType dt) {
  const int n = p.size, r = p.rank;
  const size_t es = dtype_size(dt);
  const int64_t C = p.chunk_elems(dt);
  if (bl.L <= 0) return;
  const int m = static_cast<int>((bl.L + C - 1) / C);
  auto len = [&](int b, int k) { return chunk_len(bl.len(b), 0, bl.L, C, k); };
  std::vector<MPI_Request> req;
  req.reserve(static_cast<size_t>(2 * (n - 1) * m));
  for (int i = 1; i < n; i++) {
    const int q = mod(r - i, n);
    for (int k = 0; k < m; k++) {
      req.push_back(MPI_REQUEST_NULL);
      irecv(p, at(buf, bl.off(q) + k * C, es), len(q, k), es, q, &req.back());
    }
  }
  for (int i = 1; i < n; i++) {
    const int q = mod(r + i, n);
    for (int k = 0; k < m; k++) {
      req.push_back(MPI_REQUEST_NULL);
      isend(p, at(own, k * C, es), len(r, k), es, q, &req.back());
    }
  }
  p.poll.wait_all(req);
}

void oneshot_all_reduce(const P2P& p, const void* send, void* recv, int64_t count, DType dt,
                        ReduceOp op, void* tmp) {
  const int n = p.size, r = p.rank;
  const size_t es = dtype_size(dt);
  const int64_t C = p.chunk_elems(dt);
  if (count <= 0) return;
  const int m = static_cast<int>((count + C - 1) / C);
  auto len = [&](int k) { return std::min(C, count - k * C); };
  std::vector<MPI_Request> req;
  req.reserve(static_cast<size_t>(2 * (n - 1) * m));
  for (int i = 1; i < n; i++) {
    const int q = mod(r - i, n);
    for (int k = 0; k < m; k++) {
      req.push_back(MPI_REQUEST_NULL);
      irecv(p, at(tmp, q * count + k * C, es), len(k), es, q, &req.back());
    }
  }
  for (int i = 1; i < n; i++) {
    const int q = mod(r + i, n);
    for (int k = 0; k < m; k++) {
      req.push_back(MPI_REQUEST_NULL);
      isend(p, at(send, k * C, es), len(k), es, q, &req.back());
    }
  }
  p.poll.wait_all(req);
  std::vector<const void*> src(static_cast<size_t>(n));
  for (int q = 0; q < n; q++) src[static_cast<size_t>(q)] = q == r ? send : at(tmp, q * count, es);
  reduce_n(recv, src.data(), n, count, dt, op);
  if (op == ReduceOp::Avg) divide(recv, count, dt, static_cast<float>(n));
}

// ---- Tree ----------------------------------------------------------------------------------

void tree_reduce(const P2P& p, const void* send, void* acc, int64_t e0, int64_t e1, DType dt,
                 ReduceOp op, void* tmp) {
  const int n = p.size, r = p.rank;
  const size_t es = dtype_size(dt);
  const int64_t C = p.chunk_elems(dt);
  const int64_t W = e1 - e0;
  if (W <= 0) return;
  const int m = static_cast<int>((W + C - 1) / C);
  auto len = [&](int j) { return std::min(C, W - j * C); };
  std::vector<int> kids;
  for (int k : {2 * r + 1, 2 * r + 2})
    if (k < n) kids.push_back(k);
  const int nk = static_cast<int>(kids.size());
  std::vector<MPI_Request> rreq(static_cast<size_t>(nk * m), MPI_REQUEST_NULL);
  std::vector<MPI_Request> sreq(static_cast<size_t>(m), MPI_REQUEST_NULL);
  auto slot = [&](int k, int j) { return at(tmp, k * W + j * C, es); };
  for (int k = 0; k < nk; k++)
    for (int j = 0; j < m; j++)
      irecv(p, slot(k, j), len(j), es, kids[static_cast<size_t>(k)], &rreq[static_cast<size_t>(k * m + j)]);
  for (int j = 0; j < m; j++) {
    const char* src = at(send, e0 + j * C, es);
    char* dst = at(acc, e0 + j * C, es);
    const char* out = src;
    for (int k = 0; k < nk; k++) {
      p.poll.wait(&rreq[static_cast<size_t>(k * m + j)]);
      reduce2(dst, k == 0 ? src : dst, slot(k, j), len(j), dt, op);  // (x_r op S(left)) op S(right)
      out = dst;
    }
    if (r != 0) isend(p, out, len(j), es, (r - 1) / 2, &sreq[static_cast<size_t>(j)]);
  }
  p.poll.wait_all(sreq);
}

void tree_broadcast(const P2P& p, void* buf, int64_t e0, int64_t e1, DType dt) {
  const int n = p.size, r = p.rank;
  const size_t es = dtype_size(dt);
  const int64_t C = p.chunk_elems(dt);
  const int64_t W = e1 - e0;
  if (W <= 0) return;
  const int m = static_cast<int>((W + C - 1) / C);
  auto len = [&](int j) { return std::min(C, W - j * C); };
  std::vector<MPI_Request> rreq(static_cast<size_t>(m), MPI_REQUEST_NULL), sreq;
  sreq.reserve(static_cast<size_t>(2 * m));
  if (r != 0)
    for (int j = 0; j < m; j++)
      irecv(p, at(buf, e0 + j * C, es), len(j), es, (r - 1) / 2, &rreq[static_cast<size_t>(j)]);
  for (int j = 0; j < m; j++) {
    p.poll.wait(&rreq[static_cast<size_t>(j)]);
    for (int k : {2 * r + 1, 2 * r + 2}) {
      if (k >= n) continue;
      sreq.push_back(MPI_REQUEST_NULL);
      isend(p, at(buf, e0 + j * C, es), len(j), es, k, &sreq.back());
    }
  }
  p.poll.wait_all(sreq);
}

// ---- Recursive halving / doubling ----------------------------------------------------------

Fold::Fold(int n) {
  while (pof2 * 2 <= n) pof2 *= 2;
  rem = n - pof2;
}

namespace {
// With one peer: send sn elements from sbuf and receive rn into rbuf, both in chunks (all
// posted at once); got(off, len) runs as each received chunk lands, in order.
template <class Got>
void exchange(const P2P& p, int peer, const void* sbuf, int64_t sn, void* rbuf, int64_t rn,
              DType dt, Got got) {
  const size_t es = dtype_size(dt);
  const int64_t C = p.chunk_elems(dt);
  const int ms = static_cast<int>((sn + C - 1) / C), mr = static_cast<int>((rn + C - 1) / C);
  std::vector<MPI_Request> rreq(static_cast<size_t>(mr), MPI_REQUEST_NULL);
  std::vector<MPI_Request> sreq(static_cast<size_t>(ms), MPI_REQUEST_NULL);
  for (int j = 0; j < mr; j++)
    irecv(p, at(rbuf, j * C, es), std::min(C, rn - j * C), es, peer, &rreq[static_cast<size_t>(j)]);
  for (int j = 0; j < ms; j++)
    isend(p, at(sbuf, j * C, es), std::min(C, sn - j * C), es, peer, &sreq[static_cast<size_t>(j)]);
  for (int j = 0; j < mr; j++) {
    p.poll.wait(&rreq[static_cast<size_t>(j)]);
    got(j * C, std::min(C, rn - j * C));
  }
  p.poll.wait_all(sreq);
}
void no_op(int64_t, int64_t) {}
}  // namespace

bool halving_reduce_scatter(const P2P& p, const Fold& f, const void* in, void* acc,
                            const std::vector<int64_t>& voff, DType dt, ReduceOp op, void* tmp) {
  const int r = p.rank;
  const size_t es = dtype_size(dt);
  const int64_t total = voff[static_cast<size_t>(f.pof2)];
  const void* src = in;
  if (r < 2 * f.rem) {
    if (r % 2 == 0) {
      exchange(p, r + 1, in, total, nullptr, 0, dt, no_op);
      return false;
    }
    exchange(p, r - 1, nullptr, 0, tmp, total, dt, [&](int64_t o, int64_t l) {
      reduce2(at(acc, o, es), at(tmp, o, es), at(in, o, es), l, dt, op);  // x(2i) + x(2i+1)
    });
    src = acc;
  }
  const int v = f.vrank(r);
  int lo = 0, hi = f.pof2;
  auto off = [&](int b) { return voff[static_cast<size_t>(b)]; };
  for (int d = f.pof2 / 2; d >= 1; d /= 2) {
    const bool upper = (v & d) != 0;
    const int mid = lo + d;
    const int klo = upper ? mid : lo, khi = upper ? hi : mid;  // kept
    const int glo = upper ? lo : mid, ghi = upper ? mid : hi;  // given
    const int64_t k0 = off(klo);
    exchange(p, f.real(v ^ d), at(src, off(glo), es), off(ghi) - off(glo), tmp, off(khi) - k0, dt,
             [&](int64_t o, int64_t l) {
               const char* mine = at(src, k0 + o, es);
               const char* theirs = at(tmp, o, es);
               reduce2(at(acc, k0 + o, es), upper ? theirs : mine, upper ? mine : theirs, l, dt, op);
             });
    src = acc;
    lo = klo, hi = khi;
  }
  return true;  // (size 1 never gets here: the callers copy)
}

void doubling_all_gather(const P2P& p, const Fold& f, void* buf, const std::vector<int64_t>& voff,
                         DType dt) {
  const int r = p.rank;
  const size_t es = dtype_size(dt);
  const int64_t total = voff[static_cast<size_t>(f.pof2)];
  auto off = [&](int b) { return voff[static_cast<size_t>(b)]; };
  const int v = f.vrank(r);
  if (v >= 0) {
    int lo = v, hi = v + 1;
    for (int d = 1; d < f.pof2; d *= 2) {
      const bool upper = (v & d) != 0;
      const int plo = upper ? lo - d : lo + d, phi = upper ? hi - d : hi + d;
      exchange(p, f.real(v ^ d), at(buf, off(lo), es), off(hi) - off(lo), at(buf, off(plo), es),
               off(phi) - off(plo), dt, no_op);
      lo = std::min(lo, plo), hi = std::max(hi, phi);
    }
  }
  if (r < 2 * f.rem) {
    if (r % 2) exchange(p, r - 1, buf, total, nullptr, 0, dt, no_op);
    else exchange(p, r + 1, nullptr, 0, buf, total, dt, no_op);
  }
}

void exchange_with(const P2P& p, int peer, const void* sbuf, int64_t sn, void* rbuf, int64_t rn,
                   DType dt) {
  exchange(p, peer, sbuf, sn, rbuf, rn, dt, no_op);
}

void scatter_from_root(const P2P& p, const void* full, void* out, int64_t count, DType dt) {
  const size_t es = dtype_size(dt);
  if (p.rank != 0) return exchange(p, 0, nullptr, 0, out, count, dt, no_op);
  const int64_t C = p.chunk_elems(dt);
  const int m = static_cast<int>((count + C - 1) / C);
  std::vector<MPI_Request> sreq;
  sreq.reserve(static_cast<size_t>(m * (p.size - 1)));
  for (int q = 1; q < p.size; q++)
    for (int j = 0; j < m; j++) {
      sreq.push_back(MPI_REQUEST_NULL);
      isend(p, at(full, q * count + j * C, es), std::min(C, count - j * C), es, q, &sreq.back());
    }
  if (count > 0 && out != full) std::memmove(out, full, static_cast<size_t>(count) * es);
  p.poll.wait_all(sreq);
}

// ---- MPI types and ops ---------------------------------------------------------------------

namespace {
MPI_Op g_ops16[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};  // [bf16,f16][sum,max]

template <DType DT, ReduceOp OP>
void op16(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce2(inout, in, inout, *len, DT, OP);
}
}  // namespace

std::vector<int> world_ranks_of(MPI_Comm comm, int size) {
  MPI_Group g, wg;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  std::vector<int> mine(static_cast<size_t>(size));
  for (int i = 0; i < size; i++) mine[static_cast<size_t>(i)] = i;
  std::vector<int> world(static_cast<size_t>(size));
  MPI_Group_translate_ranks(g, size, mine.data(), wg, world.data());
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  return world;
}

MPI_Datatype mpi_type(DType dt) { return dt == DType::F32 ? MPI_FLOAT : MPI_UINT16_T; }

MPI_Op mpi_op(DType dt, ReduceOp op) {
  const bool mx = op == ReduceOp::Max;
  if (dt == DType::F32) return mx ? MPI_MAX : MPI_SUM;
  return g_ops16[dt == DType::BF16 ? 0 : 1][mx ? 1 : 0];
}

void create_mpi_ops() {
  if (g_ops16[0][0] != MPI_OP_NULL) return;
  SW_MPI_CHECK(MPI_Op_create(&op16<DType::BF16, ReduceOp::Sum>, 1, &g_ops16[0][0]));
  SW_MPI_CHECK(MPI_Op_create(&op16<DType::BF16, ReduceOp::Max>, 1, &g_ops16[0][1]));
  SW_MPI_CHECK(MPI_Op_create(&op16<DType::F16, ReduceOp::Sum>, 1, &g_ops16[1][0]));
  SW_MPI_CHECK(MPI_Op_create(&op16<DType::F16, ReduceOp::Max>, 1, &g_ops16[1][1]));
}

void free_mpi_ops() {
  for (auto& row : g_ops16)
    for (MPI_Op& o : row)
      if (o != MPI_OP_NULL) MPI_Op_free(&o);
}

}  // namespace sw::comm
