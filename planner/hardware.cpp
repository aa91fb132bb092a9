#include "planner/hardware.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/error.h"

namespace sw {

namespace {

using json = nlohmann::json;

bool lowp(DType dt) { return dt != DType::F32; }

[[noreturn]] void bad(const std::string& where, const std::string& msg) {
  fail("hardware", where + ": " + msg);
}

// The value at `path` ("compute.gemm_flops.f32") or nullptr when a part is absent.
const json* find(const json& j, const std::string& path) {
  const json* cur = &j;
  size_t b = 0;
  while (b <= path.size()) {
    const size_t e = path.find('.', b);
    const std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(part);
    if (it == cur->end() || it->is_null()) return nullptr;
    cur = &*it;
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return cur;
}

double positive(const json& j, const std::string& path, const std::string& where) {
  const json* v = find(j, path);
  if (!v) bad(where, "missing key '" + path + "'");
  if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>()))
    bad(where, "'" + path + "' must be a positive number");
  return v->get<double>();
}

double optional_positive(const json& j, const std::string& path, const std::string& where) {
  return find(j, path) ? positive(j, path, where) : 0.0;
}

double non_negative(const json& j, const std::string& path, const std::string& where) {
  const json* v = find(j, path);
  if (!v) bad(where, "missing key '" + path + "'");
  if (!v->is_number() || !(v->get<double>() >= 0) || !std::isfinite(v->get<double>()))
    bad(where, "'" + path + "' must be a number >= 0");
  return v->get<double>();
}

DType dtype_from(const std::string& s, const std::string& path, const std::string& where) {
  if (s == "f32" || s == "fp32") return DType::F32;
  if (s == "bf16") return DType::BF16;
  if (s == "f16" || s == "fp16") return DType::F16;
  bad(where, "'" + path + "' must be \"f32\", \"bf16\" or \"f16\", got \"" + s + "\"");
}

CollectiveFit read_fit(const json& j, const std::string& key, const std::string& where) {
  CollectiveFit f;
  f.latency_s = non_negative(j, "collectives." + key + ".latency_s", where);
  f.busbw = positive(j, "collectives." + key + ".busbw_bytes_per_s", where);
  if (const json* pts = find(j, "collectives." + key + ".points")) {
    if (!pts->is_array()) bad(where, "'collectives." + key + ".points' must be an array");
    for (size_t i = 0; i < pts->size(); ++i) {
      const std::string p = "collectives." + key + ".points." + std::to_string(i);
      const json& e = (*pts)[i];
      if (!e.is_object()) bad(where, "'" + p + "' must be an object");
      CollectivePoint c;
      const json wrap = {{"x", e}};
      c.bytes = static_cast<int64_t>(positive(wrap, "x.bytes", where + " (" + p + ")"));
      c.time_s = positive(wrap, "x.time_s", where + " (" + p + ")");
      f.points.push_back(c);
    }
  }
  return f;
}

json fit_json(const CollectiveFit& f) {
  json pts = json::array();
  for (const CollectivePoint& p : f.points) pts.push_back({{"bytes", p.bytes}, {"time_s", p.time_s}});
  return {{"latency_s", f.latency_s}, {"busbw_bytes_per_s", f.busbw}, {"points", pts}};
}

}  // namespace

double HardwareProfile::gemm_rate(int64_t m, int64_t n, int64_t k, DType dt, bool ta, bool tb) const {
  const double dflt = lowp(dt) && gemm_bf16 > 0 ? gemm_bf16 : gemm_f32;
  // The nearest calibrated shape of the same precision (log distance over m, n, k), if it is
  // within a factor of 8 overall; else the default rate.
  double best = 1e300, rate = 0;
  for (const GemmPoint& p : gemm_shapes) {
    if (lowp(p.dtype) != lowp(dt) || p.flops <= 0) continue;
    const double d = std::fabs(std::log(double(m) / double(p.m))) +
                     std::fabs(std::log(double(n) / double(p.n))) +
                     std::fabs(std::log(double(k) / double(p.k))) +
                     (p.ta != ta || p.tb != tb ? 1e-3 : 0.0);  // same shape: same transposes first
    if (d < best) best = d, rate = p.flops;
  }
  return best <= std::log(8.0) ? rate : dflt;
}

