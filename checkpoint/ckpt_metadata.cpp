#include "checkpoint/ckpt_metadata.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/hf_layout.h"
#include "core/error.h"
#include "core/json_depth.h"

namespace sw {

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

std::string tensor_name(int unit, int kind, int64_t lo, int64_t hi) {
  std::string s = "u";  // (appended: GCC 12's -Wrestrict misfires on "u" + std::to_string)
  s += std::to_string(unit);
  s += '.';
  s += kKindNames[kind];
  s += '[';
  s += std::to_string(lo);
  s += ':';
  s += std::to_string(hi);
  s += ']';
  return s;
}

std::string rect_name(int unit, int kind, const std::string& param, int64_t r0, int64_t r1,
                      int64_t c0, int64_t c1) {
  std::string s = "u";
  s += std::to_string(unit);
  s += '.';
  s += kKindNames[kind];
  s += '.';
  s += param;
  s += '[';
  s += std::to_string(r0) + ":" + std::to_string(r1) + "," + std::to_string(c0) + ":" +
       std::to_string(c1);
  s += ']';
  return s;
}

RowsCols rows_cols(const Shape& s) {
  if (s.empty()) return {};
  // (A zero dimension first: the other dims of an empty shape are not bounded by its numel.)
  for (int64_t d : s)
    if (d == 0) return {s[0], 0};
  int64_t cols = 1;
  for (size_t d = 1; d < s.size(); ++d) cols *= s[d];
  return {s[0], cols};
}

namespace {

std::string errno_str() { return std::strerror(errno); }

// Bounds on what metadata.json may claim, so nothing sized from it can overflow 64 bits or
// allocate without limit: floats per unit and in all (2^52 floats = 16 PiB), bytes per file,
// the checksum block (the writer uses 256 KiB; verify allocates one), the document itself.
constexpr int64_t kMaxFloats = int64_t{1} << 52;
constexpr int64_t kMaxFileBytes = int64_t{1} << 60;
constexpr int64_t kMaxBlockBytes = int64_t{64} << 20;
constexpr uint64_t kMaxMetadataBytes = uint64_t{1} << 30;

// Typed access with one-line errors naming metadata.json and the key path. Numbers are read
// only when they are integers of the right sign and within the field's range: nothing is
// truncated (a d_model of 2^40 is an error, not 0).
struct MetaReader {
  std::string path;
  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    fail("checkpoint", path + ": " + where + " " + what);
  }
  const nlohmann::json& at(const nlohmann::json& j, const char* key, const std::string& where) const {
    if (!j.is_object() || !j.contains(key)) bad(where, std::string("has no '") + key + "'");
    return j.at(key);
  }
  std::string str(const nlohmann::json& j, const char* key, const std::string& where) const {
    const nlohmann::json& v = at(j, key, where);
    if (!v.is_string()) bad(join(where, key), "must be a string (got " + kind(v) + ")");
    return v.get<std::string>();
  }
  bool boolean(const nlohmann::json& j, const char* key, const std::string& where) const {
    const nlohmann::json& v = at(j, key, where);
    if (!v.is_boolean()) bad(join(where, key), "must be true or false (got " + kind(v) + ")");
    return v.get<bool>();
  }
  // An integer in [lo, hi].
  int64_t integer(const nlohmann::json& v, const std::string& where, int64_t lo, int64_t hi) const {
    int64_t x = 0;
    bool ok = false;
    if (v.is_number_unsigned()) {
      ok = v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
      x = ok ? static_cast<int64_t>(v.get<uint64_t>()) : 0;
    } else if (v.is_number_integer()) {
      ok = true;
      x = v.get<int64_t>();
    }
    if (ok && x >= lo && x <= hi) return x;
    bad(where, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                   "] (got " + kind(v) + ")");
  }
  int64_t integer(const nlohmann::json& j, const char* key, const std::string& where, int64_t lo,
                  int64_t hi) const {
    return integer(at(j, key, where), join(where, key), lo, hi);
  }
  // "units[2].numel"; a top-level key alone ("world_size").
  static std::string join(const std::string& where, const char* key) {
    return where == "the document" ? std::string(key) : where + "." + key;
  }
  uint32_t crc(const nlohmann::json& v, const std::string& where) const {
    return static_cast<uint32_t>(integer(v, where, 0, UINT32_MAX));
  }
  const nlohmann::json& array(const nlohmann::json& j, const char* key,
                              const std::string& where) const {
    const nlohmann::json& v = at(j, key, where);
    if (!v.is_array()) bad(join(where, key), "is not an array");
    return v;
  }
  static std::string kind(const nlohmann::json& v) {
    if (v.is_number() || v.is_boolean() || v.is_null()) return v.dump();
    return v.is_string() ? "a string" : v.is_array() ? "an array" : "an object";
  }
};

// The product of a shape's dimensions, or -1 when it exceeds `limit`.
int64_t bounded_numel(const Shape& s, int64_t limit) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d == 0) return 0;
    if (n > limit / d) return -1;
    n *= d;
  }
  return n <= limit ? n : -1;
}

}  // namespace

