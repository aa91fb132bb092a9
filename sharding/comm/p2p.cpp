// Point-to-point transport (p2p.h): the one-rank LocalPeerComm and the MPI backend's
// MpiPeerComm with its progress thread and watchdog.
#include "sharding/comm/p2p.h"

#include <mpi.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "sharding/comm/mpi_algos.h"
#include "sharding/comm/mpi_backend.h"
#include "sharding/comm/work.h"

namespace sw {

namespace detail {
int64_t p2p_chunk_count(int64_t bytes, int64_t chunk) {
  return bytes <= 0 ? 0 : (bytes + chunk - 1) / chunk;
}
int64_t p2p_chunk_len(int64_t bytes, int64_t chunk, int64_t i) {
  return std::min(chunk, bytes - i * chunk);
}
}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;
double secs_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
double seconds_of(Clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}
std::string fmt_seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", s);
  return b;
}

constexpr int kAbortCode = 70;  // exit status of every rank when the watchdog fires (as MpiGroup)
constexpr int kTagQuery = 1, kTagReply = 2;
constexpr int64_t kMaxChunk = int64_t(1) << 30;

// "recv from rank 1 (tag 77, 4194304 bytes)"
std::string op_desc(bool is_send, int peer_world, int tag, int64_t bytes) {
  return std::string(is_send ? "send to" : "recv from") + " rank " + std::to_string(peer_world) +
         " (tag " + std::to_string(tag) + ", " + std::to_string(bytes) + " bytes)";
}

std::string mismatch_line(const std::string& name, int me, int peer, int tag, int64_t want,
                          int64_t sent) {
  return "p2p[" + name + "]: rank " + std::to_string(me) + ": recv from rank " +
         std::to_string(peer) + " (tag " + std::to_string(tag) + "): expected " +
         std::to_string(want) + " bytes, rank " + std::to_string(peer) + " sent " +
         std::to_string(sent) + " bytes";
}

void check_args(const std::string& name, int size, const void* buf, int64_t bytes, int peer,
                int tag, bool is_send) {
  const std::string what = "p2p[" + name + "]: " + (is_send ? "send" : "recv") + ": ";
  if (tag < 0 || tag >= kP2PMaxTag)
    fail("comm", what + "tag " + std::to_string(tag) + " is outside [0, 2^20)");
  if (peer < 0 || peer >= size)
    fail("comm", what + "peer " + std::to_string(peer) + " is not a rank of the group (size " +
                     std::to_string(size) + ")");
  if (bytes < 0) fail("comm", what + "negative size " + std::to_string(bytes));
  if (bytes > 0 && buf == nullptr) fail("comm", what + "null buffer of " + std::to_string(bytes) + " bytes");
}

std::shared_ptr<detail::WorkState> new_work(const std::shared_ptr<detail::StatsBlock>& stats) {
  auto w = std::make_shared<detail::WorkState>();
  w->stats = stats;
  w->t_start = seconds_of(Clock::now());
  return w;
}

// ---- LocalPeerComm -------------------------------------------------------------------------

