// Sharded checkpoints: the format and protocol are described in sharded_checkpoint.h and
// docs/ARCHITECTURE.md ("Checkpoints"). Integrity: every tensor's bytes are checksummed in
// fixed blocks of kBlockBytes (relative to the tensor's start; the last one shorter), so a
// rank that reads part of a tensor reads the whole blocks around that part and checks them;
// the tensor CRC and the file CRC (header included) are combined from the block CRCs, so the
// data is checksummed once, while it is written.
#include "checkpoint/sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "checkpoint/ckpt_metadata.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/extra_state.h"
#include "checkpoint/file_io.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/hf_layout.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/save_memory.h"
#include "core/alloc.h"
#include "core/env.h"
#include "core/error.h"
#include "offload/aio.h"
#include "sharding/sharded_model.h"

namespace sw {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using StateKind = ShardedModel::StateKind;

namespace {

std::string errno_str() { return std::strerror(errno); }

}  // namespace

// ---- Snapshot --------------------------------------------------------------------------------

struct SnapTensor {
  int unit = 0, kind = 0;        // unit: this rank's (local) index, for reading its state
  int64_t lo = 0, hi = 0;        // floats of the unit's (local) flat buffer
  int64_t at = 0;                // floats into the snapshot's data section
  std::vector<uint32_t> blocks;  // CRC-32C per kBlockBytes block (filled with the data)
  // v2 (a tensor-parallel model): the block of logical parameter `param` that [lo, hi) holds,
  // rows [r0, r1) x columns [c0, c1) (contiguous in the local buffer).
  std::string param;
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
  int gunit = 0;  // the unit's index in the whole model (pipeline stages: StageView::global_unit)
};

struct CheckpointSnapshot {
  int rank = 0, world = 1, shard_group = 1;  // rank and world: of the whole mesh
  int tensor = 1;                            // tensor-parallel degree (> 1: a v2 save)
  // Pipeline parallelism: the degree, the whole model's unit count, and whether this rank
  // describes its stage's units to rank 0 (one rank per stage: data and tensor rank 0).
  int pipeline = 1, global_units = 0;
  bool describes = true;
  std::string strategy;
  ModelConfig config;
  TrainState state;
  // The model's layout as metadata.json records it; pipeline stages: this stage's units only,
  // each with its global index in "index" (commit_checkpoint assembles the whole model's).
  ojson units;
  std::vector<SnapTensor> tensors;
  int64_t floats = 0;  // sum of the tensors' sizes
  // The shard file's first bytes (safetensors length + header; the data section follows).
  std::string header;
  // Either a copy of the whole file (header, then the data, with every block's CRC already in
  // `tensors`) starting at the 4096-aligned `image`, so write_snapshot hands it to the disk as
  // it is (O_DIRECT, no copy), or (synchronous saves) the model itself, read and checksummed
  // while writing.
  Buffer data;
  unsigned char* image = nullptr;
  const ShardedModel* source = nullptr;
  // Local SGD: the replica groups; only replica 0 writes the rank files (every replica's own
  // inner state goes to its extra file).
  int replicas = 1;
  bool writes_main = true;
  ExtraSnapshot extra;  // this rank's extra state (checkpoint/extra_state.h), copied
  // Set by write_snapshot (the file's entry in metadata.json, and its extra file's; "" = none),
  // read by commit_checkpoint.
  mutable std::string file_entry, extra_entry;

  uint64_t file_bytes() const { return header.size() + static_cast<uint64_t>(floats) * 4; }
};

void SnapshotDeleter::operator()(CheckpointSnapshot* s) const { delete s; }

int64_t snapshot_bytes(const CheckpointSnapshot& s) { return s.floats * 4; }

namespace {

// A unit's entry of metadata.json: its parameters (name, shape, place in the flat buffer, HF
// name) and sizes.
ojson unit_json(const std::string& name, const FlatLayout& L) {
  ojson params = ojson::array();
  for (size_t i = 0; i < L.specs.size(); ++i) {
    const ParamSpec& p = L.specs[i];
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"offset", L.entries[i].offset},
                      {"numel", L.entries[i].numel},
                      {"hf_name", hf_file_name(p)},
                      {"hf_transpose", p.hf_transpose}});
  }
  return {{"name", name},
          {"numel", L.used},
          {"padded", L.padded},
          {"dtype", "F32"},
          {"params", std::move(params)}};
}

ojson layout_json(const ShardedModel& sm) {
  ojson units = ojson::array();
  for (int u = 0; u < sm.num_units(); ++u) {
    units.push_back(unit_json(sm.unit_name(u), sm.unit_layout(u)));
  }
  return units;
}

// The whole model's index of local unit u (a pipeline stage's units are a subset).
int global_unit(const StageView& sv, int u) {
  return sv.split() ? sv.global_unit[static_cast<size_t>(u)] : u;
}

// Whether this rank's stage writes local unit u: a unit two stages hold (GPT-2's tied
// embedding and head) is written by the lower pipeline rank alone (both hold the same state).
bool stage_writes(const StageView& sv, int u) {
  for (size_t i = 0; i < sv.shared.size(); ++i)
    if (sv.shared[i] == u && sv.shared_peer[i] < sv.rank) return false;
  return true;
}

ojson state_json(const TrainState& s) {
  return {{"step", s.step},
          {"seed", s.seed},
          {"optimizer_steps", s.optimizer_steps},
          {"loss_scale", s.loss_scale},
          {"scaler_good_steps", s.scaler_good_steps},
          {"scaler_hysteresis_left", s.scaler_hysteresis_left},
          {"config_json", s.config_json}};
}

std::string shard_file_name(int rank) { return "rank_" + std::to_string(rank) + ".safetensors"; }

// Linear elements [a, b) of a rows x `cols` row-major matrix as at most three blocks (a partial
// first row, whole rows, a partial last row): fn(r0, r1, c0, c1, first element).
template <class Fn>
void linear_blocks(int64_t cols, int64_t a, int64_t b, Fn&& fn) {
  if (cols <= 0) return;
  if (a < b && a % cols) {
    const int64_t r = a / cols, e = std::min(b, (r + 1) * cols);
    fn(r, r + 1, a - r * cols, e - r * cols, a);
    a = e;
  }
  if (b / cols > a / cols && a < b) {
    const int64_t r0 = a / cols, r1 = b / cols;
    fn(r0, r1, int64_t{0}, cols, a);
    a = r1 * cols;
  }
  if (a < b) fn(a / cols, a / cols + 1, int64_t{0}, b - (a / cols) * cols, a);
}

// A block of a logical parameter held contiguously in a rank's local flat buffer: logical rows
// [r0, r1) x columns [c0, c1), element (r0, c0) at local flat index `at`, local rows `stride`
// floats apart (a block of several rows spans all the local columns).
struct LocalBlock {
  int64_t r0, r1, c0, c1, at, stride;
};

// Local elements [a, b) of parameter p (at flat offset `off` of its unit) as logical blocks:
// linear_blocks of the local matrix, each cut where the split's row runs are (TensorSplit).
void local_blocks(const ParamSpec& p, int64_t off, int64_t a, int64_t b,
                  std::vector<LocalBlock>& out) {
  const TensorSplit& sp = p.split;
  const int64_t C = rows_cols(p.shape).cols;
  const int64_t cbase = sp.split() && sp.col_hi > 0 ? sp.col_lo : 0;
  linear_blocks(C, a, b, [&](int64_t lr0, int64_t lr1, int64_t c0, int64_t c1, int64_t) {
    if (!sp.split() || sp.rows.empty()) {
      out.push_back({lr0, lr1, c0 + cbase, c1 + cbase, off + lr0 * C + c0, C});
      return;
    }
    int64_t base = 0;  // local row of the run's first row
    for (const auto& run : sp.rows) {
      const int64_t n = run[1] - run[0];
      const int64_t s0 = std::max(lr0, base), s1 = std::min(lr1, base + n);
      if (s0 < s1)
        out.push_back({run[0] + s0 - base, run[0] + s1 - base, c0 + cbase, c1 + cbase,
                       off + s0 * C + c0, C});
      base += n;
    }
  });
}

// The logical parameter of local spec p: its logical shape, not split.
ParamSpec logical_spec(ParamSpec p) {
  if (p.split.split()) p.shape = p.split.logical;
  p.split = TensorSplit{};
  return p;
}

// A tensor-parallel model's units as the t = 1 model has them (v2's "units"): each unit's
// logical parameters in the t = 1 model's order (tensor-parallel units list replicated ones
// first; parameters a t = 1 build does not name keep their order, after the others), at the
// offsets of FlatLayout::build of those.
ojson logical_layout_json(const ShardedModel& sm) {
  std::map<std::string, int64_t> order;
  try {
    const Model one = build_model(const_cast<ShardedModel&>(sm).model().config);
    for (const auto& u : one.units)
      for (const ParamSpec& p : u->params()) order.emplace(p.name, static_cast<int64_t>(order.size()));
  } catch (const Error&) {  // a custom model's config: the local order
  }
  ojson units = ojson::array();
  for (int u = 0; u < sm.num_units(); ++u) {
    std::vector<ParamSpec> specs;
    for (const ParamSpec& p : sm.unit_layout(u).specs) specs.push_back(logical_spec(p));
    std::stable_sort(specs.begin(), specs.end(), [&](const ParamSpec& a, const ParamSpec& b) {
      const auto ia = order.find(a.name), ib = order.find(b.name);
      const int64_t x = ia == order.end() ? INT64_MAX : ia->second;
      const int64_t y = ib == order.end() ? INT64_MAX : ib->second;
      return x < y;
    });
    units.push_back(unit_json(sm.unit_name(u), FlatLayout::build(std::move(specs), 1)));
  }
  return units;
}

