// Helpers of the GPU tests (tests/cuda): this process's device, host <-> device Buffers, a
// gate that holds a CUDA stream until the test opens it, and the collective cases compared
// across groups. Uses the CUDA runtime headers (these tests only build with the backend).
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/alloc.h"
#include "core/dtype.h"
#include "kernels/cuda/cuda_runtime.h"
#include "sharding/comm/group.h"

namespace sw::test {

inline Device gpu() { return Device::cuda(cuda_current_device()); }

inline Buffer upload(const std::vector<uint8_t>& h, Mem cat = Mem::Communication) {
  Buffer b(std::max<size_t>(h.size(), 1), cat, gpu());
  copy_bytes(b.data(), gpu(), h.data(), Device::cpu(), h.size());
  return b;
}

inline std::vector<uint8_t> download(const void* dev, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  copy_bytes(h.data(), Device::cpu(), dev, gpu(), bytes);
  return h;
}

cudaError_t launch_stream_gate(cudaStream_t s, const int* device_flag);  // stream_gate.cu

// Holds `stream` (a one-thread kernel that spins on a flag in mapped pinned memory) so that
// work enqueued after it stays pending while the test looks. The destructor opens it and waits
// for the stream, so a failed check never leaves the stream held. The host must not synchronise
// with the device while the gate is closed (that would wait for ever: Watchdog reports it).
class StreamGate {
 public:
  explicit StreamGate(void* stream) : stream_(static_cast<cudaStream_t>(stream)) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, sizeof(int), cudaHostAllocMapped) != cudaSuccess)
      throw std::runtime_error("StreamGate: cudaHostAlloc failed");
    flag_ = static_cast<int*>(p);
    *flag_ = 0;
    void* d = nullptr;
    if (cudaHostGetDevicePointer(&d, flag_, 0) != cudaSuccess ||
        launch_stream_gate(stream_, static_cast<const int*>(d)) != cudaSuccess) {
      cudaFreeHost(flag_);
      throw std::runtime_error("StreamGate: could not hold the stream");
    }
  }
  ~StreamGate() {
    open();
    cudaStreamSynchronize(stream_);
    cudaFreeHost(flag_);
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  void open() { __atomic_store_n(flag_, 1, __ATOMIC_SEQ_CST); }

 private:
  cudaStream_t stream_;
  int* flag_ = nullptr;
};

