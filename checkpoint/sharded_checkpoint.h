// Sharded checkpoints (issue 5): one step directory per save,
//   <ckpt_dir>/step_<N>/metadata.json        format version, model config, world size,
//                                            strategy, every flat unit's layout and dtype,
//                                            which file holds which flat range, and a CRC-32C
//                                            per tensor and per file
//   <ckpt_dir>/step_<N>/rank_<r>.safetensors this rank's share: fp32 master parameters and
//                                            AdamW m, v: v1 (a model that is not tensor-
//                                            parallel) ranges of a unit's flat buffer; v2 (tensor
//                                            parallel; r = the world rank) blocks of logical
//                                            parameters, rows x columns, replicated parameters
//                                            from tensor rank 0 only
// plus the engine state (TrainState) inside metadata.json. Either loads at any mesh shape (tensor
// degree x data-parallel ranks, any strategy). Pipeline parallelism (each rank's model one stage,
// Model::stage): the same files, with the whole model's unit indices and names (r = the world
// rank: pipeline rank outermost); rank 0 learns every stage's units at the commit, and a unit two
// stages hold is written by the lower pipeline rank; "pipeline_parallel_degree" is informational.
// A stage loads the tensors of its own units only, at any pipeline degree. The save protocol is
// split so the engine can write in the background (async save):
//   1. snapshot_checkpoint  (local, synchronous): copies this rank's share into host memory;
//   2. write_snapshot       (local, any thread): writes and fsyncs this rank's files into a
//                           temporary directory; touches nothing but the snapshot;
//   3. commit_checkpoint    (collective): once every rank has written, rank 0 writes
//                           metadata.json, fsyncs, and renames the temporary directory to the
//                           final one (atomic: a step directory either exists complete or not).
// Maintaining <ckpt_dir>/latest, keep_last pruning and when to save are the engine's
// (engine/checkpointer.*).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/hf_export.h"