class LocalPeerComm final : public PeerComm {
 public:
  explicit LocalPeerComm(std::string name)
      : name_(std::move(name)), me_(world_rank()), stats_(std::make_shared<detail::StatsBlock>()) {}
  ~LocalPeerComm() override {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [tag, q] : recvs_)
      for (Pending& p : q)
        p.work->complete("p2p[" + name_ + "]: rank " + std::to_string(me_) + ": " +
                         op_desc(false, me_, tag, p.bytes) +
                         " cancelled: the PeerComm was destroyed before a send matched it");
  }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Work send(const void* buf, int64_t bytes, int peer, int tag) override {
    check_args(name_, 1, buf, bytes, peer, tag, true);
    auto w = new_work(stats_);
    std::unique_lock<std::mutex> l(mu_);
    auto it = recvs_.find(tag);
    if (it != recvs_.end()) {
      Pending p = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) recvs_.erase(it);
      l.unlock();
      deliver(p, buf, bytes, tag);
    } else {
      const auto* b = static_cast<const char*>(buf);
      sends_[tag].emplace_back(b, b + bytes);
      l.unlock();
    }
    stats_->add_op(static_cast<double>(bytes), 0);
    w->complete("");
    return Work(w);
  }
  Work recv(void* buf, int64_t bytes, int peer, int tag) override {
    check_args(name_, 1, buf, bytes, peer, tag, false);
    auto w = new_work(stats_);
    std::unique_lock<std::mutex> l(mu_);
    auto it = sends_.find(tag);
    if (it != sends_.end()) {
      std::vector<char> data = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) sends_.erase(it);
      l.unlock();
      deliver(Pending{buf, bytes, w, Clock::now()}, data.data(), static_cast<int64_t>(data.size()), tag);
    } else {
      recvs_[tag].push_back(Pending{buf, bytes, w, Clock::now()});
    }
    return Work(w);
  }
  CommStats stats() const override { return stats_->get(); }
  void reset_stats() override { stats_->reset(); }

 private:
  struct Pending {
    void* buf;
    int64_t bytes;
    std::shared_ptr<detail::WorkState> work;
    Clock::time_point posted;
  };
  void deliver(const Pending& p, const void* src, int64_t n, int tag) {
    if (n != p.bytes) return p.work->complete(mismatch_line(name_, me_, me_, tag, p.bytes, n));
    if (n > 0) std::memcpy(p.buf, src, static_cast<size_t>(n));
    stats_->add_op(static_cast<double>(n), secs_since(p.posted));
    p.work->complete("");
  }

  std::string name_;
  int me_;
  std::shared_ptr<detail::StatsBlock> stats_;
  std::mutex mu_;
  std::map<int, std::deque<Pending>> recvs_;            // receives waiting, by tag
  std::map<int, std::deque<std::vector<char>>> sends_;  // sends copied aside, by tag
};

// ---- MpiPeerComm ---------------------------------------------------------------------------

struct Op {
  bool is_send = false;
  const void* sbuf = nullptr;
  void* rbuf = nullptr;
  int64_t bytes = 0;
  int peer = 0, tag = 0;
  uint64_t id = 0;
  std::shared_ptr<detail::WorkState> work;
  // Progress thread only.
  int64_t hdr[2] = {0, 0};  // {bytes, chunk}: what a send sends, what a receive got
  std::vector<MPI_Request> reqs;
  bool header_done = false;  // receive: its header arrived (or failed, or was cancelled)
  bool data_posted = false;  // receive: its data receives are posted (or none will be)
  std::unique_ptr<char[]> sink;  // receive, size mismatch: the sender's data is dropped here
  std::string err;
  Clock::time_point posted;
};

// What the watchdog knows of a pending operation.
struct PendingInfo {
  bool is_send;
  int peer, tag;
  int64_t bytes;
  Clock::time_point since;
};

// Watchdog side channel: the asker's late operation, and the peer's answer about it.
struct Query {
  int64_t is_send, tag, bytes;
};
struct Answer {
  int64_t pending;      // operations pending on the answering rank
  int64_t match_bytes;  // its counterpart of the asked operation: its size, or -1 if not posted
  int64_t oldest_is_send, oldest_peer, oldest_tag, oldest_bytes;  // oldest_peer -1: none
  double oldest_age;
};

class MpiPeerComm;
struct Registry {
  std::mutex mu;
  std::set<MpiPeerComm*> live;
  bool hooked = false;
};
Registry& registry() {
  static Registry* r = new Registry;  // leaked: outlives static destructors
  return *r;
}
void shutdown_all_at_exit();