// Everything but the data: identity, layout, the tensors this rank writes and the file header.
SnapshotPtr describe_snapshot(const ShardedModel& sm, const TrainState& state) {
  SnapshotPtr s(new CheckpointSnapshot);
  const TensorSlice ts = const_cast<ShardedModel&>(sm).model().tensor;
  const StageView& sv = const_cast<ShardedModel&>(sm).model().stage;
  // Tensor groups are a data-parallel slot's ts.size ranks; (data rank, tensor rank) names a
  // rank of the stage uniquely, and (pipeline rank, that) a rank of the mesh: its world rank
  // when stages are blocks of consecutive ranks and tensor groups consecutive ranks inside
  // them (engine/trainer.cpp's mesh).
  const int stage_ranks = sm.world() * ts.size;
  s->tensor = ts.size;
  s->pipeline = sv.size;
  s->global_units = sv.split() ? sv.global_units : sm.num_units();
  s->describes = sm.rank() == 0 && ts.rank == 0;
  s->rank = sv.rank * stage_ranks + sm.rank() * ts.size + ts.rank;
  s->world = sv.size * stage_ranks;
  s->shard_group = sm.num_units() > 0 ? sm.unit_layout(0).world : 1;
  s->strategy = strategy_name(sm.policy().strategy);
  s->config = const_cast<ShardedModel&>(sm).model().config;
  s->state = state;
  if (const int R = sm.replicas(); R > 1) {  // local SGD: the world is R replicas of the stage's
    if (ts.size > 1 || sv.size > 1)
      fail("checkpoint", "local_sgd with tensor or pipeline parallelism: checkpoints are not "
                         "implemented");
    s->replicas = R;
    s->rank += sm.replica() * stage_ranks;
    s->world = R * stage_ranks;
    s->writes_main = sm.replica() == 0;
  }
  if (ts.size == 1 && sv.size == 1) s->extra = snapshot_extra(const_cast<ShardedModel&>(sm));
  if (ts.size == 1) {
    s->units = layout_json(sm);
    for (int u = 0; u < sm.num_units(); ++u) {
      const FlatRange r = sm.owned_range(u);
      if (r.empty() || !stage_writes(sv, u) || !s->writes_main) continue;
      for (int k = 0; k < 3; ++k) {
        s->tensors.push_back(
            {u, k, r.lo, r.hi, s->floats, {}, {}, 0, 0, 0, 0, global_unit(sv, u)});
        s->floats += r.size();
      }
    }
  } else {
    // v2: the owned range's part of each parameter as logical blocks; a replicated parameter
    // (no split, equal on every tensor rank) is written by tensor rank 0 alone.
    s->units = logical_layout_json(sm);
    std::vector<LocalBlock> blocks;
    for (int u = 0; u < sm.num_units(); ++u) {
      const FlatRange r = sm.owned_range(u);
      if (r.empty() || !stage_writes(sv, u)) continue;
      const FlatLayout& L = sm.unit_layout(u);
      blocks.clear();
      std::vector<const std::string*> names;
      for (size_t i = 0; i < L.specs.size(); ++i) {
        const ParamSpec& p = L.specs[i];
        if (!p.split.split() && ts.rank != 0) continue;
        const int64_t off = L.entries[i].offset, n = L.entries[i].numel;
        const int64_t a = std::max(r.lo, off), b = std::min(r.hi, off + n);
        if (a >= b) continue;
        local_blocks(p, off, a - off, b - off, blocks);
        names.resize(blocks.size(), &p.name);
      }
      for (int k = 0; k < 3; ++k)
        for (size_t i = 0; i < blocks.size(); ++i) {
          const LocalBlock& lb = blocks[i];
          const int64_t n = (lb.r1 - lb.r0) * (lb.c1 - lb.c0);
          s->tensors.push_back({u, k, lb.at, lb.at + n, s->floats, {}, *names[i], lb.r0, lb.r1,
                                lb.c0, lb.c1, global_unit(sv, u)});
          s->floats += n;
        }
    }
  }
  if (sv.split())  // each unit's global index, for commit_checkpoint's assembly
    for (int u = 0; u < sm.num_units(); ++u) s->units[static_cast<size_t>(u)]["index"] = global_unit(sv, u);
  std::vector<StTensorDesc> descs;
  for (const SnapTensor& t : s->tensors)
    descs.push_back({s->tensor > 1 ? rect_name(t.gunit, t.kind, t.param, t.r0, t.r1, t.c0, t.c1)
                                   : tensor_name(t.gunit, t.kind, t.lo, t.hi),
                     StDType::F32,
                     {t.hi - t.lo}});
  std::map<std::string, std::string> hmeta = {{"format", kFormatName},
                                              {"rank", std::to_string(s->rank)},
                                              {"world_size", std::to_string(s->world)},
                                              {"tensor_parallel_degree", std::to_string(s->tensor)}};
  if (s->pipeline > 1) hmeta["pipeline_parallel_degree"] = std::to_string(s->pipeline);
  s->header = safetensors_header(shard_file_name(s->rank), descs, hmeta);
  return s;
}

uint64_t num_blocks(const SnapTensor& t) {
  return (static_cast<uint64_t>(t.hi - t.lo) * 4 + kBlockBytes - 1) / kBlockBytes;
}

// Host memory for a snapshot's file image: `bytes` from a 4096-aligned start (what O_DIRECT
// asks of buffers). `huge`: advise transparent huge pages (512x fewer page faults when it is
// first touched, fewer TLB misses in every copy) — only for memory faulted in off the training
// thread (reserve_snapshot): where the kernel compacts memory to find huge pages
// (defrag=madvise, the default), a fault can stall for a long time: a 124M model's first
// snapshot into fresh huge-page-advised memory took 9.4 and 11.8 s in two bench_ckpt_stall
// runs on this shared VM, against 3.8-4.4 s with 4 KiB pages in other runs (noisy, but the
// tail is the risk).
void alloc_image(CheckpointSnapshot& s, bool huge) {
  const size_t bytes = static_cast<size_t>(s.file_bytes());
  const size_t need = (bytes + kAioAlign - 1) / kAioAlign * kAioAlign;
  auto fits = [&] {  // the buffer holds `need` bytes from its first 4096-aligned address
    if (s.data.empty() || !s.data.device().is_cpu() || s.data.bytes() > need + kAioAlign) return false;
    const size_t skip = (kAioAlign - reinterpret_cast<uintptr_t>(s.data.data()) % kAioAlign) % kAioAlign;
    return s.data.bytes() >= need + skip;
  };
  if (!fits()) {  // (host memory whatever the model's device: the host tier)
    s.data = Buffer(need, Mem::Checkpoint, Device::cpu(), Tier::Host);
    if (!fits()) s.data = Buffer(need + kAioAlign, Mem::Checkpoint, Device::cpu(), Tier::Host);
  }
  auto* p = static_cast<unsigned char*>(s.data.data());
  s.image = p + (kAioAlign - reinterpret_cast<uintptr_t>(p) % kAioAlign) % kAioAlign;
#if defined(MADV_HUGEPAGE)
  if (!huge) return;
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(s.image) + kHuge - 1) / kHuge * kHuge;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(s.image) + need) / kHuge * kHuge;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // a hint
#endif
}

// SHARDWISE_CKPT_THREADS=1: copy, checksum and load on the calling thread alone (default 2:
// one helper thread while a save or load runs; training waits then, so its cores are idle).
int ckpt_threads() { return int(env_int("SHARDWISE_CKPT_THREADS").value_or(2)); }

// Runs fn(0, n/2) on a helper thread and fn(n/2, n) on the caller (fn(0, n) alone when n is
// small or SHARDWISE_CKPT_THREADS=1).
template <class Fn>
void split_two(uint64_t n, uint64_t min_each, Fn&& fn) {
  if (n < 2 * min_each || ckpt_threads() == 1) {
    fn(uint64_t{0}, n);
    return;
  }
  const uint64_t mid = n / 2;
  std::exception_ptr err;
  std::thread helper([&] {
    try {
      fn(uint64_t{0}, mid);
    } catch (...) {
      err = std::current_exception();
    }
  });
  try {
    fn(mid, n);
  } catch (...) {
    helper.join();
    throw;
  }
  helper.join();
  if (err) std::rethrow_exception(err);
}

}  // namespace

SnapshotPtr reserve_snapshot(const ShardedModel& sm) {
  SnapshotPtr s = describe_snapshot(sm, TrainState{});
  alloc_image(*s, /*huge=*/true);
  return s;
}

void prefault_snapshot(CheckpointSnapshot& s) {
  if (!s.image) return;
  // One write per 4 KiB page (the kernel zeroes the page, or the huge page, it faults in).
  volatile unsigned char* p = s.image;
  const uint64_t n = s.file_bytes();
  for (uint64_t i = 0; i < n; i += 4096) p[i] = 0;
}