// metadata.json's text (`path` names it) -> Meta, checked field by field; step_dir: where the
// shard files are.
Meta parse_meta(const std::string& step_dir, const std::string& path, const std::string& text) {
  Meta m;
  m.dir = step_dir;
  m.path = path;
  MetaReader R{m.path};
  if (const size_t at = json_depth_exceeded(text); at != std::string::npos)
    R.bad("the document", "nests deeper than " + std::to_string(kJsonMaxDepth) + " levels (at " +
                              json_position(text, at) + ")");
  nlohmann::ordered_json oj;
  try {
    oj = nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    std::string w = e.what();
    fail("checkpoint", m.path + ": not valid JSON (" + w.substr(0, w.find('\n')) + ")");
  }
  if (!oj.is_object()) R.bad("the document", "is not a JSON object");
  if (!oj.contains("format") || oj["format"] != kFormatName)
    R.bad("the document", std::string("is not a Shardwise checkpoint (no \"format\": \"") +
                              kFormatName + "\")");
  if (!oj.contains("metadata_crc32c")) R.bad("the document", "has no 'metadata_crc32c'");
  const uint32_t stored = R.crc(oj["metadata_crc32c"], "metadata_crc32c");
  oj.erase("metadata_crc32c");
  const std::string body = oj.dump();
  const uint32_t got = crc32c(body.data(), body.size());
  if (got != stored)
    fail("checkpoint", m.path + ": checksum mismatch (stored " + hex32(stored) + ", computed " +
                           hex32(got) + "): the metadata is corrupt");
  const nlohmann::json j = nlohmann::json::parse(body);

  constexpr int64_t kIntMax = INT32_MAX;
  m.version = static_cast<int>(R.integer(j, "format_version", "the document", 0, kIntMax));
  if (m.version != kCheckpointFormatVersion && m.version != kCheckpointFormatV2)
    R.bad("format_version", std::to_string(m.version) + " is not supported (this build reads " +
                                std::to_string(kCheckpointFormatVersion) + " and " +
                                std::to_string(kCheckpointFormatV2) + ")");
  const bool v2 = m.version == kCheckpointFormatV2;
  m.world = static_cast<int>(R.integer(j, "world_size", "the document", 1, kIntMax));
  if (v2)
    m.tensor = static_cast<int>(R.integer(j, "tensor_parallel_degree", "the document", 1, m.world));
  if (j.contains("pipeline_parallel_degree"))
    m.pipeline = static_cast<int>(R.integer(j, "pipeline_parallel_degree", "the document", 1, m.world));
  m.shard_group = static_cast<int>(R.integer(j, "shard_group_size", "the document", 1, m.world));
  m.strategy = R.str(j, "strategy", "the document");
  m.config_json = R.at(j, "model_config", "the document");
  m.config = model_config_from_json(m.config_json, m.path, /*any_type=*/true);  // (custom models)
  m.block_bytes = static_cast<uint64_t>(R.integer(j, "block_bytes", "the document", 4, kMaxBlockBytes));
  if (m.block_bytes % 4) R.bad("block_bytes", "must be a multiple of 4");
  const nlohmann::json& ts = R.at(j, "train_state", "the document");
  m.state.step = R.integer(ts, "step", "train_state", 0, INT64_MAX);
  {
    const nlohmann::json& v = R.at(ts, "seed", "train_state");
    if (!v.is_number_unsigned())  // any uint64 (JSON's non-negative integers)
      R.bad("train_state.seed", "must be an integer in [0, 2^64) (got " + R.kind(v) + ")");
    m.state.seed = v.get<uint64_t>();
  }
  m.state.optimizer_steps = R.integer(ts, "optimizer_steps", "train_state", 0, m.state.step);
  {
    const nlohmann::json& v = R.at(ts, "loss_scale", "train_state");
    if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>()))
      R.bad("train_state.loss_scale", "must be a finite number >= 0 (got " + R.kind(v) + ")");
    m.state.loss_scale = v.get<double>();
  }
  m.state.scaler_good_steps = R.integer(ts, "scaler_good_steps", "train_state", 0, INT64_MAX);
  m.state.scaler_hysteresis_left =
      static_cast<int>(R.integer(ts, "scaler_hysteresis_left", "train_state", 0, kIntMax));
  m.state.config_json = R.str(ts, "config_json", "train_state");

  const nlohmann::json& units = R.array(j, "units", "the document");
  int64_t all_floats = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string w = "units[" + std::to_string(u) + "]";
    UnitMeta um;
    um.name = R.str(units[u], "name", w);
    um.numel = R.integer(units[u], "numel", w, 0, kMaxFloats);
    um.padded = R.integer(units[u], "padded", w, um.numel, kMaxFloats);
    if (um.numel > kMaxFloats - all_floats)
      R.bad(w + ".numel", "brings the model past " + std::to_string(kMaxFloats) + " floats");
    all_floats += um.numel;
    const nlohmann::json& ps = R.array(units[u], "params", w);
    for (size_t p = 0; p < ps.size(); ++p) {
      const std::string pw = w + ".params[" + std::to_string(p) + "]";
      ParamMeta pm;
      pm.name = R.str(ps[p], "name", pw);
      pm.hf_name = R.str(ps[p], "hf_name", pw);
      pm.hf_transpose = R.boolean(ps[p], "hf_transpose", pw);
      pm.offset = R.integer(ps[p], "offset", pw, 0, um.numel);
      pm.numel = R.integer(ps[p], "numel", pw, 0, um.numel - pm.offset);
      const nlohmann::json& shape = R.array(ps[p], "shape", pw);
      for (size_t d = 0; d < shape.size(); ++d)
        pm.shape.push_back(R.integer(shape[d], pw + ".shape[" + std::to_string(d) + "]", 0, kMaxFloats));
      if (bounded_numel(pm.shape, kMaxFloats) != pm.numel)
        R.bad(pw, "is inconsistent (shape " + shape_str(pm.shape) + " does not hold numel " +
                      std::to_string(pm.numel) + ")");
      if (pm.hf_transpose && pm.shape.size() != 2) R.bad(pw, "has hf_transpose but is not a matrix");
      um.params.push_back(std::move(pm));
    }
    m.units.push_back(std::move(um));
  }

  const nlohmann::json& files = R.array(j, "files", "the document");
  std::set<std::string> fnames;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string w = "files[" + std::to_string(f) + "]";
    FileEntry fe;
    fe.file = R.str(files[f], "file", w);
    // A plain name inside the step directory: never a path ("../x", "a/b", "/x"), a hidden
    // or special name, or a byte that could end or confuse a path.
    bool plain = !fe.file.empty() && fe.file.size() <= 255 && fe.file[0] != '.';
    for (char c : fe.file) plain = plain && c != '/' && c != '\\' && c != '\0';
    if (!plain || !fnames.insert(fe.file).second)
      R.bad(w + ".file", "'" + fe.file + "' is not a plain, unique file name");
    fe.bytes = static_cast<uint64_t>(R.integer(files[f], "bytes", w, 0, kMaxFileBytes));
    fe.crc = R.crc(R.at(files[f], "crc32c", w), w + ".crc32c");
    const nlohmann::json& ts2 = R.array(files[f], "tensors", w);
    for (size_t t = 0; t < ts2.size(); ++t) {
      const std::string tw = w + ".tensors[" + std::to_string(t) + "]";
      FileTensor ft;
      ft.name = R.str(ts2[t], "name", tw);
      ft.unit = static_cast<int>(
          R.integer(ts2[t], "unit", tw, 0, static_cast<int64_t>(m.units.size()) - 1));
      const std::string kind = R.str(ts2[t], "kind", tw);
      ft.kind = -1;
      for (int k = 0; k < 3; ++k)
        if (kind == kKindNames[k]) ft.kind = k;
      if (ft.kind < 0) R.bad(tw + ".kind", "'" + kind + "' is not master, exp_avg or exp_avg_sq");
      const UnitMeta& um = m.units[static_cast<size_t>(ft.unit)];
      if (v2) {  // a block of a parameter: rows [r0, r1) x columns [c0, c1)
        const std::string pname = R.str(ts2[t], "param", tw);
        for (size_t p = 0; p < um.params.size() && ft.param < 0; ++p)
          if (um.params[p].name == pname) ft.param = static_cast<int>(p);
        if (ft.param < 0) R.bad(tw + ".param", "'" + pname + "' is not a parameter of its unit");
        const RowsCols rc = rows_cols(um.params[static_cast<size_t>(ft.param)].shape);
        auto span = [&](const char* key, int64_t n, int64_t& a, int64_t& b) {
          const nlohmann::json& v = R.array(ts2[t], key, tw);
          if (v.size() != 2) R.bad(R.join(tw, key), "must be [begin, end]");
          a = R.integer(v[0], R.join(tw, key) + "[0]", 0, n);
          b = R.integer(v[1], R.join(tw, key) + "[1]", a, n);
        };
        span("rows", rc.rows, ft.r0, ft.r1);
        span("cols", rc.cols, ft.c0, ft.c1);
        ft.lo = 0, ft.hi = (ft.r1 - ft.r0) * (ft.c1 - ft.c0);  // within the parameter's numel
      } else {
        ft.lo = R.integer(ts2[t], "lo", tw, 0, um.numel);
        ft.hi = R.integer(ts2[t], "hi", tw, ft.lo, um.numel);
      }
      ft.offset = static_cast<uint64_t>(R.integer(ts2[t], "offset", tw, 0, static_cast<int64_t>(fe.bytes)));
      ft.bytes = static_cast<uint64_t>(
          R.integer(ts2[t], "bytes", tw, 0, static_cast<int64_t>(fe.bytes - ft.offset)));
      ft.crc = R.crc(R.at(ts2[t], "crc32c", tw), tw + ".crc32c");
      const nlohmann::json& blocks = R.array(ts2[t], "block_crc32c", tw);
      if (ft.bytes != static_cast<uint64_t>(ft.hi - ft.lo) * 4 ||
          blocks.size() != (ft.bytes + m.block_bytes - 1) / m.block_bytes)
        R.bad(tw, "('" + ft.name + "') is inconsistent (unit, range, offset, bytes or blocks)");
      ft.blocks.reserve(blocks.size());
      for (size_t b = 0; b < blocks.size(); ++b)
        ft.blocks.push_back(R.crc(blocks[b], tw + ".block_crc32c[" + std::to_string(b) + "]"));
      fe.tensors.push_back(std::move(ft));
    }
    m.files.push_back(std::move(fe));
  }
  if (j.contains("replica_groups"))
    m.replica_groups = static_cast<int>(R.integer(j, "replica_groups", "the document", 1, m.world));
  if (j.contains("extra_files")) {
    const nlohmann::json& ex = R.array(j, "extra_files", "the document");
    std::set<int> ranks;
    for (size_t f = 0; f < ex.size(); ++f) {
      const std::string w = "extra_files[" + std::to_string(f) + "]";
      Meta::ExtraFile e;
      e.file = R.str(ex[f], "file", w);
      e.rank = static_cast<int>(R.integer(ex[f], "rank", w, 0, m.world - 1));
      if (e.file != "extra_rank_" + std::to_string(e.rank) + ".safetensors" || !ranks.insert(e.rank).second)
        R.bad(w + ".file", "'" + e.file + "' is not extra_rank_<rank>.safetensors of a rank of its own");
      e.bytes = static_cast<uint64_t>(R.integer(ex[f], "bytes", w, 0, kMaxFileBytes));
      e.crc = R.crc(R.at(ex[f], "crc32c", w), w + ".crc32c");
      m.extra_files.push_back(std::move(e));
    }
  }
  return m;
}