class MpiPeerComm final : public PeerComm {
 public:
  MpiPeerComm(MPI_Comm comm, std::string name, const CommOptions& opts, int64_t chunk);
  ~MpiPeerComm() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Work send(const void* buf, int64_t bytes, int peer, int tag) override {
    check_args(name_, size_, buf, bytes, peer, tag, true);
    return enqueue(true, buf, nullptr, bytes, peer, tag);
  }
  Work recv(void* buf, int64_t bytes, int peer, int tag) override {
    check_args(name_, size_, buf, bytes, peer, tag, false);
    return enqueue(false, nullptr, buf, bytes, peer, tag);
  }
  CommStats stats() const override { return stats_->get(); }
  void reset_stats() override { stats_->reset(); }
  void shutdown();  // idempotent: ends the threads (cancelling what is pending) and frees the comms

 private:
  Work enqueue(bool is_send, const void* sbuf, void* rbuf, int64_t bytes, int peer, int tag);
  void progress_loop();
  void post(Op& op);
  void post_recv_data(Op& op);
  bool poll();
  void complete(Op& op);
  void abandon_all();
  void watchdog_loop();
  void serve_queries(MPI_Request* qreq, Query* qbuf);
  [[noreturn]] void on_timeout(const PendingInfo& p, MPI_Request* qreq, Query* qbuf);
  int wr(int group_rank) const { return world_ranks_[static_cast<size_t>(group_rank)]; }
  std::string prefix() const { return "p2p[" + name_ + "]: rank " + std::to_string(wr(rank_)) + ": "; }
  std::string desc(const Op& op) const { return op_desc(op.is_send, wr(op.peer), op.tag, op.bytes); }

  MPI_Comm comm_ = MPI_COMM_NULL, hb_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
  std::string name_;
  CommOptions opts_;
  int64_t chunk_;
  std::shared_ptr<detail::StatsBlock> stats_;

  // Queue (callers -> progress thread).
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> incoming_;
  bool stopping_ = false;
  uint64_t next_id_ = 0;

  std::vector<std::shared_ptr<Op>> active_;  // progress thread only: posted, in enqueue order
  std::vector<MPI_Request> poll_reqs_;        // progress thread only: poll()'s arrays
  std::vector<std::pair<size_t, size_t>> poll_where_;
  std::vector<int> poll_idx_;
  std::vector<MPI_Status> poll_status_;
  std::vector<std::pair<int, int>> poll_blocked_;

  std::mutex st_mu_;
  std::map<uint64_t, PendingInfo> pending_;  // enqueued and not complete, by id (oldest first)

  std::mutex wd_mu_;
  std::condition_variable wd_cv_;
  bool wd_stop_ = false;
  std::deque<Answer> reply_bufs_;  // watchdog only; stable addresses for Isend

  std::mutex shut_mu_;
  bool shut_ = false;
  std::thread progress_thread_, watchdog_thread_;
};

MpiPeerComm::MpiPeerComm(MPI_Comm comm, std::string name, const CommOptions& opts, int64_t chunk)
    : comm_(comm), name_(std::move(name)), opts_(opts), chunk_(chunk),
      stats_(std::make_shared<detail::StatsBlock>()) {
  SW_MPI_CHECK(MPI_Comm_dup(comm_, &hb_comm_));
  for (MPI_Comm c : {comm_, hb_comm_}) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  void* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
  if (flag && *static_cast<int*>(ub) < 2 * kP2PMaxTag - 1)
    fail("comm", "p2p[" + name_ + "]: this MPI's largest tag is " +
                     std::to_string(*static_cast<int*>(ub)) + "; point-to-point messages need 2^21-1");
  world_ranks_ = comm::world_ranks_of(comm_, size_);
  {
    Registry& R = registry();
    std::lock_guard<std::mutex> l(R.mu);
    // Registered after MPI_Init's finalize handler, so it runs before it.
    if (!R.hooked) std::atexit(shutdown_all_at_exit);
    R.hooked = true;
    R.live.insert(this);
  }
  progress_thread_ = std::thread([this] { progress_loop(); });
  watchdog_thread_ = std::thread([this] { watchdog_loop(); });
}

