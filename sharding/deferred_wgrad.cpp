#include "sharding/deferred_wgrad.h"

#include <cstring>
#include <utility>

#include "core/error.h"

namespace sw {

namespace {

size_t extent(int rows, int cols) {
  return rows > 0 && cols > 0 ? static_cast<size_t>(rows) * static_cast<size_t>(cols) : 0;
}

// A copy of n fp32 values on `ops`' device, on its stream (empty where n is 0 or src null).
Buffer copy32(const Ops& ops, const float* src, size_t n) {
  if (!src || n == 0) return {};
  Buffer b(n * sizeof(float), Mem::Activations, ops.device());
  ops.copy(b.f32(), src, n);
  return b;
}

// A copy of n 16-bit values: as n / 2 floats through ops.copy (on the stream; a copy moves
// bits, CPU memcpy / CUDA cudaMemcpyAsync) where src is 4-byte aligned and n even, else with
// copy_bytes (ordered after the stream's work, and waited for: a synchronisation on a device).
Buffer copy16(const Ops& ops, const uint16_t* src, size_t n) {
  if (!src || n == 0) return {};
  Buffer b(n * sizeof(uint16_t), Mem::Activations, ops.device());
  if (reinterpret_cast<uintptr_t>(src) % alignof(float) == 0 && n % 2 == 0)
    ops.copy(b.f32(), reinterpret_cast<const float*>(src), n / 2);
  else
    copy_bytes(b.data(), ops.device(), src, ops.device(), n * sizeof(uint16_t));
  return b;
}

Operand operand_of(const Buffer& f32, const Buffer& lp) {
  return {f32.empty() ? nullptr : f32.f32(), lp.empty() ? nullptr : lp.as<uint16_t>()};
}

}  // namespace

int64_t DeferredWeightGrads::Job::bytes() const {
  return static_cast<int64_t>(dout32.bytes() + dout16.bytes() + inp32.bytes() + inp16.bytes());
}

// Every op forwards to the inner Ops; linear_backward with a parameter gradient asked for is
// split while deferring.
class DeferredWeightGrads::Decorator final : public Ops {
 public:
  Decorator(const Ops& in, DeferredWeightGrads& owner) : in_(in), owner_(owner) {}

