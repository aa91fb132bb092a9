// State a bitwise resume needs beyond the master parameters and moments of the sharded
// checkpoint's rank files, one file per rank beside them: <step_dir>/extra_rank_<w>.safetensors
// (w: the world rank), named fp32 tensors with a CRC-32C each in the header's metadata:
//   inner.u<u>.<master|exp_avg|exp_avg_sq>  local SGD: this rank's replica's own inner state
//                                          (the shard it holds; replica 0's is also in the rank
//                                          files, which only replica 0 writes);
//   outer.u<u>.*, qgz.u<u>.*               ShardedModel::extra_state (the round's start, outer
//                                          momentum, a reduce in flight, error-feedback residuals).
// metadata.json lists the files ("extra_files") and the replica groups ("replica_groups").
// They load only onto the mesh that saved them (same world, shard group and replica groups);
// elsewhere the residuals restart at zero and a local SGD run refuses in one line.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sw {

class ShardedModel;
struct Meta;

struct ExtraSnapshot {
  struct T {
    std::string name;
    int64_t at = 0, n = 0;  // floats into data
    uint32_t crc = 0;
  };
  std::vector<T> tensors;
  std::vector<float> data;
  bool empty() const { return tensors.empty(); }
};

// Local (waits for an outer reduce in flight). This rank's extra state, copied; empty when it
// has none. Host memory only.
ExtraSnapshot snapshot_extra(ShardedModel& sm);
// Local. Writes <dir>/extra_rank_<rank>.safetensors (fsynced); returns its metadata.json entry.
std::string write_extra(const ExtraSnapshot& x, const std::string& dir, int rank, int world);
// Local, after the rank files are loaded. `rank`: this rank's world rank (as saved). Throws
// sw::Error naming the file on a bad CRC, an unknown or missized tensor, or (local SGD) a mesh
// that differs from the one that saved the round.
void load_extra(ShardedModel& sm, const Meta& m, int rank, int world);

}  // namespace sw