double HardwareProfile::attention_rate(DType dt) const {
  const double r = lowp(dt) ? (attention_bf16 > 0 ? attention_bf16 : attention_f32) : attention_f32;
  return r > 0 ? r : gemm_rate(1, 1, 1, dt);
}

double HardwareProfile::lmhead_rate(DType dt) const {
  const double r = lowp(dt) ? (lmhead_bf16 > 0 ? lmhead_bf16 : lmhead_f32) : lmhead_f32;
  return r > 0 ? r : (lowp(dt) && gemm_bf16 > 0 ? gemm_bf16 : gemm_f32);
}

HardwareProfile hardware_from_json_text(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    std::string m = e.what();
    bad(where, "not valid JSON: " + m.substr(m.find(']') == std::string::npos ? 0 : m.find(']') + 2));
  }
  if (!j.is_object()) bad(where, "not a JSON object");
  HardwareProfile hw;
  if (const json* v = find(j, "name"); v && v->is_string()) hw.name = v->get<std::string>();
  if (const json* v = find(j, "source"); v && v->is_string()) hw.source = v->get<std::string>();
  if (const json* v = find(j, "world_size"); v && v->is_number_integer()) hw.world_size = v->get<int>();
  if (const json* v = find(j, "threads"); v && v->is_number_integer()) hw.threads = v->get<int>();
  if (!find(j, "compute")) bad(where, "missing key 'compute'");
  hw.gemm_f32 = positive(j, "compute.gemm_flops.f32", where);
  hw.gemm_bf16 = optional_positive(j, "compute.gemm_flops.bf16", where);
  if (const json* s = find(j, "compute.gemm_shapes")) {
    if (!s->is_array()) bad(where, "'compute.gemm_shapes' must be an array");
    for (size_t i = 0; i < s->size(); ++i) {
      const std::string p = "compute.gemm_shapes." + std::to_string(i);
      const json wrap = {{"x", (*s)[i]}};
      const std::string w = where + " (" + p + ")";
      GemmPoint g;
      g.m = static_cast<int64_t>(positive(wrap, "x.m", w));
      g.n = static_cast<int64_t>(positive(wrap, "x.n", w));
      g.k = static_cast<int64_t>(positive(wrap, "x.k", w));
      g.flops = positive(wrap, "x.flops", w);
      for (const char* t : {"ta", "tb"})
        if (const json* b = find(wrap, std::string("x.") + t)) {
          if (!b->is_boolean()) bad(where, "'" + p + "." + t + "' must be true or false");
          (t[1] == 'a' ? g.ta : g.tb) = b->get<bool>();
        }
      const json* d = find(wrap, "x.dtype");
      if (!d) bad(where, "missing key '" + p + ".dtype'");
      if (!d->is_string()) bad(where, "'" + p + ".dtype' must be a string");
      g.dtype = dtype_from(d->get<std::string>(), p + ".dtype", where);
      hw.gemm_shapes.push_back(g);
    }
  }
  hw.attention_f32 = optional_positive(j, "compute.attention_flops.f32", where);
  hw.attention_bf16 = optional_positive(j, "compute.attention_flops.bf16", where);
  hw.lmhead_f32 = optional_positive(j, "compute.lmhead_flops.f32", where);
  hw.lmhead_bf16 = optional_positive(j, "compute.lmhead_flops.bf16", where);
  hw.elementwise_bps = positive(j, "compute.elementwise_bytes_per_s", where);
  hw.optimizer_fps = positive(j, "compute.optimizer_floats_per_s", where);
  hw.memcpy_bps = optional_positive(j, "compute.memcpy_bytes_per_s", where);
  if (!j.contains("collectives")) bad(where, "missing key 'collectives' (null when calibrated at one rank)");
  if (!j["collectives"].is_null()) {
    if (!j["collectives"].is_object()) bad(where, "'collectives' must be an object or null");
    hw.has_collectives = true;
    if (const json* v = find(j, "collectives.separate_streams")) {
      if (!v->is_boolean()) bad(where, "'collectives.separate_streams' must be true or false");
      hw.separate_streams = v->get<bool>();
    }
    hw.all_gather = read_fit(j, "all_gather", where);
    hw.reduce_scatter = read_fit(j, "reduce_scatter", where);
    hw.all_reduce = read_fit(j, "all_reduce", where);
    if (find(j, "collectives.p2p")) {
      hw.p2p_latency_s = non_negative(j, "collectives.p2p.latency_s", where);
      hw.p2p_bps = positive(j, "collectives.p2p.bytes_per_s", where);
    }
    if (find(j, "collectives.across_hosts")) {
      hw.across_latency_s = non_negative(j, "collectives.across_hosts.latency_s", where);
      hw.across_busbw = positive(j, "collectives.across_hosts.busbw", where);
    }
  }
  if (!find(j, "disk")) bad(where, "missing key 'disk'");
  if (const json* v = find(j, "disk.path"); v && v->is_string()) hw.disk_path = v->get<std::string>();
  hw.disk_read_bps = positive(j, "disk.read_bytes_per_s", where);
  hw.disk_write_bps = positive(j, "disk.write_bytes_per_s", where);
  if (find(j, "disk.latency_s")) hw.disk_latency_s = non_negative(j, "disk.latency_s", where);
  if (find(j, "host")) {
    hw.has_host = true;
    hw.host_link_bps = positive(j, "host.link_bytes_per_s", where);
    hw.host_optimizer_fps = positive(j, "host.optimizer_floats_per_s", where);
  }
  if (find(j, "process")) {
    hw.baseline_rss_bytes = positive(j, "process.baseline_rss_bytes", where);
    if (find(j, "process.baseline_rss_bytes_bf16"))
      hw.baseline_rss_bf16_bytes = positive(j, "process.baseline_rss_bytes_bf16", where);
  }
  return hw;
}