  Device device() const override { return in_.device(); }
  Stream& stream() const override { return in_.stream(); }
  DType compute() const override { return in_.compute(); }
  bool fuses_product_residual() const override { return in_.fuses_product_residual(); }
  bool rounds_grads_on_read() const override { return in_.rounds_grads_on_read(); }
  bool prefers_lp_operands() const override { return in_.prefers_lp_operands(); }

  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, Operand A, int lda, Operand B,
            int ldb, float beta, float* C, int ldc) const override {
    in_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void linear_forward(Out out, Operand inp, Operand w, const float* b, const float* res, int N,
                      int C, int OC) const override {
    in_.linear_forward(out, inp, w, b, res, N, C, OC);
  }
  void linear_backward(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp, Operand w,
                       int N, int C, int OC) const override {
    if (owner_.deferring_ && (dw || db))
      return owner_.record(dinp, dw, db, dout, inp, w, N, C, OC);
    in_.linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  }
  void embedding_forward(float* out, const int32_t* tokens, Operand wte, const float* wpe, int B,
                         int T, int C, int V) const override {
    in_.embedding_forward(out, tokens, wte, wpe, B, T, C, V);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C) const override {
    in_.embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(Out out, float* mean, float* rstd, NormIn inp, const float* w,
                         const float* b, int N, int C) const override {
    in_.layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(GradIn dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const override {
    in_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(Out out, float* rstd, NormIn inp, const float* w, int N, int C,
                       float eps) const override {
    in_.rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(GradIn dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int N, int C) const override {
    in_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void gelu_forward(Out out, Operand inp, size_t n) const override { in_.gelu_forward(out, inp, n); }
  void gelu_backward(GradIn dinp, Operand inp, Operand dout, size_t n) const override {
    in_.gelu_backward(dinp, inp, dout, n);
  }
  void swiglu_forward(Out out, Operand gu, int N, int F) const override {
    in_.swiglu_forward(out, gu, N, F);
  }
  void swiglu_backward(GradIn dgu, Operand dout, Operand gu, int N, int F) const override {
    in_.swiglu_backward(dgu, dout, gu, N, F);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    in_.residual_forward(out, a, b, n);
  }
  void rope_forward(Out out, Operand qkv, int B, int T, int H, int KVH, int hd,
                    const RopeSpec& rope) const override {
    in_.rope_forward(out, qkv, B, T, H, KVH, hd, rope);
  }
  void rope_backward(Out out, Operand dqkv, int B, int T, int H, int KVH, int hd,
                     const RopeSpec& rope) const override {
    in_.rope_backward(out, dqkv, B, T, H, KVH, hd, rope);
  }
  void attention_forward(Out out, float* lse, Operand qkv, int B, int T, int H, int KVH,
                         int hd) const override {
    in_.attention_forward(out, lse, qkv, B, T, H, KVH, hd);
  }
  void attention_backward(GradIn dqkv, Operand dout, Operand qkv, Operand out, const float* lse,
                          int B, int T, int H, int KVH, int hd) const override {
    in_.attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
  }
  double lmhead_xent(float* loss, float* dx, float* dw, const float* x, Operand w,
                     const int32_t* targets, int N, int C, int V,
                     float grad_scale) const override {
    return in_.lmhead_xent(loss, dx, dw, x, w, targets, N, C, V, grad_scale);
  }
  void lmhead_xent_into(double* total, float* loss, float* dx, float* dw, const float* x,
                        Operand w, const int32_t* targets, int N, int C, int V,
                        float grad_scale) const override {
    in_.lmhead_xent_into(total, loss, dx, dw, x, w, targets, N, C, V, grad_scale);
  }
  void vocab_embedding_forward(float* out, const int32_t* tokens, Operand wte, int64_t v_lo,
                               int N, int C, int V) const override {
    in_.vocab_embedding_forward(out, tokens, wte, v_lo, N, C, V);
  }
  void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                                int64_t v_lo, int N, int C, int V) const override {
    in_.vocab_embedding_backward(dwte, dout, tokens, v_lo, N, C, V);
  }
  void position_forward(float* out, const float* wpe, int64_t row_lo, int rows, int T,
                        int C) const override {
    in_.position_forward(out, wpe, row_lo, rows, T, C);
  }
  void position_backward(float* dwpe, const float* dout, int64_t row_lo, int rows, int T,
                         int C) const override {
    in_.position_backward(dwpe, dout, row_lo, rows, T, C);
  }
  void xent_shard_stats(float* stats, const float* h, Operand w, const int32_t* targets,
                        int64_t v_lo, int N, int C, int V) const override {
    in_.xent_shard_stats(stats, h, w, targets, v_lo, N, C, V);
  }
  void xent_shard_combine(double* total, float* lse, float* loss, const float* stats,
                          const int32_t* targets, int t, int N) const override {
    in_.xent_shard_combine(total, lse, loss, stats, targets, t, N);
  }
  void xent_shard_backward(float* dh, GradOut dw, const float* h, Operand w, const float* lse,
                           const int32_t* targets, int64_t v_lo, int N, int C, int V,
                           float grad_scale) const override {
    in_.xent_shard_backward(dh, dw, h, w, lse, targets, v_lo, N, C, V, grad_scale);
  }
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr,
             float beta1, float beta2, float eps, float wd, int step, float grad_mult,
             const AdamWCopies& copies) const override {
    in_.adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult, copies);
  }
  void sgd(float* param, const float* grad, float* m, size_t n, float lr, float momentum,
           float dampening, bool nesterov, float wd, float scale, int step,
           float grad_mult) const override {
    in_.sgd(param, grad, m, n, lr, momentum, dampening, nesterov, wd, scale, step, grad_mult);
  }
  void lamb_prepare(const float* param, float* grad, float* m, float* v, size_t n, float beta1,
                    float beta2, float eps, float wd, float grad_mult) const override {
    in_.lamb_prepare(param, grad, m, v, n, beta1, beta2, eps, wd, grad_mult);
  }
  void add_scaled(float* y, float a, const float* x, size_t n) const override {
    in_.add_scaled(y, a, x, n);
  }
  void sums_of_squares(const float* const* xs, const size_t* ns, int k, double* out, SumsTo to,
                       DType dt) const override {
    in_.sums_of_squares(xs, ns, k, out, to, dt);
  }
  void scale(float* x, float a, size_t n) const override { in_.scale(x, a, n); }
  void fill(float* x, float v, size_t n) const override { in_.fill(x, v, n); }
  void add_inplace(float* y, const float* x, size_t n) const override { in_.add_inplace(y, x, n); }
  void copy(float* dst, const float* src, size_t n) const override { in_.copy(dst, src, n); }
  void narrow(DType dt, const float* src, void* dst, size_t n) const override {
    in_.narrow(dt, src, dst, n);
  }
  void widen(DType dt, const void* src, float* dst, size_t n) const override {
    in_.widen(dt, src, dst, n);
  }
  void add_widened(DType dt, const void* src, float* dst, size_t n) const override {
    in_.add_widened(dt, src, dst, n);
  }
  void round_to(DType dt, float* x, size_t n) const override { in_.round_to(dt, x, n); }
  void round_copy(DType dt, float* dst, const float* src, size_t n,
                  uint16_t* dst16) const override {
    in_.round_copy(dt, dst, src, n, dst16);
  }

 private:
  const Ops& in_;
  DeferredWeightGrads& owner_;
};

DeferredWeightGrads::DeferredWeightGrads(const Ops& inner)
    : inner_(inner), deco_(std::make_unique<Decorator>(inner, *this)) {}

DeferredWeightGrads::~DeferredWeightGrads() = default;

const Ops& DeferredWeightGrads::ops() const { return *deco_; }

void DeferredWeightGrads::begin(uint64_t key) {
  SW_CHECK(!deferring_, "DeferredWeightGrads::begin while already deferring (end() first)");
  key_ = key;
  deferring_ = true;
}

void DeferredWeightGrads::end() { deferring_ = false; }

// I now: the inner call with the parameter gradients left out (none where dinp is null too).
// W later: copies of dout and inp in each form given, on the stream after what produced them.
void DeferredWeightGrads::record(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp,
                                 Operand w, int N, int C, int OC) {
  if (dinp) inner_.linear_backward(dinp, nullptr, nullptr, dout, inp, w, N, C, OC);
  Job j;
  const size_t nd = extent(N, OC), ni = extent(N, C);
  j.dout32 = copy32(inner_, dout.f32, nd);
  j.dout16 = copy16(inner_, dout.lp, nd);
  if (dw) {  // inp is read for dw only
    j.inp32 = copy32(inner_, inp.f32, ni);
    j.inp16 = copy16(inner_, inp.lp, ni);
  }
  j.dw = dw;
  j.db = db;
  j.N = N, j.C = C, j.OC = OC;
  std::lock_guard<std::mutex> lock(mu_);
  jobs_[key_].push_back(std::move(j));
}

void DeferredWeightGrads::run(uint64_t key) {
  std::vector<Job> list;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    list = std::move(it->second);
    jobs_.erase(it);
  }
  // w: neither backend reads it without dinp (the parameters may be freed by now).
  for (Job& j : list) {
    inner_.linear_backward(nullptr, j.dw, j.db, operand_of(j.dout32, j.dout16),
                           operand_of(j.inp32, j.inp16), nullptr, j.N, j.C, j.OC);
    j = Job{};  // the copies back to the pool (stream-ordered on a device)
  }
}

void DeferredWeightGrads::clear() {
  std::map<uint64_t, std::vector<Job>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone.swap(jobs_);
  }
  deferring_ = false;
}

int64_t DeferredWeightGrads::pending_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [k, list] : jobs_)
    for (const Job& j : list) n += j.bytes();
  return n;
}

int64_t DeferredWeightGrads::pending_bytes(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(key);
  int64_t n = 0;
  if (it != jobs_.end())
    for (const Job& j : it->second) n += j.bytes();
  return n;
}

size_t DeferredWeightGrads::pending_jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [k, list] : jobs_) n += list.size();
  return n;
}

}  // namespace sw
