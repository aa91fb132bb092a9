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

struct FileTensor {
  std::string name;
  int unit = 0, kind = 0;
  int64_t lo = 0, hi = 0;
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
  std::string strategy;
  nlohmann::json config_json;
  ModelConfig config;
  uint64_t block_bytes = kBlockBytes;
  TrainState state;
  std::vector<UnitMeta> units;
  std::vector<FileEntry> files;
};

// metadata.json's text -> Meta, every field checked for type, range and consistency (one
// line naming `path` and the key on the first problem). `step_dir`: where the shard files are.
Meta parse_meta(const std::string& step_dir, const std::string& path, const std::string& text);
// parse_meta of <step_dir>/metadata.json (refusing a file over 1 GiB before reading it).
Meta read_meta(const std::string& step_dir);
// Every (unit, kind) must be tiled exactly by the files' tensors.
void check_coverage(const Meta& m);

}  // namespace sw