// Ends the process with a message if a test has not finished a stage within `seconds`: a GPU
// test that waits for ever reports where, instead of running into ctest's timeout silently.
class Watchdog {
 public:
  Watchdog(const char* what, double seconds)
      : what_(what), thread_([this, seconds] {
          std::unique_lock<std::mutex> lk(mu_);
          if (!cv_.wait_for(lk, std::chrono::duration<double>(seconds), [this] { return done_; })) {
            std::fprintf(stderr, "%s: not done after %.0f s, at '%s': a hang; exiting\n", what_,
                         seconds, stage_.load());
            std::fflush(stderr);
            std::_Exit(3);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void at(const char* stage) { stage_.store(stage); }

 private:
  const char* what_;
  std::atomic<const char*> stage_{"start"};
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Seeded payload: f32 in [-1, 1), or bf16 (rounded from such f32) as raw bytes.
inline std::vector<uint8_t> payload(size_t count, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint8_t> out(count * dtype_size(dt));
  for (size_t i = 0; i < count; ++i) {
    const float f = u(rng);
    if (dt == DType::F32) {
      std::memcpy(out.data() + 4 * i, &f, 4);
    } else {
      const uint16_t h = f32_to_bf16(f);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// One collective to compare across groups.
struct Case {
  CollKind kind;
  DType dt;
  ReduceOp op = ReduceOp::Sum;
  bool in_place = false;
  int root = 0;
  std::string name() const {
    std::string s = std::string(coll_name(kind)) + "/" + dtype_name(dt);
    if (kind == CollKind::ReduceScatter || kind == CollKind::AllReduce)
      s += std::string("/") + reduce_op_name(op);
    if (kind == CollKind::Broadcast) s += "/root" + std::to_string(root);
    return s + (in_place ? "/in-place" : "");
  }
};

inline std::vector<Case> all_cases(int size) {
  std::vector<Case> cs;
  for (DType dt : {DType::F32, DType::BF16})
    for (bool ip : {false, true}) {
      cs.push_back({CollKind::AllGather, dt, ReduceOp::Sum, ip});
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        cs.push_back({CollKind::ReduceScatter, dt, op, ip});
        cs.push_back({CollKind::AllReduce, dt, op, ip});
      }
    }
  for (DType dt : {DType::F32, DType::BF16})
    for (int root = 0; root < size; ++root) cs.push_back({CollKind::Broadcast, dt, {}, true, root});
  return cs;
}

// Runs `c` on `g` with this rank's input `in` (size*count elements for reduce-scatter,
// count otherwise) and returns the output bytes. `on_device`: the buffers are on gpu(), else
// host memory. `work` (if given) receives the Work before it is waited for.
inline std::vector<uint8_t> run_case(Group& g, const Case& c, const std::vector<uint8_t>& in,
                                     int64_t count, bool on_device, Work* work = nullptr) {
  const size_t es = dtype_size(c.dt), n = static_cast<size_t>(count) * es;
  const size_t P = static_cast<size_t>(g.size()), r = static_cast<size_t>(g.rank());
  // One buffer holding input and output as the case lays them out.
  size_t total = 0, send_off = 0, recv_off = 0, out_bytes = 0;
  switch (c.kind) {
    case CollKind::AllGather:
      out_bytes = n * P;
      total = c.in_place ? n * P : n + n * P;
      send_off = c.in_place ? r * n : 0;
      recv_off = c.in_place ? 0 : n;
      break;
    case CollKind::ReduceScatter:
      out_bytes = n;
      total = c.in_place ? n * P : n * P + n;
      send_off = 0;
      recv_off = c.in_place ? r * n : n * P;
      break;
    case CollKind::AllReduce:
      out_bytes = n;
      total = c.in_place ? n : 2 * n;
      send_off = 0;
      recv_off = c.in_place ? 0 : n;
      break;
    default:  // broadcast: in place
      out_bytes = n;
      total = n;
      break;
  }
  std::vector<uint8_t> host(total, 0xAB);
  std::memcpy(host.data() + send_off, in.data(), in.size());
  Buffer dev;
  uint8_t* base = host.data();
  if (on_device) {
    dev = upload(host);
    base = dev.as<uint8_t>();
  }
  Work w;
  switch (c.kind) {
    case CollKind::AllGather:
      w = g.issue_all_gather(base + send_off, base + recv_off, count, c.dt);
      break;
    case CollKind::ReduceScatter:
      w = g.issue_reduce_scatter(base + send_off, base + recv_off, count, c.op, c.dt);
      break;
    case CollKind::AllReduce:
      w = g.issue_all_reduce(base + send_off, base + recv_off, count, c.op, c.dt);
      break;
    default: w = g.issue_broadcast(base, count, c.root, c.dt); break;
  }
  if (work) *work = w;
  w.wait();
  if (on_device) return download(base + recv_off, out_bytes);
  return std::vector<uint8_t>(host.begin() + static_cast<long>(recv_off),
                              host.begin() + static_cast<long>(recv_off + out_bytes));
}

// Largest difference in units of the last place between two payloads (bf16: the raw 16-bit
// patterns of same-sign values; f32: 0 when bitwise equal, else a large number).
inline int64_t max_ulps(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, DType dt) {
  if (a.size() != b.size()) return INT64_MAX;
  if (dt == DType::F32) return a == b ? 0 : INT64_MAX;
  int64_t m = 0;
  for (size_t i = 0; i + 1 < a.size(); i += 2) {
    uint16_t x, y;
    std::memcpy(&x, a.data() + i, 2);
    std::memcpy(&y, b.data() + i, 2);
    if ((x ^ y) & 0x8000) {
      if ((x & 0x7fff) == 0 && (y & 0x7fff) == 0) continue;  // +0 / -0
      return INT64_MAX;
    }
    m = std::max<int64_t>(m, std::abs(static_cast<int>(x) - static_cast<int>(y)));
  }
  return m;
}

}  // namespace sw::test
