// The profiler's writers on hand-made data: the trace parses back as JSON with one pid per rank,
// one tid per queue and every action complete; peaks are computed exactly; the SVG is
// well-formed and draws what the data says.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "core/error.h"
#include "engine/profiler.h"
#include "engine/trainer.h"
#include "engine_test_util.h"

using namespace sw;
using json = nlohmann::json;

namespace {

// Two steps of a tiny plan on rank 1 of 2; times in seconds from 100.0.
ProfileData sample_data() {
  ProfileData d;
  d.rank = 1, d.world = 2;
  d.categories = {"params", "grads", "activations", "communication"};
  d.mem_start = {{"params", 1000}, {"grads", 0}, {"activations", 0}, {"communication", 0}};
  int idx = 0;
  auto act = [&](int step, const char* q, const char* kind, int unit, const char* uname,
                 double b, double e, int64_t bytes) {
    TraceAction a;
    a.step = step, a.action = idx++, a.queue = q, a.kind = kind, a.unit = unit, a.call = 0;
    a.unit_name = uname, a.t_begin = 100 + b, a.t_end = 100 + e, a.bytes = bytes;
    d.actions.push_back(a);
  };
  for (int s = 1; s <= 2; ++s) {
    const double o = (s - 1) * 0.010;
    act(s, "gather", "gather", 0, "h.0", o + 0.000, o + 0.001, 4096);
    act(s, "compute", "forward", 0, "h.0", o + 0.001, o + 0.003, 0);
    act(s, "compute", "backward", 0, "h.0 \"tied\"\n<x>", o + 0.003, o + 0.006, 0);
    act(s, "reduce", "reduce_scatter", 0, "h.0", o + 0.006, o + 0.007, 2048);
    act(s, "io", "evict", 0, "h.0", o + 0.007, o + 0.008, 512);
  }
  // Memory: per step +comm 500 (gather), +act 300, -comm 500, +grads 200, +act 100 (peak),
  // -act 400, -grads 200.
  auto mem = [&](double t, int a, const char* c, int64_t delta) {
    d.mem.push_back(MemSample{100 + t, a, c, delta});
  };
  for (int s = 0; s < 2; ++s) {
    const double o = s * 0.010;
    const int a0 = s * 5;
    mem(o + 0.0001, a0, "communication", 500);
    mem(o + 0.0015, a0 + 1, "activations", 300);
    mem(o + 0.0020, a0 + 1, "communication", -500);
    mem(o + 0.0035, a0 + 2, "grads", 200);
    mem(o + 0.0040, a0 + 2, "activations", 100 + s * 50);  // step 2 goes 50 higher
    mem(o + 0.0050, a0 + 2, "activations", -400 - s * 50);
    mem(o + 0.0070, a0 + 3, "grads", -200);
  }
  return d;
}

}  // namespace

TEST_CASE("profiler: peaks of a hand-made timeline are exact") {
  const ProfileData d = sample_data();
  const Peaks p = compute_peaks(d);
  // Totals, step 1: 1000 (start), 1500, 1800, 1300, 1500, 1600, 1200, 1000; step 2 ties 1800
  // (the first time counts) and its activations reach 450.
  CHECK(p.rank == 1);
  CHECK(p.peak_bytes == 1800);  // the gather's buffer plus the first activations
  CHECK(p.peak_action == 1);
  CHECK(p.peak_time == Approx(100.0015));
  CHECK(p.peak_step == 1);  // action 1 of step 1 holds that time (step 2's action 6 does not)
  CHECK(p.peak_kind == "forward");
  CHECK(p.at_peak.at("params") == 1000);
  CHECK(p.at_peak.at("communication") == 500);
  CHECK(p.at_peak.at("activations") == 300);
  CHECK(p.at_peak.at("grads") == 0);
  // Each category's own peak happens at a different time than the total's.
  CHECK(p.peak_per_category.at("activations") == 450);
  CHECK(p.peak_per_category.at("grads") == 200);
  CHECK(p.peak_per_category.at("communication") == 500);
  CHECK(p.peak_per_category.at("params") == 1000);
  CHECK(p.categories == d.categories);

  // Samples out of time order are applied in time order; an unknown category is appended.
  ProfileData e = d;
  std::swap(e.mem[0], e.mem[1]);
  e.mem.push_back(MemSample{100.0016, 9, "workspace", 1});
  const Peaks q = compute_peaks(e);
  CHECK(q.peak_bytes == 1801);
  CHECK(q.peak_action == 9);
  CHECK(q.categories.back() == "workspace");

  // The start state counts: nothing recorded -> the peak is mem_start.
  ProfileData f;
  f.categories = {"params"};
  f.mem_start = {{"params", 77}};
  const Peaks r = compute_peaks(f);
  CHECK(r.peak_bytes == 77);
  CHECK(r.peak_action == -1);

  // peaks json carries the same numbers.
  const json j = json::parse(peaks_json(p));
  CHECK(j["peak_bytes"] == 1800);
  CHECK(j["peak_action"] == 1);
  CHECK(j["at_peak"]["activations"] == 300);
  CHECK(j["peak_per_category"]["activations"] == 450);
  int64_t sum = 0;
  for (auto& [k, v] : j["at_peak"].items()) sum += v.get<int64_t>();
  CHECK(sum == 1800);

  const std::string table = format_peaks_table(p);
  CHECK_THAT(table, Catch::Matchers::Contains("rank 1: peak memory 1.8 KiB at action 1 (step 1, forward)"));
  CHECK_THAT(table, Catch::Matchers::Contains("activations"));
}

