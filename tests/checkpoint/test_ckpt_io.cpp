// The checkpoint I/O paths (docs/ARCHITECTURE.md, "Checkpoints"; throughput: bench/results/
// cpu_2026-11-24.md, "Checkpoint I/O"): the fused copy + CRC-32C against the plain CRC on odd sizes
// and alignments; saves and loads through O_DIRECT and through the page cache
// (SHARDWISE_CKPT_O_DIRECT=0), io_uring and the thread backend (SHARDWISE_AIO_DISABLE_URING=1), all
// giving the same bytes and the same model state, with tensors spanning several load pieces (4 MiB)
// and write chunks (8 MiB); a corrupt block anywhere (first, straddling a piece boundary, last)
// named by file, tensor and byte range while later reads are in flight; reserved, prefaulted
// snapshot memory taken over by the first snapshot (no second allocation) and by
// Checkpointer::reserve.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/crc32c.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "tests/checkpoint/ckpt_state_util.h"
#include "core/alloc.h"
#include "core/error.h"
#include "engine/checkpointer.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "st_test_util.h"

using namespace sw;
using SK = ShardedModel::StateKind;
namespace fs = std::filesystem;

namespace {

const Ops& cpu() { return ops_for(Device::cpu()); }

// wte alone is 8195 x 256 floats = 8.4 MB: unit 0's tensors span three 4 MiB load pieces and
// two 8 MiB write chunks, and end mid-block.
ModelConfig wide() {
  ModelConfig c;
  c.type = "gpt2";
  c.vocab_size = 8195;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 256;
  c.seq_len = 8;
  return c;
}

void train(ShardedModel& sm, int steps) { ckpttest::train(sm, steps, 8195); }
using ckpttest::same_state;

std::vector<char> slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
void spit(const std::string& p, const std::vector<char>& d) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(d.data(), static_cast<std::streamsize>(d.size()));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Sets an environment variable for a scope.
struct Env {
  std::string name;
  Env(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~Env() { ::unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("ckpt io: crc32c_copy copies and checksums like crc32c", "[checkpoint][io]") {
  std::mt19937 rng(3);
  std::vector<unsigned char> src((size_t{1} << 20) + 64), dst(src.size() + 64);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  // Odd sizes around the 3 x 4096-byte rounds; source and destination at several alignments.
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{4095}, size_t{12287},
                   size_t{12288}, size_t{12289}, size_t{65535}, size_t{65536}, size_t{65537},
                   size_t{100003}, size_t{1} << 20})
    for (size_t so : {size_t{0}, size_t{3}})
      for (size_t d0 = 0; d0 < 8; ++d0) {
        std::fill(dst.begin(), dst.end(), 0xA5);
        const uint32_t seed = static_cast<uint32_t>(n * 31 + d0);
        const uint32_t got = crc32c_copy(dst.data() + d0, src.data() + so, n, seed);
        INFO("n " << n << " src offset " << so << " dst offset " << d0);
        CHECK(got == crc32c(src.data() + so, n, seed));
        CHECK(std::memcmp(dst.data() + d0, src.data() + so, n) == 0);
        CHECK(dst[d0 + n] == 0xA5);  // nothing written past the end
        if (d0 > 0) CHECK(dst[d0 - 1] == 0xA5);
      }
}

TEST_CASE("ckpt io: O_DIRECT and buffered, io_uring and threads: same files, same state",
          "[checkpoint][io]") {
  sttest::TempDir dir("ckpt_io_paths");
  Model m = build_model(wide());
  ShardedModel sm(m, cpu(), 5);
  train(sm, 2);
  TrainState st;
  st.step = 2;
  save_checkpoint(sm, st, dir.file("direct"));
  const std::string shard = "/rank_0.safetensors";
  REQUIRE(slurp(dir.file("direct") + shard).size() > (size_t{20} << 20));
  {
    Env e("SHARDWISE_CKPT_O_DIRECT", "0");
    save_checkpoint(sm, st, dir.file("buffered"));
  }
  {
    Env e("SHARDWISE_AIO_DISABLE_URING", "1");
    save_checkpoint(sm, st, dir.file("threads"));
  }
  SnapshotPtr snap = snapshot_checkpoint(sm, st);
  {
    Env e("SHARDWISE_CKPT_O_DIRECT", "0");
    write_snapshot(*snap, dir.file("snapbuf.tmp"));
    REQUIRE(commit_checkpoint(sm.group(), *snap, true, dir.file("snapbuf.tmp"), dir.file("snapbuf")));
  }
  for (const char* d : {"buffered", "threads", "snapbuf"})
    for (const char* f : {"/rank_0.safetensors", "/metadata.json"}) {
      INFO(d << f);
      CHECK(slurp(dir.file("direct") + f) == slurp(dir.file(d) + f));
    }
  verify_checkpoint(dir.file("direct"));

  auto load_into_fresh = [&](const char* env, const char* val) {
    Model m2 = build_model(wide());
    ShardedModel b(m2, cpu(), 99);
    if (env) {
      Env e(env, val);
      load_checkpoint(b, dir.file("direct"));
    } else {
      load_checkpoint(b, dir.file("direct"));
    }
    return same_state(b, sm);
  };
  CHECK(load_into_fresh(nullptr, nullptr));
  CHECK(load_into_fresh("SHARDWISE_CKPT_O_DIRECT", "0"));
  CHECK(load_into_fresh("SHARDWISE_AIO_DISABLE_URING", "1"));
}

TEST_CASE("ckpt io: a corrupt block is named while later reads are in flight", "[checkpoint][io]") {
  sttest::TempDir dir("ckpt_io_corrupt");
  Model m = build_model(wide());
  ShardedModel sm(m, cpu(), 5);
  train(sm, 1);
  save_checkpoint(sm, TrainState{}, dir.file("s"));
  const std::string shard = dir.file("s") + "/rank_0.safetensors";
  const std::vector<char> good = slurp(shard);
  SafeTensorsReader r(shard);
  const StTensorInfo& big = r.tensors()[0];  // u0.master: 8.4 MB, three load pieces
  REQUIRE(big.bytes() > (uint64_t{8} << 20));
  const uint64_t kBlock = uint64_t{256} << 10, kPiece = uint64_t{4} << 20;
  struct Case {
    const char* what;
    size_t tensor;
    uint64_t at;  // byte of the tensor to flip
  };
  const std::vector<Case> cases = {
      {"first block of the first tensor", 0, 5},
      {"last block before a piece boundary", 0, kPiece - 1},
      {"first block after a piece boundary", 0, kPiece},
      {"the short last block of a tensor", 0, big.bytes() - 3},
      {"the last tensor's last byte", r.tensors().size() - 1, r.tensors().back().bytes() - 1},
  };
  for (const Case& c : cases) {
    for (const char* direct : {"1", "0"}) {
      const StTensorInfo& t = r.tensors()[c.tensor];
      std::vector<char> d = good;
      d[r.data_start() + t.begin + c.at] ^= 0x20;
      spit(shard, d);
      Model m2 = build_model(wide());
      ShardedModel b(m2, cpu(), 99);
      Env e("SHARDWISE_CKPT_O_DIRECT", direct);
      const std::string err = error_of([&] { load_checkpoint(b, dir.file("s")); });
      const uint64_t s = c.at / kBlock * kBlock, end = std::min(s + kBlock, t.bytes());
      INFO(c.what << (direct[0] == '1' ? " (O_DIRECT)" : " (buffered)") << ": " << err);
      CHECK_THAT(err, Catch::Contains("rank_0.safetensors") && Catch::Contains("tensor '" + t.name + "'") &&
                          Catch::Contains("checksum mismatch in bytes [" + std::to_string(s) + ", " +
                                          std::to_string(end) + ")"));
      CHECK(err.find('\n') == std::string::npos);
    }
  }
  spit(shard, good);
  Model m2 = build_model(wide());
  ShardedModel b(m2, cpu(), 99);
  load_checkpoint(b, dir.file("s"));
  CHECK(same_state(b, sm));
}

TEST_CASE("ckpt io: reserved snapshot memory is taken over by the first snapshot",
          "[checkpoint][io]") {
  sttest::TempDir dir("ckpt_io_reserve");
  Model m = build_model(wide());
  ShardedModel sm(m, cpu(), 5);
  train(sm, 1);
  TrainState st;
  st.step = 1;
  SnapshotPtr reserved = reserve_snapshot(sm);
  prefault_snapshot(*reserved);
  MemTracker::of(Tier::Host).reset_peaks();
  const size_t before = MemTracker::of(Tier::Host).current(Mem::Checkpoint);
  CHECK(before >= static_cast<size_t>(snapshot_bytes(*reserved)));
  SnapshotPtr snap = snapshot_checkpoint(sm, st, std::move(reserved));
  CHECK(MemTracker::of(Tier::Host).peak(Mem::Checkpoint) == before);  // no second buffer
  write_snapshot(*snap, dir.file("a.tmp"));
  REQUIRE(commit_checkpoint(sm.group(), *snap, true, dir.file("a.tmp"), dir.file("a")));
  save_checkpoint(sm, st, dir.file("b"));
  for (const char* f : {"/rank_0.safetensors", "/metadata.json"})
    CHECK(slurp(dir.file("a") + f) == slurp(dir.file("b") + f));

  // The engine's use: reserve() when async saving is set up, then saves as usual.
  snap.reset();
  const GroupPtr g = make_local_group();
  for (bool async : {false, true}) {
    const std::string ck = dir.file(async ? "ck_async" : "ck_sync");
    Checkpointer c(ck, 0, async, *g);
    c.reserve(sm);  // a no-op for sync saving
    const CkptEvents e1 = c.save(sm, st);
    CHECK(e1.failed < 0);
    const CkptEvents e2 = c.finish();
    CHECK(e2.failed < 0);
    verify_checkpoint(ck + "/step_1");
    CHECK(slurp(ck + "/step_1/rank_0.safetensors") == slurp(dir.file("b") + "/rank_0.safetensors"));
  }
}