MpiPeerComm::~MpiPeerComm() {
  shutdown();
  Registry& R = registry();
  std::lock_guard<std::mutex> l(R.mu);
  R.live.erase(this);
}

void shutdown_all_at_exit() {
  std::vector<MpiPeerComm*> live;
  {
    Registry& R = registry();
    std::lock_guard<std::mutex> l(R.mu);
    live.assign(R.live.begin(), R.live.end());
  }
  for (MpiPeerComm* p : live) p->shutdown();
}

void MpiPeerComm::shutdown() {
  std::lock_guard<std::mutex> s(shut_mu_);
  if (shut_) return;
  shut_ = true;
  // The watchdog first: from here on, what does not complete is abandoned after a drain period
  // rather than aborting the job.
  {
    std::lock_guard<std::mutex> l(wd_mu_);
    wd_stop_ = true;
  }
  wd_cv_.notify_all();
  if (watchdog_thread_.joinable()) watchdog_thread_.join();
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (progress_thread_.joinable()) progress_thread_.join();
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin)
    for (MPI_Comm* c : {&comm_, &hb_comm_})
      if (*c != MPI_COMM_NULL) SW_MPI(MPI_Comm_free(c));
}

Work MpiPeerComm::enqueue(bool is_send, const void* sbuf, void* rbuf, int64_t bytes, int peer,
                          int tag) {
  auto op = std::make_shared<Op>();
  op->is_send = is_send;
  op->sbuf = sbuf;
  op->rbuf = rbuf;
  op->bytes = bytes;
  op->peer = peer;
  op->tag = tag;
  op->work = std::make_shared<detail::WorkState>();
  op->work->stats = stats_;
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) fail("comm", prefix() + (is_send ? "send" : "recv") + " on a PeerComm that was shut down");
    op->id = ++next_id_;
    op->work->seq = op->id;
    {
      std::lock_guard<std::mutex> p(st_mu_);
      pending_[op->id] = PendingInfo{is_send, peer, tag, bytes, now};
    }
    incoming_.push_back(op);
  }
  cv_.notify_one();
  return Work(op->work);
}

// ---- The progress thread -------------------------------------------------------------------

void MpiPeerComm::post(Op& op) {
  op.posted = Clock::now();
  op.work->t_start = seconds_of(op.posted);
  try {
    if (op.is_send) {
      const int64_t n = detail::p2p_chunk_count(op.bytes, chunk_);
      op.hdr[0] = op.bytes;
      op.hdr[1] = chunk_;
      op.reqs.assign(static_cast<size_t>(1 + n), MPI_REQUEST_NULL);
      SW_MPI_CHECK(MPI_Isend(op.hdr, sizeof op.hdr, MPI_BYTE, op.peer, 2 * op.tag, comm_, &op.reqs[0]));
      const auto* b = static_cast<const char*>(op.sbuf);
      for (int64_t i = 0; i < n; i++)
        SW_MPI_CHECK(MPI_Isend(b + i * chunk_, static_cast<int>(detail::p2p_chunk_len(op.bytes, chunk_, i)),
                               MPI_BYTE, op.peer, 2 * op.tag + 1, comm_, &op.reqs[static_cast<size_t>(1 + i)]));
    } else {
      op.reqs.assign(1, MPI_REQUEST_NULL);
      SW_MPI_CHECK(MPI_Irecv(op.hdr, sizeof op.hdr, MPI_BYTE, op.peer, 2 * op.tag, comm_, &op.reqs[0]));
    }
  } catch (const std::exception& e) {
    op.err = prefix() + desc(op) + ": " + e.what();
    op.header_done = op.data_posted = true;
  }
}

