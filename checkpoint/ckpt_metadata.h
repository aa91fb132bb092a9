// metadata.json of a sharded checkpoint (format: sharded_checkpoint.h, docs/ARCHITECTURE.md):
// the document as types, its reader, and the checks every reader (load, verify, inspect,
// export) runs before opening a shard file. Internal to checkpoint/. Kept apart from the I/O in
// sharded_checkpoint.cpp so the fuzzer (fuzz/) builds it with a handful of other files.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/sharded_checkpoint.h"
#include "core/tensor.h"
#include "models/model.h"

namespace sw {

// Checksum block: the unit of verification and of partial reads (a rank reads whole blocks, so
// smaller blocks waste less when a rank's share of a tensor is small; 256 KiB keeps the
// metadata at ~4 CRCs per MiB).
inline constexpr uint64_t kBlockBytes = uint64_t{256} << 10;
inline constexpr const char* kFormatName = "shardwise-checkpoint";
inline constexpr const char* kKindNames[3] = {"master", "exp_avg", "exp_avg_sq"};

std::string hex32(uint32_t v);                                    // "0badf00d"
std::string tensor_name(int unit, int kind, int64_t lo, int64_t hi);  // "u3.exp_avg[0:128]"
// v2 (tensor-parallel saves): "u3.exp_avg.h.0.attn.qkv.weight[0:64,0:128]" (rows, columns).
std::string rect_name(int unit, int kind, const std::string& param, int64_t r0, int64_t r1,
                      int64_t c0, int64_t c1);
// A parameter as a matrix: dim 0 rows of the product of the other dims (1-D: n rows of 1; a
// scalar: 1 x 1). v2 blocks and resharded loads address parameters this way.
struct RowsCols {
  int64_t rows = 1, cols = 1;
};
RowsCols rows_cols(const Shape& s);

struct FileTensor {
  std::string name;
  int unit = 0, kind = 0;
  // v1: floats [lo, hi) of the unit's flat buffer. v2: lo = 0, hi = the block's floats, and the
  // block is rows [r0, r1) x columns [c0, c1) of parameter `param` (an index into the unit's
  // params), stored row-major.
  int64_t lo = 0, hi = 0;
  int param = -1;
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
  uint64_t offset = 0, bytes = 0;  // offset: absolute in the file
  uint32_t crc = 0;
  std::vector<uint32_t> blocks;
};
struct FileEntry {
  std::string file;  // name inside the step directory
  uint64_t bytes = 0;
  uint32_t crc = 0;
  std::vector<FileTensor> tensors;
};
struct ParamMeta {
  std::string name, hf_name;
  Shape shape;
  int64_t offset = 0, numel = 0;
  bool hf_transpose = false;
};
struct UnitMeta {
  std::string name;
  int64_t numel = 0, padded = 0;
  std::vector<ParamMeta> params;
};
struct Meta {
  std::string dir, path;  // step directory, metadata.json
  int version = 0, world = 0, shard_group = 0;
  int tensor = 1;  // v2: the tensor-parallel degree of the run that saved
  int pipeline = 1;  // the pipeline-parallel degree of the run that saved (informational)
  std::string strategy;
  nlohmann::json config_json;
  ModelConfig config;
  uint64_t block_bytes = kBlockBytes;
  TrainState state;
  std::vector<UnitMeta> units;
  std::vector<FileEntry> files;
  // State beyond the master and moments (checkpoint/extra_state.h): local SGD's replica groups
  // (1: none) and the per-rank files holding it (every rank's own, whole-file CRC-32C).
  int replica_groups = 1;
  struct ExtraFile {
    std::string file;
    int rank = 0;
    uint64_t bytes = 0;
    uint32_t crc = 0;
  };
  std::vector<ExtraFile> extra_files;
};

// metadata.json's text -> Meta, every field checked for type, range and consistency (one
// line naming `path` and the key on the first problem). `step_dir`: where the shard files are.
Meta parse_meta(const std::string& step_dir, const std::string& path, const std::string& text);
// parse_meta of <step_dir>/metadata.json (refusing a file over 1 GiB before reading it).
Meta read_meta(const std::string& step_dir);
// v1: every (unit, kind) must be tiled exactly by the files' tensors; v2: every (parameter,
// kind) by the files' blocks.
void check_coverage(const Meta& m);

}  // namespace sw