Meta read_meta(const std::string& step_dir) {
  const std::string path = step_dir + "/metadata.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("checkpoint", path + ": cannot open (" + errno_str() + ")");
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxMetadataBytes)
    fail("checkpoint", path + ": " + std::to_string(size) + " bytes, more than the " +
                           std::to_string(kMaxMetadataBytes) + " a metadata file may have");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_meta(step_dir, path, ss.str());
}

namespace {

// v2: every parameter's rows x columns tiled exactly, per kind, by the files' blocks: no block
// overlaps another (blocks sorted by first row; only those starting above a block's last row
// are compared with it) and their areas add up to the parameter's.
void check_coverage_v2(const Meta& m) {
  struct Block {
    int64_t r0, r1, c0, c1;
  };
  std::vector<std::vector<std::vector<Block>>> by(m.units.size());  // [unit][param * 3 + kind]
  for (size_t u = 0; u < m.units.size(); ++u) by[u].resize(m.units[u].params.size() * 3);
  for (const FileEntry& f : m.files)
    for (const FileTensor& t : f.tensors)
      if (t.hi > t.lo)
        by[static_cast<size_t>(t.unit)][static_cast<size_t>(t.param) * 3 + static_cast<size_t>(t.kind)]
            .push_back({t.r0, t.r1, t.c0, t.c1});
  for (size_t u = 0; u < m.units.size(); ++u)
    for (size_t p = 0; p < m.units[u].params.size(); ++p)
      for (int k = 0; k < 3; ++k) {
        const ParamMeta& pm = m.units[u].params[p];
        std::vector<Block>& bs = by[u][p * 3 + static_cast<size_t>(k)];
        std::sort(bs.begin(), bs.end(), [](const Block& a, const Block& b) {
          return a.r0 != b.r0 ? a.r0 < b.r0 : a.c0 < b.c0;
        });
        auto name = [&](const Block& b) {
          return rect_name(int(u), k, pm.name, b.r0, b.r1, b.c0, b.c1);
        };
        int64_t area = 0;
        for (size_t i = 0; i < bs.size(); ++i) {
          for (size_t j = i + 1; j < bs.size() && bs[j].r0 < bs[i].r1; ++j)
            if (bs[j].c0 < bs[i].c1 && bs[i].c0 < bs[j].c1)
              fail("checkpoint", m.path + ": " + name(bs[i]) + " and " + name(bs[j]) + " overlap");
          area += (bs[i].r1 - bs[i].r0) * (bs[i].c1 - bs[i].c0);  // disjoint: at most numel
        }
        if (area != pm.numel)
          fail("checkpoint", m.path + ": " + std::to_string(pm.numel - area) + " of the " +
                                 std::to_string(pm.numel) + " elements of u" + std::to_string(u) +
                                 "." + kKindNames[k] + "." + pm.name + " are in no file");
      }
}

}  // namespace