// Once the header has arrived: the data in the sender's chunks, or (size mismatch) received
// and dropped so that the next message on this tag still matches.
void MpiPeerComm::post_recv_data(Op& op) {
  op.data_posted = true;
  if (!op.err.empty()) return;
  const int64_t sent = op.hdr[0], chunk = op.hdr[1];
  if (sent < 0 || chunk < 1 || chunk > kMaxChunk) {
    op.err = prefix() + desc(op) + ": malformed header {" + std::to_string(sent) + ", " +
             std::to_string(chunk) + "} (not a PeerComm message?)";
    return;
  }
  const int64_t n = detail::p2p_chunk_count(sent, chunk);
  op.reqs.assign(static_cast<size_t>(n), MPI_REQUEST_NULL);
  try {
    if (sent != op.bytes) {
      op.err = mismatch_line(name_, wr(rank_), wr(op.peer), op.tag, op.bytes, sent);
      // Into one scratch chunk, every message on top of the last (the data is dropped). Not
      // into nothing: OpenMPI's ob1 crashes truncating a message it fetches by RDMA get.
      op.sink.reset(new char[static_cast<size_t>(std::max<int64_t>(1, std::min(chunk, sent)))]);
      for (int64_t i = 0; i < n; i++)
        SW_MPI_CHECK(MPI_Irecv(op.sink.get(), static_cast<int>(detail::p2p_chunk_len(sent, chunk, i)),
                               MPI_BYTE, op.peer, 2 * op.tag + 1, comm_, &op.reqs[static_cast<size_t>(i)]));
      return;
    }
    auto* b = static_cast<char*>(op.rbuf);
    for (int64_t i = 0; i < n; i++)
      SW_MPI_CHECK(MPI_Irecv(b + i * chunk, static_cast<int>(detail::p2p_chunk_len(sent, chunk, i)),
                             MPI_BYTE, op.peer, 2 * op.tag + 1, comm_, &op.reqs[static_cast<size_t>(i)]));
  } catch (const std::exception& e) {
    if (op.err.empty()) op.err = prefix() + desc(op) + ": " + e.what();
  }
}

std::string mpi_error_text(int code) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(msg, static_cast<size_t>(len));
}