SnapshotPtr snapshot_checkpoint(const ShardedModel& sm, const TrainState& state, SnapshotPtr reuse) {
  SnapshotPtr s = describe_snapshot(sm, state);
  if (reuse && reuse->data.device().is_cpu()) s->data = std::move(reuse->data);  // kept if it fits
  reuse.reset();
  alloc_image(*s, /*huge=*/false);
  std::memcpy(s->image, s->header.data(), s->header.size());
  unsigned char* base = s->image + s->header.size();
  const bool on_device = sm.state_on_device();
  for (SnapTensor& t : s->tensors) {
    unsigned char* dst = base + t.at * 4;
    const uint64_t nb = num_blocks(t), bytes = static_cast<uint64_t>(t.hi - t.lo) * 4;
    t.blocks.resize(nb);
    if (on_device) {
      // Device memory: one device -> host copy of the tensor straight into the image, then
      // its blocks are checksummed there (the host never reads the device's memory).
      sm.read_state(t.unit, static_cast<StateKind>(t.kind), {t.lo, t.hi},
                    reinterpret_cast<float*>(dst));
      split_two(nb, 8, [&](uint64_t b0, uint64_t b1) {
        for (uint64_t b = b0; b < b1; ++b) {
          const uint64_t off = b * kBlockBytes;
          t.blocks[b] = crc32c(dst + off, std::min(kBlockBytes, bytes - off));
        }
      });
      continue;
    }
    // One view per tensor (an NVMe-offloaded moment is read into a buffer valid until the next
    // view), copied and checksummed block by block: one pass over the model's memory.
    const auto* src = reinterpret_cast<const unsigned char*>(
        sm.state_view(t.unit, static_cast<StateKind>(t.kind), {t.lo, t.hi}));
    split_two(nb, 8, [&](uint64_t b0, uint64_t b1) {
      for (uint64_t b = b0; b < b1; ++b) {
        const uint64_t off = b * kBlockBytes, n = std::min(kBlockBytes, bytes - off);
        t.blocks[b] = crc32c_copy(dst + off, src + off, n);
      }
    });
  }
  return s;
}

// ---- Write -----------------------------------------------------------------------------------

namespace {

// The shard file is written through the aio engine (offload/aio.h) from 4096-aligned memory:
// O_DIRECT where the file system takes it (no page-cache copy; the disk reads the memory
// itself), kIoDepth pieces of kIoPiece bytes in flight. Deep, because disks (this VM's virtio
// one among them) keep speeding up well past 8 requests: a sync save with 8 in flight and a
// 32 MiB ring ran at 0.61 of an 8-deep O_DIRECT write, with 32 and 128 MiB at 1.27 of it,
// alternating in one run (the bench's reference is now driven as deep as this).
constexpr size_t kIoPiece = size_t{1} << 20;
constexpr int kIoDepth = 32;
// Synchronous saves: the model's memory is not aligned like the file, so it is copied (and
// checksummed in the same pass) into a ring of kRing staging chunks of kStageChunk bytes
// (128 MiB while a save runs); the disk writes kRing - 1 chunks while the next is filled.
// (Mapped for the save alone: the cache would keep them resident between saves. The planner
// counts them while a save runs: save_memory.h.)
constexpr size_t kStageChunk = size_t{kCkptStageChunk};
constexpr int kRing = kCkptRing;
static_assert(kStageChunk % kAioAlign == 0 && kCkptAlign == kAioAlign,
              "staging chunks keep file offsets aligned");

// SHARDWISE_CKPT_O_DIRECT=0: buffered shard reads and writes (the same bytes through the page
// cache), for file systems whose O_DIRECT misbehaves and for tests comparing the two.
bool want_o_direct() { return env_switch("SHARDWISE_CKPT_O_DIRECT"); }

AioConfig io_config() {
  AioConfig c;
  c.block_size = kIoPiece;
  c.queue_depth = kIoDepth;
  c.intra_op_parallelism = 4;  // thread backend: blocked in the kernel, not computing
  return c;
}

// A shard file written in place under a temporary name, then fsynced and renamed.
class ShardFile {
 public:
  ShardFile(std::string path, uint64_t bytes) : path_(std::move(path)) {
    tmp_ = path_ + ".tmp." + std::to_string(::getpid());
    try {
      f_ = AioFile::create(tmp_, bytes, want_o_direct());
    } catch (const Error& e) {
      fail("checkpoint", path_ + ": cannot create (" + std::string(e.what()) + ")");
    }
  }
  ~ShardFile() {
    if (f_.is_open()) {
      f_.close();
      ::unlink(tmp_.c_str());
    }
  }
  const AioFile& file() const { return f_; }
  // Turns an I/O error into one line naming the file.
  [[noreturn]] void failed(const std::string& what) {
    fail("checkpoint", path_ + ": write failed (" + what + ")");
  }
  void finish(const std::string& dir) {
    if (::fsync(f_.fd()) != 0) failed("fsync: " + errno_str());
    f_.close();
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string err = errno_str();
      ::unlink(tmp_.c_str());
      fail("checkpoint", path_ + ": cannot rename " + tmp_ + " into place (" + err + ")");
    }
    fsync_dir(dir);
  }

 private:
  std::string path_, tmp_;
  AioFile f_;
};

// Writes the snapshot's file: from a copied snapshot, one request for the whole image (pure
// I/O: the CRCs are known); from the model (s.source), chunk by chunk through the staging ring,
// each chunk copied and checksummed in one pass, then written while the next is filled.
void write_main(const CheckpointSnapshot& s, const std::string& tmp_dir);

void write_shard(const CheckpointSnapshot& s, const std::string& tmp_dir) {
  std::error_code ec;
  fs::create_directories(tmp_dir, ec);
  if (ec) fail("checkpoint", tmp_dir + ": cannot create the directory (" + ec.message() + ")");
  s.file_entry.clear(), s.extra_entry.clear();
  if (s.writes_main) write_main(s, tmp_dir);
  if (!s.extra.empty()) s.extra_entry = write_extra(s.extra, tmp_dir, s.rank, s.world);
}

void write_main(const CheckpointSnapshot& s, const std::string& tmp_dir) {
  const std::string fname = shard_file_name(s.rank);
  const std::string path = tmp_dir + "/" + fname;
  const uint64_t total = s.file_bytes(), hbytes = s.header.size();
  ShardFile file(path, total);
  std::vector<StagingBuffer> ring;   // (declared before `io`, whose destructor waits for
  std::vector<AioRequest> busy(kRing);  //  the writes reading them)
  AioHandle io(io_config());

  // Streamed from the model: block CRCs are computed here, per tensor.
  std::vector<std::vector<uint32_t>> streamed_blocks;
  try {
    if (!s.source) {
      io.write(file.file(), s.image, static_cast<size_t>(total), 0).synchronize();
    } else {
      streamed_blocks.resize(s.tensors.size());
      // (No more chunks than the file needs: a small checkpoint takes one, not 128 MiB.)
      const uint64_t chunks = (total + kStageChunk - 1) / kStageChunk;
      for (uint64_t i = 0; i < std::min<uint64_t>(kRing, chunks); ++i)
        ring.push_back(aligned_staging(kStageChunk, Mem::Checkpoint, Tier::Host, true, true));
      const int R = static_cast<int>(ring.size());
      // The file is produced in order: the header, then each tensor's blocks. A chunk is a
      // list of runs (one tensor's bytes inside the chunk), each cut into segments at block
      // boundaries; a run's segments are copied and checksummed on two threads (the view of
      // one tensor at a time: an NVMe-offloaded moment's view lasts until the next view),
      // and a block split by a chunk boundary gets its CRC combined from its two parts.
      struct Seg {
        uint64_t dst, src, len;  // offset in the chunk, offset in the tensor, bytes
        uint32_t crc;
      };
      // State on a device: each run is copied device -> host into the chunk with read_state
      // (copy_bytes) and its segments are checksummed in place; `src` stays null.
      const bool on_device = s.source->state_on_device();
      std::vector<Seg> segs;
      size_t ti = 0;              // tensor being copied
      const unsigned char* src = nullptr;
      uint64_t tpos = 0;          // bytes of tensor ti done
      uint32_t bcrc = 0;          // CRC of the current block's bytes in earlier chunks
      auto open_tensor = [&] {
        while (ti < s.tensors.size() && s.tensors[ti].hi == s.tensors[ti].lo) ++ti;
        if (ti == s.tensors.size()) return;
        const SnapTensor& t = s.tensors[ti];
        if (!on_device)
          src = reinterpret_cast<const unsigned char*>(
              s.source->state_view(t.unit, static_cast<StateKind>(t.kind), {t.lo, t.hi}));
        streamed_blocks[ti].assign(num_blocks(t), 0);
        tpos = 0, bcrc = 0;
      };
      open_tensor();
      for (uint64_t pos = 0, chunk = 0; pos < total; pos += kStageChunk, ++chunk) {
        const int k = static_cast<int>(chunk % static_cast<uint64_t>(R));
        if (busy[k].valid()) busy[k].synchronize();  // the disk has this buffer's last chunk
        auto* dst = ring[k].as<unsigned char>();
        const uint64_t n = std::min<uint64_t>(kStageChunk, total - pos);
        uint64_t fill = 0;
        if (pos < hbytes) {
          fill = std::min(n, hbytes - pos);
          std::memcpy(dst, s.header.data() + pos, fill);
        }
        while (fill < n) {  // one run: tensor ti's bytes in this chunk
          const SnapTensor& t = s.tensors[ti];
          const uint64_t bytes = static_cast<uint64_t>(t.hi - t.lo) * 4;
          const uint64_t run = std::min(bytes - tpos, n - fill);
          segs.clear();
          for (uint64_t at = tpos; at < tpos + run;) {
            const uint64_t block_end = std::min(bytes, (at / kBlockBytes + 1) * kBlockBytes);
            const uint64_t m = std::min(block_end, tpos + run) - at;
            segs.push_back({fill + (at - tpos), at, m, 0});
            at += m;
          }
          if (on_device)  // (tensor bytes, chunk and header sizes are multiples of 4)
            s.source->read_state(t.unit, static_cast<StateKind>(t.kind),
                                 {t.lo + static_cast<int64_t>(tpos / 4),
                                  t.lo + static_cast<int64_t>((tpos + run) / 4)},
                                 reinterpret_cast<float*>(dst + fill));
          split_two(segs.size(), 4, [&](uint64_t s0, uint64_t s1) {
            for (uint64_t i = s0; i < s1; ++i) {
              Seg& g = segs[i];
              g.crc = on_device ? crc32c(dst + g.dst, g.len)
                                : crc32c_copy(dst + g.dst, src + g.src, g.len);
            }
          });
          for (const Seg& g : segs) {  // in order: the blocks' CRCs
            const bool starts = g.src % kBlockBytes == 0;
            bcrc = starts ? g.crc : crc32c_combine(bcrc, g.crc, g.len);
            const uint64_t end = g.src + g.len;
            if (end % kBlockBytes == 0 || end == bytes) streamed_blocks[ti][g.src / kBlockBytes] = bcrc;
          }
          fill += run, tpos += run;
          if (tpos == bytes) ++ti, open_tensor();
        }
        busy[k] = io.write(file.file(), dst, static_cast<size_t>(n), static_cast<off_t>(pos));
      }
      for (AioRequest& r : busy)
        if (r.valid()) r.synchronize();
    }
  } catch (const Error& e) {
    io.wait_all();
    file.failed(e.what());
  }
  file.finish(tmp_dir);  // fsyncs the file, renames it into place and fsyncs tmp_dir

  uint32_t file_crc = crc32c(s.header.data(), s.header.size());
  uint64_t pos = hbytes;
  ojson tensors = ojson::array();
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const SnapTensor& t = s.tensors[i];
    const std::vector<uint32_t>& blocks = s.source ? streamed_blocks[i] : t.blocks;
    const uint64_t bytes = static_cast<uint64_t>(t.hi - t.lo) * sizeof(float);
    uint32_t tcrc = 0;
    for (size_t b = 0; b < blocks.size(); ++b)
      tcrc = b == 0 ? blocks[b]
                    : crc32c_combine(tcrc, blocks[b], std::min(kBlockBytes, bytes - b * kBlockBytes));
    file_crc = crc32c_combine(file_crc, tcrc, bytes);
    if (s.tensor > 1)
      tensors.push_back({{"name", rect_name(t.gunit, t.kind, t.param, t.r0, t.r1, t.c0, t.c1)},
                         {"unit", t.gunit},
                         {"kind", kKindNames[t.kind]},
                         {"param", t.param},
                         {"rows", {t.r0, t.r1}},
                         {"cols", {t.c0, t.c1}},
                         {"offset", pos},
                         {"bytes", bytes},
                         {"crc32c", tcrc},
                         {"block_crc32c", blocks}});
    else
      tensors.push_back({{"name", tensor_name(t.gunit, t.kind, t.lo, t.hi)},
                         {"unit", t.gunit},
                         {"kind", kKindNames[t.kind]},
                         {"lo", t.lo},
                         {"hi", t.hi},
                         {"offset", pos},
                         {"bytes", bytes},
                         {"crc32c", tcrc},
                         {"block_crc32c", blocks}});
    pos += bytes;
  }
  ojson entry = {{"file", fname},
                 {"rank", s.rank},
                 {"bytes", pos},
                 {"crc32c", file_crc},
                 {"tensors", std::move(tensors)}};
  s.file_entry = entry.dump();
}

}  // namespace

