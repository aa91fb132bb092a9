// The simulated accelerator (tests/common/sim_device.h).
#include "tests/common/sim_device.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/env.h"
#include "core/error.h"
#include "core/stream.h"
#include "kernels/ops.h"

namespace swtest {
namespace {

constexpr size_t kArena = size_t{16} << 30;  // reserved, not committed
constexpr size_t kAlign = 256;
constexpr size_t kPage = 4096;

void arm();  // (re)installs the fault handler (below)

struct Arena {
  char* base = nullptr;
  std::mutex mu;
  std::map<size_t, size_t> free_;   // offset -> size, coalesced
  std::map<size_t, size_t> used_;   // offset -> size
  size_t in_use = 0, high = 0;      // high: page-rounded end of the highest block ever handed out
  int open = 0;
  uint64_t opens = 0;
  // SHARDWISE_SIM_GUARD=0 (benchmarks): the arena stays readable and writable, so the ops
  // run at the CPU's speed without an mprotect per op; nothing faults then.
  const bool guard = sw::env_switch("SHARDWISE_SIM_GUARD");

  Arena() {
    void* p = mmap(nullptr, kArena, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("sim device: mmap");
      std::abort();
    }
    base = static_cast<char*>(p);
    free_[0] = kArena;
  }
  void protect(size_t lo, size_t hi, int prot) {
    if (hi > lo && mprotect(base + lo, hi - lo, prot) != 0) {
      std::perror("sim device: mprotect");
      std::abort();
    }
  }
  void* alloc(size_t bytes) {
    arm();
    const size_t n = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    std::lock_guard<std::mutex> l(mu);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < n) continue;
      const size_t off = it->first, left = it->second - n;
      free_.erase(it);
      if (left) free_[off + n] = left;
      used_[off] = n;
      in_use += n;
      const size_t end = (off + n + kPage - 1) / kPage * kPage;
      if (end > high) {
        // Newly reached pages take the arena's current state (open: readable and writable).
        protect(high, end, open > 0 || !guard ? PROT_READ | PROT_WRITE : PROT_NONE);
        high = end;
      }
      return base + off;
    }
    return nullptr;
  }
  void release(void* p) {
    std::lock_guard<std::mutex> l(mu);
    const size_t off = static_cast<size_t>(static_cast<char*>(p) - base);
    auto it = used_.find(off);
    if (it == used_.end()) {
      std::fprintf(stderr, "sim device: free of %p, which is not a live block\n", p);
      std::abort();
    }
    size_t lo = off, n = it->second;
    used_.erase(it);
    in_use -= n;
    auto next = free_.lower_bound(lo);
    if (next != free_.end() && next->first == lo + n) {
      n += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == lo) {
        lo = prev->first;
        n += prev->second;
        free_.erase(prev);
      }
    }
    free_[lo] = n;
  }
  void open_up() {
    std::lock_guard<std::mutex> l(mu);
    ++opens;
    if (open++ == 0 && guard) protect(0, high, PROT_READ | PROT_WRITE);
  }
  void close_down() {
    std::lock_guard<std::mutex> l(mu);
    if (--open == 0 && guard) protect(0, high, PROT_NONE);
  }
};

Arena& arena() {
  static Arena* a = new Arena;  // never destroyed: buffers may be freed at static destruction
  return *a;
}
bool arena_owns(const void* p) {
  const char* c = static_cast<const char*>(p);
  return c >= arena().base && c < arena().base + kArena;
}

struct Open {
  Open() { arena().open_up(); }
  ~Open() { arena().close_down(); }
  Open(const Open&) = delete;
  Open& operator=(const Open&) = delete;
};

struct sigaction g_old_segv;