// One MPI_Testsome over every posted request; true when anything completed.
bool MpiPeerComm::poll() {
  // Reused from poll to poll (the thread polls every few microseconds while work is pending).
  std::vector<MPI_Request>& flat = poll_reqs_;
  std::vector<std::pair<size_t, size_t>>& where = poll_where_;
  flat.clear();
  where.clear();
  for (size_t i = 0; i < active_.size(); i++)
    for (size_t k = 0; k < active_[i]->reqs.size(); k++)
      if (active_[i]->reqs[k] != MPI_REQUEST_NULL) {
        flat.push_back(active_[i]->reqs[k]);
        where.emplace_back(i, k);
      }
  bool progressed = false;
  if (!flat.empty()) {
    int outcount = 0;
    std::vector<int>& idx = poll_idx_;
    std::vector<MPI_Status>& st = poll_status_;
    idx.resize(flat.size());
    st.resize(flat.size());
    const int rc = SW_MPI(MPI_Testsome(static_cast<int>(flat.size()), flat.data(), &outcount,
                                       idx.data(), st.data()));
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
      // Nothing is known about the individual requests: fail every operation.
      for (auto& op : active_) {
        if (op->err.empty()) op->err = prefix() + desc(*op) + ": MPI_Testsome: " + mpi_error_text(rc);
        for (MPI_Request& r : op->reqs)
          if (r != MPI_REQUEST_NULL) SW_MPI(MPI_Request_free(&r));
        op->header_done = op->data_posted = true;
      }
      outcount = 0;
      progressed = true;
    }
    if (outcount == MPI_UNDEFINED) outcount = 0;
    for (int j = 0; j < outcount; j++) {
      progressed = true;
      const auto [i, k] = where[static_cast<size_t>(idx[static_cast<size_t>(j)])];
      Op& op = *active_[i];
      op.reqs[k] = MPI_REQUEST_NULL;
      const MPI_Status& s = st[static_cast<size_t>(j)];
      const int e = rc == MPI_ERR_IN_STATUS ? s.MPI_ERROR : MPI_SUCCESS;
      const bool header = !op.is_send && !op.data_posted;
      if (header) {
        op.header_done = true;
        int cancelled = 0;
        MPI_Test_cancelled(&s, &cancelled);
        if (cancelled) {
          op.err = prefix() + desc(op) + " cancelled: the PeerComm was destroyed before a send matched it";
          op.data_posted = true;
        } else if (e != MPI_SUCCESS && e != MPI_ERR_PENDING) {
          op.err = prefix() + desc(op) + ": " + mpi_error_text(e);
          op.data_posted = true;
        }
      } else if (e != MPI_SUCCESS && e != MPI_ERR_PENDING) {
        if (op.err.empty()) op.err = prefix() + desc(op) + ": " + mpi_error_text(e);
      } else if (!op.is_send && !op.sink) {
        // A data message of another size: the messages of this (peer, tag) are out of step.
        int got = 0;
        MPI_Get_count(&s, MPI_BYTE, &got);
        const int64_t want = detail::p2p_chunk_len(op.hdr[0], op.hdr[1], static_cast<int64_t>(k));
        if (got != want && op.err.empty())
          op.err = prefix() + desc(op) + ": data message " + std::to_string(k) + " has " +
                   std::to_string(got) + " bytes, expected " + std::to_string(want) +
                   " (messages on this tag out of step)";
      }
    }
  }
  // Data receives in enqueue order per (peer, tag): a receive whose header came first may not
  // post its data before an earlier receive of the same (peer, tag) did, or they would swap.
  std::vector<std::pair<int, int>>& blocked = poll_blocked_;
  blocked.clear();
  for (auto& op : active_) {
    if (op->is_send || op->data_posted) continue;
    const auto key = std::make_pair(op->peer, op->tag);
    if (op->header_done && std::find(blocked.begin(), blocked.end(), key) == blocked.end()) {
      post_recv_data(*op);
      progressed = true;
    } else {
      blocked.push_back(key);
    }
  }
  // Complete what is done, keeping the order of the rest.
  size_t w = 0;
  for (size_t i = 0; i < active_.size(); i++) {
    Op& op = *active_[i];
    const bool done = (op.is_send || op.data_posted) &&
                      std::all_of(op.reqs.begin(), op.reqs.end(),
                                  [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
    if (done) {
      complete(op);
      progressed = true;
    } else {
      active_[w++] = std::move(active_[i]);
    }
  }
  active_.resize(w);
  return progressed;
}

void MpiPeerComm::complete(Op& op) {
  {
    std::lock_guard<std::mutex> l(st_mu_);
    pending_.erase(op.id);
  }
  if (op.err.empty()) stats_->add_op(static_cast<double>(op.bytes), secs_since(op.posted));
  op.work->complete(std::move(op.err));
}

void MpiPeerComm::abandon_all() {
  for (auto& op : active_) {
    for (MPI_Request& r : op->reqs)
      if (r != MPI_REQUEST_NULL) {
        SW_MPI(MPI_Cancel(&r));
        SW_MPI(MPI_Request_free(&r));
      }
    if (op->err.empty())
      op->err = prefix() + desc(*op) + " abandoned: the PeerComm was destroyed before it completed";
    complete(*op);
  }
  active_.clear();
}

void MpiPeerComm::progress_loop() {
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 us, so the poller's short naps stay short
#endif
  bool draining = false;
  Clock::time_point drain_end;
  auto idle_since = Clock::now();
  int nap_us = 2;
  for (;;) {
    std::deque<std::shared_ptr<Op>> fresh;
    bool stop = false;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (active_.empty())
        cv_.wait(l, [&] { return stopping_ || !incoming_.empty(); });
      fresh.swap(incoming_);
      stop = stopping_;
    }
    for (auto& op : fresh) {
      post(*op);
      active_.push_back(std::move(op));
    }
    if (stop && !draining) {
      // Receives nothing matched yet are cancelled; the rest get a drain period.
      draining = true;
      drain_end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::min(opts_.timeout_s, 5.0)));
      for (auto& op : active_)
        if (!op->is_send && !op->data_posted && !op->header_done && op->reqs[0] != MPI_REQUEST_NULL)
          SW_MPI(MPI_Cancel(&op->reqs[0]));
    }
    if (active_.empty()) {
      if (stop) return;
      continue;
    }
    const bool progressed = poll() || !fresh.empty();
    if (draining && !active_.empty() && Clock::now() > drain_end) {
      abandon_all();
      return;
    }
    // Spin for spin_us after the last progress, then nap between polls: up to 20 us for the
    // first millisecond (a transfer under way, or a peer about to answer: a 1 MiB message over
    // shared memory takes ~70 us, and 200 us naps made it ~370), then up to 200 us.
    const double idle_us =
        std::chrono::duration<double, std::micro>(Clock::now() - idle_since).count();
    if (progressed) {
      idle_since = Clock::now();
      nap_us = 2;
    } else if (idle_us >= opts_.spin_us) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, std::chrono::microseconds(nap_us),
                   [&] { return !incoming_.empty() || (stopping_ && !draining); });
      nap_us = std::min(nap_us * 2, idle_us < 1000 ? 20 : 200);
    }
  }
}