void write_snapshot(const CheckpointSnapshot& s, const std::string& tmp_dir) {
  write_shard(s, tmp_dir);
}

// ---- Commit ----------------------------------------------------------------------------------

namespace {

// The metadata document with its self-checksum: "metadata_crc32c" is the CRC-32C of the
// document's compact dump without that key (ordered, so the dump is reproducible).
// The whole model's "units" from the stages' descriptions (unit JSON with its global "index";
// a unit two stages hold is described by both, identically), in global order.
ojson whole_model_units(const std::vector<std::string>& stages, int global_units,
                        const std::string& final_dir) {
  std::vector<ojson> by(static_cast<size_t>(global_units));
  for (const std::string& text : stages) {
    if (text.empty()) continue;
    for (ojson u : ojson::parse(text)) {
      const int i = u["index"].get<int>();
      u.erase("index");
      if (i < 0 || i >= global_units)
        fail("checkpoint", final_dir + ": a stage describes unit " + std::to_string(i) + " of " +
                               std::to_string(global_units));
      if (!by[static_cast<size_t>(i)].is_null() && by[static_cast<size_t>(i)] != u)
        fail("checkpoint", final_dir + ": two stages describe unit " + std::to_string(i) +
                               " differently");
      by[static_cast<size_t>(i)] = std::move(u);
    }
  }
  ojson units = ojson::array();
  for (int i = 0; i < global_units; ++i) {
    if (by[static_cast<size_t>(i)].is_null())
      fail("checkpoint", final_dir + ": no pipeline stage describes unit " + std::to_string(i));
    units.push_back(std::move(by[static_cast<size_t>(i)]));
  }
  return units;
}

std::string seal_metadata(ojson j) {
  j.erase("metadata_crc32c");
  const uint32_t c = crc32c(j.dump().data(), j.dump().size());
  j["metadata_crc32c"] = c;
  return j.dump(1) + "\n";
}

}  // namespace

bool commit_checkpoint(Group& g, const CheckpointSnapshot& s, bool ok, const std::string& tmp_dir,
                       const std::string& final_dir) {
  if (g.size() != s.world)  // (every rank alike: before any collective)
    fail("checkpoint", final_dir + ": committed over " + std::to_string(g.size()) +
                           " ranks, but the model's mesh has " + std::to_string(s.world) +
                           " (a tensor- or pipeline-parallel save commits over the world)");
  const bool all_ok = !any_rank(g, !ok);
  std::vector<std::string> entries = all_gather_strings(g, all_ok ? s.file_entry : std::string());
  const std::vector<std::string> extras =
      all_gather_strings(g, all_ok ? s.extra_entry : std::string());
  // Pipeline stages: rank 0 learns every stage's units (one rank of each stage describes them).
  std::vector<std::string> stage_units;
  if (s.pipeline > 1)
    stage_units = all_gather_strings(g, all_ok && s.describes ? s.units.dump() : std::string());
  if (!all_ok) {
    if (g.rank() == 0) {
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);
    }
    g.barrier();
    return false;
  }
  std::string error;
  if (g.rank() == 0) {
    try {
      const bool v2 = s.tensor > 1;
      ojson meta = {{"format", kFormatName},
                    {"format_version", v2 ? kCheckpointFormatV2 : kCheckpointFormatVersion},
                    {"model_config", model_config_to_json(s.config)},
                    {"world_size", s.world}};
      if (v2) meta["tensor_parallel_degree"] = s.tensor;
      if (s.pipeline > 1) meta["pipeline_parallel_degree"] = s.pipeline;  // (informational)
      meta["strategy"] = s.strategy;
      meta["shard_group_size"] = s.shard_group;
      meta["dtype"] = "F32";
      meta["block_bytes"] = kBlockBytes;
      meta["tensor_names"] =
          v2 ? "u<unit>.<master|exp_avg|exp_avg_sq>.<parameter>[<r0>:<r1>,<c0>:<c1>], rows x "
               "columns of the logical parameter (dim 0 x the rest), row-major"
             : "u<unit>.<master|exp_avg|exp_avg_sq>[<lo>:<hi>], floats of the unit's flat buffer";
      meta["train_state"] = state_json(s.state);
      meta["units"] = s.pipeline > 1 ? whole_model_units(stage_units, s.global_units, final_dir)
                                     : s.units;
      ojson files = ojson::array();
      for (const std::string& e : entries)
        if (!e.empty()) files.push_back(ojson::parse(e));  // (local SGD: replica 0's alone)
      meta["files"] = std::move(files);
      if (s.replicas > 1) meta["replica_groups"] = s.replicas;
      ojson xf = ojson::array();
      for (const std::string& e : extras)
        if (!e.empty()) xf.push_back(ojson::parse(e));
      if (!xf.empty()) meta["extra_files"] = std::move(xf);
      const std::string text = seal_metadata(std::move(meta));
      // v2: the blocks must tile every parameter (a custom unit's split that two tensor ranks
      // both claim would otherwise make a checkpoint that no load accepts); pipeline stages:
      // every unit written exactly once.
      if (v2 || s.pipeline > 1) check_checkpoint_metadata(final_dir + "/metadata.json", text);
      write_file_synced(tmp_dir + "/metadata.json", text);
      fsync_dir(tmp_dir);
      std::error_code ec;
      std::string old;
      if (fs::exists(final_dir, ec)) {  // saving the same step again: replace it
        old = final_dir + ".old";
        fs::remove_all(old, ec);
        fs::rename(final_dir, old, ec);
        if (ec) fail("checkpoint", final_dir + ": cannot move the existing directory aside (" +
                                       ec.message() + ")");
      }
      fs::rename(tmp_dir, final_dir, ec);
      if (ec)
        fail("checkpoint", "cannot rename " + tmp_dir + " to " + final_dir + " (" + ec.message() + ")");
      fsync_dir(parent_dir(final_dir));
      if (!old.empty()) fs::remove_all(old, ec);
    } catch (const std::exception& e) {
      error = e.what();
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);
    }
  }
  int status = error.empty() ? 1 : 0;
  float f = static_cast<float>(status);
  g.broadcast(&f, 1, 0);
  if (!error.empty()) throw Error(error);
  if (f != 1.f) fail("checkpoint", "rank 0 could not commit " + final_dir + " (see its error)");
  return true;
}

SnapshotPtr view_checkpoint(const ShardedModel& sm, const TrainState& state) {
  SnapshotPtr snap = describe_snapshot(sm, state);
  snap->source = &sm;
  return snap;
}

