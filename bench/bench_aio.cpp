// The async I/O engine (offload/aio.h) against fio on the same disk, same block size, queue
// depth and kind of engine, alternating engine / fio, sequential write then read, N reps.
//
//   bench_aio DIR   (bench/aio_vs_fio.sh wraps it)
//   bench_aio --backend   prints the backend the environment's settings get here, and why
// Environment: AIO_BENCH_BYTES (file size, default 2GiB), AIO_BLOCK (1MiB), AIO_QD (8),
// AIO_BACKEND (auto | io_uring | threads), AIO_THREADS (thread backend, 1), AIO_DIRECT (1),
// AIO_REPS (7), AIO_CHUNK (bytes per engine request, 64MiB), AIO_INFLIGHT (requests in flight, 2;
// each with its own buffer when reading: 2 x 64MiB of buffers reused, as fio reuses its queue
// depth x block size. On the Firecracker VM of 2026-11-26 the engine read about 2x faster into
// 2 x 1GiB buffers (each byte written once) than into 2 x 64MiB reused ones, with its ring at
// the queue depth at every completion in both: the reuse, not the engine, set the difference).
// Reported: every repetition, then the medians of each side's bandwidth and their ratio (the
// figure compared with the >= 0.90 target), and the median of the per-repetition ratios.
//
// Writes include an fdatasync (fio: --end_fsync=1), files are created fresh each repetition
// (fio lays its file out with fallocate, AioFile::create too). Both read the same file (fio's,
// written last): a VM's disk is cached by its host, and a file written more recently reads
// faster there, whoever reads it. Before each read the file's pages are dropped with
// posix_fadvise(DONTNEED) (fio: invalidate=1, its default), the only cache drop a container
// allows. The order alternates: odd repetitions the engine first, even ones fio. fio's figure is its own bw_bytes (its process start and file
// layout are not counted), the engine's is bytes over the wall time of the loop (its file is
// created and fallocate'd before the clock starts, its buffers touched once beforehand).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/error.h"
#include "offload/aio.h"

using namespace sw;