TEST_CASE("profiler: chrome trace is valid JSON with one pid per rank and one tid per queue") {
  const ProfileData d = sample_data();
  const json doc = json::parse(chrome_trace_json(d));  // throws if invalid
  const json& ev = doc.at("traceEvents");
  std::map<int, std::string> tid_name;
  std::set<int> pids;
  std::string process_name;
  int complete = 0, counters = 0;
  std::map<int, int> open;  // B/E balance per tid
  double prev_counter_ts = -1;
  for (const json& e : ev) {
    pids.insert(e.at("pid").get<int>());
    const std::string ph = e.at("ph");
    if (ph == "M" && e["name"] == "thread_name") tid_name[e["tid"]] = e["args"]["name"];
    if (ph == "M" && e["name"] == "process_name") process_name = e["args"]["name"];
    if (ph == "B") ++open[e["tid"].get<int>()];
    if (ph == "E") --open[e["tid"].get<int>()];
    if (ph == "X") {
      ++complete;
      CHECK(e.at("dur").get<double>() >= 0);
      CHECK(e.at("ts").get<double>() >= 0);
      const json& a = e.at("args");
      for (const char* k : {"unit", "call", "micro", "step", "bytes", "action"}) CHECK(a.contains(k));
      // The event sits on the tid named after its queue.
      CHECK(tid_name.at(e["tid"].get<int>()) == e["cat"].get<std::string>());
    }
    if (ph == "C") {
      ++counters;
      CHECK(e["ts"].get<double>() >= prev_counter_ts);
      prev_counter_ts = e["ts"].get<double>();
    }
  }
  CHECK(pids == std::set<int>{1});
  CHECK(process_name == "rank 1");
  CHECK(tid_name.size() == 4);  // compute, gather, reduce, io: distinct tids
  std::set<std::string> names;
  for (auto& [t, n] : tid_name) names.insert(n);
  CHECK(names == std::set<std::string>{"compute", "gather", "reduce", "io"});
  for (auto& [t, n] : open) CHECK(n == 0);
  CHECK(complete == static_cast<int>(d.actions.size()));
  CHECK(counters == static_cast<int>(d.mem.size()) + 1);  // the start state, then each sample

  // Names and numbers: "forward h.0", times in µs from the earliest time, bytes kept; the name
  // with quotes and a newline survived as a string.
  bool saw_fwd = false, saw_odd = false;
  for (const json& e : ev) {
    if (e["ph"] != "X") continue;
    const json& a = e["args"];
    if (e["name"] == "forward h.0" && a["step"] == 2) {
      saw_fwd = true;
      CHECK(e["ts"].get<double>() == Approx(11000.0));
      CHECK(e["dur"].get<double>() == Approx(2000.0));
      CHECK(a["action"] == 6);
    }
    if (e["name"] == "backward h.0 \"tied\"\n<x>") saw_odd = true;
    if (e["name"] == "gather h.0") CHECK(a["bytes"] == 4096);
  }
  CHECK(saw_fwd);
  CHECK(saw_odd);
  // The counter at the total's peak holds the bytes per category at that time.
  bool saw_peak = false;
  for (const json& e : ev)
    if (e["ph"] == "C" && std::abs(e["ts"].get<double>() - 1500.0) < 1e-6) {
      saw_peak = true;
      CHECK(e["args"]["communication"] == 500);
      CHECK(e["args"]["activations"] == 300);
    }
  CHECK(saw_peak);

  // A given origin (another rank's start) shifts every time by the same amount.
  ProfileData o = d;
  o.t_origin = 99.5;
  const json shifted = json::parse(chrome_trace_json(o));  // (a range-for over a member of the
                                                          // temporary would read freed memory)
  for (const json& e : shifted["traceEvents"])
    if (e["ph"] == "X" && e["name"] == "forward h.0" && e["args"]["step"] == 2)
      CHECK(e["ts"].get<double>() == Approx(511000.0));
}