void save_checkpoint(const ShardedModel& sm, const TrainState& state, const std::string& final_dir,
                     Group* world) {
  // Synchronous: the model cannot change during the call, so the file is written straight
  // from its memory (no snapshot copy).
  SnapshotPtr snap = describe_snapshot(sm, state);
  snap->source = &sm;
  const std::string tmp = final_dir + ".tmp";
  std::string error;
  try {
    write_snapshot(*snap, tmp);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!commit_checkpoint(world ? *world : sm.group(), *snap, error.empty(), tmp, final_dir)) {
    if (!error.empty()) throw Error(error);
    fail("checkpoint", final_dir + ": another rank failed to write its shard; nothing was saved");
  }
}

// ---- Reading shard files (metadata.json: checkpoint/ckpt_metadata.cpp) -------------------------

namespace {

// Opens a shard file and checks that its safetensors header (validated by the reader) says
// what metadata.json says about every tensor, so later reads are bounded by both.
SafeTensorsReader open_shard(const Meta& m, const FileEntry& fe) {
  const std::string path = m.dir + "/" + fe.file;
  SafeTensorsReader r(path);
  auto bad = [&](const std::string& msg) { fail("checkpoint", path + ": " + msg); };
  if (r.file_size() != fe.bytes)
    bad("file is " + std::to_string(r.file_size()) + " bytes, metadata.json says " +
        std::to_string(fe.bytes) + (r.file_size() < fe.bytes ? " (truncated)" : ""));
  for (const FileTensor& t : fe.tensors) {
    const StTensorInfo* i = r.find(t.name);
    if (!i) bad("tensor '" + t.name + "' is missing");
    if (i->dtype != StDType::F32 || r.data_start() + i->begin != t.offset || i->bytes() != t.bytes)
      bad("tensor '" + t.name + "': the header's dtype/offsets disagree with metadata.json");
  }
  return r;
}

// Checks the CRC of whole blocks [b0, b1) of tensor t, found at `data` (block b0's first
// byte), naming the file, tensor and byte range of a bad one.
void check_blocks(const std::string& path, const FileTensor& t, uint64_t block_bytes, size_t b0,
                  size_t b1, const unsigned char* data) {
  for (size_t b = b0; b < b1; ++b) {
    const uint64_t s = b * block_bytes, n = std::min(block_bytes, t.bytes - s);
    const uint32_t c = crc32c(data + (s - b0 * block_bytes), n);
    if (c != t.blocks[b])
      fail("checkpoint", path + ": tensor '" + t.name + "': checksum mismatch in bytes [" +
                             std::to_string(s) + ", " + std::to_string(s + n) + ") (stored " +
                             hex32(t.blocks[b]) + ", computed " + hex32(c) + "): corrupt file");
  }
}

// Reads whole checksum blocks [b0, b1) of tensor t into dst and checks each one.
void read_blocks(const SafeTensorsReader& r, const FileTensor& t, uint64_t block_bytes, size_t b0,
                 size_t b1, unsigned char* dst) {
  const uint64_t lo = b0 * block_bytes, hi = std::min<uint64_t>(b1 * block_bytes, t.bytes);
  r.read_bytes(t.name, dst, lo, hi - lo);
  check_blocks(r.path(), t, block_bytes, b0, b1, dst);
}

// Reads floats [a, b) of tensor t (inside [t.lo, t.hi)) in pieces of kChunkBlocks whole
// blocks, verified, handing each piece to fn(lo, hi, data). The pieces are small enough to
// stay in cache between the read, the CRC check and fn's copy; the kernel is asked to read
// kAheadBlocks ahead of the piece in hand (asking for everything at once would make the
// request block until the whole range is queued, serialising the disk and the checking).
// `st` (optional) counts what is read, under file name `file`.
template <class Fn>
void read_range(const SafeTensorsReader& r, const FileTensor& t, uint64_t block_bytes, int64_t a,
                int64_t b, std::vector<unsigned char>& buf, Fn&& fn, LoadStats* st = nullptr,
                const std::string& file = {}) {
  const uint64_t bf = block_bytes / 4;  // floats per block
  // Pieces of about 2 MiB (read, checked and copied while in cache), read-ahead about 32 MiB,
  // whatever block size the checkpoint was written with.
  const size_t kChunkBlocks = std::max<size_t>(1, (size_t{2} << 20) / block_bytes);
  const size_t kAheadBlocks = std::max<size_t>(1, (size_t{32} << 20) / block_bytes);
  size_t blk = static_cast<size_t>(static_cast<uint64_t>(a - t.lo) / bf);
  const size_t end_blk = static_cast<size_t>((static_cast<uint64_t>(b - t.lo) + bf - 1) / bf);
  const uint64_t tensor_end = t.bytes;
  auto ask = [&](size_t from, size_t to) {  // blocks [from, to) clipped to the range
    to = std::min(to, end_blk);
    if (from < to)
      r.prefetch(t.name, from * block_bytes, std::min<uint64_t>(to * block_bytes, tensor_end) - from * block_bytes);
  };
  if (st && blk < end_blk) {
    const uint64_t begin = t.offset + blk * block_bytes;
    const uint64_t end = t.offset + std::min<uint64_t>(end_blk * block_bytes, tensor_end);
    st->payload_bytes += static_cast<int64_t>(end - begin);
    st->blocks_read += static_cast<int64_t>(end_blk - blk);
    st->spans.push_back({file, begin, end});
  }
  ask(blk, blk + kAheadBlocks);
  buf.resize(std::min(end_blk - blk, kChunkBlocks) * block_bytes);
  while (blk < end_blk) {
    const size_t nb = std::min(kChunkBlocks, end_blk - blk);
    ask(blk + kAheadBlocks, blk + kAheadBlocks + nb);
    read_blocks(r, t, block_bytes, blk, blk + nb, buf.data());
    const int64_t plo = t.lo + static_cast<int64_t>(blk * bf);
    const int64_t lo = std::max(a, plo), hi = std::min<int64_t>(b, plo + static_cast<int64_t>(nb * bf));
    fn(lo, hi, reinterpret_cast<const float*>(buf.data()) + (lo - plo));
    blk += nb;
  }
}

// load_checkpoint's reads of one file: the whole blocks overlapping each needed range, in
// pieces of about kLoadChunk bytes read through the aio engine (O_DIRECT where the file system
// takes it, so the data goes from the disk to the staging memory without a page-cache copy)
// into a ring of up to kLoadRing aligned staging chunks (fewer for a small file): the reads of
// the whole ring are in flight (kIoDepth 1 MiB requests at the disk) while the blocks of
// earlier pieces are checked (on a helper thread) and handed to fn(tensor, lo, hi, floats),
// which copies them into the model (on the caller's). The ring is deep (128 MiB) because the
// disk must never wait for a thread that the scheduler has put aside: with 8 chunks and 8
// requests, a loaded 2-core machine read at 0.64 of the disk, with 32 and 32 at 0.85, in the
// same run. A piece's file range is widened to 4096-byte boundaries (what O_DIRECT reads),
// clipped to the file's end; `st` counts the whole blocks, as before.
constexpr uint64_t kLoadChunk = uint64_t{4} << 20;
constexpr size_t kLoadRing = 32;

template <class Fn>
void load_file(const SafeTensorsReader& r, uint64_t block_bytes,
               const std::vector<std::pair<const FileTensor*, FlatRange>>& need, AioHandle& io,
               std::vector<StagingBuffer>& ring, LoadStats& st, const std::string& file, Fn&& fn) {
  struct Piece {
    const FileTensor* t;
    size_t need;         // index into `need`
    size_t b0, b1;       // blocks
    int64_t lo, hi;      // floats handed to fn
    uint64_t alo, ahi;   // aligned file range read
  };
  const uint64_t bf = block_bytes / 4;
  const size_t chunk_blocks = static_cast<size_t>(std::max<uint64_t>(1, kLoadChunk / block_bytes));
  std::vector<Piece> pieces;
  uint64_t cap = 0;
  for (size_t ni = 0; ni < need.size(); ++ni) {
    const auto& [t, o] = need[ni];
    size_t blk = static_cast<size_t>(static_cast<uint64_t>(o.lo - t->lo) / bf);
    const size_t end_blk = static_cast<size_t>((static_cast<uint64_t>(o.hi - t->lo) + bf - 1) / bf);
    if (blk < end_blk) {
      const uint64_t begin = t->offset + blk * block_bytes;
      const uint64_t end = t->offset + std::min<uint64_t>(end_blk * block_bytes, t->bytes);
      st.payload_bytes += static_cast<int64_t>(end - begin);
      st.blocks_read += static_cast<int64_t>(end_blk - blk);
      st.spans.push_back({file, begin, end});
    }
    for (; blk < end_blk; blk += chunk_blocks) {
      Piece p{t, ni, blk, std::min(end_blk, blk + chunk_blocks), 0, 0, 0, 0};
      const int64_t plo = t->lo + static_cast<int64_t>(p.b0 * bf);
      p.lo = std::max(o.lo, plo);
      p.hi = std::min<int64_t>(o.hi, t->lo + static_cast<int64_t>(p.b1 * bf));
      const uint64_t flo = t->offset + p.b0 * block_bytes;
      const uint64_t fhi = t->offset + std::min<uint64_t>(p.b1 * block_bytes, t->bytes);
      p.alo = flo / kAioAlign * kAioAlign;
      p.ahi = std::min<uint64_t>((fhi + kAioAlign - 1) / kAioAlign * kAioAlign, r.file_size());
      cap = std::max(cap, p.ahi - p.alo);
      pieces.push_back(p);
    }
  }
  const size_t want = std::min(kLoadRing, pieces.size());
  if (ring.size() < want || (!ring.empty() && ring[0].capacity() < cap)) {
    ring.clear();
    for (size_t i = 0; i < want; ++i)
      ring.push_back(
          aligned_staging(static_cast<size_t>(cap), Mem::Checkpoint, Tier::Host, true, true));
  }
  const size_t R = ring.size();
  const AioFile f = AioFile::open(r.path(), /*writable=*/false, want_o_direct());
  const size_t N = pieces.size();
  std::vector<AioRequest> reqs(N);
  // Two stages on two threads: a helper waits for each read and checks its blocks' CRCs; the
  // caller issues the reads (kLoadRing pieces ahead of the copying) and copies verified pieces
  // into the model. State under `mu`: pieces issued, pieces verified, the first bad one.
  std::mutex mu;
  std::condition_variable cv;
  size_t issued = 0, verified = 0, bad_at = SIZE_MAX;
  std::exception_ptr bad;
  bool stop = false;
  auto verify = [&](size_t i) {
    reqs[i].synchronize();
    const Piece& p = pieces[i];
    const uint64_t flo = p.t->offset + p.b0 * block_bytes;
    check_blocks(r.path(), *p.t, block_bytes, p.b0, p.b1,
                 ring[i % R].as<unsigned char>() + (flo - p.alo));
  };
  auto helper_body = [&] {
    for (size_t i = 0; i < N; ++i) {
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || issued > i; });
        if (stop) return;
      }
      std::exception_ptr e;
      try {
        verify(i);
      } catch (...) {
        e = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu);
      if (e) {
        bad = e, bad_at = i;
        cv.notify_all();
        return;
      }
      verified = i + 1;
      cv.notify_all();
    }
  };
  const bool two = N >= 2 && ckpt_threads() == 2 && std::thread::hardware_concurrency() > 1;
  std::thread helper;
  auto issue_upto = [&](size_t lim) {
    for (lim = std::min(lim, N); issued < lim;) {
      const Piece& p = pieces[issued];
      reqs[issued] = io.read(f, ring[issued % R].data(), static_cast<size_t>(p.ahi - p.alo),
                             static_cast<off_t>(p.alo));
      std::lock_guard<std::mutex> lk(mu);
      ++issued;
      cv.notify_all();
    }
  };
  try {
    issue_upto(R);
    if (two) helper = std::thread(helper_body);
    for (size_t i = 0; i < N; ++i) {
      if (two) {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return verified > i || bad_at <= i; });
        if (bad_at <= i) std::rethrow_exception(bad);
      } else {
        verify(i);
      }
      const Piece& p = pieces[i];
      const auto* base = ring[i % R].as<unsigned char>();
      const uint64_t at = p.t->offset + static_cast<uint64_t>(p.lo - p.t->lo) * 4 - p.alo;
      fn(p.need, *p.t, p.lo, p.hi, reinterpret_cast<const float*>(base + at));
      issue_upto(i + 1 + R);  // into the buffer just copied out
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    if (helper.joinable()) helper.join();
    io.wait_all();  // nothing may still be reading into the ring
    throw;
  }
  if (helper.joinable()) helper.join();
}