HardwareProfile load_hardware(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("hardware", path + ": cannot open the hardware profile");
  std::stringstream ss;
  ss << f.rdbuf();
  return hardware_from_json_text(ss.str(), path);
}

std::string hardware_to_json(const HardwareProfile& hw) {
  json j;
  j["name"] = hw.name;
  j["source"] = hw.source;
  j["world_size"] = hw.world_size;
  j["threads"] = hw.threads;
  json c;
  c["gemm_flops"] = {{"f32", hw.gemm_f32}};
  if (hw.gemm_bf16 > 0) c["gemm_flops"]["bf16"] = hw.gemm_bf16;
  c["gemm_shapes"] = json::array();
  for (const GemmPoint& g : hw.gemm_shapes)
    c["gemm_shapes"].push_back({{"m", g.m}, {"n", g.n}, {"k", g.k}, {"ta", g.ta}, {"tb", g.tb},
                                {"dtype", dtype_name(g.dtype)}, {"flops", g.flops}});
  if (hw.attention_f32 > 0) c["attention_flops"]["f32"] = hw.attention_f32;
  if (hw.attention_bf16 > 0) c["attention_flops"]["bf16"] = hw.attention_bf16;
  if (hw.lmhead_f32 > 0) c["lmhead_flops"]["f32"] = hw.lmhead_f32;
  if (hw.lmhead_bf16 > 0) c["lmhead_flops"]["bf16"] = hw.lmhead_bf16;
  c["elementwise_bytes_per_s"] = hw.elementwise_bps;
  c["optimizer_floats_per_s"] = hw.optimizer_fps;
  if (hw.memcpy_bps > 0) c["memcpy_bytes_per_s"] = hw.memcpy_bps;
  j["compute"] = c;
  if (hw.has_collectives)
    j["collectives"] = {{"separate_streams", hw.separate_streams},
                        {"all_gather", fit_json(hw.all_gather)},
                        {"reduce_scatter", fit_json(hw.reduce_scatter)},
                        {"all_reduce", fit_json(hw.all_reduce)}};
  if (hw.has_collectives && hw.p2p_bps > 0)
    j["collectives"]["p2p"] = {{"latency_s", hw.p2p_latency_s}, {"bytes_per_s", hw.p2p_bps}};
  if (hw.has_collectives && hw.across_busbw > 0)
    j["collectives"]["across_hosts"] = {{"latency_s", hw.across_latency_s}, {"busbw", hw.across_busbw}};
  if (!hw.has_collectives)
    j["collectives"] = nullptr;
  j["disk"] = {{"path", hw.disk_path}, {"read_bytes_per_s", hw.disk_read_bps},
               {"write_bytes_per_s", hw.disk_write_bps}, {"latency_s", hw.disk_latency_s}};
  if (hw.has_host)
    j["host"] = {{"link_bytes_per_s", hw.host_link_bps},
                 {"optimizer_floats_per_s", hw.host_optimizer_fps}};
  if (hw.baseline_rss_bytes > 0) j["process"] = {{"baseline_rss_bytes", hw.baseline_rss_bytes}};
  if (hw.baseline_rss_bytes > 0 && hw.baseline_rss_bf16_bytes > 0)
    j["process"]["baseline_rss_bytes_bf16"] = hw.baseline_rss_bf16_bytes;
  return j.dump(2) + "\n";
}

