// The CUDA Ops (kernels/ops.h): GEMMs through cuBLAS, everything else through the kernels of
// elementwise.cu, norm.cu and attention.cu. Registered with kernels/registry.cpp at program
// start, like the device allocator in cuda_runtime.cu, once per compute precision (F32, BF16,
// F16: ops_for(device, compute)).
//
// Precision, as the CPU backend defines it (kernels/ops.h): every pointer is fp32 in memory,
// except the 16-bit forms of Operands, Outs and GradIns (compute()'s values, as narrow
// writes them).
// F32 computes everything in fp32 (cuBLAS with fp32 compute and the default math mode: no
// TF32). BF16 / F16 round the operands of the matrix products (gemm, linear_*, attention_*,
// lmhead_xent) to bf16 / fp16 with the host's bit formulas (cuda::narrow: round to nearest
// even, fp16 overflow to +-inf) and accumulate in fp32: cuBLAS products take 16-bit copies of
// their operands in device scratch (cublasGemmEx, CUDA_R_16BF / CUDA_R_16F A and B, fp32 C,
// CUBLAS_COMPUTE_32F), attention rounds inside its kernels (attention.cu). Every other op is the
// fp32 op, bit for bit (the same code). Products of rounded operands are exact in fp32, so
// CUDA and CPU low precision differ by fp32 summation order, plus the rare 16-bit rounding flip
// of a value the two compute in fp32 before rounding it (attention's P and dS, the LM head's
// dlogits).
//
// The CUDA Ops serve this process's device, cuda_current_device() (cuda_runtime.h: local rank
// modulo the GPUs visible, or SHARDWISE_CUDA_DEVICE), chosen on first use: device() asks for it
// (its only driver call, cudaGetDeviceCount, answers 0 GPUs, so cuda:0, on a machine without one)
// and nothing runs at registration. Its CUDA state (a compute stream, a cuBLAS handle bound to it) is
// created on first use, so a build with this backend starts and runs its CPU paths on a machine
// without a GPU. Every op enqueues on that stream and returns without synchronising, except
// sum_squares and lmhead_xent, whose results the host reads. The stream is created blocking
// (not cudaStreamNonBlocking), so plain cudaMemcpy calls (cuda_copy_to_host) on the legacy
// default stream are ordered after the ops.
//
// Weights are converted on every call (they change every step; nothing is cached), which
// costs a read of 4 and a write of 2 bytes per operand element before each product: for
// GPT-2 124M about three passes over the weights per step (~2 GB of traffic, around a
// millisecond on an H100-class GPU; estimated, not measured). Keeping bf16 weights from the
// all-gather (param_dtype) would remove it; that is the sharding layer's to hand over.
//
// The three CudaOps share one CudaDevice: one compute stream, one cuBLAS handle bound to it
// (cuBLAS is bit-reproducible only with one active stream per handle), one set of scratch
// buffers, for the one device of the process (above).
//
// Scratch memory (norm partials, the LM head's logits chunk, reduction partials, attention's D,
// the 16-bit operand copies) comes from grow-only device buffers kept between calls, tracked as
// Mem::Workspace. Use the CUDA Ops from one host thread at a time.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/attention_mm.h"
#include "kernels/cuda/attention_path.h"
#include "kernels/cuda/lazy_load.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/tp_kernels.cuh"
#include "kernels/cuda/workspace.h"
#include "kernels/ops.h"