TEST_CASE("profiler: actions with a device interval are on their streams' tracks too") {
  // Each action whose record carries a stream (the device's interval) stays on its queue's
  // track and is also on one track per stream ("stream: <name>", after the queues', in order
  // of first appearance) at the same times, with the host's issue in its args; an action
  // without one is on its queue's track only.
  ProfileData d = sample_data();
  for (TraceAction& a : d.actions) {
    if (a.queue == "compute") a.stream = "cuda compute";
    if (a.queue == "gather" || a.queue == "reduce") a.stream = "nccl";
    if (a.stream.empty()) continue;
    a.host_begin = a.t_begin - 0.0005, a.host_end = a.t_begin - 0.0004;
  }
  const json doc = json::parse(chrome_trace_json(d));
  std::map<int, std::string> tid_name;
  std::map<int, int> sort;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tid_name[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "thread_sort_index") sort[e["tid"]] = e["args"]["sort_index"];
  }
  std::vector<std::string> order;
  for (const auto& [tid, n] : sort) order.push_back(tid_name.at(tid));
  CHECK(order == std::vector<std::string>{"compute", "gather", "reduce", "io", "stream: nccl",
                                          "stream: cuda compute"});
  std::map<std::string, int> per_track;
  std::map<std::pair<std::string, double>, int> twins;  // (name, ts) -> events
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string track = tid_name.at(e["tid"].get<int>());
    ++per_track[track];
    const json& a = e["args"];
    if (track == "io") {
      CHECK_FALSE(a.contains("stream"));
      continue;
    }
    ++twins[{e["name"].get<std::string>(), e["ts"].get<double>()}];
    const std::string stream = a.at("stream");
    CHECK((track == "stream: " + stream || track == e["cat"].get<std::string>()));
    CHECK(a.at("issue_ts").get<double>() == Approx(e["ts"].get<double>() - 500.0));
    CHECK(a.at("issue_dur").get<double>() == Approx(100.0));
  }
  CHECK(per_track["stream: cuda compute"] == per_track["compute"]);
  CHECK(per_track["stream: nccl"] == per_track["gather"] + per_track["reduce"]);
  CHECK(per_track["io"] == 2);
  for (const auto& [k, n] : twins) CHECK(n == 2);
}

TEST_CASE("profiler: invalid UTF-8 and non-finite args still give valid JSON") {
  ProfileData d;
  TraceAction a;
  a.queue = "compute", a.kind = "step", a.unit_name = std::string("bad\xff\xfe");
  a.t_begin = 1, a.t_end = 0.5;  // ends before it begins: drawn with zero duration
  a.args = {{"loss", std::nan("")}};
  d.actions.push_back(a);
  const json doc = json::parse(chrome_trace_json(d));
  int x = 0;
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "X") {
      ++x;
      CHECK(e["dur"].get<double>() == 0);
      CHECK(e["args"]["loss"].is_null());
    }
  CHECK(x == 1);
}