namespace sw {

class Group;
class ShardedModel;

// v1: ranges of each unit's flat buffer (every save of an untensored model: t = 1); v2: blocks
// of logical parameters (a tensor-parallel save). Both load at any mesh shape.
constexpr int kCheckpointFormatVersion = 1;
constexpr int kCheckpointFormatV2 = 2;

// Engine state saved beside the tensors, so that a resumed run continues bit-identically.
// Batches are a pure function of (seed, step) (engine/data.h), so the data position is `step`.
struct TrainState {
  int64_t step = 0;       // optimizer steps completed; the resumed run starts at step index `step`
  uint64_t seed = 0;      // the run's seed (init and data order)
  // Optimizer steps applied (AdamW's step count and the LR schedule's position): step minus
  // the steps an fp16 overflow skipped.
  int64_t optimizer_steps = 0;
  // Dynamic loss scaler (fp16); loss_scale 0 = no scaler.
  double loss_scale = 0;
  int64_t scaler_good_steps = 0;
  int scaler_hysteresis_left = 0;
  std::string config_json;  // the resolved config of the run that saved (informational)
};

// This rank's share of a checkpoint, copied out of the model (opaque).
struct CheckpointSnapshot;
struct SnapshotDeleter {
  void operator()(CheckpointSnapshot* s) const;
};
using SnapshotPtr = std::unique_ptr<CheckpointSnapshot, SnapshotDeleter>;

// Local. Copies this rank's share of every unit's master parameters and AdamW moments (and
// `state`) into host memory, checksumming each block as it is copied (so write_snapshot is
// pure I/O); snapshot_bytes() says how much. The model may train on right after. `reuse`: a
// previous snapshot, whose host memory is taken over when it has the right size (already
// faulted in, so the copy runs at memory speed; the engine passes its last snapshot back).
// State in device memory (ShardedModel::state_on_device) is copied device -> host into the
// snapshot with read_state, then checksummed there.
SnapshotPtr snapshot_checkpoint(const ShardedModel& sm, const TrainState& state,
                                SnapshotPtr reuse = nullptr);
int64_t snapshot_bytes(const CheckpointSnapshot& s);
// Local. A snapshot holding only host memory of the size snapshot_checkpoint(sm, ...) needs
// (allocated, transparent huge pages advised, not yet touched), to pass as its `reuse`.
// prefault_snapshot (any thread; the engine runs it in the background when async saving is
// set up) touches every page, so even the first snapshot copies at memory speed instead of
// stalling training in page faults.
SnapshotPtr reserve_snapshot(const ShardedModel& sm);
void prefault_snapshot(CheckpointSnapshot& s);
// Local. A snapshot that refers to the model's own memory instead of a copy (no allocation, no
// copy): valid only while the model does not change, so for synchronous saves that write it
// before training goes on. (State in device memory is copied out range by range into the
// write's staging chunks.)
SnapshotPtr view_checkpoint(const ShardedModel& sm, const TrainState& state);

// Local, callable from a background thread. Writes this rank's files into `tmp_dir` (which it
// creates if needed), fsyncs them. Throws sw::Error naming the file on any failure (ENOSPC...);
// nothing outside tmp_dir is touched.
void write_snapshot(const CheckpointSnapshot& s, const std::string& tmp_dir);

// Collective. `ok`: whether this rank's write_snapshot succeeded. When every rank succeeded,
// rank 0 writes metadata.json into tmp_dir, fsyncs it and the directory, renames tmp_dir to
// final_dir and fsyncs the parent; returns true on every rank. When any rank failed, rank 0
// removes tmp_dir and every rank returns false (the caller reports the error it caught).
bool commit_checkpoint(Group& g, const CheckpointSnapshot& s, bool ok, const std::string& tmp_dir,
                       const std::string& final_dir);

// Collective convenience: write (tmp dir final_dir + ".tmp") + commit; throws sw::Error on
// failure (after cleaning the tmp dir), leaving other checkpoints untouched. Writes straight
// from the model (no snapshot copy), checksumming each block on the way. `world`: the group
// of every rank of the mesh (null: sm.group(), right when the model is neither tensor- nor
// pipeline-parallel);
// commit_checkpoint's `g` likewise.
void save_checkpoint(const ShardedModel& sm, const TrainState& state, const std::string& final_dir,
                     Group* world = nullptr);

// What one load_checkpoint call read on this rank (counted always; a few additions per file).
struct LoadStats {
  // One contiguous pread range of tensor data: bytes [begin, end) of shard file `file` (a file
  // name inside the step directory), whole checksum blocks.
  struct Span {
    std::string file;
    uint64_t begin = 0, end = 0;
  };
  int64_t metadata_bytes = 0;  // metadata.json, read whole by every rank
  int64_t files_opened = 0;    // shard files opened (those with a tensor overlapping held ranges)
  int64_t header_bytes = 0;    // safetensors headers of those files (8-byte length + JSON)
  int64_t payload_bytes = 0;   // tensor bytes pread (= the sum of the spans' sizes)
  int64_t blocks_read = 0;     // checksum blocks read and checked
  std::vector<Span> spans;     // in read order
};

// Collective. Loads a step directory written by any world size, strategy and tensor degree into
// `sm` (whatever its own): each rank reads only the byte ranges of the files that overlap the
// ranges it holds, checking their CRCs. Across tensor degrees (a v2 checkpoint, or a
// tensor-parallel `sm`) parameters are matched by name and assembled from logical blocks. Throws sw::Error naming the file and
// tensor on a missing/truncated/corrupt file, and listing every difference when the model
// shape differs from the checkpoint's. `stats` (optional): filled with what this rank read.
TrainState load_checkpoint(ShardedModel& sm, const std::string& step_dir,
                           LoadStats* stats = nullptr);

// Tools (one process, no model needed).
void verify_checkpoint(const std::string& step_dir);           // every checksum; throws naming file+tensor
std::string inspect_checkpoint(const std::string& step_dir);   // human-readable table
// Consolidated weights with Hugging Face names and layouts, streamed tensor by tensor so memory
// stays within about twice the largest tensor. out_path ending in .safetensors: one file, the
// bytes export_hf_safetensors writes. Otherwise a Hugging Face model directory
// (checkpoint/hf_export.h: config.json, files of at most o.max_shard_bytes with an index, the
// tokenizer: o.tokenizer, else the data.tokenizer of the run that saved), replacing out_path.
void export_checkpoint(const std::string& step_dir, const std::string& out_path,
                       const HfExportOptions& o = {});

// Parses and validates the text of a step directory's metadata.json (`path` names it in
// messages) as load, verify, inspect and export do before opening a shard file: the checksum,
// every field's type and range (nothing is truncated), the layout's consistency and the files'
// tiling of every unit. Throws sw::Error("checkpoint: <path>: ..."). Reads nothing from disk
// (fuzz/ drives it).
void check_checkpoint_metadata(const std::string& path, const std::string& text);

// Resolves a user's --resume argument: a step directory, or a checkpoint directory whose
// `latest` file names one. Throws sw::Error when neither.
std::string resolve_checkpoint_dir(const std::string& path);

}  // namespace sw