// ---- The watchdog --------------------------------------------------------------------------
//
// Every tick it answers peers' questions on the side channel and checks the oldest pending
// operation's age. Past the limit it asks the operation's peer about its counterpart (grace
// period of up to 2 s for the answer), prints one line, lingers 1-4 s (so that other ranks
// whose deadlines fall within it print theirs) and aborts the job.

void MpiPeerComm::serve_queries(MPI_Request* qreq, Query* qbuf) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (SW_MPI(MPI_Test(qreq, &flag, &st)) != MPI_SUCCESS || !flag) return;
    const int asker = st.MPI_SOURCE;
    Answer a{};
    a.match_bytes = -1;
    a.oldest_peer = -1;
    {
      std::lock_guard<std::mutex> l(st_mu_);
      a.pending = static_cast<int64_t>(pending_.size());
      for (const auto& [id, p] : pending_)
        if (p.peer == asker && p.tag == qbuf->tag && p.is_send != (qbuf->is_send != 0)) {
          a.match_bytes = p.bytes;
          break;
        }
      if (!pending_.empty()) {
        const PendingInfo& p = pending_.begin()->second;
        a.oldest_is_send = p.is_send ? 1 : 0;
        a.oldest_peer = wr(p.peer);
        a.oldest_tag = p.tag;
        a.oldest_bytes = p.bytes;
        a.oldest_age = secs_since(p.since);
      }
    }
    reply_bufs_.push_back(a);
    MPI_Request r;
    if (SW_MPI(MPI_Isend(&reply_bufs_.back(), sizeof(Answer), MPI_BYTE, asker, kTagReply,
                         hb_comm_, &r)) == MPI_SUCCESS)
      SW_MPI(MPI_Request_free(&r));
    SW_MPI(MPI_Irecv(qbuf, sizeof(Query), MPI_BYTE, MPI_ANY_SOURCE, kTagQuery, hb_comm_, qreq));
  }
}

void MpiPeerComm::watchdog_loop() {
  Query qbuf{};
  MPI_Request qreq = MPI_REQUEST_NULL;
  SW_MPI(MPI_Irecv(&qbuf, sizeof(Query), MPI_BYTE, MPI_ANY_SOURCE, kTagQuery, hb_comm_, &qreq));
  const double timeout = opts_.timeout_s;
  const double tick = std::clamp(timeout / 20, 0.005, 0.1);
  for (;;) {
    {
      std::unique_lock<std::mutex> l(wd_mu_);
      wd_cv_.wait_for(l, std::chrono::duration<double>(tick), [&] { return wd_stop_; });
      if (wd_stop_) break;
    }
    serve_queries(&qreq, &qbuf);
    std::optional<PendingInfo> late;
    {
      std::lock_guard<std::mutex> l(st_mu_);
      if (!pending_.empty() && secs_since(pending_.begin()->second.since) > timeout)
        late = pending_.begin()->second;
    }
    if (late) on_timeout(*late, &qreq, &qbuf);
  }
  if (qreq != MPI_REQUEST_NULL) {
    SW_MPI(MPI_Cancel(&qreq));
    SW_MPI(MPI_Wait(&qreq, MPI_STATUS_IGNORE));
  }
}