void on_segv(int sig, siginfo_t* info, void* ctx) {
  Arena& a = arena();
  const char* addr = static_cast<const char*>(info->si_addr);
  if (addr >= a.base && addr < a.base + kArena) {
    char msg[160];
    const int n = std::snprintf(msg, sizeof msg,
                                "sim device: host code touched device memory at %p (arena "
                                "offset %zu) outside the device's ops and copies\n",
                                info->si_addr, static_cast<size_t>(addr - a.base));
    if (n > 0) (void)!write(2, msg, static_cast<size_t>(n));
    void* frames[64];
    const int k = backtrace(frames, 64);
    backtrace_symbols_fd(frames, k, 2);
    _exit(86);
  }
  // Not ours: the previous handler, or the default action.
  if (g_old_segv.sa_flags & SA_SIGINFO) {
    if (g_old_segv.sa_sigaction) return g_old_segv.sa_sigaction(sig, info, ctx);
  } else if (g_old_segv.sa_handler != SIG_DFL && g_old_segv.sa_handler != SIG_IGN) {
    return g_old_segv.sa_handler(sig);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

// A device op given host memory (a GPU kernel would fault or read garbage): a test failure
// with the op and argument named. Null pointers are allowed (optional arguments).
void on_device(const char* op, const char* arg, const void* p) {
  if (!p || arena_owns(p)) return;
  std::fprintf(stderr, "sim device: %s's argument %s (%p) is not device memory\n", op, arg, p);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
  _exit(87);
}
void on_operand(const char* op, const char* arg, sw::Operand x) {
  on_device(op, arg, x.f32);
  on_device(op, arg, x.lp);
}
void on_out(const char* op, const char* arg, sw::Out x) {
  on_device(op, arg, x.f32);
  on_device(op, arg, x.lp);
}
void on_grad(const char* op, const char* arg, sw::GradIn x) {
  on_device(op, arg, x.f32);
  on_device(op, arg, x.lp);
}
void on_norm_in(const char* op, sw::NormIn x) {
  on_device(op, "inp", x.a);
  on_device(op, "residual", x.b);
  on_device(op, "res", x.res);
}
// An Operand with both forms (a unit's weight and its 16-bit copy; a gradient a biased product
// takes) as the CUDA backend reads it: the 16-bit values alone (the bias gradient, a sum, the
// fp32 ones). The CPU's ops underneath would take the fp32 form; this way the
// engine's 16-bit copies are what a run on the sim computes with, so a stale or misplaced copy
// changes its numbers against the CPU's run.
sw::Operand as_device_reads(sw::Operand x) { return x.lp ? sw::Operand(x.lp) : x; }

// Host synchronisations with the device, per thread (sim_host_syncs): a synchronous copy, an op
// whose result the host reads, the host waiting for an asynchronous copy or for the stream. A
// wait the compute stream makes (SimStream::wait_event) is not one: on a GPU the host goes on;
// nor is a query of a copy's event.
thread_local uint64_t t_syncs = 0, t_unpinned = 0;
thread_local bool t_stream_wait = false;
void count_sync() {
  if (!t_stream_wait) ++t_syncs;
}

// The device's timed events (its compute stream's record_timed, a timed copy's span), stamped
// on the device's clock, which is not the host's (trace_now() + kDeviceClock, as a GPU counts
// from its own origin): only a tie to the host (the profiler's reference event) makes host
// times of them. As cudaEventElapsedTime, two timed events of this device time against each
// other whatever stream recorded them; an event made otherwise (untimed, the host's stamped
// one) throws sw::Error. A copy's events are stamped when its lane runs it (lazily, below), so
// timing one makes it run.
constexpr double kDeviceClock = 1.0e4;
double device_now() { return sw::trace_now() + kDeviceClock; }
struct Lane;
class SimTimedEvent final : public sw::Event {
 public:
  SimTimedEvent() : at_(device_now()) {}                   // the compute stream: now
  SimTimedEvent(Lane* lane, uint64_t seq) : lane_(lane), seq_(seq) {}  // a copy's: when it runs
  bool query() override;
  void synchronize() override { (void)query(); }
  double elapsed_since(sw::Event& ref) override {
    auto* r = dynamic_cast<SimTimedEvent*>(&ref);
    if (!r)
      sw::fail("sim", "an event timed against one that is not a timed event of this device");
    synchronize();
    r->synchronize();
    return at_ - r->at_;
  }
  void stamp() { at_ = device_now(); }  // by the lane running the copy (under its mutex)

 private:
  Lane* lane_ = nullptr;
  uint64_t seq_ = 0;
  double at_ = 0;
};

// The compute stream: the calling thread, as the CPU's, with its waits told apart from the
// host's own.
class SimStream final : public sw::Stream {
 public:
  const char* name() const override { return "sim"; }
  void wait_event(sw::Event& e) override {
    const bool was = t_stream_wait;
    t_stream_wait = true;
    try {
      e.synchronize();
    } catch (...) {
      t_stream_wait = was;
      throw;
    }
    t_stream_wait = was;
  }
  void synchronize() override { count_sync(); }
  // Its work has run when enqueued: a timed event of the device stamped now.
  std::shared_ptr<sw::Event> record_timed() override { return std::make_shared<SimTimedEvent>(); }
};
SimStream g_stream;

class SimOps final : public sw::Ops {
 public:
  explicit SimOps(sw::DType compute) : base_(&sw::ops_for(sw::Device::cpu(), compute)) {}
  sw::Device device() const override { return sw::Device::sim(0); }
  sw::Stream& stream() const override { return g_stream; }
  sw::DType compute() const override { return base_->compute(); }
  // Every op of sw::Ops, forwarded to the CPU's inside an Open, each pointer checked to be
  // device memory, each Operand read as CUDA reads it (as_device_reads).
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, sw::Operand A, int lda, sw::Operand B, int ldb, float beta, float* C, int ldc) const override {
    Open g;
    on_operand(__func__, "A", A);
    on_operand(__func__, "B", B);
    on_device(__func__, "C", C);
    base_->gemm(ta, tb, M, N, K, alpha, as_device_reads(A), lda, as_device_reads(B), ldb, beta, C,
                ldc);
  }
  void linear_forward(sw::Out out, sw::Operand inp, sw::Operand w, const float* b, const float* res, int N, int C, int OC) const override {
    Open g;
    on_out(__func__, "out", out);
    on_operand(__func__, "inp", inp);
    on_operand(__func__, "w", w);
    on_device(__func__, "b", b);
    on_device(__func__, "res", res);
    base_->linear_forward(out, as_device_reads(inp), as_device_reads(w), b, res, N, C, OC);
  }
  // A dout with both forms, as CUDA reads it: the products the 16-bit one (as_device_reads),
  // the bias gradient, a sum, the fp32 one (here, after the products).
  void linear_backward(sw::GradIn dinp, sw::GradOut dw, sw::GradOut db, sw::Operand dout, sw::Operand inp, sw::Operand w, int N, int C, int OC) const override {
    Open g;
    on_grad(__func__, "dinp", dinp);
    on_device(__func__, "dw", dw.p);
    on_device(__func__, "db", db.p);
    on_operand(__func__, "dout", dout);
    on_operand(__func__, "inp", inp);
    on_operand(__func__, "w", w);
    const bool both = dout.f32 && dout.lp;
    base_->linear_backward(dinp, dw, both ? nullptr : db, as_device_reads(dout),
                           as_device_reads(inp), as_device_reads(w), N, C, OC);
    if (db && both)
      base_->linear_backward(nullptr, nullptr, db, sw::Operand(dout.f32), inp, w, N, C, OC);
  }
  void embedding_forward(float* out, const int32_t* tokens, sw::Operand wte, const float* wpe, int B, int T, int C, int V) const override {
    Open g;
    on_device(__func__, "out", out);
    on_device(__func__, "tokens", tokens);
    on_operand(__func__, "wte", wte);
    on_device(__func__, "wpe", wpe);
    base_->embedding_forward(out, tokens, as_device_reads(wte), wpe, B, T, C, V);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) const override {
    Open g;
    on_device(__func__, "dwte", dwte);
    on_device(__func__, "dwpe", dwpe);
    on_device(__func__, "dout", dout);
    on_device(__func__, "tokens", tokens);
    base_->embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(sw::Out out, float* mean, float* rstd, sw::NormIn inp, const float* w, const float* b, int N, int C) const override {
    Open g;
    on_out(__func__, "out", out);
    on_device(__func__, "mean", mean);
    on_device(__func__, "rstd", rstd);
    on_norm_in(__func__, inp);
    on_device(__func__, "w", w);
    on_device(__func__, "b", b);
    base_->layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(sw::GradIn dinp, float* dw, float* db, const float* dout, const float* inp, const float* w, const float* mean, const float* rstd, int N, int C) const override {
    Open g;
    on_grad(__func__, "dinp", dinp);
    on_device(__func__, "dw", dw);
    on_device(__func__, "db", db);
    on_device(__func__, "dout", dout);
    on_device(__func__, "inp", inp);
    on_device(__func__, "w", w);
    on_device(__func__, "mean", mean);
    on_device(__func__, "rstd", rstd);
    base_->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(sw::Out out, float* rstd, sw::NormIn inp, const float* w, int N, int C, float eps) const override {
    Open g;
    on_out(__func__, "out", out);
    on_device(__func__, "rstd", rstd);
    on_norm_in(__func__, inp);
    on_device(__func__, "w", w);
    base_->rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(sw::GradIn dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd, int N, int C) const override {
    Open g;
    on_grad(__func__, "dinp", dinp);
    on_device(__func__, "dw", dw);
    on_device(__func__, "dout", dout);
    on_device(__func__, "inp", inp);
    on_device(__func__, "w", w);
    on_device(__func__, "rstd", rstd);
    base_->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void gelu_forward(sw::Out out, sw::Operand inp, size_t n) const override {
    Open g;
    on_out(__func__, "out", out);
    on_operand(__func__, "inp", inp);
    base_->gelu_forward(out, as_device_reads(inp), n);
  }
  void gelu_backward(sw::GradIn dinp, sw::Operand inp, sw::Operand dout, size_t n) const override {
    Open g;
    on_grad(__func__, "dinp", dinp);
    on_operand(__func__, "inp", inp);
    on_operand(__func__, "dout", dout);
    base_->gelu_backward(dinp, as_device_reads(inp), as_device_reads(dout), n);
  }
  void swiglu_forward(sw::Out out, sw::Operand gu, int N, int F) const override {
    Open g;
    on_out(__func__, "out", out);
    on_operand(__func__, "gu", gu);
    base_->swiglu_forward(out, as_device_reads(gu), N, F);
  }
  void swiglu_backward(sw::GradIn dgu, sw::Operand dout, sw::Operand gu, int N, int F) const override {
    Open g;
    on_grad(__func__, "dgu", dgu);
    on_operand(__func__, "dout", dout);
    on_operand(__func__, "gu", gu);
    base_->swiglu_backward(dgu, as_device_reads(dout), as_device_reads(gu), N, F);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    Open g;
    on_device(__func__, "out", out);
    on_device(__func__, "a", a);
    on_device(__func__, "b", b);
    base_->residual_forward(out, a, b, n);
  }
  void rope_forward(sw::Out out, sw::Operand qkv, int B, int T, int H, int KVH, int hd, const sw::RopeSpec& spec) const override {
    Open g;
    on_out(__func__, "out", out);
    on_operand(__func__, "qkv", qkv);
    base_->rope_forward(out, as_device_reads(qkv), B, T, H, KVH, hd, spec);
  }
  void rope_backward(sw::Out out, sw::Operand dqkv, int B, int T, int H, int KVH, int hd, const sw::RopeSpec& spec) const override {
    Open g;
    on_out(__func__, "out", out);
    on_operand(__func__, "dqkv", dqkv);
    base_->rope_backward(out, as_device_reads(dqkv), B, T, H, KVH, hd, spec);
  }
  void attention_forward(sw::Out out, float* lse, sw::Operand qkv, int B, int T, int H, int KVH, int hd) const override {
    Open g;
    on_out(__func__, "out", out);
    on_device(__func__, "lse", lse);
    on_operand(__func__, "qkv", qkv);
    base_->attention_forward(out, lse, as_device_reads(qkv), B, T, H, KVH, hd);
  }
  void attention_backward(sw::GradIn dqkv, sw::Operand dout, sw::Operand qkv, sw::Operand out, const float* lse, int B, int T, int H, int KVH, int hd) const override {
    Open g;
    on_grad(__func__, "dqkv", dqkv);
    on_operand(__func__, "dout", dout);
    on_operand(__func__, "qkv", qkv);
    on_operand(__func__, "out", out);
    on_device(__func__, "lse", lse);
    base_->attention_backward(dqkv, as_device_reads(dout), as_device_reads(qkv),
                              as_device_reads(out), lse, B, T, H, KVH, hd);
  }
  double lmhead_xent(float* loss, float* dx, float* dw, const float* x, sw::Operand w, const int32_t* targets, int N, int C, int V, float grad_scale) const override {
    Open g;
    xent_args(__func__, loss, dx, dw, x, w, targets);
    count_sync();  // the total is read on the host
    return base_->lmhead_xent(loss, dx, dw, x, as_device_reads(w), targets, N, C, V, grad_scale);
  }
  void lmhead_xent_into(double* total, float* loss, float* dx, float* dw, const float* x, sw::Operand w, const int32_t* targets, int N, int C, int V, float grad_scale) const override {
    Open g;
    on_device(__func__, "total", total);
    xent_args(__func__, loss, dx, dw, x, w, targets);
    base_->lmhead_xent_into(total, loss, dx, dw, x, as_device_reads(w), targets, N, C, V,
                            grad_scale);
  }
  // Tensor parallelism: every pointer device memory, each Operand read as CUDA reads it.
  void vocab_embedding_forward(float* out, const int32_t* tokens, sw::Operand wte, int64_t v_lo, int N, int C, int V) const override {
    Open g;
    on_device(__func__, "out", out);
    on_device(__func__, "tokens", tokens);
    on_operand(__func__, "wte", wte);
    base_->vocab_embedding_forward(out, tokens, as_device_reads(wte), v_lo, N, C, V);
  }
  void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t v_lo, int N, int C, int V) const override {
    Open g;
    on_device(__func__, "dwte", dwte);
    on_device(__func__, "dout", dout);
    on_device(__func__, "tokens", tokens);
    base_->vocab_embedding_backward(dwte, dout, tokens, v_lo, N, C, V);
  }
  void position_forward(float* out, const float* wpe, int64_t row_lo, int rows, int T, int C) const override {
    Open g;
    on_device(__func__, "out", out);
    on_device(__func__, "wpe", wpe);
    base_->position_forward(out, wpe, row_lo, rows, T, C);
  }
  void position_backward(float* dwpe, const float* dout, int64_t row_lo, int rows, int T, int C) const override {
    Open g;
    on_device(__func__, "dwpe", dwpe);
    on_device(__func__, "dout", dout);
    base_->position_backward(dwpe, dout, row_lo, rows, T, C);
  }
  void xent_shard_stats(float* stats, const float* h, sw::Operand w, const int32_t* targets, int64_t v_lo, int N, int C, int V) const override {
    Open g;
    on_device(__func__, "stats", stats);
    on_device(__func__, "h", h);
    on_operand(__func__, "w", w);
    on_device(__func__, "targets", targets);
    base_->xent_shard_stats(stats, h, as_device_reads(w), targets, v_lo, N, C, V);
  }
  void xent_shard_combine(double* total, float* lse, float* loss, const float* stats, const int32_t* targets, int t, int N) const override {
    Open g;
    on_device(__func__, "total", total);
    on_device(__func__, "lse", lse);
    on_device(__func__, "loss", loss);
    on_device(__func__, "stats", stats);
    on_device(__func__, "targets", targets);
    base_->xent_shard_combine(total, lse, loss, stats, targets, t, N);
  }
  void xent_shard_backward(float* dh, sw::GradOut dw, const float* h, sw::Operand w, const float* lse, const int32_t* targets, int64_t v_lo, int N, int C, int V, float grad_scale) const override {
    Open g;
    on_device(__func__, "dh", dh);
    on_device(__func__, "dw", dw.p);
    on_device(__func__, "h", h);
    on_operand(__func__, "w", w);
    on_device(__func__, "lse", lse);
    on_device(__func__, "targets", targets);
    base_->xent_shard_backward(dh, dw, h, as_device_reads(w), lse, targets, v_lo, N, C, V,
                               grad_scale);
  }
  static void xent_args(const char* op, const float* loss, const float* dx, const float* dw,
                        const float* x, sw::Operand w, const int32_t* targets) {
    on_device(op, "loss", loss);
    on_device(op, "dx", dx);
    on_device(op, "dw", dw);
    on_device(op, "x", x);
    on_operand(op, "w", w);
    on_device(op, "targets", targets);
  }
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps, float wd, int step, float grad_mult, const sw::AdamWCopies& copies = {}) const override {
    Open g;
    on_device(__func__, "param", param);
    on_device(__func__, "grad", grad);
    on_device(__func__, "m", m);
    on_device(__func__, "v", v);
    on_device(__func__, "param32", copies.param32);
    on_device(__func__, "param16", copies.param16);
    base_->adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult, copies);
  }
  void sgd(float* param, const float* grad, float* m, size_t n, float lr, float momentum, float dampening, bool nesterov, float wd, float scale, int step, float grad_mult) const override {
    Open g;
    on_device(__func__, "param", param);
    on_device(__func__, "grad", grad);
    if (momentum != 0.f) on_device(__func__, "m", m);
    base_->sgd(param, grad, m, n, lr, momentum, dampening, nesterov, wd, scale, step, grad_mult);
  }
  void lamb_prepare(const float* param, float* grad, float* m, float* v, size_t n, float beta1, float beta2, float eps, float wd, float grad_mult) const override {
    Open g;
    on_device(__func__, "param", param);
    on_device(__func__, "grad", grad);
    on_device(__func__, "m", m);
    on_device(__func__, "v", v);
    base_->lamb_prepare(param, grad, m, v, n, beta1, beta2, eps, wd, grad_mult);
  }
  void add_scaled(float* y, float a, const float* x, size_t n) const override {
    Open g;
    on_device(__func__, "y", y);
    on_device(__func__, "x", x);
    base_->add_scaled(y, a, x, n);
  }
  // As CUDA, a one-rank unit's gradients rounded by their readers (the CPU's: a rounded
  // copy), so that the engine's tests run that path.
  bool rounds_grads_on_read(sw::DType) const override { return true; }
  bool prefers_lp_operands() const override { return true; }  // as CUDA (as_device_reads)
  bool fuses_product_residual() const override { return true; }  // as CUDA, to test that path
  // Rounded sums through copies in this device's scratch (Ops::sums_rounded_through_copies:
  // this device's round_copy, then its sums).
  void sums_of_squares(const float* const* xs, const size_t* ns, int k, double* out, sw::SumsTo to, sw::DType dt = sw::DType::F32) const override {
    if (dt != sw::DType::F32) return sums_rounded_through_copies(dt, xs, ns, k, out);
    Open g;
    for (int i = 0; i < k; ++i) on_device(__func__, "xs[i]", xs[i]);
    if (to == sw::SumsTo::Device)
      on_device(__func__, "out", out);
    else
      count_sync();  // all k results in one read
    base_->sums_of_squares(xs, ns, k, out, to);
  }
  void scale(float* x, float a, size_t n) const override {
    Open g;
    on_device(__func__, "x", x);
    base_->scale(x, a, n);
  }
  void fill(float* x, float v, size_t n) const override {
    Open g;
    on_device(__func__, "x", x);
    base_->fill(x, v, n);
  }
  void add_inplace(float* y, const float* x, size_t n) const override {
    Open g;
    on_device(__func__, "y", y);
    on_device(__func__, "x", x);
    base_->add_inplace(y, x, n);
  }
  void copy(float* dst, const float* src, size_t n) const override {
    Open g;
    on_device(__func__, "dst", dst);
    on_device(__func__, "src", src);
    base_->copy(dst, src, n);
  }
  void narrow(sw::DType dt, const float* src, void* dst, size_t n) const override {
    Open g;
    on_device(__func__, "src", src);
    on_device(__func__, "dst", dst);
    base_->narrow(dt, src, dst, n);
  }
  void widen(sw::DType dt, const void* src, float* dst, size_t n) const override {
    Open g;
    on_device(__func__, "src", src);
    on_device(__func__, "dst", dst);
    base_->widen(dt, src, dst, n);
  }
  void add_widened(sw::DType dt, const void* src, float* dst, size_t n) const override {
    Open g;
    on_device(__func__, "src", src);
    on_device(__func__, "dst", dst);
    base_->add_widened(dt, src, dst, n);
  }
  void round_to(sw::DType dt, float* x, size_t n) const override {
    Open g;
    on_device(__func__, "x", x);
    base_->round_to(dt, x, n);
  }

 private:
  const sw::Ops* base_;
};

void* sim_alloc(size_t bytes, int) { return arena().alloc(bytes); }
void sim_free(void* p, int) { arena().release(p); }
// A copy whose pointers are not on the sides its direction says (a host pointer passed as
// device memory: cudaMemcpy would fail or copy garbage) exits with 88.
void check_sides(void* dst, const void* src, size_t bytes, sw::CopyDir dir) {
  const bool src_dev = dir != sw::CopyDir::HostToDevice, dst_dev = dir != sw::CopyDir::DeviceToHost;
  if (arena_owns(src) != src_dev || arena_owns(dst) != dst_dev) {
    std::fprintf(stderr, "sim device: a copy of %zu bytes from %p (%s) to %p (%s) has a pointer "
                 "on the wrong side\n", bytes, src, src_dev ? "device" : "host", dst,
                 dst_dev ? "device" : "host");
    void* frames[64];
    backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
    _exit(88);
  }
}
void sim_copy(void* dst, const void* src, size_t bytes, sw::CopyDir dir, int) {
  check_sides(dst, src, bytes, dir);
  count_sync();  // it waits for the stream's work and for itself
  Open g;
  std::memcpy(dst, src, bytes);
}

// Asynchronous copies (copy_async): one lane per direction, whose copies run only when somebody
// waits for or queries one of them, and then in issue order up to it: the latest a copy stream
// could run them. So a consumer that reads dst without waiting, or code that writes src or
// reuses dst (or frees either) before the wait, sees other bytes than the CPU run and the
// comparison with it fails. `after` is waited for at issue (the arithmetic runs on the calling
// thread, so the compute stream's work is always done).
struct Lane {
  struct Job {
    void* dst;
    const void* src;
    size_t bytes;
    std::shared_ptr<SimTimedEvent> begin, end;  // issued while sw::stream_timing()
  };
  std::mutex mu;
  std::deque<Job> jobs;
  uint64_t issued = 0, done = 0;
  void run_through(uint64_t seq) {
    std::lock_guard<std::mutex> l(mu);
    while (done < seq) {
      const Job j = jobs.front();
      jobs.pop_front();
      if (j.begin) j.begin->stamp();
      {
        Open g;
        std::memcpy(j.dst, j.src, j.bytes);
      }
      if (j.end) j.end->stamp();
      ++done;
    }
  }
};
Lane g_lanes[3];  // indexed by CopyDir

bool SimTimedEvent::query() {
  if (lane_) lane_->run_through(seq_);  // (a query runs the copy, as SimCopyEvent's)
  return true;
}

class SimCopyEvent final : public sw::Event {
 public:
  SimCopyEvent(Lane* lane, uint64_t seq, std::shared_ptr<SimTimedEvent> begin = nullptr,
               std::shared_ptr<SimTimedEvent> end = nullptr, const char* stream = nullptr)
      : lane_(lane), seq_(seq), begin_(std::move(begin)), end_(std::move(end)), stream_(stream) {}
  TimedSpan timed_span() override {
    if (!begin_) return {};
    return {begin_.get(), end_.get(), stream_};
  }
  bool query() override {
    // The copy is made to run (the latest a copy stream could have run it); a GPU's query
    // never blocks, so it is no synchronisation.
    lane_->run_through(seq_);
    return true;
  }
  void synchronize() override {
    count_sync();
    lane_->run_through(seq_);
  }

 private:
  Lane* lane_;
  uint64_t seq_;
  std::shared_ptr<SimTimedEvent> begin_, end_;
  const char* stream_;
};

// Host pinning (core/alloc.h HostPinning), as a GPU backend registers it: nothing is locked,
// the spans are recorded, so that a copy can tell pinned host memory from pageable.
std::mutex g_pin_mu;
std::map<const char*, size_t> g_pinned;  // start -> bytes
bool sim_pin(void* p, size_t n) {
  std::lock_guard<std::mutex> l(g_pin_mu);
  g_pinned[static_cast<const char*>(p)] = n;
  return true;
}
void sim_unpin(void* p, size_t) {
  std::lock_guard<std::mutex> l(g_pin_mu);
  g_pinned.erase(static_cast<const char*>(p));
}
bool pinned_span(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> l(g_pin_mu);
  auto it = g_pinned.upper_bound(c);
  if (it == g_pinned.begin()) return false;
  --it;
  return c + n <= it->first + it->second;
}

std::shared_ptr<sw::Event> sim_copy_async(void* dst, const void* src, size_t bytes,
                                          sw::CopyDir dir, int, sw::Event* after) {
  check_sides(dst, src, bytes, dir);
  if (after) after->synchronize();
  Lane& lane = g_lanes[static_cast<int>(dir)];
  std::shared_ptr<sw::Event> e;
  {
    std::lock_guard<std::mutex> l(lane.mu);
    const uint64_t seq = ++lane.issued;
    std::shared_ptr<SimTimedEvent> b, en;
    if (sw::stream_timing()) {  // the profiler's span: stamped when the lane runs the copy
      b = std::make_shared<SimTimedEvent>(&lane, seq);
      en = std::make_shared<SimTimedEvent>(&lane, seq);
    }
    lane.jobs.push_back({dst, src, bytes, b, en});
    static const char* const names[] = {"sim copy h2d", "sim copy d2h", "sim copy d2d"};
    e = std::make_shared<SimCopyEvent>(&lane, seq, b, en, names[static_cast<int>(dir)]);
  }
  // Pageable host memory: cudaMemcpyAsync waits for the stream and returns once the copy is
  // done (staged), so it is a synchronisation, and the copy runs now.
  const void* host = dir == sw::CopyDir::HostToDevice ? src : dst;
  if (dir != sw::CopyDir::DeviceToDevice && !pinned_span(host, bytes)) {
    ++t_unpinned;
    e->synchronize();
  }
  return e;
}

// Test frameworks install their own SIGSEGV handler per test (Catch2 does); ours goes back on
// top at every allocation and passes faults outside the arena on to the one it displaced.
void arm() {
  struct sigaction cur {};
  sigaction(SIGSEGV, nullptr, &cur);
  if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_segv) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_old_segv);
}

struct Registrar {
  Registrar() {
    static const SimOps f32(sw::DType::F32), bf16(sw::DType::BF16), f16(sw::DType::F16);
    sw::register_ops(sw::DeviceKind::Sim, sw::DType::F32, &f32);
    sw::register_ops(sw::DeviceKind::Sim, sw::DType::BF16, &bf16);
    sw::register_ops(sw::DeviceKind::Sim, sw::DType::F16, &f16);
    sw::DeviceAllocator a;
    a.alloc = sim_alloc;
    a.free = sim_free;
    a.copy = sim_copy;
    a.copy_async = sim_copy_async;
    sw::register_device_allocator(sw::DeviceKind::Sim, a);
    sw::register_host_pinning({sim_pin, sim_unpin});
    arm();
  }
} registrar;

}  // namespace

size_t sim_device_bytes_in_use() {
  std::lock_guard<std::mutex> l(arena().mu);
  return arena().in_use;
}
uint64_t sim_device_opens() {
  std::lock_guard<std::mutex> l(arena().mu);
  return arena().opens;
}
bool sim_device_open() {
  std::lock_guard<std::mutex> l(arena().mu);
  return arena().open > 0;
}
bool sim_device_owns(const void* p) { return arena_owns(p); }
namespace {
uint64_t lanes_sum(uint64_t Lane::*count) {
  uint64_t n = 0;
  for (Lane& l : g_lanes) {
    std::lock_guard<std::mutex> g(l.mu);
    n += l.*count;
  }
  return n;
}
}  // namespace
uint64_t sim_host_syncs() { return t_syncs; }
uint64_t sim_unpinned_copies() { return t_unpinned; }
uint64_t sim_copies_issued() { return lanes_sum(&Lane::issued); }
uint64_t sim_copies_done() { return lanes_sum(&Lane::done); }

}  // namespace swtest
