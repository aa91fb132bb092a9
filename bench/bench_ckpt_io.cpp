// Checkpoint I/O against the disk's own sequential bandwidth, measured in the same run.
//
//   bench_ckpt_io [DIR] [--small]
//
// 1. Disk: writes one file of the checkpoint's size in 8 MiB write() calls and fsyncs it (what
//    `dd bs=8M conv=fsync` measures); then evicts its pages with posix_fadvise(DONTNEED)
//    (dropping caches globally is impossible in a container, but clean pages of one file can be
//    dropped, which is all a cold read needs) and reads it back in 8 MiB read() calls.
// 2. save_checkpoint of a 124M-parameter GPT-2 (master + AdamW m, v: ~1.5 GB): snapshot,
//    CRC-32C, write, fsync, metadata, rename. Then the shard file's pages are evicted the same
//    way and load_checkpoint reads it back (pread of every block, CRC check, copy into the model).
// Prints bandwidths and the ratios save/disk-write and load/disk-read (target >= 0.8).
// --small: a 4-layer d=256 model (quick check of the program itself).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"

using namespace sw;
namespace fs = std::filesystem;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("bench", path + ": cannot open");
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void evict_dir(const std::string& dir) {
  for (auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) evict(e.path().string());
}

constexpr size_t kChunk = size_t{8} << 20;

double disk_write(const std::string& path, uint64_t bytes) {
  std::vector<char> buf(kChunk);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 131 + 7);
  const double t0 = now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("bench", path + ": cannot create");
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, bytes - done));
    if (::write(fd, buf.data(), n) != static_cast<ssize_t>(n)) fail("bench", path + ": write failed");
    done += n;
  }
  if (::fsync(fd) != 0) fail("bench", path + ": fsync failed");
  ::close(fd);
  return now() - t0;
}

double disk_read(const std::string& path) {
  std::vector<char> buf(kChunk);
  const double t0 = now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
  return now() - t0;
}

uint64_t dir_bytes(const std::string& dir) {
  uint64_t n = 0;
  for (auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "bench_ckpt_io.tmp";
  bool small = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--small")
      small = true;
    else
      dir = argv[i];
  }
  try {
    fs::remove_all(dir);
    fs::create_directories(dir);
    ModelConfig c;  // GPT-2 small (124M)
    c.type = "gpt2";
    c.vocab_size = 50257;
    c.n_layer = small ? 4 : 12;
    c.n_head = small ? 4 : 12;
    c.d_model = small ? 256 : 768;
    c.seq_len = 1024;
    Model model = build_model(c);
    ShardedModel sm(model, ops_for(Device::cpu()), 1);
    const uint64_t bytes = static_cast<uint64_t>(sm.num_params()) * 12;
    std::printf("model: GPT-2 %lld parameters, checkpoint ~%.2f GB (fp32 master + m + v), dir %s\n",
                static_cast<long long>(sm.num_params()), bytes / 1e9, dir.c_str());

    // Disk (best of two, each on a fresh file).
    double wbw = 0, rbw = 0;
    for (int rep = 0; rep < 2; ++rep) {
      const std::string f = dir + "/disk_probe.bin";
      wbw = std::max(wbw, bytes / disk_write(f, bytes) / 1e9);
      evict(f);
      rbw = std::max(rbw, bytes / disk_read(f) / 1e9);
      fs::remove(f);
    }
    std::printf("disk      write %.3f GB/s (8 MiB writes + fsync)   read %.3f GB/s (8 MiB reads, "
                "pages evicted)\n", wbw, rbw);

    // Checkpoint (best of two).
    double sbw = 0, wbw2 = 0, lbw = 0, snap_s = 1e9;
    TrainState st;
    st.step = 1;
    for (int rep = 0; rep < 2; ++rep) {
      const std::string step = dir + "/step_" + std::to_string(rep);
      // save_checkpoint's three phases, timed apart.
      double t0 = now();
      SnapshotPtr snap = snapshot_checkpoint(sm, st);
      const double t1 = now();
      write_snapshot(*snap, step + ".tmp");
      if (!commit_checkpoint(sm.group(), *snap, true, step + ".tmp", step)) fail("bench", "commit failed");
      const double t2 = now();
      snap.reset();
      snap_s = std::min(snap_s, t1 - t0);
      const uint64_t on_disk = dir_bytes(step);
      sbw = std::max(sbw, on_disk / (t2 - t0) / 1e9);
      wbw2 = std::max(wbw2, on_disk / (t2 - t1) / 1e9);
      evict_dir(step);
      t0 = now();
      load_checkpoint(sm, step);
      lbw = std::max(lbw, on_disk / (now() - t0) / 1e9);
      fs::remove_all(step);
    }
    std::printf("snapshot  %.3f s (in-memory copy; what an async save stalls training for)\n", snap_s);
    std::printf("save      %.3f GB/s   ratio to disk write %.2f   (snapshot + write + commit)\n", sbw, sbw / wbw);
    std::printf("  write   %.3f GB/s   ratio to disk write %.2f   (write_snapshot + commit: CRC, write, fsync, rename)\n", wbw2, wbw2 / wbw);
    std::printf("load      %.3f GB/s   ratio to disk read  %.2f\n", lbw, lbw / rbw);
    fs::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ckpt_io: %s\n", e.what());
    return 1;
  }
  return 0;
}