std::string shape_list(const Shape& s) { return shape_str(s); }

// The model config differences (load's first check).
void config_diffs(const ShardedModel& sm, const Meta& m, std::vector<std::string>& diffs) {
  // (The checkpoint's config as read, so that files from before a field was added compare
  // with the value they stand for.)
  const nlohmann::json mine = nlohmann::json::parse(
      model_config_to_json(const_cast<ShardedModel&>(sm).model().config).dump());
  const nlohmann::json saved = nlohmann::json::parse(model_config_to_json(m.config).dump());
  for (auto it = mine.begin(); it != mine.end(); ++it) {
    const auto theirs = saved.find(it.key());
    if (theirs == saved.end() || *theirs != it.value())
      diffs.push_back("model_config." + it.key() + ": checkpoint " +
                      (theirs == saved.end() ? std::string("(absent)") : theirs->dump()) +
                      ", model " + it.value().dump());
  }
}

[[noreturn]] void fail_diffs(const std::string& step_dir, const std::vector<std::string>& diffs) {
  std::string msg = step_dir + ": the checkpoint's model differs from this one (" +
                    std::to_string(diffs.size()) + " difference" + (diffs.size() > 1 ? "s" : "") +
                    "): ";
  for (size_t i = 0; i < diffs.size(); ++i) msg += (i ? "; " : "") + diffs[i];
  fail("checkpoint", msg);
}

// ---- Logical blocks: loads across mesh shapes, v2 export ------------------------------------
// A checkpoint's data for one (parameter, kind) as blocks of the logical parameter (rows x
// columns, RowsCols): v2's blocks as they are, v1's flat ranges cut at parameters and rows.
struct Source {
  size_t file;
  const FileTensor* t;
  int64_t r0, r1, c0, c1;
  int64_t at;  // where element (r0, c0) is, in t's [lo, hi) coordinates (read_range's)
};
using Sources = std::map<std::string, std::vector<Source>>;  // by parameter name

std::array<Sources, 3> logical_sources(const Meta& m) {
  std::array<Sources, 3> out;
  for (size_t f = 0; f < m.files.size(); ++f)
    for (const FileTensor& t : m.files[f].tensors) {
      if (t.hi <= t.lo) continue;
      const UnitMeta& um = m.units[static_cast<size_t>(t.unit)];
      Sources& by = out[static_cast<size_t>(t.kind)];
      if (m.version == kCheckpointFormatV2) {
        by[um.params[static_cast<size_t>(t.param)].name].push_back(
            {f, &t, t.r0, t.r1, t.c0, t.c1, 0});
        continue;
      }
      for (const ParamMeta& p : um.params) {
        const int64_t a = std::max(t.lo, p.offset), b = std::min(t.hi, p.offset + p.numel);
        if (a >= b) continue;
        linear_blocks(rows_cols(p.shape).cols, a - p.offset, b - p.offset,
                      [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t e) {
                        by[p.name].push_back({f, &t, r0, r1, c0, c1, p.offset + e});
                      });
      }
    }
  return out;
}

// Shard files opened on first use (open_shard's checks), counted in `st`.
struct Readers {
  const Meta& m;
  LoadStats* st;
  std::map<size_t, SafeTensorsReader> open;
  const SafeTensorsReader& get(size_t f) {
    auto it = open.find(f);
    if (it != open.end()) return it->second;
    it = open.emplace(f, open_shard(m, m.files[f])).first;
    if (st) ++st->files_opened, st->header_bytes += static_cast<int64_t>(it->second.data_start());
    return it->second;
  }
};

// The part of source F inside destination block N: the range of F's file tensor from the first
// to the last element of their intersection (in t's [lo, hi) coordinates); empty when none.
struct Copy {
  const Source* F;
  LocalBlock N;
  int64_t r0, r1, c0, c1;  // the intersection
  FlatRange range;
};
Copy plan_copy(const Source& F, const LocalBlock& N) {
  Copy c{&F, N, std::max(N.r0, F.r0), std::min(N.r1, F.r1), std::max(N.c0, F.c0),
         std::min(N.c1, F.c1), {}};
  if (c.r0 >= c.r1 || c.c0 >= c.c1) return c;
  const int64_t w = F.c1 - F.c0;
  c.range = {F.at + (c.r0 - F.r0) * w + (c.c0 - F.c0), F.at + (c.r1 - 1 - F.r0) * w + (c.c1 - F.c0)};
  return c;
}

// Floats [l, h) of F's file tensor (inside c.range) at `data`: the intersection's part of each
// row copied to dst (N's element (r, col) at dst[N.at + (r - N.r0) * N.stride + (col - N.c0)]).
void scatter(const Copy& c, int64_t l, int64_t h, const float* data, float* dst) {
  const Source& F = *c.F;
  const int64_t w = F.c1 - F.c0;
  for (int64_t x = l; x < h;) {
    const int64_t rel = x - F.at, r = F.r0 + rel / w, col = F.c0 + rel % w;
    const int64_t row_end = std::min(h, x + (F.c1 - col));  // this row's end in [l, h)
    const int64_t cs = std::max(col, c.c0), ce = std::min(c.c1, col + (row_end - x));
    if (r >= c.r0 && r < c.r1 && cs < ce)
      std::memcpy(dst + c.N.at + (r - c.N.r0) * c.N.stride + (cs - c.N.c0),
                  data + (x - l) + (cs - col), static_cast<size_t>(ce - cs) * 4);
    x = row_end;
  }
}

// copy_block: the same through read_range (export: one parameter at a time, synchronously).
void copy_block(Readers& rd, const Meta& m, const Source& F, const LocalBlock& N, float* dst,
                std::vector<unsigned char>& buf) {
  const Copy c = plan_copy(F, N);
  if (c.range.empty()) return;
  read_range(rd.get(F.file), *F.t, m.block_bytes, c.range.lo, c.range.hi, buf,
             [&](int64_t l, int64_t h, const float* data) { scatter(c, l, h, data, dst); },
             rd.st, m.files[F.file].file);
}

