#include "planner/calibrate.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "offload/aio.h"
#include "sharding/comm/p2p.h"
#include "sharding/wrap.h"

namespace sw {

namespace {

// Seconds per call of f: one warm-up call, then repetitions until min_s has passed (at least
// 3); the median repetition: on a quiet machine it is the fastest one, on a shared machine it
// is the rate a training step sees, which the fastest (a moment the others were idle) is not.
template <class F>
double time_it(F&& f, double min_s) {
  f();
  std::vector<double> ts;
  double total = 0;
  while (ts.size() < 3 || total < min_s) {
    const double t0 = trace_now();
    f();
    ts.push_back(trace_now() - t0);
    total += ts.back();
    if (ts.size() >= 200) break;
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

std::vector<float> filled(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (float& x : v) x = d(rng);
  return v;
}

void say(const CalibrateOptions& o, const std::string& s) {
  if (o.log) o.log(s);
}

std::string fmt(const char* f, double a, double b = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

// v in the 16-bit form of dt (narrow's bits).
std::vector<uint16_t> narrowed(const Ops& ops, DType dt, const std::vector<float>& v) {
  std::vector<uint16_t> r(v.size());
  ops.narrow(dt, v.data(), r.data(), v.size());
  return r;
}

// One product of the step in 16-bit compute, as the step runs it: a linear op with the
// activations in the compute precision and the weight in both forms (a unit's rounded fp32
// copy and its 16-bit one), rather than gemm() on fp32 operands, which rounds them on every
// call (on the CPU's bf16 path the step's products read the 16-bit forms in place: the small
// GPT-2's weight gradients ran 1.5-2x faster than gemm() measured them, and the plan's step
// came out ~30% long). Shapes: x @ w^T (!ta, tb) is linear_forward; dy @ w (!ta, !tb) the
// input gradient; dy^T @ x (ta, !tb) the weight gradient (A^T B^T, which no step has, is
// not one). A (and B, as the activation of the weight gradient) 16-bit; B as the weight in
// both forms.
void product16(const Ops& ops, const CostOp& g, const float* B, const uint16_t* A16,
               const uint16_t* B16, float* C) {
  const int M = int(g.m), N = int(g.n), K = int(g.k);
  if (!g.ta && g.tb)
    ops.linear_forward(C, A16, Operand(B, B16), nullptr, nullptr, M, K, N);
  else if (!g.ta)
    ops.linear_backward(GradIn::set(C), nullptr, nullptr, A16, nullptr, Operand(B, B16), M, N,
                        K);
  else
    ops.linear_backward(nullptr, GradOut(C, true), nullptr, A16, B16, nullptr, K, N, M);
}

// after(dt): called once each precision's products were measured (bf16 first: its kernels
// leave OpenBLAS's buffers untouched, so the process's resident set can be read for each).
void measure_compute(const CalibrateOptions& opt, HardwareProfile& hw,
                     const std::function<void(DType)>& after) {
  const CalibrationShapes& sh = opt.shapes;
  std::vector<DType> dts;
  if (opt.bf16) dts.push_back(DType::BF16);
  dts.push_back(DType::F32);
  for (DType dt : dts) {
    const Ops& ops = ops_for(Device::cpu(), dt);
    double flops = 0, secs = 0;
    for (const CostOp& g : sh.gemms) {
      const int M = int(g.m), N = int(g.n), K = int(g.k);
      const std::vector<float> A = filled(size_t(M) * K, 1), B = filled(size_t(K) * N, 2);
      std::vector<float> C(size_t(M) * N, 0.f);
      const int lda = g.ta ? M : K, ldb = g.tb ? K : N;
      const bool lp = dt != DType::F32 && !(g.ta && g.tb);  // (A^T B^T: gemm, as fp32)
      const std::vector<uint16_t> A16 = lp ? narrowed(ops, dt, A) : std::vector<uint16_t>{},
                                  B16 = lp ? narrowed(ops, dt, B) : std::vector<uint16_t>{};
      const double t = time_it([&] {
        if (lp)
          product16(ops, g, B.data(), A16.data(), B16.data(), C.data());
        else
          ops.gemm(g.ta, g.tb, M, N, K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C.data(), N);
      }, opt.min_seconds);
      const double f = 2.0 * M * N * K;
      hw.gemm_shapes.push_back({g.m, g.n, g.k, g.ta, g.tb, dt, f / t});
      flops += f, secs += t;
      say(opt, std::string("  gemm ") + dtype_name(dt) + " " + std::to_string(M) + "x" +
                   std::to_string(N) + "x" + std::to_string(K) + (g.ta ? " (A^T)" : "") +
                   (g.tb ? " (B^T)" : "") + fmt(": %.1f GFLOP/s", f / t / 1e9));
    }
    const double rate = secs > 0 ? flops / secs : 0;
    (dt == DType::F32 ? hw.gemm_f32 : hw.gemm_bf16) = rate;
    // Attention forward + backward at the model's shape (the time model's flop count).
    {
      const int B = sh.B, T = sh.T, H = sh.H, KVH = sh.KVH, hd = sh.hd;
      const size_t qkv_n = size_t(B) * T * (H + 2 * KVH) * hd, out_n = size_t(B) * T * H * hd;
      const std::vector<float> qkv = filled(qkv_n, 3), dout = filled(out_n, 4);
      std::vector<float> out(out_n), lse(size_t(B) * H * T), dqkv(qkv_n);
      double tf = 0, tb = 0;
      if (dt == DType::F32) {
        tf = time_it([&] {
          ops.attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KVH, hd);
        }, opt.min_seconds);
        tb = time_it([&] {
          ops.attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B,
                                 T, H, KVH, hd);
        }, opt.min_seconds);
      } else {  // as the step: qkv, out, dout and dqkv in the compute precision
        const std::vector<uint16_t> qkv16 = narrowed(ops, dt, qkv),
                                    dout16 = narrowed(ops, dt, dout);
        std::vector<uint16_t> out16(out_n), dqkv16(qkv_n);
        tf = time_it([&] {
          ops.attention_forward(out16.data(), lse.data(), qkv16.data(), B, T, H, KVH, hd);
        }, opt.min_seconds);
        tb = time_it([&] {
          ops.attention_backward(GradIn::set(nullptr, dqkv16.data()), dout16.data(), qkv16.data(),
                                 out16.data(), lse.data(), B, T, H, KVH, hd);
        }, opt.min_seconds);
      }
      const double att = 2.0 * B * H * double(T) * T * hd;
      const double r = 3.5 * att / (tf + tb);
      (dt == DType::F32 ? hw.attention_f32 : hw.attention_bf16) = r;
      say(opt, std::string("  attention ") + dtype_name(dt) + fmt(": %.1f GFLOP/s", r / 1e9));
    }
    // The fused LM head with its gradients (6 N V C flops).
    {
      const int N = int(sh.lm_N), C = int(sh.lm_C), V = int(sh.lm_V);
      const std::vector<float> x = filled(static_cast<size_t>(N) * C, 5), w = filled(static_cast<size_t>(V) * C, 6);
      std::vector<float> loss(static_cast<size_t>(N)), dx(static_cast<size_t>(N) * C), dw(static_cast<size_t>(V) * C);
      std::vector<int32_t> tg(static_cast<size_t>(N));
      for (int i = 0; i < N; ++i) tg[size_t(i)] = int32_t((i * 7919) % V);
      // The weight in both forms where the step's head has them (16-bit compute).
      const std::vector<uint16_t> w16 =
          dt != DType::F32 ? narrowed(ops, dt, w) : std::vector<uint16_t>{};
      const Operand wo = w16.empty() ? Operand(w.data()) : Operand(w.data(), w16.data());
      const double t = time_it([&] {
        ops.lmhead_xent(loss.data(), dx.data(), dw.data(), x.data(), wo, tg.data(), N, C, V, 1.f);
      }, opt.min_seconds);
      const double r = 6.0 * N * double(V) * C / t;
      (dt == DType::F32 ? hw.lmhead_f32 : hw.lmhead_bf16) = r;
      say(opt, std::string("  lm head ") + dtype_name(dt) + fmt(": %.1f GFLOP/s", r / 1e9));
    }
    after(dt);
  }
  // The profile lists fp32 shapes first, as before bf16 was measured first.
  std::stable_partition(hw.gemm_shapes.begin(), hw.gemm_shapes.end(),
                        [](const GemmPoint& g) { return g.dtype == DType::F32; });
  const Ops& ops = ops_for(Device::cpu());
  {  // element-wise: a LayerNorm over (N, C) and a GELU over (N, 4C), bytes read + written
    const int N = int(sh.N), C = int(sh.C);
    const std::vector<float> x = filled(static_cast<size_t>(N) * C * 4, 7), w = filled(size_t(C), 8);
    std::vector<float> y(static_cast<size_t>(N) * C * 4), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    const double t = time_it([&] {
      ops.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), N, C);
      ops.gelu_forward(y.data(), x.data(), static_cast<size_t>(N) * C * 4);
    }, opt.min_seconds);
    hw.elementwise_bps = (2.0 * N * C + 8.0 * N * C) * 4 / t;
    say(opt, fmt("  element-wise: %.1f GB/s", hw.elementwise_bps / 1e9));
  }
  {  // AdamW over a unit-sized shard (16M floats: 256 MiB of parameter, gradient and moments)
    const size_t n = size_t{16} << 20;
    std::vector<float> p = filled(n, 9), g = filled(n, 10), m(n, 0.f), v(n, 0.f);
    const double t = time_it([&] { ops.adamw(p.data(), g.data(), m.data(), v.data(), n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.f); },
                             opt.min_seconds);
    hw.optimizer_fps = double(n) / t;
    say(opt, fmt("  AdamW: %.2f G floats/s", hw.optimizer_fps / 1e9));
  }
  {  // copies (activation offload to the host tier, local gathers)
    const size_t n = size_t{16} << 20;
    const std::vector<float> a = filled(n, 11);
    std::vector<float> b(n);
    const double t = time_it([&] { ops.copy(b.data(), a.data(), n); }, opt.min_seconds);
    hw.memcpy_bps = 8.0 * double(n) / t;
    say(opt, fmt("  copy: %.1f GB/s", hw.memcpy_bps / 1e9));
  }
}

// One collective kind at several sizes: the fastest of a few timed repetitions each (a
// barrier before each, so every rank starts together).
CollectiveFit measure_collective(Group& g, CollKind kind, const CalibrateOptions& opt) {
  CollectiveFit f;
  const int n = g.size();
  const std::vector<int64_t> sizes = {int64_t{64} << 10, int64_t{1} << 20, int64_t{8} << 20,
                                      int64_t{32} << 20};
  std::vector<float> send(size_t(sizes.back() / 4)), recv(size_t(sizes.back() / 4));
  for (int64_t bytes : sizes) {
    const int64_t total = bytes / 4 / n * n;  // floats of the whole buffer
    double best = 1e300;
    for (int r = 0; r < 5; ++r) {
      g.barrier();
      const double t0 = trace_now();
      switch (kind) {
        case CollKind::AllGather:
          g.all_gather(send.data(), recv.data(), total / n);
          break;
        case CollKind::ReduceScatter:
          g.reduce_scatter(send.data(), recv.data(), total / n, ReduceOp::Avg);
          break;
        default:
          g.all_reduce(send.data(), recv.data(), total, ReduceOp::Avg);
      }
      const double dt = trace_now() - t0;
      if (r > 0) best = std::min(best, dt);
    }
    f.points.push_back({total * 4, best});
  }
  // latency: the smallest message's time less its bytes at the largest's bandwidth
  const bool ar = kind == CollKind::AllReduce;
  auto bus = [&](int64_t b) { return double(b) * (n - 1) / n * (ar ? 2.0 : 1.0); };
  const CollectivePoint& lo = f.points.front();
  const CollectivePoint& hi = f.points.back();
  f.busbw = (bus(hi.bytes) - bus(lo.bytes)) / std::max(1e-9, hi.time_s - lo.time_s);
  if (!(f.busbw > 0)) f.busbw = bus(hi.bytes) / hi.time_s;
  f.latency_s = std::max(0.0, lo.time_s - bus(lo.bytes) / f.busbw);
  say(opt, std::string("  ") + coll_name(kind) + fmt(": latency %.1f us, busbw %.2f GB/s",
                                                      f.latency_s * 1e6, f.busbw / 1e9));
  return f;
}

// Point-to-point messages between pipeline stages (hardware.h "collectives.p2p"): ranks in
// pairs (0-1, 2-3, ...) bounce a message of each size; half the fastest round trip of a few.
void measure_p2p(Group& g, const CalibrateOptions& opt, HardwareProfile& hw) {
  const PeerCommPtr pc = make_peer_comm(g, "calibrate");
  const int r = g.rank(), peer = r ^ 1;
  const bool paired = peer < g.size();
  const std::vector<int64_t> sizes = {int64_t{64} << 10, int64_t{8} << 20};
  std::vector<char> buf(size_t(sizes.back()));
  std::vector<double> t(sizes.size(), 1e300);
  int tag = 0;
  for (size_t k = 0; k < sizes.size(); ++k)
    for (int rep = 0; rep < 5; ++rep) {
      g.barrier();
      if (!paired) continue;
      const double t0 = trace_now();
      if (r % 2 == 0) {
        pc->send(buf.data(), sizes[k], peer, tag).wait();
        pc->recv(buf.data(), sizes[k], peer, tag + 1).wait();
      } else {
        pc->recv(buf.data(), sizes[k], peer, tag).wait();
        pc->send(buf.data(), sizes[k], peer, tag + 1).wait();
      }
      if (rep > 0) t[k] = std::min(t[k], (trace_now() - t0) / 2);
      tag += 2;
    }
  g.barrier();
  if (!paired) return;
  hw.p2p_bps = double(sizes[1] - sizes[0]) / std::max(1e-9, t[1] - t[0]);
  if (!(hw.p2p_bps > 0)) hw.p2p_bps = double(sizes[1]) / t[1];
  hw.p2p_latency_s = std::max(0.0, t[0] - double(sizes[0]) / hw.p2p_bps);
  say(opt, fmt("  p2p: latency %.1f us, %.2f GB/s", hw.p2p_latency_s * 1e6, hw.p2p_bps / 1e9));
}

void measure_disk(const CalibrateOptions& opt, int rank, HardwareProfile& hw) {
  hw.disk_path = opt.disk_path;
  const std::string path = opt.disk_path + "/.shardwise_calibrate_" + std::to_string(getpid()) +
                           "_" + std::to_string(rank);
  const size_t piece = size_t{8} << 20;
  const int64_t total = std::max<int64_t>(int64_t(piece), opt.disk_bytes / int64_t(piece) * int64_t(piece));
  AioFile f = AioFile::create(path, uint64_t(total), true, /*temp=*/true);
  AioHandle h;
  StagingBuffer buf = aligned_staging(piece, Mem::Workspace, Tier::Host);
  std::fill(buf.as<char>(), buf.as<char>() + piece, 'x');
  auto pass = [&](bool write) {
    std::vector<AioRequest> rs;
    const double t0 = trace_now();
    for (int64_t off = 0; off < total; off += int64_t(piece))
      rs.push_back(write ? h.write(f, buf.data(), piece, off) : h.read(f, buf.data(), piece, off));
    for (AioRequest& r : rs) r.synchronize();
    if (write) ::fdatasync(f.fd());
    return trace_now() - t0;
  };
  pass(true);  // first touch of the reserved blocks
  const double tw = std::min(pass(true), pass(true));
  const double tr = std::min(pass(false), pass(false));
  hw.disk_write_bps = double(total) / tw;
  hw.disk_read_bps = double(total) / tr;
  // Latency: the median of 20 reads and 20 writes of 4 KiB at scattered offsets (the fastest
  // would be one the host's cache answered; the plan's small transfers see the typical one).
  std::vector<double> lats;
  for (int i = 0; i < 40; ++i) {
    const off_t off = off_t(kAioAlign) * ((i * 7919) % (total / int64_t(kAioAlign)));
    const double t0 = trace_now();
    (i % 2 ? h.write(f, buf.data(), kAioAlign, off) : h.read(f, buf.data(), kAioAlign, off)).synchronize();
    lats.push_back(trace_now() - t0);
  }
  std::nth_element(lats.begin(), lats.begin() + 20, lats.end());
  const double lat = lats[20];
  hw.disk_latency_s = lat;
  say(opt, std::string("  disk ") + opt.disk_path + " (" + h.backend_name() + ", " + f.io_mode() +
               fmt("): read %.2f GB/s, write %.2f GB/s", hw.disk_read_bps / 1e9, hw.disk_write_bps / 1e9) +
               fmt(", 4 KiB read or write %.0f us (median)", lat * 1e6));
}

}  // namespace