TEST_CASE("profiler: memory SVG is well-formed and shows the categories and the peak") {
  const ProfileData d = sample_data();
  std::vector<MemSample> predicted = {{100.0001, 0, "activations", 900},
                                      {100.0150, 7, "activations", -900}};
  const std::string svg = memory_svg(d, &predicted);
  REQUIRE(svg.rfind("<svg ", 0) == 0);
  CHECK(svg.find("</svg>") == svg.size() - 7);
  // Tags balance (self-closing ones aside) and no stray '&'.
  std::map<std::string, int> depth;
  const std::regex tag("<(/?)([a-z]+)[^>]*?(/?)>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tag); it != std::sregex_iterator();
       ++it) {
    const auto& m = *it;
    if (m[3] == "/") continue;
    depth[m[2]] += m[1] == "/" ? -1 : 1;
  }
  for (auto& [t, n] : depth) CHECK(n == 0);
  CHECK(std::regex_search(svg, std::regex("&(?!amp;|lt;|gt;|quot;)")) == false);
  // One filled layer per category, each named in the legend.
  int polys = 0;
  for (size_t p = svg.find("<polygon"); p != std::string::npos; p = svg.find("<polygon", p + 1))
    ++polys;
  CHECK(polys == 4);
  for (const std::string& c : d.categories) CHECK(svg.find(">" + c + "</text>") != std::string::npos);
  CHECK(svg.find("predicted total") != std::string::npos);
  CHECK(svg.find("stroke-dasharray=\"6,4\"") != std::string::npos);
  CHECK(svg.find("peak 1.8 KiB") != std::string::npos);
  CHECK(svg.find("step 2") != std::string::npos);
  // KiB axis for these small numbers, ms on the time axis.
  CHECK(svg.find("memory in use (KiB)") != std::string::npos);
  CHECK(svg.find("(ms)") != std::string::npos);
}

TEST_CASE("profiler: writers create files and name an unwritable path") {
  const auto dir = enginetest::make_test_dir("sw_profiler_test");
  const ProfileData d = sample_data();
  write_chrome_trace(d, (dir / "trace_rank1.json").string());
  write_memory_svg(d, (dir / "memory_rank1.svg").string());
  write_peaks_json(compute_peaks(d), (dir / "peaks_rank1.json").string());
  CHECK(json::parse(enginetest::read_bytes((dir / "peaks_rank1.json").string()))["peak_bytes"] ==
        1800);
  CHECK(std::filesystem::file_size(dir / "memory_rank1.svg") > 1000);
  CHECK(!std::filesystem::exists(dir / "trace_rank1.json.tmp"));
  try {
    write_chrome_trace(d, "/nonexistent_dir_sw/trace.json");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Matchers::StartsWith("profile: /nonexistent_dir_sw/trace.json"));
  }
}