// load_checkpoint across mesh shapes (a v2 checkpoint, or a tensor-parallel model): per unit and
// kind, the held range is assembled in host memory from the logical blocks overlapping each
// local parameter's part, then written with write_state. The units may differ from the saving
// run's (blocks_per_unit): parameters are found by name.
void load_logical(ShardedModel& sm, const Meta& m, LoadStats& st) {
  // Parameters are matched by name, whatever unit holds them (blocks_per_unit may differ).
  std::vector<std::string> diffs;
  config_diffs(sm, m, diffs);
  std::map<std::string, const ParamMeta*> theirs;
  for (const UnitMeta& cu : m.units)
    for (const ParamMeta& p : cu.params) theirs[p.name] = &p;
  std::set<std::string> ours;
  for (int u = 0; u < sm.num_units(); ++u)
    for (const ParamSpec& local : sm.unit_layout(u).specs) {
      const ParamSpec p = logical_spec(local);
      ours.insert(p.name);
      auto it = theirs.find(p.name);
      if (it == theirs.end())
        diffs.push_back("parameter '" + p.name + "' " + shape_list(p.shape) + " is not in the checkpoint");
      else if (it->second->shape != p.shape)
        diffs.push_back("parameter '" + p.name + "': checkpoint " + shape_list(it->second->shape) +
                        ", model " + shape_list(p.shape));
    }
  // (A pipeline stage holds some of the model's parameters: the others are other stages'.)
  if (!sm.model().stage.split())
    for (const auto& [name, p] : theirs)
      if (!ours.count(name))
        diffs.push_back("parameter '" + name + "' " + shape_list(p->shape) + " is not in the model");
  if (!diffs.empty()) fail_diffs(m.dir, diffs);
  check_coverage(m);

  // The copies of each (unit, kind), grouped by file, go through load_file (the aio reads of
  // the v1 path, checked on a helper thread), scattered into `stage`.
  const std::array<Sources, 3> src = logical_sources(m);
  Readers rd{m, &st, {}};
  std::vector<StagingBuffer> ring;
  AioHandle io(io_config());  // (after `ring`: destroyed first, waiting for reads into it)
  std::vector<float> stage;
  std::vector<LocalBlock> blocks;
  std::map<size_t, std::vector<Copy>> by_file;
  std::vector<std::pair<const FileTensor*, FlatRange>> need;
  for (int u = 0; u < sm.num_units(); ++u) {
    const FlatLayout& L = sm.unit_layout(u);
    for (int k = 0; k < 3; ++k) {
      const FlatRange H = sm.held_range(u, static_cast<StateKind>(k));
      if (H.empty()) continue;
      stage.assign(static_cast<size_t>(H.size()), 0.f);  // alignment gaps stay zero
      by_file.clear();
      for (size_t i = 0; i < L.specs.size(); ++i) {
        const int64_t off = L.entries[i].offset, n = L.entries[i].numel;
        const int64_t a = std::max(H.lo, off), b = std::min(H.hi, off + n);
        if (a >= b) continue;
        blocks.clear();
        local_blocks(L.specs[i], off, a - off, b - off, blocks);
        const auto it = src[static_cast<size_t>(k)].find(L.specs[i].name);
        if (it == src[static_cast<size_t>(k)].end()) continue;  // (coverage checked: empty)
        for (LocalBlock N : blocks) {
          N.at -= H.lo;  // into `stage`
          for (const Source& F : it->second) {
            const Copy c = plan_copy(F, N);
            if (!c.range.empty()) by_file[F.file].push_back(c);
          }
        }
      }
      for (const auto& entry : by_file) {
        const size_t f = entry.first;
        const std::vector<Copy>& copies = entry.second;  // (no structured binding: captured)
        need.clear();
        for (const Copy& c : copies) need.push_back({c.F->t, c.range});
        load_file(rd.get(f), m.block_bytes, need, io, ring, st, m.files[f].file,
                  [&](size_t i, const FileTensor&, int64_t lo, int64_t hi, const float* data) {
                    scatter(copies[i], lo, hi, data, stage.data());
                  });
      }
      sm.write_state(u, static_cast<StateKind>(k), H, stage.data());
    }
  }
}

}  // namespace

// ---- Load ------------------------------------------------------------------------------------

TrainState load_checkpoint(ShardedModel& sm, const std::string& step_dir, LoadStats* stats) {
  const Meta m = read_meta(step_dir);
  LoadStats st;
  std::error_code ec;
  st.metadata_bytes = static_cast<int64_t>(std::filesystem::file_size(m.path, ec));
  // Across mesh shapes: by logical blocks. A v1 checkpoint into an untensored model: by flat
  // ranges, as below.
  if (m.version == kCheckpointFormatV2 || sm.model().tensor.size > 1) {
    load_logical(sm, m, st);
    if (stats) *stats = std::move(st);
    return m.state;
  }

  // The model must match: every difference is listed. A pipeline stage holds some of the
  // whole model's units: unit u here is the checkpoint's global_unit(u), and the checkpoint's
  // other units are not read.
  const StageView& sv = sm.model().stage;
  const int whole = sv.split() ? sv.global_units : sm.num_units();
  std::vector<std::string> diffs;
  config_diffs(sm, m, diffs);
  if (static_cast<int>(m.units.size()) != whole)
    diffs.push_back("units: checkpoint has " + std::to_string(m.units.size()) + ", model has " +
                    std::to_string(whole));
  std::vector<int> local_of(m.units.size(), -1);  // checkpoint unit -> this rank's, or -1
  for (int u = 0; u < sm.num_units(); ++u) {
    const int gu = global_unit(sv, u);
    if (gu >= static_cast<int>(m.units.size())) continue;  // (counted above)
    local_of[static_cast<size_t>(gu)] = u;
    const UnitMeta& cu = m.units[static_cast<size_t>(gu)];
    const FlatLayout& L = sm.unit_layout(u);
    const std::string un = "unit " + std::to_string(gu);
    if (cu.name != sm.unit_name(u))
      diffs.push_back(un + " name: checkpoint '" + cu.name + "', model '" + sm.unit_name(u) + "'");
    std::map<std::string, const ParamMeta*> theirs;
    for (const ParamMeta& p : cu.params) theirs[p.name] = &p;
    std::set<std::string> ours;
    for (size_t s = 0; s < L.specs.size(); ++s) {
      const ParamSpec& p = L.specs[s];
      ours.insert(p.name);
      auto it = theirs.find(p.name);
      if (it == theirs.end()) {
        diffs.push_back("parameter '" + p.name + "' " + shape_list(p.shape) + " is not in the checkpoint");
      } else if (it->second->shape != p.shape) {
        diffs.push_back("parameter '" + p.name + "': checkpoint " + shape_list(it->second->shape) +
                        ", model " + shape_list(p.shape));
      } else if (it->second->offset != L.entries[s].offset) {
        diffs.push_back("parameter '" + p.name + "': flat offset " +
                        std::to_string(it->second->offset) + " in the checkpoint, " +
                        std::to_string(L.entries[s].offset) + " in the model");
      }
    }
    for (const ParamMeta& p : cu.params)
      if (!ours.count(p.name))
        diffs.push_back("parameter '" + p.name + "' " + shape_list(p.shape) + " is not in the model");
    if (diffs.empty() && cu.numel != L.used)
      diffs.push_back(un + " numel: checkpoint " + std::to_string(cu.numel) + ", model " +
                      std::to_string(L.used));
  }
  if (!diffs.empty()) fail_diffs(step_dir, diffs);
  check_coverage(m);

  // Each rank reads the blocks overlapping what it holds, file by file.
  std::vector<StagingBuffer> ring;
  AioHandle io(io_config());  // (after `ring`: destroyed first, waiting for reads into it)
  for (const FileEntry& fe : m.files) {
    std::vector<std::pair<const FileTensor*, FlatRange>> need;
    for (const FileTensor& t : fe.tensors) {
      const int u = local_of[static_cast<size_t>(t.unit)];
      if (u < 0) continue;  // another stage's unit
      const FlatRange h = sm.held_range(u, static_cast<StateKind>(t.kind));
      const FlatRange o{std::max(h.lo, t.lo), std::min(h.hi, t.hi)};
      if (!o.empty()) need.push_back({&t, o});
    }
    if (need.empty()) continue;
    const SafeTensorsReader r = open_shard(m, fe);
    ++st.files_opened;
    st.header_bytes += static_cast<int64_t>(r.data_start());
    load_file(r, m.block_bytes, need, io, ring, st, fe.file,
              [&](size_t, const FileTensor& t, int64_t lo, int64_t hi, const float* data) {
                sm.write_state(local_of[static_cast<size_t>(t.unit)],
                               static_cast<StateKind>(t.kind), {lo, hi}, data);
              });
  }
  if (!sv.split())  // state beyond the rank files: local SGD's round, error-feedback residuals
    load_extra(sm, m, sm.replica() * sm.world() + sm.rank(), sm.replicas() * sm.world());
  if (stats) *stats = std::move(st);
  return m.state;
}

// ---- Tools -----------------------------------------------------------------------------------