CalibrationShapes calibration_shapes(const Model* model, const PlanInput* in) {
  CalibrationShapes s;
  if (!model || !in) {
    ModelConfig mc;
    mc.vocab_size = 50304, mc.n_layer = 1, mc.n_head = 12, mc.d_model = 768, mc.seq_len = 256;
    Model m = build_model(mc);
    ShardingPolicy p;
    PlanInput pi = make_plan_input(m, p, 1);
    pi.B = 4, pi.T = 256;
    return calibration_shapes(&m, &pi);
  }
  const TimeInputs ti = time_inputs(*model, *in);
  std::set<std::tuple<int64_t, int64_t, int64_t, bool, bool>> seen;
  for (const CallCost& c : ti.calls)
    for (const auto* v : {&c.fwd, &c.bwd})
      for (const CostOp& o : *v)
        if (o.kind == CostOp::Gemm && seen.insert({o.m, o.n, o.k, o.ta, o.tb}).second)
          s.gemms.push_back(o);
  const ModelConfig& mc = model->config;
  s.B = in->B, s.T = in->T, s.H = mc.n_head;
  s.KVH = mc.type == "llama" && mc.n_kv_head > 0 ? mc.n_kv_head : mc.n_head;
  s.hd = mc.d_model / mc.n_head;
  s.lm_N = int64_t(in->B) * in->T, s.lm_C = mc.d_model, s.lm_V = mc.vocab_size;
  s.N = s.lm_N, s.C = mc.d_model;
  return s;
}