TEST_CASE("profiler: train records the profile block steps through the hook and changes no number") {
  namespace fs = std::filesystem;
  const fs::path dir = enginetest::make_test_dir("sw_profiler_train");
  fs::remove_all(dir / "plain"), fs::remove_all(dir / "prof");
  const std::string data = enginetest::write_random_tokens(dir / "tok.bin", 4000, 32, 3);
  auto config = [&](const std::string& run, std::vector<std::string> extra) {
    std::vector<std::string> ov = {"data.train=" + data, "data.val=" + data,
                                   "run_dir=" + (dir / run).string()};
    ov.insert(ov.end(), extra.begin(), extra.end());
    return parse_config(R"({
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "model": {"type": "gpt2", "vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16},
      "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 1}},
      "train_steps": 5, "eval_every_steps": 3, "eval_batches": 1, "seed": 9, "threads": 2
    })", "p.json", ov);
  };
  const TrainSummary plain = train(config("plain", {}), enginetest::quiet_options(false));
  std::vector<int> begun, ended;
  int finished = 0;
  ProfileHook hook;
  hook.begin_step = [&](int s) { begun.push_back(s); };
  hook.end_step = [&](int s) { ended.push_back(s); };
  hook.finish = [&](ProfileData& d, std::vector<MemSample>& predicted) {
    ++finished;
    // The trainer's own actions: steps 2-4, each a step, 2 micro-steps, grad_norm and the
    // optimizer; step 3 evaluates. Inside them, the executor's: every forward call of the
    // schedule (embedding, 2 blocks, loss) per micro-step.
    size_t coarse = 0, forwards = 0;
    for (const TraceAction& a : d.actions) {
      coarse += a.kind == "step" || a.kind == "forward_backward" || a.kind == "grad_norm" ||
                a.kind == "optimizer" || a.kind == "evaluate";
      forwards += a.kind == "forward";
    }
    CHECK(coarse == 3 * (2 + 1 + 1 + 1) + 1);
    CHECK(forwards == 3 * 2 * 4);
    CHECK(!d.mem.empty());
    predicted.push_back(MemSample{d.actions.front().t_begin, 0, "activations", 1 << 20});
  };
  TrainOptions o = enginetest::quiet_options(false);
  o.profile_hook = &hook;
  const TrainSummary prof = train(
      config("prof", {"profile.enabled=true", "profile.start_step=2", "profile.num_steps=3"}), o);

  // Profiling changes no number.
  const auto ma = enginetest::read_metrics((dir / "plain").string());
  const auto mb = enginetest::read_metrics((dir / "prof").string());
  REQUIRE(ma.size() == mb.size());
  for (size_t i = 0; i < ma.size(); ++i) {
    CHECK(ma[i]["loss"] == mb[i]["loss"]);
    CHECK(ma[i]["grad_norm"] == mb[i]["grad_norm"]);
  }
  CHECK(plain.last_val_loss == prof.last_val_loss);

  CHECK(begun == std::vector<int>{2, 3, 4});
  CHECK(ended == std::vector<int>{2, 3, 4});
  CHECK(finished == 1);
  const ProfileResult& r = prof.profile;
  CHECK(r.steps_recorded == 3);
  CHECK(r.dir == (dir / "prof" / "profile").string());  // the default: <run_dir>/profile
  CHECK(r.trace_path == (dir / "prof" / "profile" / "trace_rank0.json").string());
  REQUIRE(fs::exists(r.trace_path));
  REQUIRE(fs::exists(r.svg_path));
  REQUIRE(fs::exists(r.peaks_path));
  CHECK(plain.profile.steps_recorded == 0);
  CHECK(!fs::exists(dir / "plain" / "profile"));

  // The trace: per step a "step" action enclosing its micro-steps, grad_norm and optimizer,
  // the loss in its args equal to metrics.jsonl's.
  const json t = json::parse(enginetest::read_bytes(r.trace_path));
  std::map<int, std::pair<double, double>> step_span;
  std::map<int, int> children;
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "X" && e["name"] == "step") {
      const int s = e["args"]["step"];
      step_span[s] = {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
      CHECK(e["args"]["loss"].get<double>() == mb[static_cast<size_t>(s - 1)]["loss"].get<double>());
    }
  CHECK(step_span.size() == 3);
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "X" && e["name"] != "step") {
      const int s = e["args"]["step"];
      const double b = e["ts"], en = b + e["dur"].get<double>();
      CHECK(b >= step_span.at(s).first - 1e-3);
      CHECK(en <= step_span.at(s).second + 1e-3);
      const std::string n = e["name"];
      if (n.rfind("forward_backward", 0) == 0 || n.rfind("grad_norm", 0) == 0 ||
          n.rfind("optimizer ", 0) == 0 || n == "optimizer" || n.rfind("evaluate", 0) == 0)
        ++children[s];
    }
  CHECK(children == std::map<int, int>{{2, 4}, {3, 5}, {4, 4}});
  // Peaks: the total includes the parameters, at least as large as the start state.
  const json p = json::parse(enginetest::read_bytes(r.peaks_path));
  CHECK(p["peak_bytes"].get<int64_t>() == r.peaks.peak_bytes);
  CHECK(r.peaks.peak_per_category.at("params") > 0);
  CHECK(enginetest::read_bytes(r.svg_path).find("predicted total") != std::string::npos);
}