void MpiPeerComm::on_timeout(const PendingInfo& p, MPI_Request* qreq, Query* qbuf) {
  const double timeout = opts_.timeout_s;
  Query q{p.is_send ? 1 : 0, p.tag, p.bytes};
  Answer a{};
  MPI_Request rr = MPI_REQUEST_NULL, sr = MPI_REQUEST_NULL;
  SW_MPI(MPI_Irecv(&a, sizeof a, MPI_BYTE, p.peer, kTagReply, hb_comm_, &rr));
  SW_MPI(MPI_Isend(&q, sizeof q, MPI_BYTE, p.peer, kTagQuery, hb_comm_, &sr));
  const double grace = std::clamp(timeout / 4, 0.5, 2.0);
  const auto t0 = Clock::now();
  bool answered = false;
  for (;;) {
    serve_queries(qreq, qbuf);
    int flag = 0;
    if (SW_MPI(MPI_Test(&rr, &flag, MPI_STATUS_IGNORE)) == MPI_SUCCESS && flag) answered = true;
    if (answered || secs_since(t0) > grace) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string peer = "rank " + std::to_string(wr(p.peer));
  const char* other = p.is_send ? "recv" : "send";
  std::string why;
  if (!answered) {
    why = peer + " is not responding";
  } else if (a.match_bytes >= 0) {
    why = peer + " has posted the " + other + " (" + std::to_string(a.match_bytes) +
          " bytes) but it has not completed";
  } else {
    why = peer + " has not posted the " + other;
    if (a.oldest_peer >= 0)
      why += " (its oldest pending operation: " +
             op_desc(a.oldest_is_send != 0, static_cast<int>(a.oldest_peer),
                     static_cast<int>(a.oldest_tag), a.oldest_bytes) +
             " for " + fmt_seconds(std::round(a.oldest_age * 10) / 10) + " s)";
    else
      why += " (it has no operation pending)";
  }
  std::fprintf(stderr, "%s%s not complete after %s s: %s\n", prefix().c_str(),
               op_desc(p.is_send, wr(p.peer), p.tag, p.bytes).c_str(), fmt_seconds(timeout).c_str(),
               why.c_str());
  std::fflush(stderr);
  // Linger (still answering) so that the other ranks waiting on this one print their lines too,
  // even when they reached their waits a second later (oversubscribed ranks, a loaded host).
  const double linger = std::clamp(timeout / 2, 1.0, 4.0);
  const auto t1 = Clock::now();
  while (secs_since(t1) < linger) {
    serve_queries(qreq, qbuf);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  comm::mpi_abort_if_initialized(kAbortCode);
  std::_Exit(kAbortCode);
}

}  // namespace

PeerCommPtr make_peer_comm(Group& group, const std::string& name, int64_t chunk_bytes) {
  if (chunk_bytes < 1 || chunk_bytes > kMaxChunk)
    fail("comm", "p2p[" + name + "]: chunk of " + std::to_string(chunk_bytes) +
                     " bytes is outside [1, 2^30]");
  const std::string backend = group.backend();
  if (backend == "local") return std::make_shared<LocalPeerComm>(name);
  const int f = backend == "mpi" ? comm::mpi_dup_comm_of(group) : -1;
  if (f < 0)
    fail("comm", "p2p[" + name + "]: point-to-point messages need an MPI or a one-rank local "
                 "group, not a '" + backend + "' group (pass its host group)");
  return std::make_shared<MpiPeerComm>(MPI_Comm_f2c(f), name, group.options(), chunk_bytes);
}

}  // namespace sw