int64_t resident_bytes() {
  int64_t r = -1;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    long size = 0, resident = 0;
    if (std::fscanf(f, "%ld %ld", &size, &resident) == 2)
      r = static_cast<int64_t>(resident) * ::sysconf(_SC_PAGESIZE);
    std::fclose(f);
  }
  return r;
}

// The resident set once every cached block and glibc's free heap went back to the OS, less
// what the allocator still holds (thread-local kernel workspaces): the binary and libraries,
// OpenBLAS's and OpenMP's per-thread buffers and stacks as the GEMMs so far touched them,
// MPI's shared-memory segments, glibc's heap in use.
int64_t untracked_rss() {
  release_cached();
  ::malloc_trim(0);  // the calibration's operands are std::vectors
  int64_t held = 0;
  for (size_t t = 0; t < static_cast<size_t>(Tier::Count); ++t)
    held += static_cast<int64_t>(MemTracker::of(static_cast<Tier>(t)).reserved());
  const int64_t rss = resident_bytes();
  return rss > held ? rss - held : -1;
}

HardwareProfile calibrate(const CalibrateOptions& opt, Group* world) {
  HardwareProfile hw;
  const int n = world ? world->size() : 1;
  const int rank = world ? world->rank() : 0;
  hw.world_size = n;
  hw.threads = num_threads();
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  hw.name = std::string(host) + ", " + std::to_string(n) + " rank" + (n == 1 ? "" : "s") + " x " +
            std::to_string(hw.threads) + " thread" + (hw.threads == 1 ? "" : "s");
  hw.source = "shardwise plan --calibrate (measured)";
  say(opt, "compute (every rank at once, " + std::to_string(hw.threads) + " threads each):");
  // The process without tensors, for the RSS prediction (hardware.h "process"): read after
  // each precision's products (bf16 first), and after the collectives (MPI's shared memory).
  int64_t rss_bf16 = -1, rss_f32 = -1;
  measure_compute(opt, hw, [&](DType dt) { (dt == DType::F32 ? rss_f32 : rss_bf16) = untracked_rss(); });
  if (world && n > 1) {
    say(opt, "collectives over " + std::to_string(n) + " ranks (the engine's MPI group):");
    hw.has_collectives = true;
    hw.separate_streams = false;  // one communication thread per group on the CPU backend
    hw.all_gather = measure_collective(*world, CollKind::AllGather, opt);
    hw.reduce_scatter = measure_collective(*world, CollKind::ReduceScatter, opt);
    hw.all_reduce = measure_collective(*world, CollKind::AllReduce, opt);
    measure_p2p(*world, opt, hw);
  }
  say(opt, "disk (every rank at once, " + std::to_string(opt.disk_bytes >> 20) + " MiB each):");
  measure_disk(opt, rank, hw);
  if (world && n > 1) world->barrier();
  // The resident set less what the tracker holds undercounts where held buffers are not all
  // touched: after the collectives and the disk, 20 MB held of which ~8 MB resident (a tiny
  // Llama's 2 ranks, 2026-11-30: 20.0 MiB read here, 27.6 after the products, ~27 in its
  // training). Pages the libraries and threads touched stay resident, so the untracked part
  // only grows: the larger of the two reads.
  const int64_t rss_all = std::max(untracked_rss(), rss_f32);
  if (rss_all > 0 && rss_f32 > 0) {
    hw.baseline_rss_bytes = static_cast<double>(rss_all);
    if (rss_bf16 > 0) hw.baseline_rss_bf16_bytes = static_cast<double>(rss_bf16 + rss_all - rss_f32);
    char line[128];
    std::snprintf(line, sizeof line,
                  "  process baseline (RSS without tensors): %.1f MiB (bf16 compute: %.1f MiB)",
                  hw.baseline_rss_bytes / (1024.0 * 1024.0), hw.baseline_rss_bf16_bytes / (1024.0 * 1024.0));
    say(opt, line);
  }
  return hw;
}

}  // namespace sw
