#include "sharding/deferred_wgrad.h"

#include <cstring>
#include <utility>

#include "core/error.h"
#include "kernels/forwarding_ops.h"

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

// Every op forwards to the inner Ops (kernels/forwarding_ops.h); linear_backward with a
// parameter gradient asked for is split while deferring.
class DeferredWeightGrads::Decorator final : public ForwardingOps {
 public:
  Decorator(const Ops& in, DeferredWeightGrads& owner) : ForwardingOps(in), owner_(owner) {}
  void linear_backward(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp, Operand w,
                       int N, int C, int OC) const override {
    if (owner_.deferring_ && (dw || db))
      return owner_.record(dinp, dw, db, dout, inp, w, N, C, OC);
    in_.linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  }

 private:
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