void save_hardware(const HardwareProfile& hw, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec) fail("hardware", path + ": cannot create directory '" + parent.string() + "': " + ec.message());
  std::ofstream f(path);
  f << hardware_to_json(hw);
  if (!f) fail("hardware", path + ": cannot write the hardware profile");
}

std::string plan_shape_note(const HardwareProfile& hw, int world, int threads, bool on_device) {
  const bool ranks_match = hw.world_size == world;
  const bool threads_match = on_device || (hw.threads > 0 && hw.threads == threads);
  if (ranks_match && threads_match) return "";
  auto count = [](int n, const char* what) {
    return n > 0 ? std::to_string(n) + " " + what + (n == 1 ? "" : "s") : std::string("? ") + what + "s";
  };
  auto shape = [&](int r, int t) {
    return on_device ? count(r, "rank") : count(r, "rank") + " x " + count(t, "thread");
  };
  const bool recorded = hw.world_size > 0 && (on_device || hw.threads > 0);
  std::string line = "note: hardware profile '" + hw.name + "' was measured with " +
                     shape(hw.world_size, hw.threads) + (recorded ? "" : " (not recorded)") +
                     ", this run is " + shape(world, threads) +
                     ": the step time uses its per-rank rates as measured (not rescaled), so it "
                     "assumes the profile's ranks";
  line += on_device ? "" : " x threads";
  line += "; calibrate with the run's (`";
  if (world > 1) line += "mpirun -np " + std::to_string(world) + " ";
  line += "shardwise plan CONFIG --calibrate";
  if (!on_device) line += " --set threads=" + std::to_string(threads);
  return line + "`) to predict this run";
}

double HardwareProfile::p2p_seconds(double bytes) const {
  if (p2p_bps > 0) return p2p_latency_s + bytes / p2p_bps;
  const double bw = all_gather.busbw > 0 ? all_gather.busbw : copy_bps();
  return all_gather.latency_s + bytes / bw;
}

HardwareProfile nominal_hardware(int world) {
  HardwareProfile hw;
  hw.name = "nominal (no calibrated profile)";
  hw.source = "built in: round figures of a 2-core CPU machine";
  hw.world_size = world;
  hw.gemm_f32 = 1e11, hw.gemm_bf16 = 2e11;
  hw.attention_f32 = 5e10, hw.attention_bf16 = 5e10;
  hw.lmhead_f32 = 1e11, hw.lmhead_bf16 = 2e11;
  hw.elementwise_bps = 2e10, hw.optimizer_fps = 1e9, hw.memcpy_bps = 2e10;
  hw.has_collectives = true;
  hw.all_gather = hw.reduce_scatter = hw.all_reduce = {3e-5, 2e9, {}};
  hw.disk_read_bps = 1e9, hw.disk_write_bps = 1e9, hw.disk_latency_s = 1e-4;
  return hw;
}

std::string default_hardware_path() {
  if (const std::optional<std::string> e = env_text("SHARDWISE_HARDWARE")) return *e;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/shardwise/hardware.json";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/shardwise/hardware.json";
}

}  // namespace sw