namespace sw {

namespace cuda {

void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    fail("cuda", std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " +
                     cudaGetErrorString(e));
}

void check(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail("cuda", std::string(what) + " failed at " + file + ":" + std::to_string(line) +
                     ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

}  // namespace cuda

namespace {

// cuBLAS / cuBLASLt, loaded on first use (lazy_load.h).
inline const cuda::CublasApi& cublas() { return cuda::cublas_api(); }

using cuda::check;

// The compute stream as core/stream.h sees it. wait_event: an event with a native handle (a
// cudaEvent_t: a CudaEvent, a NCCL group's Work) becomes cudaStreamWaitEvent, so later work on
// this stream waits on the device and the host does not block; any other event (a CPU
// communication thread's Work, an io_stream completion) is waited for on the host.
class CudaStream final : public Stream {
 public:
  const char* name() const override { return "cuda compute"; }
  void wait_event(Event& e) override {
    if (void* h = e.native_handle())
      SW_CUDA_CHECK(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(h), 0));
    else
      e.synchronize();
  }
  void synchronize() override {
    if (stream) SW_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  void* native_handle() const override { return stream; }
  // A CudaEvent recorded on the stream (nothing enqueued yet: a completed event).
  std::shared_ptr<Event> record() override {
    if (!stream) return completed_event();
    return cuda_record_event(stream, device);
  }
  // A timed CudaEvent (the profiler's device timeline); none enqueued yet: the host's clock.
  std::shared_ptr<Event> record_timed() override {
    if (!stream) return Stream::record_timed();
    auto e = std::make_shared<CudaEvent>(device, true);
    e->record(stream);
    return e;
  }
  cudaStream_t stream = nullptr;
  int device = 0;
};

// Grow-only device scratch, one buffer per use so that one op's pieces never overlap.
// Lowp0..2: the 16-bit operand copies of one low-precision product call.
// AttnPack..AttnAcc: the cuBLAS attention path (packed 16-bit heads, a chunk's scores, its
// 16-bit probabilities, the accumulators).
enum class Slot {
  Norm, Logits, Rows, Reduce, Reduce2, Attn, Convert, Lowp0, Lowp1, Lowp2,
  AttnPack, AttnS, AttnP, AttnAcc, Rope, Count
};
static_assert(static_cast<int>(Slot::AttnS) - static_cast<int>(Slot::AttnPack) == attn_mm::kS &&
                  static_cast<int>(Slot::AttnP) - static_cast<int>(Slot::AttnPack) == attn_mm::kP &&
                  static_cast<int>(Slot::AttnAcc) - static_cast<int>(Slot::AttnPack) == attn_mm::kAcc,
              "attn_mm's slots map onto AttnPack..AttnAcc in order");

// The device state the CudaOps of every precision share: stream, cuBLAS handle, scratch.
class CudaDevice {
 public:
  CudaDevice() = default;

  // Creates the stream and the cuBLAS handle on first use; makes dev_ current; returns the
  // stream.
  cudaStream_t begin() const {
    std::call_once(once_, [this] {
      dev_ = cuda_current_device();
      SW_CUDA_CHECK(cudaSetDevice(dev_));
      cudaStream_t st = nullptr;
      SW_CUDA_CHECK(cudaStreamCreate(&st));
      SW_CUDA_CHECK(cublas().Create(&blas_));
      SW_CUDA_CHECK(cublas().SetStream(blas_, st));
      // fp32 products in fp32 (no TF32 tensor-op rounding).
      // A product written 16-bit (gemm16_out16) sums in fp32 to the end: no split-K
      // reduction in the output's precision, so it is rounded once, as kernels/ops.h says
      // (no effect on fp32 outputs).
      SW_CUDA_CHECK(cublas().SetMathMode(
          blas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                           CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
      // cuBLAS's workspace, from the tracked allocator: kCublasWorkspace, what NVIDIA's cuBLAS
      // guide recommends for Hopper and PyTorch sets there (without one, cuBLAS keeps a
      // smaller default of its own, outside the tracker). bench_cuda_gemm times both.
      blas_ws_ = Buffer(cuda::kCublasWorkspace, Mem::Workspace, Device::cuda(dev_));
      SW_CUDA_CHECK(cublas().SetWorkspace(blas_, blas_ws_.data(), cuda::kCublasWorkspace));
      // cuBLASLt (the products with a bias epilogue) runs on the same stream and shares that
      // workspace: one stream orders their uses.
      SW_CUDA_CHECK(cublas().LtCreate(&lt_));
      stream_.device = dev_;
      stream_.stream = st;
    });
    SW_CUDA_CHECK(cudaSetDevice(dev_));
    return stream_.stream;
  }

  CudaStream& stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* blas_workspace() const { return blas_ws_.data(); }

  // A cuBLASLt product's plan (descriptors and algorithm) per key, made once by `make` and
  // kept for the process: the same algorithm for every call of a shape (reruns give the same
  // bits) and no heuristic query per call. `ok` false: cuBLASLt offered no algorithm. (One
  // host thread at a time, as for the scratch slots.)
  struct LtPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
  };
  // dt, m, n, k, alignments (w, x, out), the output's dtype (0 fp32, else dt), the bias's and
  // the residual's alignments (0: none)
  using LtKey = std::tuple<int, int, int, int, int, int, int, int, int, int>;
  template <class Make>
  LtPlan& lt_plan(const LtKey& key, Make make) const {
    auto it = lt_plans_.find(key);
    if (it == lt_plans_.end()) it = lt_plans_.emplace(key, make()).first;
    return it->second;
  }

  // At least `floats` floats of the slot's scratch (contents undefined). Growing frees the old
  // buffer to the caching device allocator: kernels already enqueued on this (blocking)
  // stream that use it run before any later work that reuses the block (stream order).
  float* wsf(Slot slot, size_t floats) const {
    Buffer& b = ws_[static_cast<int>(slot)];
    const size_t bytes = std::max<size_t>(floats, 1) * sizeof(float);
    if (b.bytes() < bytes) {
      b.release();
      b = Buffer(bytes + bytes / 4, Mem::Workspace, Device::cuda(dev_));
    }
    return b.f32();
  }
  // At least n 16-bit values of the slot's scratch.
  uint16_t* wsh(Slot slot, size_t n) const {
    return reinterpret_cast<uint16_t*>(wsf(slot, (n + 1) / 2));
  }
  // RoPE's angle table for (T, hd, RopeSpec) in the Rope slot, built on the stream when the key or
  // the slot's buffer changed (one model: built once).
  const float* rope_table(cudaStream_t s, int T, int hd, const RopeSpec& spec) const {
    float* tab = wsf(Slot::Rope, static_cast<size_t>(T) * hd);
    if (tab != rope_.tab || T != rope_.T || hd != rope_.hd || !spec.same(rope_.spec)) {
      cuda::rope_table(s, tab, T, hd, spec);
      rope_ = RopeKey{tab, T, hd, spec};
    }
    return tab;
  }

 private:
  mutable int dev_ = 0;  // cuda_current_device(), set by the first begin()
  mutable std::once_flag once_;
  mutable CudaStream stream_;
  mutable cublasHandle_t blas_ = nullptr;
  mutable cublasLtHandle_t lt_ = nullptr;
  mutable Buffer blas_ws_;
  mutable std::map<LtKey, LtPlan> lt_plans_;
  mutable Buffer ws_[static_cast<int>(Slot::Count)];
  struct RopeKey {
    const float* tab = nullptr;
    int T = 0, hd = 0;
    RopeSpec spec{0.f};
  };
  mutable RopeKey rope_;
};

// ---- Op times (SHARDWISE_CUDA_OP_TIMES=1, or =PATH to write the table there as well): a
// diagnosis, not a profiler's timeline. Each op (and inside it the 16-bit conversions, the
// cuBLAS products and the attention path's pieces) is bracketed by two CUDA events on the
// compute stream; at exit the elapsed times are summed per op and printed to stderr, with the
// ops' total against the span from the first op to the last (the rest is the compute stream
// idle: the host late, a copy or collective waited for). Each op's host time (its call to its
// return: the launches) is summed too, against the host's span, so a step bound by the host's
// launches shows as host time close to the GPU's span. Each op's (and part's) first call is
// left out of its sums: it carries one-time costs (cuDNN builds its graphs inside the first
// attention call, which the H200 run of 2026-11-27 showed as ~0.2 s of "device time" in the
// parent ops of a 5-step run). Costs two event records per op and a host wait per 8192 ops
// (draining the oldest half); off, one branch per op.
class OpTimes {
 public:
  // Whether SHARDWISE_CUDA_OP_TIMES asks for the table (read once).
  static bool enabled() {
    static const bool on = [] {
      const auto v = env_text("SHARDWISE_CUDA_OP_TIMES");
      return v && *v != "0";
    }();
    return on;
  }
  // The process's table (null when not enabled). First called after the CUDA runtime is in
  // use (OpScope makes the device current first), so the report registered here runs before
  // the runtime's own teardown at exit.
  static OpTimes* get() {
    static OpTimes* t = []() -> OpTimes* {
      if (!enabled()) return nullptr;
      const std::string v = *env_text("SHARDWISE_CUDA_OP_TIMES");
      auto* p = new OpTimes(v == "1" ? "" : v.c_str());
      std::atexit([] { OpTimes::get()->report(); });
      return p;
    }();
    return t;
  }
  // host_t0 / host_t1: when the op's call began and returned on the host (steady clock, s).
  void add(std::string key, bool top, cudaEvent_t a, cudaEvent_t b, double host_t0,
           double host_t1) {
    std::lock_guard<std::mutex> lk(mu_);
    if (seen_.insert(key).second) {  // the first call: one-time costs, left out
      ++skipped_;
      cudaEventDestroy(a);
      cudaEventDestroy(b);
      return;
    }
    if (!first_) first_ = a;
    if (host_first_ < 0 || host_t0 < host_first_) host_first_ = host_t0;
    host_last_ = std::max(host_last_, host_t1);
    pending_.push_back({std::move(key), top, a, b, 1e3 * (host_t1 - host_t0)});
    if (pending_.size() >= kMaxPending) drain(pending_.size() / 2);
  }

 private:
  struct Rec {
    std::string key;
    bool top;
    cudaEvent_t a, b;
    double host_ms;
  };
  struct Sum {
    long long calls = 0;
    double ms = 0, host_ms = 0;
  };
  static constexpr size_t kMaxPending = 8192;
  std::set<std::string> seen_;  // keys whose first call was left out
  long long skipped_ = 0;
  explicit OpTimes(std::string path) : path_(std::move(path)) {}

  void drain(size_t n) {
    for (size_t i = 0; i < n; ++i) {
      Rec& r = pending_[i];
      float ms = 0;
      if (cudaEventSynchronize(r.b) == cudaSuccess &&
          cudaEventElapsedTime(&ms, r.a, r.b) == cudaSuccess) {
        Sum& sm = sums_[r.key];
        ++sm.calls;
        sm.ms += ms;
        sm.host_ms += r.host_ms;
        if (r.top) top_ms_ += ms, top_host_ms_ += r.host_ms;
      }
      if (r.a != first_) cudaEventDestroy(r.a);
      cudaEventDestroy(r.b);
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
  }

  void report() {
    std::lock_guard<std::mutex> lk(mu_);
    if (pending_.empty()) return;
    float span = 0;
    const cudaEvent_t last = pending_.back().b;
    if (cudaEventSynchronize(last) != cudaSuccess ||
        cudaEventElapsedTime(&span, first_, last) != cudaSuccess)
      span = 0;
    drain(pending_.size());
    // Top-level ops by total time, each followed by its parts ("op/part") by total time.
    std::vector<std::pair<std::string, Sum>> rows(sums_.begin(), sums_.end());
    auto total = [&](const std::string& k) {
      const size_t c = k.find('/');
      return sums_[c == std::string::npos ? k : k.substr(0, c)].ms;
    };
    std::sort(rows.begin(), rows.end(), [&](const auto& x, const auto& y) {
      const double tx = total(x.first), ty = total(y.first);
      if (tx != ty) return tx > ty;
      const bool px = x.first.find('/') != std::string::npos;
      const bool py = y.first.find('/') != std::string::npos;
      if (px != py) return !px;  // the op before its parts
      return x.second.ms > y.second.ms;
    });
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line,
                  "# shardwise CUDA op times: ops %.1f ms of a %.1f ms span from the first op to "
                  "the last (%.1f%%); each op's and part's first call left out (%lld calls)\n",
                  top_ms_, span, span > 0 ? 100.0 * top_ms_ / span : 0.0, skipped_);
    out += line;
    const double host_span = 1e3 * (host_last_ - host_first_);
    std::snprintf(line, sizeof line,
                  "# host: %.1f ms inside the ops' calls (launches, and the timing's own event "
                  "records) of a %.1f ms span from the first call to the last return (%.1f%%); "
                  "the rest is the engine between ops and its waits\n",
                  top_host_ms_, host_span, host_span > 0 ? 100.0 * top_host_ms_ / host_span : 0.0);
    out += line;
    // cudaMalloc / cudaFree in the steady state would show here (a cudaFree waits for the
    // device): raw calls should stop growing after the first steps.
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess) {
      const DeviceCacheStats cs = cuda_cache_stats(dev);
      std::snprintf(line, sizeof line,
                    "# device cache: %llu allocations, %llu served from the cache; %llu cudaMalloc, "
                    "%llu cudaFree; peak reserved %.2f GiB\n",
                    static_cast<unsigned long long>(cs.allocs),
                    static_cast<unsigned long long>(cs.hits),
                    static_cast<unsigned long long>(cs.raw_allocs),
                    static_cast<unsigned long long>(cs.raw_frees),
                    static_cast<double>(cs.peak_reserved) / (1u << 30));
      out += line;
    }
    out += "op\tcalls\ttotal_ms\tmean_us\tshare_of_ops\thost_ms\n";
    for (const auto& [k, sm] : rows) {
      std::snprintf(line, sizeof line, "%s%s\t%lld\t%.3f\t%.1f\t%.1f%%\t%.3f\n",
                    k.find('/') != std::string::npos ? "  " : "", k.c_str(), sm.calls, sm.ms,
                    1000.0 * sm.ms / static_cast<double>(std::max(1LL, sm.calls)),
                    top_ms_ > 0 ? 100.0 * sm.ms / top_ms_ : 0.0, sm.host_ms);
      out += line;
    }
    std::fputs(out.c_str(), stderr);
    if (!path_.empty()) {
      if (std::FILE* f = std::fopen(path_.c_str(), "w")) {
        std::fputs(out.c_str(), f);
        std::fclose(f);
      } else {
        std::fprintf(stderr, "SHARDWISE_CUDA_OP_TIMES: cannot write %s\n", path_.c_str());
      }
    }
  }

  std::string path_;
  std::mutex mu_;
  std::vector<Rec> pending_;
  std::map<std::string, Sum> sums_;
  cudaEvent_t first_ = nullptr;
  double top_ms_ = 0, top_host_ms_ = 0;
  double host_first_ = -1, host_last_ = 0;
};

// Brackets one op (the outermost on this thread: "name") or a part of one ("op/name").
class OpScope {
 public:
  OpScope(const CudaDevice& d, const char* name) {
    if (!OpTimes::enabled()) return;
    const cudaStream_t s = d.begin();
    start(OpTimes::get(), s, name);
  }
  OpScope(cudaStream_t s, const char* name) {
    if (OpTimes::enabled()) start(OpTimes::get(), s, name);
  }
  ~OpScope() {
    if (!t_) return;
    --depth_;
    if (a_ && cudaEventRecord(b_, s_) == cudaSuccess) {
      t_->add(std::move(key_), top_, a_, b_, host_t0_, now());
    } else {
      if (a_) cudaEventDestroy(a_);
      if (b_) cudaEventDestroy(b_);
    }
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void start(OpTimes* t, cudaStream_t s, const char* name) {
    host_t0_ = now();
    t_ = t;
    s_ = s;
    top_ = depth_ == 0;
    if (top_) top_name_ = name;
    key_ = top_ ? std::string(name) : std::string(top_name_) + "/" + name;
    ++depth_;
    if (cudaEventCreate(&a_) != cudaSuccess || cudaEventCreate(&b_) != cudaSuccess ||
        cudaEventRecord(a_, s_) != cudaSuccess) {
      if (a_) cudaEventDestroy(a_);
      if (b_) cudaEventDestroy(b_);
      a_ = b_ = nullptr;
    }
  }
  static thread_local int depth_;
  static thread_local const char* top_name_;
  OpTimes* t_ = nullptr;
  cudaStream_t s_ = nullptr;
  cudaEvent_t a_ = nullptr, b_ = nullptr;
  bool top_ = false;
  double host_t0_ = 0;
  std::string key_;
};
thread_local int OpScope::depth_ = 0;
thread_local const char* OpScope::top_name_ = "";

#define SW_OP_TIME() const OpScope sw_op_scope_(d_, __func__)

// compute_ is the precision of the matrix products (gemm, linear, attention, LM head); every
// other op is the fp32 op whatever it is (as kernels/cpu/cpu_ops.cpp).
class CudaOps final : public Ops {
 public:
  CudaOps(const CudaDevice& dev, DType compute) : d_(dev), compute_(compute) {}

  Device device() const override { return Device::cuda(cuda_current_device()); }
  DType compute() const override { return compute_; }
  Stream& stream() const override {
    d_.begin();
    return d_.stream();
  }

  // ---- GEMM (row-major through column-major cuBLAS): C(M,N) = op(A) op(B) is, read column-
  // major, C^T(N,M) = op(B)^T op(A)^T, and a row-major (r, c) matrix with leading dimension ld
  // is the column-major (c, r) matrix with the same ld. So B goes first, flags unchanged.
  // Low precision: each operand 16-bit already (handed to cuBLAS as it is, with its own
  // leading dimension) or fp32 (narrowed into a dense 16-bit copy, Lowp0 / Lowp1), then one
  // cublasGemmEx with fp32 accumulation; alpha and beta apply in fp32, as on the CPU. An empty
  // product (K = 0: C = beta C) reads no operand.
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, Operand A, int lda, Operand B,
            int ldb, float beta, float* C, int ldc) const override {
    SW_OP_TIME();
    if (A.has_lp() || B.has_lp()) require_lowp("gemm");
    const cudaStream_t s = begin();
    if (!lowp() || M <= 0 || N <= 0 || K <= 0) {  // K = 0: C = beta C, as the fp32 op
      gemm_raw(ta, tb, M, N, K, alpha, A.f32, lda, B.f32, ldb, beta, C, ldc);
      return;
    }
    const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const uint16_t* a16 = A.lp ? A.lp : narrowed(s, Slot::Lowp0, A.f32, lda, ar, ac);
    const uint16_t* b16 = B.lp ? B.lp : narrowed(s, Slot::Lowp1, B.f32, ldb, br, bc);
    gemm16(ta, tb, M, N, K, alpha, a16, A.lp ? lda : ac, b16, B.lp ? ldb : bc, beta, C, ldc);
  }

  // The input and the weight may be 16-bit already (kernels/ops.h): then no narrowing of them.
  // A 16-bit output: cuBLAS writes it 16-bit from its fp32 sum (one rounding, as narrow would
  // round the fp32 output); a bias in cuBLASLt's epilogue before that rounding, or (no
  // algorithm for it) the fp32 output in a transient buffer, narrowed. The residual in the
  // product's epilogue (gemm16_lt: beta 1, C = res); else the product, then residual_forward.
  void linear_forward(Out out, Operand inp, Operand w, const float* b, const float* res, int N,
                      int C, int OC) const override {
    SW_OP_TIME();
    if (inp.has_lp() || w.has_lp() || out.lp) require_lowp("linear_forward");
    if (out.lp) {
      if (out.f32 || res) refuse("linear_forward", "a 16-bit out with an fp32 one or res");
      return linear_forward16(out.lp, inp, w, b, N, C, OC);
    }
    if (!res) return linear_forward_any(out.f32, inp, w, b, N, C, OC);
    if (lowp() && N > 0 && OC > 0 && C > 0) {
      const cudaStream_t s = begin();
      const uint16_t* x16 = inp.lp ? inp.lp : narrowed(s, Slot::Lowp0, inp.f32, C, N, C);
      const uint16_t* w16 = w.lp ? w.lp : narrowed(s, Slot::Lowp1, w.f32, C, OC, C);
      if (gemm16_lt(s, N, OC, C, x16, w16, b, res, out.f32)) return;
      return product_then_residual(out.f32, x16, w16, b, res, N, C, OC);
    }
    product_then_residual(out.f32, inp, w, b, res, N, C, OC);
  }
  bool fuses_product_residual() const override { return lowp(); }
  // The residual's other path: the product, then residual_forward.
  void product_then_residual(float* out, Operand inp, Operand w, const float* b,
                             const float* res, int N, int C, int OC) const {
    linear_forward_any(out, inp, w, b, N, C, OC);
    cuda::residual_forward(begin(), out, out, res, static_cast<size_t>(N) * OC);
  }
  // The 16-bit output (above); an empty shape through the fp32 product, narrowed.
  void linear_forward16(uint16_t* out16, Operand inp, Operand w, const float* b, int N, int C,
                        int OC) const {
    if (N <= 0 || OC <= 0 || C <= 0)
      return narrowed_out(out16, extent(N, OC),
                          [&](float* t) { linear_forward_any(t, inp, w, b, N, C, OC); });
    const cudaStream_t s = begin();
    const uint16_t* x16 = inp.lp ? inp.lp : narrowed(s, Slot::Lowp0, inp.f32, C, N, C);
    const uint16_t* w16 = w.lp ? w.lp : narrowed(s, Slot::Lowp1, w.f32, C, OC, C);
    if (!b) return gemm16_out16(false, true, N, OC, C, x16, C, w16, C, out16, OC);
    // A bias in cuBLASLt's epilogue, 16-bit output; else the fp32 output in scratch, narrowed
    if (gemm16_lt(s, N, OC, C, x16, w16, b, nullptr, out16, true)) return;
    narrowed_out(out16, extent(N, OC),
                 [&](float* t) { linear_forward_any(t, x16, w16, b, N, C, OC); });
  }
  // inp and w fp32, or 16-bit (compute_'s values; lowp only), or both (the 16-bit form read).
  void linear_forward_any(float* out, Operand inp, Operand w, const float* b, int N, int C,
                          int OC) const {
    const cudaStream_t s = begin();
    if (!lowp() || N <= 0 || OC <= 0 || C <= 0) {  // (inp.lp only with lowp: C = 0, no reads)
      if (b) cuda::add_bias_rows(s, out, b, N, OC);
      gemm_raw(false, true, N, OC, C, 1.f, inp.f32, C, w.f32, C, b ? 1.f : 0.f, out, OC);
      return;
    }
    // out = x w^T + b: with a bias, in cuBLASLt's epilogue where it can (gemm16_lt); else
    // out = b, then out += x w^T with beta = 1 (the CPU's order: bias first, then the product).
    const uint16_t* x16 = inp.lp ? inp.lp : narrowed(s, Slot::Lowp0, inp.f32, C, N, C);
    const uint16_t* w16 = w.lp ? w.lp : narrowed(s, Slot::Lowp1, w.f32, C, OC, C);
    if (b && gemm16_lt(s, N, OC, C, x16, w16, b, nullptr, out)) return;
    if (b) cuda::add_bias_rows(s, out, b, N, OC);
    gemm16(false, true, N, OC, C, 1.f, x16, C, w16, C, b ? 1.f : 0.f, out, OC);
  }

  // Low precision: dout is narrowed once for both products; db stays an fp32 column sum of the
  // unrounded dout (the CPU's: a sum, not a product). A written fp32 dinp: beta = 0 (cuBLAS
  // does not read C then). A 16-bit dinp alone: written 16-bit by cuBLAS from its fp32 sum (one
  // rounding, as narrow would round the fp32 dinp; gemm16_out16), dw and db as for an fp32 one.
  void linear_backward(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp, Operand w,
                       int N, int C, int OC) const override {
    SW_OP_TIME();
    if (dinp.lp && (dinp.f32 || !dinp.write))
      refuse("linear_backward", "dinp 16-bit beside fp32 or added into");
    if (dout.has_lp() || inp.has_lp() || w.has_lp() || dinp.lp) require_lowp("linear_backward");
    if (!dinp.lp)
      return linear_backward_beta(dinp.f32, dw, db, dout, inp, w, N, C, OC,
                                  dinp.write ? 0.f : 1.f);
    if (N <= 0 || OC <= 0 || C <= 0)
      return narrowed_out(dinp.lp, extent(N, C), [&](float* t) {
        linear_backward_beta(t, dw, db, dout, inp, w, N, C, OC, 0.f);
      });
    const cudaStream_t s = begin();
    const uint16_t* d16 = dout.lp ? dout.lp : narrowed(s, Slot::Lowp0, dout.f32, OC, N, OC);
    const uint16_t* w16 = w.lp ? w.lp : narrowed(s, Slot::Lowp1, w.f32, C, OC, C);
    gemm16_out16(false, false, N, C, OC, d16, OC, w16, C, dinp.lp, C);
    linear_backward_beta(nullptr, dw, db, d16, inp, w, N, C, OC, 0.f, dout.f32);
  }
  // dout, inp and w fp32, or 16-bit (compute_'s values; lowp only; with N, C or OC = 0, dw has
  // nothing to add), or w both (the 16-bit form read). db sums db32 where given (the fp32 dout
  // of a call that hands the products its 16-bit form alone), else dout's fp32 form, else its
  // 16-bit one widened. dw, db written (beta = 0 / zeroed first: OC values) where `write`.
  void linear_backward_beta(float* dinp, GradOut dw, GradOut db, Operand dout, Operand inp,
                            Operand w, int N, int C, int OC, float dinp_beta,
                            const float* db32 = nullptr) const {
    const cudaStream_t s = begin();
    if (N <= 0 && OC > 0) {  // no rows: written parameter gradients are zeros
      if (dw.write && C > 0) cuda::fill(s, dw.p, 0.f, static_cast<size_t>(OC) * C);
      if (db.write) cuda::fill(s, db.p, 0.f, static_cast<size_t>(OC));
      dw = nullptr, db = nullptr;
    }
    if (!lowp() || N <= 0 || OC <= 0 || C <= 0) {
      // OC = 0 is an empty product: dinp = dinp_beta * dinp (gemm_raw's K = 0 case; a 16-bit
      // dout comes only with lowp, and is then not read).
      if (dinp) gemm_raw(false, false, N, C, OC, 1.f, dout.f32, OC, w.f32, C, dinp_beta, dinp, C);
      // dw += dout^T x: nothing to add when N, OC or C is 0 (and 16-bit operands only come
      // with lowp).
      if (dw && !dout.lp && !inp.lp)
        gemm_raw(true, false, OC, C, N, 1.f, dout.f32, OC, inp.f32, C, dw.beta(), dw.p, C);
    } else if (dinp || dw) {
      const uint16_t* d16 = dout.lp ? dout.lp : narrowed(s, Slot::Lowp0, dout.f32, OC, N, OC);
      if (dinp) {
        const uint16_t* w16 = w.lp ? w.lp : narrowed(s, Slot::Lowp1, w.f32, C, OC, C);
        gemm16(false, false, N, C, OC, 1.f, d16, OC, w16, C, dinp_beta, dinp, C);
      }
      if (dw) {
        const uint16_t* x16 = inp.lp ? inp.lp : narrowed(s, Slot::Lowp2, inp.f32, C, N, C);
        gemm16(true, false, OC, C, N, 1.f, d16, OC, x16, C, dw.beta(), dw.p, C);
      }
    }
    if (db && N > 0 && OC > 0) {
      if (db.write) cuda::fill(s, db.p, 0.f, static_cast<size_t>(OC));  // (OC values)
      float* ws = wsf(Slot::Norm, cuda::colsum_ws(N, OC));
      if (db32 || dout.f32)
        cuda::colsum_accumulate(s, db.p, db32 ? db32 : dout.f32, N, OC, ws);
      else
        cuda::colsum_accumulate16(s, dt(), db.p, dout.lp, N, OC, ws);
    }
  }

  // The 16-bit table where given (a unit keeping its embedding 16-bit only), else the fp32 one.
  void embedding_forward(float* out, const int32_t* tokens, Operand wte, const float* wpe, int B,
                         int T, int C, int /*V*/) const override {
    SW_OP_TIME();
    if (!wte.lp) return cuda::embedding_forward(begin(), out, tokens, wte.f32, wpe, B, T, C);
    require_lowp("embedding_forward");
    cuda::embedding_forward16(begin(), dt(), out, tokens, wte.lp, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C) const override {
    SW_OP_TIME();
    cuda::embedding_backward(begin(), dwte, dwpe, dout, tokens, B, T, C);
  }

  // The norms: fp32 kernels, the residual sum in their first pass (res), a 16-bit output with
  // only the store narrowed, the backward's 16-bit dinp stored narrowed beside the sums.
  void layernorm_forward(Out out, float* mean, float* rstd, NormIn inp, const float* w,
                         const float* b, int N, int C) const override {
    SW_OP_TIME();
    if (!out.lp)
      return cuda::layernorm_forward(begin(), inp.b ? inp.res : nullptr, out.f32, mean, rstd,
                                     inp.a, inp.b, w, b, N, C);
    require_lowp("layernorm_forward");
    cuda::layernorm_forward(begin(), inp.b ? inp.res : nullptr, nullptr, mean, rstd, inp.a, inp.b,
                            w, b, N, C, out.lp, dt());
  }
  void layernorm_backward(GradIn dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const override {
    SW_OP_TIME();
    norm_dinp("layernorm_backward", dinp);
    const cudaStream_t s = begin();
    float* ws = wsf(Slot::Norm, cuda::colsum_ws(N, C));
    if (!dinp.lp)
      return cuda::layernorm_backward(s, dinp.f32, dw, db, dout, inp, w, mean, rstd, N, C, ws);
    cuda::layernorm_backward(s, dinp.f32, dw, db, dout, inp, w, mean, rstd, N, C, ws, dinp.lp,
                             dt());
  }
  void rmsnorm_forward(Out out, float* rstd, NormIn inp, const float* w, int N, int C,
                       float eps) const override {
    SW_OP_TIME();
    if (!out.lp)
      return cuda::rmsnorm_forward(begin(), inp.b ? inp.res : nullptr, out.f32, rstd, inp.a,
                                   inp.b, w, N, C, eps);
    require_lowp("rmsnorm_forward");
    cuda::rmsnorm_forward(begin(), inp.b ? inp.res : nullptr, nullptr, rstd, inp.a, inp.b, w, N,
                          C, eps, out.lp, dt());
  }
  void rmsnorm_backward(GradIn dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int N, int C) const override {
    SW_OP_TIME();
    norm_dinp("rmsnorm_backward", dinp);
    const cudaStream_t s = begin();
    float* ws = wsf(Slot::Norm, cuda::colsum_ws(N, C));
    if (!dinp.lp) return cuda::rmsnorm_backward(s, dinp.f32, dw, dout, inp, w, rstd, N, C, ws);
    cuda::rmsnorm_backward(s, dinp.f32, dw, dout, inp, w, rstd, N, C, ws, dinp.lp, dt());
  }

  // The element-wise ops read each input 16-bit where it has that form.
  void gelu_forward(Out out, Operand inp, size_t n) const override {
    SW_OP_TIME();
    if (out.lp) {
      require_lowp("gelu_forward");
      if (inp.lp) return cuda::gelu_forward_lp(begin(), dt(), out.lp, inp.lp, n);
      return cuda::gelu_forward_lp(begin(), dt(), out.lp, inp.f32, n);
    }
    if (!inp.f32 && n) refuse("gelu_forward", "an fp32 out from a 16-bit inp");
    cuda::gelu_forward(begin(), out.f32, inp.f32, n);
  }
  void gelu_backward(GradIn dinp, Operand inp, Operand dout, size_t n) const override {
    SW_OP_TIME();
    if (!dinp.lp && !inp.has_lp() && !dout.has_lp())
      return cuda::gelu_backward(begin(), dinp.f32, inp.f32, dout.f32, n, dinp.write);
    require_lowp("gelu_backward");
    if (!dinp.write || !dinp) refuse("gelu_backward", "16-bit forms without dinp written");
    cuda::gelu_backward_set(begin(), dt(), dinp.f32, inp.lp ? nullptr : inp.f32, inp.lp,
                            dout.lp ? nullptr : dout.f32, dout.lp, n, dinp.lp);
  }
  void swiglu_forward(Out out, Operand gu, int N, int F) const override {
    SW_OP_TIME();
    if (out.lp) {
      require_lowp("swiglu_forward");
      if (gu.lp) return cuda::swiglu_forward_lp(begin(), dt(), out.lp, gu.lp, N, F);
      return cuda::swiglu_forward_lp(begin(), dt(), out.lp, gu.f32, N, F);
    }
    if (!gu.f32 && N && F) refuse("swiglu_forward", "an fp32 out from a 16-bit gu");
    cuda::swiglu_forward(begin(), out.f32, gu.f32, N, F);
  }
  void swiglu_backward(GradIn dgu, Operand dout, Operand gu, int N, int F) const override {
    SW_OP_TIME();
    if (!dgu.lp && !dout.has_lp() && !gu.has_lp())
      return cuda::swiglu_backward(begin(), dgu.f32, dout.f32, gu.f32, N, F, dgu.write);
    require_lowp("swiglu_backward");
    if (!dgu.write || dgu.f32 || !dgu.lp)
      refuse("swiglu_backward", "16-bit forms with dgu other than 16-bit and written");
    cuda::swiglu_backward_lp_set(begin(), dt(), dgu.lp, dout.lp ? nullptr : dout.f32, dout.lp,
                                 gu.lp ? nullptr : gu.f32, gu.lp, N, F);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    SW_OP_TIME();
    cuda::residual_forward(begin(), out, a, b, n);
  }

  // RoPE: the angle table of (T, hd, RopeSpec), built once (CudaDevice::rope_table); fp32 in
  // place, or into 16 bits from either form (the same table, the same arithmetic: v heads
  // narrowed as they are; a 16-bit input may be the output itself, rotated in place).
  void rope_forward(Out out, Operand qkv, int B, int T, int H, int KVH, int hd,
                    const RopeSpec& spec) const override {
    SW_OP_TIME();
    rope("rope_forward", out, qkv, B, T, H, KVH, hd, spec, 1.f);
  }
  void rope_backward(Out out, Operand dqkv, int B, int T, int H, int KVH, int hd,
                     const RopeSpec& spec) const override {
    SW_OP_TIME();
    rope("rope_backward", out, dqkv, B, T, H, KVH, hd, spec, -1.f);
  }
  void rope(const char* op, Out out, Operand in, int B, int T, int H, int KVH, int hd,
            const RopeSpec& spec, float sign) const {
    if (!out.lp) {
      if (in.lp || in.f32 != out.f32) refuse(op, "an fp32 out other than the fp32 input itself");
      SW_CHECK(hd % 2 == 0, "rope: head dim must be even");
      const cudaStream_t s = begin();
      return cuda::rope_apply(s, out.f32, d_.rope_table(s, T, hd, spec), B, T, H, KVH, hd, sign);
    }
    require_lowp(op);
    SW_CHECK(hd % 2 == 0, "rope: head dim must be even");
    const cudaStream_t s = begin();
    const float* tab = d_.rope_table(s, T, hd, spec);
    if (in.lp)
      cuda::rope_apply_lp(s, dt(), out.lp, in.lp, tab, B, T, H, KVH, hd, sign);
    else
      cuda::rope_apply_lp(s, dt(), out.lp, in.f32, tab, B, T, H, KVH, hd, sign);
  }

  // fp32: the path attention_path.h chooses (fp32 compute: the flash kernels). 16-bit: on the
  // cuDNN path cuDNN reads qkv as it is and writes O straight into out (the narrowing of qkv
  // and the widening of O gone): the fp32 op on widen(qkv) narrows it back to the same 16-bit
  // values, and its out is widen(O16), so narrow(out) == O16 and the bits are the same. The
  // cuBLAS and flash paths, and a shape cuDNN refuses (or a pointer off the 16-byte alignment
  // cuDNN's graphs assume), take the fp32 op on widened copies (Buffers per call), narrowed.
  void attention_forward(Out out, float* lse, Operand qkv, int B, int T, int H, int KVH,
                         int hd) const override {
    SW_OP_TIME();
    if (!out.lp && !qkv.has_lp()) {
      const cuda::AttentionPath path = cuda::attention_path_from_env(lowp());
      if (path == cuda::AttentionPath::Cudnn &&
          cudnn_attention_forward(out.f32, lse, qkv.f32, B, T, H, KVH, hd))
        return;
      if (path != cuda::AttentionPath::Flash)
        return attention_mm_forward(out.f32, lse, qkv.f32, B, T, H, KVH, hd);
      return cuda::attention_forward(begin(), out.f32, lse, qkv.f32, B, T, H, KVH, hd, dt());
    }
    require_lowp("attention_forward");
    if (!out.lp || !qkv.lp) refuse("attention_forward", "one of out and qkv 16-bit");
    if (cuda::attention_path_from_env(true) == cuda::AttentionPath::Cudnn &&
        cudnn_attention_forward_lp(out.lp, lse, qkv.lp, B, T, H, KVH, hd))
      return;
    attention_forward_through_f32(out, lse, qkv, B, T, H, KVH, hd);
  }
  // fp32: cuDNN writes its widened gradients (no zeroing, no read of dqkv) where written; the
  // other paths accumulate, into zeros where written. 16-bit: on the cuDNN path qkv and out to
  // cuDNN as they are, dout narrowed (or taken as it is where it is 16-bit), dq/dk/dv widened
  // into the fp32 dqkv (without one, cuDNN's 16-bit values are the whole result); elsewhere the
  // fp32 op on widened copies, dqkv narrowed where it has a 16-bit form.
  void attention_backward(GradIn dqkv, Operand dout, Operand qkv, Operand out, const float* lse,
                          int B, int T, int H, int KVH, int hd) const override {
    SW_OP_TIME();
    if (!qkv.has_lp() && !out.has_lp() && !dout.has_lp() && !dqkv.lp)
      return attention_backward_any(dqkv.f32, dout.f32, qkv.f32, out.f32, lse, B, T, H, KVH, hd,
                                    dqkv.write);
    require_lowp("attention_backward");
    if (!qkv.lp || !out.lp)
      refuse("attention_backward", "16-bit forms without 16-bit qkv and out");
    if (!dqkv.write || !dqkv) refuse("attention_backward", "16-bit forms without dqkv written");
    if (cuda::attention_path_from_env(true) == cuda::AttentionPath::Cudnn &&
        cudnn_attention_backward_lp_set(dqkv.f32, dqkv.lp, dout, qkv.lp, out.lp, lse, B, T, H,
                                        KVH, hd))
      return;
    attention_backward_through_f32(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
  }
  void attention_backward_any(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int H, int KVH, int hd,
                              bool set) const {
    const cuda::AttentionPath path = cuda::attention_path_from_env(lowp());
    if (path == cuda::AttentionPath::Cudnn &&
        cudnn_attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd, set))
      return;
    if (set && B > 0 && T > 0) {
      const OpScope scope(begin(), "attn_zero");
      SW_CUDA_CHECK(cudaMemsetAsync(dqkv, 0,
                                    size_t(B) * T * (H + 2 * KVH) * hd * sizeof(float), begin()));
    }
    if (path != cuda::AttentionPath::Flash)
      return attention_mm_backward(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
    const cudaStream_t s = begin();
    const size_t rows = static_cast<size_t>(B) * T * H;
    cuda::attention_backward(s, dqkv, dout, qkv, out, lse, B, T, H, KVH, hd,
                             wsf(Slot::Attn, std::max<size_t>(rows, 1)), dt());
  }

  // Rows in chunks (cuda::lmhead_chunk_rows, workspace.h: at most 4096 rows and 1 GiB of
  // logits): logits = x_c w^T (cuBLAS) into the workspace; one block per row turns it
  // into the loss and grad_scale * (softmax - onehot); dx_c += dlogits w and dw += dlogits^T
  // x_c (cuBLAS, beta = 1). The loss total is summed on the device in a fixed order.
  // Low precision (kernels/cpu/lmhead.cpp's rounding): x narrowed once per call (Lowp0), w
  // taken 16-bit where it has that form (a unit's 16-bit copy), else narrowed (Lowp1); the logits are fp32 products of those, the softmax and loss fp32; with gradients,
  // the row kernel writes each chunk's dlogits narrowed (Lowp2; the fp32 values are never
  // stored), and they feed both backward products.
  double lmhead_xent(float* loss, float* dx, float* dw, const float* x, Operand w,
                     const int32_t* targets, int N, int C, int V,
                     float grad_scale) const override {
    SW_OP_TIME();
    SW_CHECK(N >= 0 && C > 0 && V > 0, "lmhead_xent: bad shape");
    if (N == 0) return 0.0;
    float* rows = wsf(Slot::Rows, static_cast<size_t>(N) + 4);
    double* total = reinterpret_cast<double*>(rows + ((static_cast<size_t>(N) + 1) / 2) * 2);
    xent(total, false, loss ? loss : rows, dx, dw, x, w, targets, N, C, V, grad_scale);
    return read_double(begin(), total);
  }
  void lmhead_xent_into(double* total, float* loss, float* dx, float* dw, const float* x,
                        Operand w, const int32_t* targets, int N, int C, int V,
                        float grad_scale) const override {
    SW_OP_TIME();
    SW_CHECK(N >= 0 && C > 0 && V > 0, "lmhead_xent: bad shape");
    if (N == 0) return;
    float* rl = loss ? loss : wsf(Slot::Rows, static_cast<size_t>(N));
    xent(total, true, rl, dx, dw, x, w, targets, N, C, V, grad_scale);
  }

  // ---- Tensor parallelism (kernels/cuda/tp_kernels.cu). The table: its 16-bit rows widened
  // where given, else the fp32 ones (as embedding_forward). The cross-entropy over a vocabulary shard
  // runs as lmhead_xent does: rows in chunks of cuda::lmhead_chunk_rows(N, V) (the Logits
  // slot; V is the shard's, so no more than the full head's), the products through gemm_raw or,
  // in BF16 / F16, gemm16 on h narrowed once per call (Lowp0) and w taken 16-bit where it has
  // that form, else narrowed (Lowp1); the backward's g written narrowed by its row kernel
  // (Lowp2), feeding both products. Two passes (stats, then backward) each run the logits'
  // product, as the CPU's.
  void vocab_embedding_forward(float* out, const int32_t* tokens, Operand wte, int64_t v_lo,
                               int N, int C, int V) const override {
    SW_OP_TIME();
    if (!wte.lp)
      return cuda::vocab_embedding_forward(begin(), out, tokens, wte.f32, nullptr, 0, v_lo, N, C,
                                           V);
    require_lowp("vocab_embedding_forward");
    cuda::vocab_embedding_forward(begin(), out, tokens, nullptr, wte.lp, dt(), v_lo, N, C, V);
  }
  void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                                int64_t v_lo, int N, int C, int V) const override {
    SW_OP_TIME();
    cuda::vocab_embedding_backward(begin(), dwte, dout, tokens, v_lo, N, C, V);
  }
  void position_forward(float* out, const float* wpe, int64_t row_lo, int rows, int T,
                        int C) const override {
    SW_OP_TIME();
    SW_CHECK(T > 0 && row_lo >= 0, "position_forward: bad shape");
    cuda::position_forward(begin(), out, wpe, row_lo, rows, T, C);
  }
  void position_backward(float* dwpe, const float* dout, int64_t row_lo, int rows, int T,
                         int C) const override {
    SW_OP_TIME();
    SW_CHECK(T > 0 && row_lo >= 0, "position_backward: bad shape");
    cuda::position_backward(begin(), dwpe, dout, row_lo, rows, T, C);
  }
  void xent_shard_stats(float* stats, const float* h, Operand w, const int32_t* targets,
                        int64_t v_lo, int N, int C, int V) const override {
    SW_OP_TIME();
    SW_CHECK(N >= 0 && C > 0 && V > 0, "xent_shard_stats: bad shape");
    if (N == 0) return;
    const cudaStream_t s = begin();
    const ShardOperands op = shard_operands(s, "xent_shard_stats", h, w, N, C, V);
    const int chunk = static_cast<int>(cuda::lmhead_chunk_rows(N, V));
    float* logits = wsf(Slot::Logits, static_cast<size_t>(chunk) * V);
    for (int n0 = 0; n0 < N; n0 += chunk) {
      const int nc = std::min(chunk, N - n0);
      shard_logits(op, n0, nc, C, V, logits);
      const OpScope scope(s, "xent_shard_rows");
      cuda::xent_shard_stats_rows(s, stats + static_cast<size_t>(n0) * 3, logits, targets + n0,
                                  v_lo, nc, V);
    }
  }
  void xent_shard_combine(double* total, float* lse, float* loss, const float* stats,
                          const int32_t* targets, int t, int N) const override {
    SW_OP_TIME();
    SW_CHECK(t >= 1 && N >= 0, "xent_shard_combine: bad shape");
    cuda::xent_shard_combine(begin(), total, lse, loss, stats, targets, t, N);
  }
  void xent_shard_backward(float* dh, GradOut dw, const float* h, Operand w, const float* lse,
                           const int32_t* targets, int64_t v_lo, int N, int C, int V,
                           float grad_scale) const override {
    SW_OP_TIME();
    SW_CHECK(N >= 0 && C > 0 && V > 0, "xent_shard_backward: bad shape");
    if (!dh && !dw) return;
    const cudaStream_t s = begin();
    if (N == 0) {
      if (dw.write) cuda::fill(s, dw.p, 0.f, static_cast<size_t>(V) * C);  // written
      return;
    }
    const ShardOperands op = shard_operands(s, "xent_shard_backward", h, w, N, C, V);
    const int chunk = static_cast<int>(cuda::lmhead_chunk_rows(N, V));
    float* logits = wsf(Slot::Logits, static_cast<size_t>(chunk) * V);
    uint16_t* d16 = lowp() ? wsh(Slot::Lowp2, static_cast<size_t>(chunk) * V) : nullptr;
    for (int n0 = 0; n0 < N; n0 += chunk) {
      const int nc = std::min(chunk, N - n0);
      shard_logits(op, n0, nc, C, V, logits);
      {
        const OpScope scope(s, "xent_shard_rows");
        cuda::xent_shard_grad_rows(s, logits, lse + n0, targets + n0, v_lo, nc, V, grad_scale,
                                   d16, dt());
      }
      const float dw_beta = n0 == 0 ? dw.beta() : 1.f;
      float* dhc = dh ? dh + static_cast<size_t>(n0) * C : nullptr;
      if (!d16) {
        const float* hc = h + static_cast<size_t>(n0) * C;
        if (dhc) gemm_raw(false, false, nc, C, V, 1.f, logits, V, op.w, C, 1.f, dhc, C);
        if (dw) gemm_raw(true, false, V, C, nc, 1.f, logits, V, hc, C, dw_beta, dw.p, C);
        continue;
      }
      const uint16_t* h16c = op.h16 + static_cast<size_t>(n0) * C;
      if (dhc) gemm16(false, false, nc, C, V, 1.f, d16, V, op.w16, C, 1.f, dhc, C);
      if (dw) gemm16(true, false, V, C, nc, 1.f, d16, V, h16c, C, dw_beta, dw.p, C);
    }
  }

  // With copies, written by the update's kernel: the master read once (4 bytes a parameter
  // less than adamw, then round_copy with a 16-bit copy); a gradient to round (grad_dt) is
  // rounded as the kernel reads it.
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
             float beta2, float eps, float wd, int step, float grad_mult,
             const AdamWCopies& copies = {}) const override {
    SW_OP_TIME();
    if (copies.dt == DType::F32)
      return cuda::adamw(begin(), param, grad, m, v, n, lr, beta1, beta2, eps, wd, step,
                         grad_mult);
    cuda::adamw(begin(), param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult,
                dt_code(copies.dt), copies.param32, copies.param16, dt_code(copies.grad_dt));
  }
  void sgd(float* param, const float* grad, float* m, size_t n, float lr, float momentum,
           float dampening, bool nesterov, float wd, float scale, int step,
           float grad_mult) const override {
    SW_OP_TIME();
    cuda::sgd(begin(), param, grad, m, n, lr, momentum, dampening, nesterov, wd, scale, step,
              grad_mult);
  }
  void lamb_prepare(const float* param, float* grad, float* m, float* v, size_t n, float beta1,
                    float beta2, float eps, float wd, float grad_mult) const override {
    SW_OP_TIME();
    cuda::lamb_prepare(begin(), param, grad, m, v, n, beta1, beta2, eps, wd, grad_mult);
  }
  void add_scaled(float* y, float a, const float* x, size_t n) const override {
    SW_OP_TIME();
    cuda::add_scaled(begin(), y, a, x, n);
  }
  bool rounds_grads_on_read(DType) const override { return true; }
  bool prefers_lp_operands() const override { return true; }  // (cuBLAS takes them as they are)

  // Each sum into device memory (sums_into: the values rounded as the kernel reads them where
  // dt asks, in the same order, so the bits of round_to then the sum). Into host memory: one
  // buffer's sum with its partials in Reduce, read once; several into a device array in
  // Reduce, one read of all k.
  void sums_of_squares(const float* const* xs, const size_t* ns, int k, double* out, SumsTo to,
                       DType dt = DType::F32) const override {
    SW_OP_TIME();
    if (to == SumsTo::Device) return sums_into(xs, ns, k, out, dt_code(dt));
    if (k <= 0) return;
    const cudaStream_t s = begin();
    if (k == 1 && dt == DType::F32) {
      const size_t parts = cuda::sum_squares_ws(ns[0]);
      double* ws = reinterpret_cast<double*>(wsf(Slot::Reduce, 2 * (parts + 1)));
      cuda::sum_squares(s, ws, xs[0], ns[0], ws + 1);
      out[0] = read_double(s, ws);
      return;
    }
    double* res = reinterpret_cast<double*>(wsf(Slot::Reduce, 2 * size_t(k)));
    sums_into(xs, ns, k, res, dt_code(dt));  // (its workspaces: Slot::Reduce2)
    SW_CUDA_CHECK(cudaMemcpyAsync(out, res, sizeof(double) * size_t(k), cudaMemcpyDeviceToHost, s));
    SW_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  static int dt_code(DType d) { return d == DType::BF16 ? 1 : d == DType::F16 ? 2 : 0; }

 private:
  // Each sum into out (device), of values rounded to dt (cuda's code; 0: none) as read; one
  // workspace per buffer, so no sum waits for another's.
  void sums_into(const float* const* xs, const size_t* ns, int k, double* out, int dt) const {
    if (k <= 0) return;
    const cudaStream_t s = begin();
    size_t parts = 0;
    for (int i = 0; i < k; ++i) parts = std::max(parts, cuda::sum_squares_ws(ns[i]));
    double* ws = reinterpret_cast<double*>(wsf(Slot::Reduce2, 2 * std::max<size_t>(1, size_t(k) * parts)));
    for (int i = 0; i < k; ++i)
      cuda::sum_squares(s, out + i, xs[i], ns[i], ws + size_t(i) * parts, dt);
  }
  // The LM head over row chunks (below); the loss total is written to, or with `accumulate`
  // added to, *total (device).
  void xent(double* total, bool accumulate, float* rl, float* dx, float* dw, const float* x,
            Operand wo, const int32_t* targets, int N, int C, int V, float grad_scale) const {
    const cudaStream_t s = begin();
    const bool grad = dx != nullptr || dw != nullptr;
    const int chunk = static_cast<int>(cuda::lmhead_chunk_rows(N, V));
    float* logits = wsf(Slot::Logits, static_cast<size_t>(chunk) * V);
    const bool lp = lowp();
    SW_CHECK(lp || wo.f32, "lmhead_xent: a 16-bit weight needs BF16 / F16 Ops");
    const float* w = wo.f32;
    const uint16_t* x16 = lp ? narrowed(s, Slot::Lowp0, x, C, N, C) : nullptr;
    const uint16_t* w16 = !lp ? nullptr : wo.lp ? wo.lp : narrowed(s, Slot::Lowp1, w, C, V, C);
    uint16_t* d16 = lp && grad ? wsh(Slot::Lowp2, static_cast<size_t>(chunk) * V) : nullptr;
    for (int n0 = 0; n0 < N; n0 += chunk) {
      const int nc = std::min(chunk, N - n0);
      const float* xc = x + static_cast<size_t>(n0) * C;
      if (!lp) {
        gemm_raw(false, true, nc, V, C, 1.f, xc, C, w, C, 0.f, logits, V);
        {
          const OpScope scope(s, "xent_rows");
          cuda::xent_rows(s, logits, rl + n0, targets + n0, nc, V, grad, grad_scale);
        }
        if (dx) gemm_raw(false, false, nc, C, V, 1.f, logits, V, w, C, 1.f,
                         dx + static_cast<size_t>(n0) * C, C);
        if (dw) gemm_raw(true, false, V, C, nc, 1.f, logits, V, xc, C, 1.f, dw, C);
        continue;
      }
      const uint16_t* x16c = x16 + static_cast<size_t>(n0) * C;
      gemm16(false, true, nc, V, C, 1.f, x16c, C, w16, C, 0.f, logits, V);
      {  // with gradients, the 16-bit dlogits straight from the row kernel
        const OpScope scope(s, "xent_rows");
        cuda::xent_rows(s, logits, rl + n0, targets + n0, nc, V, grad, grad_scale, d16, dt());
      }
      if (!grad) continue;
      if (dx) gemm16(false, false, nc, C, V, 1.f, d16, V, w16, C, 1.f,
                     dx + static_cast<size_t>(n0) * C, C);
      if (dw) gemm16(true, false, V, C, nc, 1.f, d16, V, x16c, C, 1.f, dw, C);
    }
    cuda::sum_rows(s, total, rl, N, accumulate);
  }

 public:
  void scale(float* x, float a, size_t n) const override {
    SW_OP_TIME();
    cuda::scale(begin(), x, a, n);
  }
  void fill(float* x, float v, size_t n) const override {
    SW_OP_TIME();
    cuda::fill(begin(), x, v, n);
  }
  void add_inplace(float* y, const float* x, size_t n) const override {
    SW_OP_TIME();
    cuda::add_inplace(begin(), y, x, n);
  }
  void copy(float* dst, const float* src, size_t n) const override {
    SW_OP_TIME();
    const cudaStream_t s = begin();
    if (dst == src || n == 0) return;
    SW_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
  }

  // In place (dst == src) the kernels' threads would read values that other threads' results
  // overwrite, so the conversions go in ranges whose reads and writes are disjoint and which
  // overwrite only values already read, with a prefix (kConvertPrefix values) through the Convert
  // scratch: 6 bytes moved per value instead of 10 to 14 through a whole-buffer copy (a
  // gather's widen and a 16-bit reduction's narrow cover a whole unit).
  static constexpr size_t kConvertPrefix = size_t{1} << 16;
  void narrow(DType dt, const float* src, void* dst, size_t n) const override {
    SW_OP_TIME();
    const cudaStream_t s = begin();
    if (n == 0) return;
    if (dt == DType::F32) return copy(static_cast<float*>(dst), src, n);
    const int d = static_cast<int>(dt);
    if (dst != static_cast<const void*>(src)) {
      cuda::narrow(s, d, src, static_cast<uint16_t*>(dst), n);
      return;
    }
    // Value i's 16 bits, bytes [2i, 2i+2), land on float i/2: the prefix first (through
    // scratch), then [a, 2a) for a = prefix, 2 prefix, ...: reads [4a, 8a), writes [2a, 4a),
    // the floats [a/2, a) that earlier ranges read.
    uint16_t* d16 = static_cast<uint16_t*>(dst);
    size_t a = std::min(n, kConvertPrefix);
    uint16_t* tmp = reinterpret_cast<uint16_t*>(wsf(Slot::Convert, (a + 1) / 2));
    cuda::narrow(s, d, src, tmp, a);
    SW_CUDA_CHECK(cudaMemcpyAsync(dst, tmp, a * 2, cudaMemcpyDeviceToDevice, s));
    for (; a < n; a *= 2) cuda::narrow(s, d, src + a, d16 + a, std::min(n, 2 * a) - a);
  }
  void widen(DType dt, const void* src, float* dst, size_t n) const override {
    SW_OP_TIME();
    const cudaStream_t s = begin();
    if (n == 0) return;
    if (dt == DType::F32) return copy(dst, static_cast<const float*>(src), n);
    const int d = static_cast<int>(dt);
    if (src != static_cast<const void*>(dst)) {
      cuda::widen(s, d, static_cast<const uint16_t*>(src), dst, n);
      return;
    }
    // In place (a gather's 16-bit values at the front of its fp32 buffer): value i's float,
    // bytes [4i, 4i+4), lands on 16-bit values 2i and 2i+1, so a range [h, e) with h >= e/2
    // reads bytes [2h, 2e) and writes [4h, 4e), disjoint, overwriting only values that ranges
    // above it have read: the top half first, then the top half of the rest, ... (boundaries
    // on multiples of 4 for the four-wide kernel), down to the prefix, through scratch.
    const uint16_t* s16 = static_cast<const uint16_t*>(src);
    size_t e = n;
    while (e > kConvertPrefix) {
      const size_t h = ((e + 1) / 2 + 3) / 4 * 4;  // >= e / 2
      cuda::widen(s, d, s16 + h, dst + h, e - h);
      e = h;
    }
    float* tmp = wsf(Slot::Convert, e);
    cuda::widen(s, d, s16, tmp, e);
    SW_CUDA_CHECK(cudaMemcpyAsync(dst, tmp, e * 4, cudaMemcpyDeviceToDevice, s));
  }

  void add_widened(DType dt, const void* src, float* dst, size_t n) const override {
    SW_OP_TIME();
    const cudaStream_t s = begin();
    if (dt == DType::F32)
      cuda::add_inplace(s, dst, static_cast<const float*>(src), n);
    else
      cuda::add_widened(s, static_cast<int>(dt), static_cast<const uint16_t*>(src), dst, n);
  }
  void round_to(DType dt, float* x, size_t n) const override {
    SW_OP_TIME();
    const cudaStream_t s = begin();
    if (dt != DType::F32) cuda::round_to(s, static_cast<int>(dt), x, n);
  }
  // With dst16 (dt BF16 / F16), the 16-bit copy written by the same kernel.
  void round_copy(DType dt, float* dst, const float* src, size_t n,
                  uint16_t* dst16 = nullptr) const override {
    SW_OP_TIME();
    const cudaStream_t s = begin();
    if (dst16) {
      SW_CHECK(dt != DType::F32, "round_copy: a 16-bit copy needs a 16-bit dtype");
      return cuda::round_copy(s, static_cast<int>(dt), dst, src, n, dst16);
    }
    if (dt != DType::F32)
      cuda::round_copy(s, static_cast<int>(dt), dst, src, n);
    else if (dst != src && n)
      SW_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
  }

 private:
  cudaStream_t begin() const { return d_.begin(); }
  static size_t extent(int r, int c) { return size_t(r > 0 ? r : 0) * size_t(c > 0 ? c : 0); }
  // A 16-bit output through fp32 ops: `write` fills n fp32 values in a transient device
  // buffer, which are then narrowed into out16.
  template <class F>
  void narrowed_out(uint16_t* out16, size_t n, F&& write) const {
    Buffer t(std::max<size_t>(n, 1) * sizeof(float), Mem::Workspace, device());
    write(t.f32());
    narrow(compute_, t.f32(), out16, n);
  }
  // The norms' dinp: fp32 added into, a 16-bit form beside it (BF16 / F16) written.
  void norm_dinp(const char* op, GradIn dinp) const {
    if (!dinp.f32 || dinp.write) refuse(op, "dinp other than fp32 added into");
    if (dinp.lp) require_lowp(op);
  }
  float* wsf(Slot slot, size_t floats) const { return d_.wsf(slot, floats); }
  uint16_t* wsh(Slot slot, size_t n) const { return d_.wsh(slot, n); }
  bool lowp() const { return compute_ != DType::F32; }
  int dt() const { return static_cast<int>(compute_); }  // cuda::narrow's and attention's dt

  void gemm_raw(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                const float* B, int ldb, float beta, float* C, int ldc) const {
    if (M <= 0 || N <= 0) return;
    const OpScope scope(d_, "gemm_f32");
    if (K <= 0) {  // an empty sum: C = beta C (cuBLAS refuses a leading dimension of 0)
      const cudaStream_t s = begin();
      const float zero = 0.f;
      if (beta == 0.f)  // (zeros, whatever C held: the products' beta = 0 never reads it)
        SW_CUDA_CHECK(cudaMemset2DAsync(C, sizeof(float) * size_t(ldc), 0,
                                        sizeof(float) * size_t(N), size_t(M), s));
      else if (beta != 1.f)  // (in place: cuBLAS allows C = A with the same leading dimension)
        SW_CUDA_CHECK(cublas().Sgeam(d_.blas(), CUBLAS_OP_N, CUBLAS_OP_N, N, M, &beta, C, ldc,
                                     &zero, C, ldc, C, ldc));
      return;
    }
    SW_CUDA_CHECK(cublas().GemmEx(d_.blas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_32F,
                                  ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // src(rows, cols; row stride ld) narrowed to compute_ into a dense (rows, cols) copy in the
  // slot's scratch.
  const uint16_t* narrowed(cudaStream_t s, Slot slot, const float* src, int ld, int rows,
                           int cols) const {
    const OpScope scope(s, "narrow_rows");
    uint16_t* dst = wsh(slot, static_cast<size_t>(rows) * cols);
    cuda::narrow_rows(s, dt(), src, static_cast<size_t>(ld), static_cast<size_t>(rows),
                      static_cast<size_t>(cols), dst);
    return dst;
  }

  // gemm_raw on 16-bit operands (compute_'s type) with fp32 C, fp32 alpha/beta and fp32
  // accumulation (CUBLAS_COMPUTE_32F; products of bf16 / fp16 values are exact in fp32). The
  // algorithm is cuBLAS's heuristic choice for the shape, a fixed function of (shape, types,
  // device) with the handle's fixed workspace, so a rerun takes the same path and gives the
  // same bits (one stream per handle, as for fp32).
  void gemm16(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t* A, int lda,
              const uint16_t* B, int ldb, float beta, float* C, int ldc) const {
    if (M <= 0 || N <= 0) return;
    const OpScope scope(d_, "gemm16");
    const cudaDataType_t t = compute_ == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    SW_CUDA_CHECK(cublas().GemmEx(d_.blas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, t, ldb, A, t,
                                  lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
  }

  // C (M, N) = op(A) op(B) in the compute precision (alpha 1, beta 0): cuBLAS sums in fp32 and
  // rounds each value once as it writes it.
  void gemm16_out16(bool ta, bool tb, int M, int N, int K, const uint16_t* A, int lda,
                    const uint16_t* B, int ldb, uint16_t* C, int ldc) const {
    if (M <= 0 || N <= 0) return;
    const OpScope scope(d_, "gemm16_out16");
    const cudaDataType_t t = compute_ == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const float one = 1.f, zero = 0.f;
    SW_CUDA_CHECK(cublas().GemmEx(d_.blas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &one, B, t, ldb, A, t,
                                  lda, &zero, C, t, ldc, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
  }

  // The low-precision forward product with its bias and / or the residual stream added, out(N,
  // OC) = x16 w16^T (+ b) (+ res), in one cuBLASLt kernel whose epilogue adds the fp32 bias
  // (CUBLASLT_EPILOGUE_BIAS) and the fp32 residual (beta = 1, C = res, D = out) to the fp32
  // product as it writes it: the add_bias_rows + beta-1 path wrote b into every row first and
  // the product read it back, and a residual pass read the output back and wrote it again
  // (linear_forward with res). The same fp32 operations (the product, then + b, + res), though
  // cuBLASLt's kernel may sum the product in another order than cublasGemmEx's and add b and
  // res in another order. The plan of a shape is made once (CudaDevice::lt_plan), with the
  // operands' actual alignments, which the heuristic must be told (it assumes 256 bytes).
  // False, and the caller takes the other path, where cuBLASLt has no algorithm for the shape,
  // the bias is not 16-byte aligned, the call fails, or SHARDWISE_CUDA_LT=0.
  // out16: D is written in the compute precision (void* out holds 16-bit values), the fp32 sum
  // plus the bias rounded once (linear_forward's 16-bit out; no residual then: C would have D's
  // type).
  bool gemm16_lt(cudaStream_t s, int N, int OC, int C, const uint16_t* x16, const uint16_t* w16,
                 const float* b, const float* res, void* out, bool out16 = false) const {
    static const bool off = !env_switch("SHARDWISE_CUDA_LT");
    auto align = [](const void* p) {
      const auto a = reinterpret_cast<std::uintptr_t>(p);
      return static_cast<int>(std::min<std::uintptr_t>(256, a & (~a + 1)));
    };
    const int ab = b ? align(b) : 0, ar = res ? align(res) : 0;
    if (off || (b && ab < 16) || (!b && !res) || (out16 && res)) return false;
    const int aw = align(w16), ax = align(x16), ao = align(out);
    const cudaDataType_t t = compute_ == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    // Column-major, as gemm16 calls cublasGemmEx: D(OC, N) = op(A) B with A = w16 stored
    // (C, OC), transposed, and B = x16 stored (C, N); the bias has one value per row of D, and
    // C (the residual) D's layout.
    const cudaDataType_t dtype = out16 ? t : CUDA_R_32F;
    const CudaDevice::LtKey key{dt(), OC, N, C, aw, ax, ao, out16 ? dt() : 0, ab, ar};
    const void* bias = b;
    // Why a shape has no plan, said once (the caller's other path costs a pass more: the
    // lease's log shows whether cuBLASLt takes an fp32 bias with a 16-bit D, which its header
    // does not list).
    auto refuse = [&](const char* what, int status) {
      std::fprintf(stderr,
                   "shardwise cuda: cuBLASLt epilogue refused (%s, status %d) for %d x %d x %d%s%s, "
                   "%s output: the product takes the unfused path\n",
                   what, status, N, OC, C, b ? ", bias" : "", res ? ", residual" : "",
                   out16 ? "16-bit" : "fp32");
    };
    CudaDevice::LtPlan& p = d_.lt_plan(key, [&] {
      CudaDevice::LtPlan q;
      const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
      const cublasLtEpilogue_t epi = b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
      const cudaDataType_t bias_t = CUDA_R_32F;
      cublasStatus_t st = cublas().LtMatmulDescCreate(&q.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
      if (st != CUBLAS_STATUS_SUCCESS) {
        refuse("descriptor", int(st));
        return q;
      }
      auto set = [&](cublasLtMatmulDescAttributes_t a, const void* v, size_t n) {
        if (st == CUBLAS_STATUS_SUCCESS) st = cublas().LtMatmulDescSetAttribute(q.desc, a, v, n);
      };
      set(CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
      set(CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
      set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
      if (b) {
        set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t, sizeof(bias_t));
        // The heuristic reads the bias pointer's alignment (cublasLt.h); the key holds it.
        set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
      }
      if (st != CUBLAS_STATUS_SUCCESS) {
        refuse("descriptor attribute", int(st));
        return q;
      }
      if ((st = cublas().LtMatrixLayoutCreate(&q.la, t, C, OC, C)) != CUBLAS_STATUS_SUCCESS ||
          (st = cublas().LtMatrixLayoutCreate(&q.lb, t, C, N, C)) != CUBLAS_STATUS_SUCCESS ||
          (st = cublas().LtMatrixLayoutCreate(&q.lc, dtype, OC, N, OC)) != CUBLAS_STATUS_SUCCESS) {
        refuse("layout", int(st));
        return q;
      }
      cublasLtMatmulPreference_t pref = nullptr;
      if ((st = cublas().LtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS) {
        refuse("preference", int(st));
        return q;
      }
      const size_t ws = cuda::kCublasWorkspace;
      const uint32_t a_al = uint32_t(aw), b_al = uint32_t(ax), d_al = uint32_t(ao);
      const uint32_t c_al = res ? uint32_t(ar) : d_al;
      // Split-K parts summed in fp32 (never in a 16-bit D: one rounding, kernels/ops.h).
      const uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      auto pset = [&](cublasLtMatmulPreferenceAttributes_t a, const void* v, size_t n) {
        if (st == CUBLAS_STATUS_SUCCESS)
          st = cublas().LtMatmulPreferenceSetAttribute(pref, a, v, n);
      };
      pset(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
      pset(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a_al, sizeof(a_al));
      pset(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b_al, sizeof(b_al));
      pset(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c_al, sizeof(c_al));
      pset(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &d_al, sizeof(d_al));
      pset(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof(red));
      cublasLtMatmulHeuristicResult_t r{};
      int got = 0;
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublas().LtMatmulAlgoGetHeuristic(d_.lt(), q.desc, q.la, q.lb, q.lc, q.lc, pref, 1, &r,
                                               &got);
      q.ok = st == CUBLAS_STATUS_SUCCESS && got > 0 && r.state == CUBLAS_STATUS_SUCCESS;
      if (q.ok)
        q.algo = r.algo;
      else
        refuse(st != CUBLAS_STATUS_SUCCESS ? "preference or heuristic" : "no algorithm",
               int(st != CUBLAS_STATUS_SUCCESS ? st : r.state));
      cublas().LtMatmulPreferenceDestroy(pref);
      return q;
    });
    if (!p.ok) return false;
    const OpScope scope(d_, res ? "gemm16_residual" : out16 ? "gemm16_bias_out16" : "gemm16_bias");
    const float alpha = 1.f, beta = res ? 1.f : 0.f;
    const void* c = res ? static_cast<const void*>(res) : out;
    // (the descriptor is shared by the shape's calls; one host thread uses these Ops)
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (b)
      st = cublas().LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                             sizeof(bias));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublas().LtMatmul(d_.lt(), p.desc, &alpha, w16, p.la, x16, p.lb, &beta, c, p.lc, out,
                             p.lc, &p.algo, d_.blas_workspace(), cuda::kCublasWorkspace, s);
    if (st != CUBLAS_STATUS_SUCCESS) {
      refuse("matmul", int(st));
      p.ok = false;  // this shape takes the other path from now on
      return false;
    }
    return true;
  }

  // gemm16 over `batch` equally strided (in elements) operand and result matrices.
  void gemm16_sb(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t* A, int lda,
                 size_t sa, const uint16_t* B, int ldb, size_t sb, float beta, float* C, int ldc,
                 size_t sc, size_t batch) const {
    if (M <= 0 || N <= 0 || batch == 0) return;
    const OpScope scope(d_, "gemm16_batched");
    const cudaDataType_t t = compute_ == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    SW_CUDA_CHECK(cublas().GemmStridedBatchedEx(
        d_.blas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha,
        B, t, ldb, static_cast<long long>(sb), A, t, lda, static_cast<long long>(sa), &beta, C,
        CUDA_R_32F, ldc, static_cast<long long>(sc), static_cast<int>(batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
  }

  // ---- Attention through cuBLAS (bf16 / fp16 compute; the default there since its first GPU
  // run: 5.7x the flash-style kernels' tokens/s for GPT-2 124M, 6.5x for a 1.3B Llama on an
  // H100; attention_path.h chooses): kernels/cuda/attention_mm.h's orchestration over this
  // backend. Scratch: the packed heads, and per chunk the scores (fp32) and probabilities
  // (16-bit) within kAttnChunkBytes (at least 64 query rows). SHARDWISE_CUDA_ATTENTION_CHUNK=N
  // (tests) forces N query rows per chunk.
  static constexpr size_t kAttnChunkBytes = size_t{256} << 20;
  struct AttnBackend {
    const CudaOps& o;
    cudaStream_t s;
    // attn_mm's slots, in order, are AttnPack..AttnAcc.
    static Slot slot(int k) { return static_cast<Slot>(static_cast<int>(Slot::AttnPack) + k); }
    uint16_t* ws16(int k, size_t n) const { return o.wsh(slot(k), std::max<size_t>(n, 1)); }
    float* ws32(int k, size_t n) const { return o.wsf(slot(k), std::max<size_t>(n, 1)); }
    size_t chunk_budget() const { return kAttnChunkBytes; }
    int forced_chunk() const {
      return static_cast<int>(env_int("SHARDWISE_CUDA_ATTENTION_CHUNK").value_or(0));
    }
    void pack(const float* src, int B, int T, int ld, int col0, int nh, int hd,
              uint16_t* dst) const {
      const OpScope scope(s, "attn_pack");
      cuda::attn_pack(s, o.dt(), src, B, T, ld, col0, nh, hd, dst);
    }
    void gemm(bool ta, bool tb, int M, int N, int K, const uint16_t* A, int lda, size_t sa,
              const uint16_t* B, int ldb, size_t sb, float beta, float* C, int ldc, size_t sc,
              size_t batch) const {
      o.gemm16_sb(ta, tb, M, N, K, 1.f, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
    }
    void softmax_fwd(const float* S, uint16_t* P, float* alpha, float* ml, size_t rows, int nq,
                     int ldS, int kend, int q0, int tiles, float scale) const {
      const OpScope scope(s, "attn_softmax_fwd");
      cuda::attn_softmax_fwd(s, o.dt(), S, P, alpha, ml, rows, nq, ldS, kend, q0, tiles, scale);
    }
    void combine(const float* Ot, const float* alpha, const float* ml, float* out, float* lse,
                 size_t rows, int nq, int hd, int tiles, int T, int H, int q0) const {
      const OpScope scope(s, "attn_combine");
      cuda::attn_combine(s, Ot, alpha, ml, out, lse, rows, nq, hd, tiles, T, H, q0);
    }
    void rowdot(const float* dout, const float* out, float* D, int B, int T, int H,
                int hd) const {
      const OpScope scope(s, "attn_rowdot");
      cuda::attention_rowdot(s, D, dout, out, B, T, H, hd);
    }
    void softmax_bwd(const float* S, const float* dP, uint16_t* P, uint16_t* dS,
                     const float* lse, const float* D, size_t rows, int nq, int ldS, int kend,
                     int q0, int T, float scale) const {
      const OpScope scope(s, "attn_softmax_bwd");
      cuda::attn_softmax_bwd(s, o.dt(), S, dP, P, dS, lse, D, rows, nq, ldS, kend, q0, T, scale);
    }
    void unpack(const float* dQn, const float* dKn, const float* dVn, float* dqkv, int B, int T,
                int H, int KVH, int hd) const {
      const OpScope scope(s, "attn_unpack");
      cuda::attn_unpack_grads(s, dQn, dKn, dVn, dqkv, B, T, H, KVH, hd);
    }
    void zero(float* p, size_t n) const {
      const OpScope scope(s, "attn_zero");
      SW_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), s));
    }
  };
  void attention_mm_forward(float* out, float* lse, const float* qkv, int B, int T, int H,
                            int KVH, int hd) const {
    SW_CHECK(KVH > 0 && H % KVH == 0, "attention: KVH must divide H");
    attn_mm::forward(AttnBackend{*this, begin()}, out, lse, qkv, B, T, H, KVH, hd);
  }
  void attention_mm_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, int B, int T, int H, int KVH, int hd) const {
    SW_CHECK(KVH > 0 && H % KVH == 0, "attention: KVH must divide H");
    attn_mm::backward(AttnBackend{*this, begin()}, dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
  }

  // ---- cuDNN's fused attention (SHARDWISE_CUDA_ATTENTION=cudnn; attention_cudnn.h): qkv
  // narrowed whole into AttnPack (the packed layout is cuDNN's strided Q, K, V), O comes back
  // 16-bit and is widened into out; the backward narrows qkv, out (giving the forward's O bit
  // for bit) and dout, and adds cuDNN's 16-bit dQ, dK, dV (AttnS) into dqkv. cuDNN's workspace
  // is AttnP. A shape cuDNN refuses returns false (the caller takes the cuBLAS path), with one
  // line on stderr, when its graph is first tried, saying why. The 16-bit forms (below) take the
  // 16-bit qkv and O from the caller: no narrowing of them, no widening of O.
  // The graph's workspace (AttnP; null when it needs none), or false when cuDNN refuses the
  // shape.
  bool cudnn_usable(const cuda::AttnShape& sh, bool backward, void** workspace) const {
    std::string why;
    bool first = false;
    const int64_t ws = cuda::cudnn_attention_prepare(sh, backward, &why, &first);
    if (ws < 0) {
      if (first)
        std::fprintf(stderr, "shardwise: cuda: cuDNN attention refused %s %dx%d H %d KVH %d hd %d "
                             "%s (%s); using the cuBLAS path\n", dtype_name(sh.dt), sh.B, sh.T,
                     sh.H, sh.KVH, sh.hd, backward ? "backward" : "forward", why.c_str());
      return false;
    }
    *workspace = ws > 0 ? static_cast<void*>(wsh(Slot::AttnP, size_t(ws) / 2 + 1)) : nullptr;
    return true;
  }
  bool cudnn_attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H,
                               int KVH, int hd) const {
    SW_CHECK(KVH > 0 && H % KVH == 0, "attention: KVH must divide H");
    if (B <= 0 || T <= 0) return true;
    const cudaStream_t s = begin();
    const cuda::AttnShape sh{compute_, B, T, H, KVH, hd};
    void* w = nullptr;
    if (!cudnn_usable(sh, false, &w)) return false;
    const size_t n = size_t(B) * T * (H + 2 * KVH) * hd, no = size_t(B) * T * H * hd;
    uint16_t* q16 = wsh(Slot::AttnPack, n + no);
    uint16_t* o16 = q16 + n;  // n is a multiple of 8 (hd is): 16-byte aligned
    {
      const OpScope scope(s, "attn_narrow");
      cuda::narrow(s, dt(), qkv, q16, n);
    }
    {
      const OpScope scope(s, "cudnn_sdpa_fwd");
      cuda::cudnn_attention_forward(s, sh, q16, o16, lse, w);
    }
    const OpScope scope(s, "attn_widen");
    cuda::widen(s, dt(), o16, out, no);
    return true;
  }
  bool cudnn_attention_backward(float* dqkv, const float* dout, const float* qkv,
                                const float* out, const float* lse, int B, int T, int H, int KVH,
                                int hd, bool set) const {
    SW_CHECK(KVH > 0 && H % KVH == 0, "attention: KVH must divide H");
    if (B <= 0 || T <= 0) return true;
    const cudaStream_t s = begin();
    const cuda::AttnShape sh{compute_, B, T, H, KVH, hd};
    void* w = nullptr;
    if (!cudnn_usable(sh, true, &w)) return false;
    const size_t n = size_t(B) * T * (H + 2 * KVH) * hd, no = size_t(B) * T * H * hd;
    uint16_t* q16 = wsh(Slot::AttnPack, n + 2 * no);
    uint16_t* o16 = q16 + n;
    uint16_t* do16 = o16 + no;
    uint16_t* dq16 = wsh(Slot::AttnS, n);
    {
      const OpScope scope(s, "attn_narrow");
      cuda::narrow(s, dt(), qkv, q16, n);
      cuda::narrow(s, dt(), out, o16, no);
      cuda::narrow(s, dt(), dout, do16, no);
    }
    {
      const OpScope scope(s, "cudnn_sdpa_bwd");
      cuda::cudnn_attention_backward(s, sh, q16, o16, do16, lse, dq16, w);
    }
    if (set) {
      const OpScope scope(s, "attn_widen");
      cuda::widen(s, dt(), dq16, dqkv, n);
    } else {
      const OpScope scope(s, "attn_add_widened");
      cuda::add_widened(s, dt(), dq16, dqkv, n);
    }
    return true;
  }

  // The 16-bit-operand forms of the two above (attention_forward's and
  // attention_backward's): the caller's qkv16 and out16 go to cuDNN as they are, so
  // AttnPack holds only the backward's dO. False, as above, when cuDNN refuses the shape, and
  // also when qkv16 or out16 is not 16-byte aligned (the alignment cuDNN's frontend assumes
  // for every tensor; the packed scratch of the fp32 forms always has it).
  static bool cudnn_aligned(const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  }
  bool cudnn_attention_forward_lp(uint16_t* out16, float* lse, const uint16_t* qkv16, int B,
                                  int T, int H, int KVH, int hd) const {
    SW_CHECK(KVH > 0 && H % KVH == 0, "attention: KVH must divide H");
    if (B <= 0 || T <= 0) return true;
    if (!cudnn_aligned(qkv16) || !cudnn_aligned(out16)) return false;
    const cudaStream_t s = begin();
    const cuda::AttnShape sh{compute_, B, T, H, KVH, hd};
    void* w = nullptr;
    if (!cudnn_usable(sh, false, &w)) return false;
    const OpScope scope(s, "cudnn_sdpa_fwd");
    cuda::cudnn_attention_forward(s, sh, qkv16, out16, lse, w);
    return true;
  }
  // With dqkv16, cuDNN's 16-bit dQ, dK, dV land there (the caller's both-form gradient: dqkv
  // is their widening, so dqkv16 is narrow(dqkv) exactly), else in AttnS scratch.
  // A 16-bit dout goes to cuDNN as it is (where it is 16-byte aligned), else it is narrowed
  // into AttnPack.
  bool cudnn_attention_backward_lp_set(float* dqkv, uint16_t* dqkv16, Operand dout,
                                       const uint16_t* qkv16,
                                       const uint16_t* out16, const float* lse, int B, int T,
                                       int H, int KVH, int hd) const {
    SW_CHECK(KVH > 0 && H % KVH == 0, "attention: KVH must divide H");
    if (B <= 0 || T <= 0) return true;
    if (!cudnn_aligned(qkv16) || !cudnn_aligned(out16)) return false;
    const cudaStream_t s = begin();
    const cuda::AttnShape sh{compute_, B, T, H, KVH, hd};
    void* w = nullptr;
    if (!cudnn_usable(sh, true, &w)) return false;
    const size_t n = size_t(B) * T * (H + 2 * KVH) * hd, no = size_t(B) * T * H * hd;
    const uint16_t* do16 = dout.lp;
    if (!do16 || !cudnn_aligned(do16)) {
      uint16_t* d = wsh(Slot::AttnPack, no);
      const OpScope scope(s, "attn_narrow");
      if (dout.lp)
        SW_CUDA_CHECK(cudaMemcpyAsync(d, dout.lp, no * sizeof(uint16_t), cudaMemcpyDeviceToDevice, s));
      else
        cuda::narrow(s, dt(), dout.f32, d, no);
      do16 = d;
    }
    const bool into = dqkv16 && cudnn_aligned(dqkv16);
    uint16_t* dq16 = into ? dqkv16 : wsh(Slot::AttnS, n);
    {
      const OpScope scope(s, "cudnn_sdpa_bwd");
      cuda::cudnn_attention_backward(s, sh, qkv16, out16, do16, lse, dq16, w);
    }
    if (dqkv) {
      const OpScope scope(s, "attn_widen");
      cuda::widen(s, dt(), dq16, dqkv, n);
    }
    if (dqkv16 && !into)
      SW_CUDA_CHECK(cudaMemcpyAsync(dqkv16, dq16, n * sizeof(uint16_t), cudaMemcpyDeviceToDevice, s));
    return true;
  }

  // The vocabulary-parallel cross-entropy's operands (xent_shard_*): fp32, or in BF16 / F16
  // h narrowed once per call (Lowp0) and w 16-bit as given, else narrowed (Lowp1).
  struct ShardOperands {
    const float* h;
    const float* w;
    const uint16_t* h16;
    const uint16_t* w16;
  };
  ShardOperands shard_operands(cudaStream_t s, const char* op, const float* h, Operand w, int N,
                               int C, int V) const {
    if (!lowp()) {
      if (!w.f32) refuse(op, "a 16-bit weight needs BF16 / F16 Ops");
      return {h, w.f32, nullptr, nullptr};
    }
    const uint16_t* h16 = narrowed(s, Slot::Lowp0, h, C, N, C);
    const uint16_t* w16 = w.lp ? w.lp : narrowed(s, Slot::Lowp1, w.f32, C, V, C);
    return {h, w.f32, h16, w16};
  }
  // logits(nc, V) = h[n0 : n0 + nc] w^T, in the compute precision.
  void shard_logits(const ShardOperands& op, int n0, int nc, int C, int V, float* logits) const {
    if (!lowp())
      return gemm_raw(false, true, nc, V, C, 1.f, op.h + static_cast<size_t>(n0) * C, C, op.w, C,
                      0.f, logits, V);
    gemm16(false, true, nc, V, C, 1.f, op.h16 + static_cast<size_t>(n0) * C, C, op.w16, C, 0.f,
           logits, V);
  }

  // The one host synchronisation of an op that returns a value.
  double read_double(cudaStream_t s, const double* dev) const {
    double h = 0;
    SW_CUDA_CHECK(cudaMemcpyAsync(&h, dev, sizeof(double), cudaMemcpyDeviceToHost, s));
    SW_CUDA_CHECK(cudaStreamSynchronize(s));
    return h;
  }

  const CudaDevice& d_;
  DType compute_;
};

// Never destroyed: the stream and handle are released with the process (tearing them down in a
// static destructor races the CUDA runtime's own shutdown).
const CudaOps& cuda_ops(DType compute) {
  static const CudaDevice* dev = new CudaDevice();
  static const CudaOps* f32 = new CudaOps(*dev, DType::F32);
  static const CudaOps* bf16 = new CudaOps(*dev, DType::BF16);
  static const CudaOps* f16 = new CudaOps(*dev, DType::F16);
  return compute == DType::BF16 ? *bf16 : compute == DType::F16 ? *f16 : *f32;
}

struct Registrar {
  Registrar() {
    for (DType t : {DType::F32, DType::BF16, DType::F16})
      register_ops(DeviceKind::CUDA, t, &cuda_ops(t));
  }
} registrar;

}  // namespace

}  // namespace sw
