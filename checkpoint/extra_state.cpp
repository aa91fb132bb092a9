#include "checkpoint/extra_state.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/ckpt_metadata.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "sharding/sharded_model.h"

namespace sw {

namespace {

using StateKind = ShardedModel::StateKind;
constexpr const char* kInnerKinds[3] = {"master", "exp_avg", "exp_avg_sq"};

std::string extra_file(int rank) { return "extra_rank_" + std::to_string(rank) + ".safetensors"; }

}  // namespace

ExtraSnapshot snapshot_extra(ShardedModel& sm) {
  ExtraSnapshot x;
  auto add = [&](const std::string& name, int64_t n) {
    x.tensors.push_back({name, static_cast<int64_t>(x.data.size()), n, 0});
    x.data.resize(x.data.size() + static_cast<size_t>(n));
    return x.data.data() + x.tensors.back().at;
  };
  if (sm.replicas() > 1)
    for (int u = 0; u < sm.num_units(); ++u)
      for (int k = 0; k < 3; ++k) {
        const FlatRange r = sm.held_range(u, static_cast<StateKind>(k));
        if (r.empty()) continue;
        float* dst = add("inner.u" + std::to_string(u) + "." + kInnerKinds[k], r.size());
        sm.read_state(u, static_cast<StateKind>(k), r, dst);
      }
  for (const ShardedModel::NamedState& e : sm.extra_state()) {
    float* dst = add(e.name, e.n);
    std::memcpy(dst, e.data, static_cast<size_t>(e.n) * sizeof(float));
  }
  for (ExtraSnapshot::T& t : x.tensors)
    t.crc = crc32c(x.data.data() + t.at, static_cast<size_t>(t.n) * sizeof(float));
  return x;
}

std::string write_extra(const ExtraSnapshot& x, const std::string& dir, int rank, int world) {
  const std::string name = extra_file(rank), path = dir + "/" + name;
  std::vector<StTensorRef> refs;
  std::map<std::string, std::string> meta = {{"format", "shardwise-extra-state"},
                                             {"rank", std::to_string(rank)},
                                             {"world_size", std::to_string(world)}};
  for (const ExtraSnapshot::T& t : x.tensors) {
    refs.push_back({{t.name, StDType::F32, {t.n}}, x.data.data() + t.at});
    meta["crc32c." + t.name] = std::to_string(t.crc);
  }
  save_safetensors(path, refs, meta);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) fail("checkpoint", path + ": cannot read back what was written");
  const nlohmann::ordered_json e = {{"file", name},
                                    {"rank", rank},
                                    {"bytes", bytes.size()},
                                    {"crc32c", crc32c(bytes.data(), bytes.size())}};
  return e.dump();
}

void load_extra(ShardedModel& sm, const Meta& m, int rank, int world) {
  const int R = sm.replicas();
  if (R > 1) {
    const int S = world / R;
    if (m.replica_groups == 1)  // a checkpoint without a round: every replica starts one from it
      return;
    if (m.replica_groups != R || m.world != world || m.shard_group != S)
      fail("checkpoint", m.dir + ": saved by " + std::to_string(m.replica_groups) +
                             " replica groups of " + std::to_string(m.world / m.replica_groups) +
                             " ranks; local_sgd resumes a round only on the same mesh (this run: " +
                             std::to_string(R) + " of " + std::to_string(S) + ")");
  } else if (m.world != world || m.shard_group != sm.unit_layout(0).world || m.replica_groups != 1) {
    return;  // another mesh: error-feedback residuals restart at zero
  }
  const Meta::ExtraFile* ef = nullptr;
  for (const Meta::ExtraFile& e : m.extra_files)
    if (e.rank == rank) ef = &e;
  if (!ef) {
    if (R > 1) fail("checkpoint", m.dir + ": no extra_rank_" + std::to_string(rank) +
                                      ".safetensors in extra_files (local_sgd's inner and outer state)");
    return;
  }
  const std::string path = m.dir + "/" + ef->file;
  {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec || size != ef->bytes)
      fail("checkpoint", path + ": " + (ec ? "missing" : std::to_string(size) + " bytes, metadata.json says " +
                                                        std::to_string(ef->bytes)));
  }
  const SafeTensorsReader r(path);
  std::vector<float> buf;
  for (const StTensorInfo& t : r.tensors()) {
    const int64_t n = t.numel();
    buf.resize(static_cast<size_t>(n));
    r.read_f32(t.name, buf.data());
    const auto c = r.metadata().find("crc32c." + t.name);
    if (c == r.metadata().end() ||
        c->second != std::to_string(crc32c(buf.data(), static_cast<size_t>(n) * sizeof(float))))
      fail("checkpoint", path + ": tensor '" + t.name + "': CRC-32C mismatch (corrupt file)");
    if (t.name.rfind("inner.", 0) == 0) {
      const size_t d1 = t.name.find('.', 6);
      int u = -1, k = -1;
      if (d1 != std::string::npos && t.name.compare(6, 1, "u") == 0) {
        u = std::atoi(t.name.substr(7, d1 - 7).c_str());
        for (int j = 0; j < 3; ++j)
          if (t.name.substr(d1 + 1) == kInnerKinds[j]) k = j;
      }
      if (u < 0 || u >= sm.num_units() || k < 0)
        fail("checkpoint", path + ": tensor '" + t.name + "' names no unit state of this model");
      const FlatRange h = sm.held_range(u, static_cast<StateKind>(k));
      if (h.size() != n)
        fail("checkpoint", path + ": tensor '" + t.name + "' holds " + std::to_string(n) +
                               " floats, this rank holds " + std::to_string(h.size()));
      sm.write_state(u, static_cast<StateKind>(k), h, buf.data());
      continue;
    }
    float* dst = sm.restore_target(t.name, n);
    if (!dst) fail("checkpoint", path + ": tensor '" + t.name + "' has no place in this model");
    std::memcpy(dst, buf.data(), static_cast<size_t>(n) * sizeof(float));
  }
}

}  // namespace sw