namespace {

std::string env(const char* k, const char* def) {
  const char* v = std::getenv(k);
  return v && *v ? v : def;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string run(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) fail("bench_aio", "cannot run: " + cmd);
  std::string out;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = ::pclose(p);
  if (rc != 0) fail("bench_aio", "fio failed (status " + std::to_string(rc) + "): " + cmd + "\n" + out);
  return out;
}

// fio's bandwidth in bytes/s of one sequential job.
double fio_bw(const std::string& args, bool write) {
  const std::string out = run("fio --output-format=json " + args);
  const auto j = nlohmann::json::parse(out.substr(out.find('{')));
  return j.at("jobs").at(0).at(write ? "write" : "read").at("bw_bytes").get<double>();
}

}  // namespace

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: bench_aio DIR | --backend (environment: see bench/bench_aio.cpp)\n");
    return 2;
  }
  const std::string dir = argv[1];
  const size_t bytes = parse_bytes(env("AIO_BENCH_BYTES", "2GiB"));
  const size_t chunk = parse_bytes(env("AIO_CHUNK", "64MiB"));
  const int reps = std::atoi(env("AIO_REPS", "7").c_str());
  const size_t depth = size_t(std::max(1, std::atoi(env("AIO_INFLIGHT", "2").c_str())));
  nlohmann::json jc = {{"block_size", env("AIO_BLOCK", "1MiB")},
                       {"queue_depth", std::atoi(env("AIO_QD", "8").c_str())},
                       {"intra_op_parallelism", std::atoi(env("AIO_THREADS", "1").c_str())},
                       {"backend", env("AIO_BACKEND", "auto")},
                       {"o_direct", env("AIO_DIRECT", "1") != "0"}};
  const AioConfig cfg = AioConfig::from_json(jc, "AIO_*");
  if (dir == "--backend") {
    AioHandle probe(cfg);
    std::printf("%s%s\n", probe.backend_name(),
                probe.fallback_reason().empty() ? "" : (" (" + probe.fallback_reason() + ")").c_str());
    return 0;
  }
  if (bytes % chunk != 0 || chunk % cfg.block_size != 0)
    fail("bench_aio", "AIO_BENCH_BYTES must be a multiple of AIO_CHUNK, and AIO_CHUNK of AIO_BLOCK");
  AioHandle h(cfg);
  const std::string fe = dir + "/bench_aio.engine", ff = dir + "/bench_aio.fio";

  // Which I/O mode the disk gives the engine; fio gets the same.
  bool direct;
  std::string mode;
  {
    AioFile probe = AioFile::create(fe, 0, cfg.o_direct, true);
    direct = probe.direct();
    mode = probe.io_mode();
  }
  const bool uring = std::string(h.backend_name()) == "io_uring";
  const int threads = cfg.intra_op_parallelism;
  std::string fio_common = "--name=seq --filename=" + ff + " --bs=" + std::to_string(cfg.block_size) +
                           " --direct=" + (direct ? "1" : "0");
  if (uring) {
    fio_common += " --ioengine=io_uring --iodepth=" + std::to_string(cfg.queue_depth);
  } else {
    // One pread/pwrite at a time per thread: psync, one job per engine thread over its slice.
    fio_common += " --ioengine=psync --iodepth=1 --numjobs=" + std::to_string(threads) +
                  " --group_reporting --offset_increment=" + std::to_string(bytes / threads);
  }
  const std::string fio_size = " --size=" + std::to_string(uring ? bytes : bytes / threads);

  std::printf("bench_aio: %s in %s, block %s, queue depth %d, backend %s%s, %s, chunk %s x%zu in flight\n",
              format_bytes(bytes).c_str(), dir.c_str(), format_bytes(cfg.block_size).c_str(),
              cfg.queue_depth, h.backend_name(),
              uring ? "" : (" (" + std::to_string(threads) + " threads; " + h.fallback_reason() + ")").c_str(),
              mode.c_str(), format_bytes(chunk).c_str(), depth);
  std::printf("fio: fio %s%s\n", fio_common.c_str(), fio_size.c_str());
  std::printf("%-4s %-6s %12s %12s %11s\n", "rep", "op", "engine GB/s", "fio GB/s", "engine/fio");
  std::fflush(stdout);

  StagingBuffer src = aligned_staging(chunk);
  std::vector<StagingBuffer> dst;
  for (size_t i = 0; i < depth; ++i) dst.push_back(aligned_staging(chunk));
  for (auto& d : dst) std::memset(d.data(), 0, chunk);  // no first-touch faults in the timing
  {
    std::mt19937_64 rng(1);
    for (size_t i = 0; i < chunk / 8; ++i) src.as<uint64_t>()[i] = rng();
  }
  const size_t nchunks = bytes / chunk;
  auto engine_write = [&] {
    ::unlink(fe.c_str());
    AioFile f = AioFile::create(fe, bytes, cfg.o_direct);  // layout untimed, as fio's
    const double t0 = now_s();
    std::vector<AioRequest> inflight(depth);
    for (size_t k = 0; k < nchunks; ++k) {
      if (inflight[k % depth].valid()) inflight[k % depth].synchronize();
      inflight[k % depth] = h.write(f, src.data(), chunk, off_t(k * chunk));
    }
    for (auto& r : inflight)
      if (r.valid()) r.synchronize();
    if (::fdatasync(f.fd()) != 0) fail("bench_aio", fe + ": fdatasync: " + std::strerror(errno));
    return double(bytes) / (now_s() - t0);
  };
  auto fio_write = [&] {
    ::unlink(ff.c_str());
    return fio_bw(fio_common + fio_size + " --rw=write --end_fsync=1", true);
  };
  // Both read fio's file (same extents, same cache state on the host below the VM).
  auto engine_read = [&] {
    AioFile f = AioFile::open(ff, false, cfg.o_direct);
    ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
    const double t0 = now_s();
    std::vector<AioRequest> inflight(depth);
    for (size_t k = 0; k < nchunks; ++k) {
      if (inflight[k % depth].valid()) inflight[k % depth].synchronize();
      inflight[k % depth] = h.read(f, dst[k % depth].data(), chunk, off_t(k * chunk));
    }
    for (auto& r : inflight)
      if (r.valid()) r.synchronize();
    const double bw = double(bytes) / (now_s() - t0);
    // fio's buffers are not ours: check only that something was read.
    if (f.fd() < 0) fail("bench_aio", "no file");
    return bw;
  };
  auto fio_read = [&] { return fio_bw(fio_common + fio_size + " --rw=read --invalidate=1", false); };

  std::vector<double> ratios, ew_all, fw_all, er_all, fr_all, wr, rr;
  for (int rep = 1; rep <= reps; ++rep) {
    // Alternate who goes first: odd repetitions the engine, even ones fio.
    const bool engine_first = rep % 2 == 1;
    double ew, fw, er, fr;
    if (engine_first) ew = engine_write(), fw = fio_write();
    else fw = fio_write(), ew = engine_write();
    std::printf("%-4d %-6s %12.3f %12.3f %11.3f  (%s first)\n", rep, "write", ew / 1e9, fw / 1e9,
                ew / fw, engine_first ? "engine" : "fio");
    std::fflush(stdout);
    ratios.push_back(ew / fw);
    ew_all.push_back(ew), fw_all.push_back(fw), wr.push_back(ew / fw);
    if (engine_first) er = engine_read(), fr = fio_read();
    else fr = fio_read(), er = engine_read();
    std::printf("%-4d %-6s %12.3f %12.3f %11.3f  (%s first)\n", rep, "read", er / 1e9, fr / 1e9,
                er / fr, engine_first ? "engine" : "fio");
    std::fflush(stdout);
    ratios.push_back(er / fr);
    er_all.push_back(er), fr_all.push_back(fr), rr.push_back(er / fr);
  }
  ::unlink(fe.c_str());
  ::unlink(ff.c_str());
  double lo = 1e9;
  for (double r : ratios) lo = std::min(lo, r);
  const double mew = median(ew_all), mfw = median(fw_all), mer = median(er_all), mfr = median(fr_all);
  std::printf("median of %d: write engine %.3f GB/s, fio %.3f GB/s, ratio %.3f (median of the "
              "per-repetition ratios %.3f)\n", reps, mew / 1e9, mfw / 1e9, mew / mfw, median(wr));
  std::printf("median of %d: read  engine %.3f GB/s, fio %.3f GB/s, ratio %.3f (median of the "
              "per-repetition ratios %.3f)\n", reps, mer / 1e9, mfr / 1e9, mer / mfr, median(rr));
  std::printf("target: engine >= 0.90 x fio for both (medians): write %s, read %s; lowest single "
              "repetition %.3f\n", mew / mfw >= 0.9 ? "met" : "NOT met",
              mer / mfr >= 0.9 ? "met" : "NOT met", lo);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