TEST_CASE("profiler: on a device the trace has a track per stream with the device's intervals") {
  // train with profile on the sim device, its device times on (SHARDWISE_PROFILE_DEVICE_TIMES;
  // a GPU's always are) and activations offloaded to the host: the trace has the compute
  // stream's and both copy lanes' tracks; every compute action is on the compute stream's
  // track, every evict/fetch of activations on its copy lane's (d2h, h2d), each inside its
  // step and after its issue began; no number changes. (One rank: no collectives; their
  // streams are test_device_mpi's.)
  namespace fs = std::filesystem;
  const fs::path dir = enginetest::make_test_dir("sw_profiler_streams");
  fs::remove_all(dir / "plain"), fs::remove_all(dir / "prof");
  const std::string data = enginetest::write_random_tokens(dir / "tok.bin", 4000, 32, 3);
  auto config = [&](const std::string& run, std::vector<std::string> extra) {
    std::vector<std::string> ov = {"data.train=" + data, "data.val=" + data,
                                   "run_dir=" + (dir / run).string(), "device=sim"};
    ov.insert(ov.end(), extra.begin(), extra.end());
    return parse_config(R"({
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "model": {"type": "gpt2", "vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16},
      "activation_checkpointing": {"mode": "off", "offload": "cpu"},
      "train_steps": 4, "eval_every_steps": 0, "seed": 9, "threads": 2
    })", "p.json", ov);
  };
  const TrainSummary plain = train(config("plain", {}), enginetest::quiet_options(false));
  setenv("SHARDWISE_PROFILE_DEVICE_TIMES", "1", 1);
  const TrainSummary prof = train(
      config("prof", {"profile.enabled=true", "profile.start_step=2", "profile.num_steps=2"}),
      enginetest::quiet_options(false));
  unsetenv("SHARDWISE_PROFILE_DEVICE_TIMES");
  CHECK(plain.last_loss == prof.last_loss);
  const json t = json::parse(enginetest::read_bytes(prof.profile.trace_path));
  std::map<int, std::string> track;
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") track[e["tid"]] = e["args"]["name"];
  std::set<std::string> tracks;
  for (const auto& [tid, n] : track) tracks.insert(n);
  for (const char* n : {"compute", "io", "stream: sim", "stream: sim copy d2h", "stream: sim copy h2d"})
    CHECK(tracks.count(n) == 1);
  std::map<int, std::pair<double, double>> step;
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "X" && e["name"] == "step")
      step[e["args"]["step"]] = {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
  REQUIRE(step.size() == 2);
  std::map<std::string, int> on;  // "<kind> on <track>" -> events on a stream's track
  int planned_compute = 0;
  for (const json& e : t["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string tr = track.at(e["tid"].get<int>()), kind = e["name"].get<std::string>().substr(0, e["name"].get<std::string>().find(' '));
    const json& a = e["args"];
    INFO(tr << ": " << e.dump());
    const bool trainers = kind == "step" || kind == "forward_backward" || kind == "grad_norm" ||
                          kind == "optimizer" || kind == "evaluate";  // its own, on the host
    if (tr == "compute" && !trainers) {
      ++planned_compute;
      CHECK(a.at("stream") == "sim");
    }
    if (tr.rfind("stream: ", 0) != 0) continue;
    ++on[kind + " on " + tr];
    CHECK(tr == "stream: " + a.at("stream").get<std::string>());
    const auto [b, en] = step.at(a["step"].get<int>());
    // (µs; 0.1 s of slack: the clock tie's error and a compute bracket's lead on its issue,
    // microseconds unless the thread is preempted; the sim's clock is 1e4 s off the host's)
    CHECK(e["ts"].get<double>() >= b);
    CHECK(e["ts"].get<double>() + e["dur"].get<double>() <= en + 1e5);
    CHECK(e["ts"].get<double>() >= a.at("issue_ts").get<double>() - 1e5);
    if (kind == "evict_acts") CHECK(tr == "stream: sim copy d2h");
    if (kind == "fetch_acts") CHECK(tr == "stream: sim copy h2d");
  }
  CHECK(planned_compute > 0);
  CHECK(on["forward on stream: sim"] == 2 * 2 * 4);  // 2 steps, 2 micro-steps, 4 calls
  CHECK(on["evict_acts on stream: sim copy d2h"] > 0);
  CHECK(on["fetch_acts on stream: sim copy h2d"] == on["evict_acts on stream: sim copy d2h"]);
}

TEST_CASE("profiler: an unwritable profile.out stops train before the first step") {
  namespace fs = std::filesystem;
  const fs::path dir = enginetest::make_test_dir("sw_profiler_train_bad");
  const std::string data = enginetest::write_random_tokens(dir / "tok.bin", 2000, 32, 3);
  { std::ofstream f(dir / "file"); f << "x"; }
  const TrainConfig c = parse_config(
      R"({"model": {"type": "gpt2", "vocab_size": 32, "n_layer": 1, "n_head": 2, "d_model": 32,
          "seq_len": 16}, "train_steps": 2, "scheduler": {"type": "Constant"}})",
      "p.json",
      {"data.train=" + data, "run_dir=" + (dir / "run").string(), "profile.enabled=true",
       "profile.out=" + (dir / "file" / "sub").string()});
  fs::remove_all(dir / "run");
  try {
    train(c, enginetest::quiet_options(false));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Matchers::StartsWith("profile: profile.out '" +
                                                      (dir / "file" / "sub").string() + "'"));
  }
  CHECK(!fs::exists(dir / "run" / "metrics.jsonl"));  // stopped before the run dir
}