void verify_checkpoint(const std::string& step_dir) {
  const Meta m = read_meta(step_dir);
  check_coverage(m);
  std::vector<unsigned char> buf(m.block_bytes);
  for (const FileEntry& fe : m.files) {
    const SafeTensorsReader r = open_shard(m, fe);
    // The header bytes, then every tensor by blocks, combined into the file's CRC.
    std::vector<unsigned char> head(static_cast<size_t>(r.data_start()));
    const int fd = ::open(r.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("checkpoint", r.path() + ": cannot open (" + errno_str() + ")");
    const ssize_t got = ::pread(fd, head.data(), head.size(), 0);
    ::close(fd);
    if (got != static_cast<ssize_t>(head.size()))
      fail("checkpoint", r.path() + ": cannot read the header");
    uint32_t fcrc = crc32c(head.data(), head.size());
    std::vector<const FileTensor*> order;
    for (const FileTensor& t : fe.tensors) order.push_back(&t);
    std::sort(order.begin(), order.end(),
              [](const FileTensor* a, const FileTensor* b) { return a->offset < b->offset; });
    uint64_t pos = r.data_start();
    for (const FileTensor* t : order) {
      if (t->offset != pos)
        fail("checkpoint", r.path() + ": tensor '" + t->name + "' does not follow the previous one");
      uint32_t tcrc = 0;
      for (size_t b = 0; b < t->blocks.size(); ++b) {
        read_blocks(r, *t, m.block_bytes, b, b + 1, buf.data());
        const uint64_t n = std::min(m.block_bytes, t->bytes - b * m.block_bytes);
        tcrc = b == 0 ? t->blocks[b] : crc32c_combine(tcrc, t->blocks[b], n);
      }
      if (tcrc != t->crc)
        fail("checkpoint", r.path() + ": tensor '" + t->name + "': checksum mismatch (stored " +
                               hex32(t->crc) + ", computed " + hex32(tcrc) + ")");
      fcrc = crc32c_combine(fcrc, tcrc, t->bytes);
      pos += t->bytes;
    }
    if (pos != fe.bytes)
      fail("checkpoint", r.path() + ": " + std::to_string(fe.bytes - pos) +
                             " bytes after the last tensor");
    if (fcrc != fe.crc)
      fail("checkpoint", r.path() + ": file checksum mismatch (stored " + hex32(fe.crc) +
                             ", computed " + hex32(fcrc) + ")");
  }
}

std::string inspect_checkpoint(const std::string& step_dir) {
  const Meta m = read_meta(step_dir);
  std::ostringstream o;
  char line[512];
  uint64_t total = 0;
  for (const FileEntry& f : m.files) total += f.bytes;
  int64_t nparams = 0;
  for (const UnitMeta& u : m.units)
    for (const ParamMeta& p : u.params) nparams += p.numel;
  o << "checkpoint   " << step_dir << "\n";
  o << "format       " << kFormatName << " v" << m.version << "\n";
  o << "step         " << m.state.step << "   seed " << m.state.seed << "\n";
  o << "world size   " << m.world << "   strategy " << m.strategy << "   shard group size "
    << m.shard_group;
  if (m.version == kCheckpointFormatV2) o << "   tensor parallel " << m.tensor;
  if (m.pipeline > 1) o << "   pipeline parallel " << m.pipeline;
  o << "\n";
  o << "model        " << model_config_to_json(m.config).dump() << "\n";
  o << "parameters   " << nparams << " (fp32 master + AdamW m, v)   files " << m.files.size()
    << "   bytes " << total << "\n\n";
  std::snprintf(line, sizeof line, "%-40s %-22s %-5s %12s %14s\n", "tensor (parameter)", "shape",
                "dtype", "numel", "bytes (x3)");
  o << line;
  for (const UnitMeta& u : m.units)
    for (const ParamMeta& p : u.params) {
      std::snprintf(line, sizeof line, "%-40s %-22s %-5s %12lld %14lld\n", p.name.c_str(),
                    shape_str(p.shape).c_str(), "F32", static_cast<long long>(p.numel),
                    static_cast<long long>(p.numel * 12));
      o << line;
    }
  o << "\n";
  std::snprintf(line, sizeof line, "%-22s %8s %14s %10s\n", "file", "tensors", "bytes", "crc32c");
  o << line;
  for (const FileEntry& f : m.files) {
    std::snprintf(line, sizeof line, "%-22s %8zu %14llu %10s\n", f.file.c_str(), f.tensors.size(),
                  static_cast<unsigned long long>(f.bytes), hex32(f.crc).c_str());
    o << line;
  }
  return o.str();
}

namespace {

// The tokenizer a directory export copies: the option, else the data.tokenizer of the config
// the checkpoint's run saved ("" when it names none).
std::string export_tokenizer(const Meta& m, const std::string& step_dir,
                             const std::string& option) {
  if (!option.empty()) return option;
  if (m.state.config_json.empty()) return "";
  nlohmann::json c = nlohmann::json::parse(m.state.config_json, nullptr, false);
  if (!c.is_object() || !c.contains("data") || !c["data"].is_object()) return "";
  const nlohmann::json& t = c["data"].value("tokenizer", nlohmann::json(""));
  if (!t.is_string()) return "";
  const std::string tok = t.get<std::string>();
  std::error_code ec;
  if (!tok.empty() && tok != "bytes" && !fs::exists(tok, ec))
    fail("export", step_dir + "/metadata.json: train_state.config_json: data.tokenizer: '" + tok +
                       "' no longer exists (give the tokenizer with --tokenizer, or "
                       "--tokenizer bytes for none)");
  return tok;
}

}  // namespace

void export_checkpoint(const std::string& step_dir, const std::string& out_path,
                       const HfExportOptions& o) {
  const Meta m = read_meta(step_dir);
  check_coverage(m);
  const bool single = out_path.size() >= 12 &&
                      out_path.compare(out_path.size() - 12, 12, ".safetensors") == 0;
  if (!single && o.max_shard_bytes <= 0)
    fail("export", "--max-shard-bytes must be positive (got " + std::to_string(o.max_shard_bytes) +
                       ")");
  // Pass 1: the table of contents (the order of export_hf_safetensors: units, then specs).
  std::vector<StTensorDesc> descs;
  std::set<std::string> seen;
  for (const UnitMeta& u : m.units)
    for (const ParamMeta& p : u.params) {
      const std::string n = single ? p.hf_name : hf_dir_tensor_name(m.config, p.hf_name);
      if (!seen.insert(n).second)
        fail("export", out_path + ": two parameters export to the same name '" + n + "'");
      descs.push_back({n, StDType::F32, p.hf_transpose ? Shape{p.shape[1], p.shape[0]} : p.shape});
    }
  // One file (today's single safetensors), or a directory: its files written in turn by one
  // writer into DIR.tmp, renamed at the end.
  const std::string tmp = out_path + ".tmp";
  std::unique_ptr<SafeTensorsWriter> file;
  HfShardPlan plan;
  std::unique_ptr<HfShardWriter> dir;
  std::string tokenizer;
  if (single) {
    file = std::make_unique<SafeTensorsWriter>(out_path, std::move(descs),
                                               hf_export_metadata(m.config));
  } else {
    tokenizer = export_tokenizer(m, step_dir, o.tokenizer);
    hf_config_json(m.config, out_path + "/config.json");  // refuse what HF cannot hold first
    plan = plan_hf_shards(std::move(descs), o.max_shard_bytes);
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) fail("export", tmp + ": cannot create (" + ec.message() + ")");
    dir = std::make_unique<HfShardWriter>(tmp, plan, 0, 1, hf_export_metadata(m.config));
  }
  // Master tensors by unit; readers opened on first use.
  std::vector<std::vector<std::pair<size_t, const FileTensor*>>> masters(m.units.size());
  for (size_t f = 0; f < m.files.size(); ++f)
    for (const FileTensor& t : m.files[f].tensors)
      if (t.kind == 0) masters[static_cast<size_t>(t.unit)].push_back({f, &t});
  std::map<size_t, SafeTensorsReader> readers;
  std::vector<float> val, tmpv;
  std::vector<unsigned char> buf;
  const bool v2 = m.version == kCheckpointFormatV2;
  const std::array<Sources, 3> blocks = v2 ? logical_sources(m) : std::array<Sources, 3>{};
  Readers rd{m, nullptr, {}};
  size_t i = 0;
  try {
    for (size_t u = 0; u < m.units.size(); ++u)
      for (const ParamMeta& p : m.units[u].params) {
        val.assign(static_cast<size_t>(p.numel), 0.f);
        const int64_t a = p.offset, b = p.offset + p.numel;
        if (v2) {  // the parameter's blocks, wherever they are
          const RowsCols rc = rows_cols(p.shape);
          const LocalBlock whole{0, rc.rows, 0, rc.cols, 0, rc.cols};
          if (const auto it = blocks[0].find(p.name); it != blocks[0].end())
            for (const Source& F : it->second) copy_block(rd, m, F, whole, val.data(), buf);
        } else {  // the unit's master ranges overlapping it
          for (auto [f, t] : masters[u]) {
            const int64_t lo = std::max(a, t->lo), hi = std::min(b, t->hi);
            if (lo >= hi) continue;
            auto it = readers.find(f);
            if (it == readers.end()) it = readers.emplace(f, open_shard(m, m.files[f])).first;
            read_range(it->second, *t, m.block_bytes, lo, hi, buf,
                       [&](int64_t l, int64_t h, const float* d) {
                         std::memcpy(val.data() + (l - a), d, static_cast<size_t>(h - l) * 4);
                       });
          }
        }
        const float* data = val.data();
        if (p.hf_transpose) {
          tmpv.resize(val.size());
          transpose_f32(tmpv.data(), val.data(), p.shape[0], p.shape[1]);
          data = tmpv.data();
        }
        if (file)
          file->write_tensor(p.hf_name, data);
        else
          dir->put(i, data);
        ++i;
      }
    if (file) {
      file->finish();
      return;
    }
    dir->finish();
    write_hf_dir_extras(tmp, m.config, plan, tokenizer);
    fsync_dir(tmp);
    replace_dir(tmp, out_path, "export");
  } catch (...) {
    if (dir) {
      dir.reset();
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    throw;
  }
}

std::string resolve_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path + "/metadata.json", ec)) return path;
  const std::string latest = path + "/latest";
  if (fs::is_regular_file(latest, ec)) {
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    if (name.empty()) fail("checkpoint", latest + ": empty");
    const std::string dir = name[0] == '/' ? name : path + "/" + name;
    if (fs::is_regular_file(dir + "/metadata.json", ec)) return dir;
    fail("checkpoint", latest + " names '" + name + "', which has no metadata.json");
  }
  if (!fs::exists(path, ec)) fail("checkpoint", path + ": no such file or directory");
  fail("checkpoint", path + ": neither a checkpoint step directory (no metadata.json) nor a "
                            "checkpoint directory with a 'latest' file");
}

}  // namespace sw