// Every (unit, kind) must be tiled exactly by the files' tensors (v2: every parameter's).
void check_coverage(const Meta& m) {
  if (m.version == kCheckpointFormatV2) return check_coverage_v2(m);
  for (size_t u = 0; u < m.units.size(); ++u)
    for (int k = 0; k < 3; ++k) {
      std::vector<std::pair<int64_t, int64_t>> rs;
      for (const FileEntry& f : m.files)
        for (const FileTensor& t : f.tensors)
          if (t.unit == static_cast<int>(u) && t.kind == k && t.hi > t.lo) rs.push_back({t.lo, t.hi});
      std::sort(rs.begin(), rs.end());
      int64_t at = 0;
      for (auto [lo, hi] : rs) {
        if (lo != at)
          fail("checkpoint", m.path + ": " + tensor_name(int(u), k, std::min(lo, at), std::max(lo, at)) +
                                 (lo > at ? " is in no file" : " is in two files"));
        at = hi;
      }
      if (at != m.units[u].numel)
        fail("checkpoint", m.path + ": " + tensor_name(int(u), k, at, m.units[u].numel) + " is in no file");
    }
}

void check_checkpoint_metadata(const std::string& path, const std::string& text) {
  check_coverage(parse_meta(parent_dir(path), path, text));
}


}  // namespace sw
