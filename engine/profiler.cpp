#include "engine/profiler.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/xml.h"

namespace sw {

using json = nlohmann::json;

namespace {

// ---- The memory timeline -------------------------------------------------------------------

struct State {
  double t = 0;
  int action = -1;
  std::vector<int64_t> bytes;  // per category, in Timeline::categories order
  int64_t total() const {
    int64_t s = 0;
    for (int64_t b : bytes) s += b;
    return s;
  }
};

struct Timeline {
  std::vector<std::string> categories;
  std::vector<State> states;  // states[0]: mem_start at the origin; then one per sample
};

int index_of(std::vector<std::string>& cats, const std::string& c) {
  for (size_t i = 0; i < cats.size(); ++i)
    if (cats[i] == c) return static_cast<int>(i);
  cats.push_back(c);
  return static_cast<int>(cats.size()) - 1;
}

// Earliest time in the data (the origin of the trace's and the chart's time axes).
double origin_of(const ProfileData& d) {
  if (std::isfinite(d.t_origin)) return d.t_origin;
  double t = std::numeric_limits<double>::infinity();
  for (const TraceAction& a : d.actions) t = std::min(t, a.t_begin);
  for (const MemSample& m : d.mem) t = std::min(t, m.t);
  return std::isfinite(t) ? t : 0.0;
}

std::vector<MemSample> time_sorted(const std::vector<MemSample>& mem) {
  std::vector<MemSample> s = mem;
  std::stable_sort(s.begin(), s.end(),
                   [](const MemSample& a, const MemSample& b) { return a.t < b.t; });
  return s;
}

Timeline timeline(const ProfileData& d, const std::vector<MemSample>& mem) {
  Timeline tl;
  tl.categories = d.categories;
  for (const auto& [c, b] : d.mem_start) index_of(tl.categories, c);
  for (const MemSample& m : mem) index_of(tl.categories, m.category);
  State s;
  s.t = origin_of(d);
  s.bytes.assign(tl.categories.size(), 0);
  for (const auto& [c, b] : d.mem_start) s.bytes[index_of(tl.categories, c)] = b;
  tl.states.push_back(s);
  for (const MemSample& m : time_sorted(mem)) {
    s.t = m.t;
    s.action = m.action;
    s.bytes[index_of(tl.categories, m.category)] += m.delta;
    tl.states.push_back(s);
  }
  return tl;
}

void write_file_impl(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("profile", path + ": cannot write (" + std::strerror(errno) + ")");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    fail("profile", path + ": write failed (" + std::strerror(ok ? errno : err) + ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail("profile", path + ": cannot rename into place (" + std::strerror(errno) + ")");
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}


// The known queues get fixed tids in this order; others follow in order of appearance.
const char* const kQueues[] = {"compute", "gather", "reduce", "tensor", "io", "host"};

}  // namespace

// ---- Peaks ---------------------------------------------------------------------------------

Peaks compute_peaks(const ProfileData& d) {
  const Timeline tl = timeline(d, d.mem);
  Peaks p;
  p.rank = d.rank;
  p.categories = tl.categories;
  const State* best = &tl.states[0];
  std::vector<int64_t> per(tl.categories.size(), std::numeric_limits<int64_t>::min());
  for (const State& s : tl.states) {
    if (s.total() > best->total()) best = &s;
    for (size_t i = 0; i < per.size(); ++i) per[i] = std::max(per[i], s.bytes[i]);
  }
  p.peak_bytes = best->total();
  p.peak_time = best->t;
  p.peak_action = best->action;
  double best_span = std::numeric_limits<double>::infinity();  // the innermost such action
  for (const TraceAction& a : d.actions)
    if (best != &tl.states[0] && a.action == p.peak_action && a.t_begin <= p.peak_time && p.peak_time <= a.t_end &&
        a.t_end - a.t_begin < best_span) {
      best_span = a.t_end - a.t_begin;
      p.peak_step = a.step;
      p.peak_kind = a.kind;
    }
  for (size_t i = 0; i < tl.categories.size(); ++i) {
    p.at_peak[tl.categories[i]] = best->bytes[i];
    p.peak_per_category[tl.categories[i]] = per[i];
  }
  return p;
}

std::string format_bytes(int64_t b) {
  const double a = std::fabs(static_cast<double>(b));
  if (a < 1024) return std::to_string(b) + " B";
  if (a < 1024.0 * 1024) return fmt("%.1f KiB", b / 1024.0);
  if (a < 1024.0 * 1024 * 1024) return fmt("%.2f MiB", b / (1024.0 * 1024));
  return fmt("%.2f GiB", b / (1024.0 * 1024 * 1024));
}

std::string peaks_json(const Peaks& p) {
  json j = json::object();
  j["rank"] = p.rank;
  j["peak_bytes"] = p.peak_bytes;
  j["peak_action"] = p.peak_action;
  j["peak_time_s"] = p.peak_time;
  j["peak_step"] = p.peak_step;
  j["peak_kind"] = p.peak_kind;
  j["categories"] = p.categories;
  json at = json::object(), per = json::object();
  for (const std::string& c : p.categories) {
    at[c] = p.at_peak.count(c) ? p.at_peak.at(c) : 0;
    per[c] = p.peak_per_category.count(c) ? p.peak_per_category.at(c) : 0;
  }
  j["at_peak"] = at;
  j["peak_per_category"] = per;
  if (p.max_rss_bytes >= 0) j["max_rss_bytes"] = p.max_rss_bytes;
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

void write_peaks_json(const Peaks& p, const std::string& path) { write_file_impl(path, peaks_json(p)); }

std::string format_peaks_table(const Peaks& p) {
  std::string out = "rank " + std::to_string(p.rank) + ": peak memory " +
                    format_bytes(p.peak_bytes) +
                    (p.peak_action >= 0 ? " at action " + std::to_string(p.peak_action)
                                        : std::string(" at the start")) +
                    (p.peak_step > 0 ? " (step " + std::to_string(p.peak_step) + ", " +
                                           p.peak_kind + ")"
                                     : std::string()) +
                    "\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %-16s %14s %14s\n", "category", "at peak", "own peak");
  out += line;
  int64_t sum_at = 0;
  for (const std::string& c : p.categories) {
    const int64_t at = p.at_peak.count(c) ? p.at_peak.at(c) : 0;
    const int64_t own = p.peak_per_category.count(c) ? p.peak_per_category.at(c) : 0;
    sum_at += at;
    std::snprintf(line, sizeof line, "  %-16s %14s %14s\n", c.c_str(), format_bytes(at).c_str(),
                  format_bytes(own).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-16s %14s %14s\n", "total", format_bytes(sum_at).c_str(),
                "");
  out += line;
  return out;
}

// ---- Chrome trace --------------------------------------------------------------------------

std::string chrome_trace_json(const ProfileData& d) {
  const double t0 = origin_of(d);
  auto us = [&](double t) { return std::round((t - t0) * 1e9) / 1e3; };  // µs, ns resolution
  const int pid = d.rank;

  std::vector<std::string> queues(std::begin(kQueues), std::end(kQueues));
  std::vector<bool> used(queues.size(), false);
  for (const TraceAction& a : d.actions) {
    const size_t q = static_cast<size_t>(index_of(queues, a.queue.empty() ? "compute" : a.queue));
    if (q >= used.size()) used.resize(q + 1, false);
    used[q] = true;
  }
  // The device streams' tracks, after the queues', in order of first appearance: each action
  // with a device interval is on its queue's track (as the others; compute's is the device's
  // timeline there too) and on its stream's, with when the host issued it in the args.
  std::vector<std::string> streams;
  for (const TraceAction& a : d.actions)
    if (!a.stream.empty()) index_of(streams, a.stream);
  const int stream_tid0 = static_cast<int>(queues.size()) + 1;

  json ev = json::array();
  ev.push_back({{"ph", "M"}, {"pid", pid}, {"name", "process_name"},
                {"args", {{"name", "rank " + std::to_string(d.rank)}}}});
  ev.push_back({{"ph", "M"}, {"pid", pid}, {"name", "process_sort_index"},
                {"args", {{"sort_index", d.rank}}}});
  for (size_t q = 0; q < queues.size(); ++q) {
    if (!used[q]) continue;
    const int tid = static_cast<int>(q) + 1;
    ev.push_back({{"ph", "M"}, {"pid", pid}, {"tid", tid}, {"name", "thread_name"},
                  {"args", {{"name", queues[q]}}}});
    ev.push_back({{"ph", "M"}, {"pid", pid}, {"tid", tid}, {"name", "thread_sort_index"},
                  {"args", {{"sort_index", tid}}}});
  }
  for (size_t k = 0; k < streams.size(); ++k) {
    const int tid = stream_tid0 + static_cast<int>(k);
    ev.push_back({{"ph", "M"}, {"pid", pid}, {"tid", tid}, {"name", "thread_name"},
                  {"args", {{"name", "stream: " + streams[k]}}}});
    ev.push_back({{"ph", "M"}, {"pid", pid}, {"tid", tid}, {"name", "thread_sort_index"},
                  {"args", {{"sort_index", tid}}}});
  }
  for (const TraceAction& a : d.actions) {
    std::string name = a.kind.empty() ? "action" : a.kind;
    if (!a.unit_name.empty())
      name += " " + a.unit_name;
    else if (a.unit >= 0)
      name += " u" + std::to_string(a.unit);
    json args = {{"step", a.step}, {"micro", a.micro}, {"action", a.action},
                 {"unit", a.unit}, {"call", a.call}, {"bytes", a.bytes}};
    for (const auto& [k, v] : a.args) args[k] = v;  // NaN/inf are written as null
    if (!a.stream.empty()) {
      args["stream"] = a.stream;
      args["issue_ts"] = us(a.host_begin);
      args["issue_dur"] = us(std::max(a.host_end, a.host_begin)) - us(a.host_begin);
    }
    const double b = us(a.t_begin), e = us(std::max(a.t_end, a.t_begin));
    ev.push_back({{"ph", "X"},
                  {"pid", pid},
                  {"tid", index_of(queues, a.queue.empty() ? "compute" : a.queue) + 1},
                  {"name", name},
                  {"cat", a.queue.empty() ? "compute" : a.queue},
                  {"ts", b},
                  {"dur", e - b},
                  {"args", args}});
    if (!a.stream.empty())
      ev.push_back({{"ph", "X"},
                    {"pid", pid},
                    {"tid", stream_tid0 + index_of(streams, a.stream)},
                    {"name", name},
                    {"cat", "stream"},
                    {"ts", b},
                    {"dur", e - b},
                    {"args", args}});
  }
  // Memory: one counter track per rank with a series per category (Perfetto stacks them).
  if (!d.mem.empty() || !d.mem_start.empty()) {
    const Timeline tl = timeline(d, d.mem);
    for (const State& s : tl.states) {
      json args = json::object();
      for (size_t i = 0; i < tl.categories.size(); ++i) args[tl.categories[i]] = s.bytes[i];
      ev.push_back({{"ph", "C"}, {"pid", pid}, {"name", "memory bytes"}, {"ts", us(s.t)},
                    {"args", args}});
    }
  }
  json doc = {{"traceEvents", ev},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"rank", d.rank}, {"world", d.world}, {"clock_origin_s", t0},
                {"producer", "shardwise profile"}}}};
  return doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

void write_chrome_trace(const ProfileData& d, const std::string& path) {
  write_file_impl(path, chrome_trace_json(d));
}

// ---- Memory chart (SVG) --------------------------------------------------------------------

namespace {

// A "nice" tick step (1, 2 or 5 × 10^k) giving about `n` ticks over `span`.
double nice_step(double span, int n) {
  if (!(span > 0)) return 1;
  const double raw = span / n, p = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

// Colours that stay apart for the six built-in categories, then repeat.
const char* const kColors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759",
                               "#76b7b2", "#edc948", "#b07aa1", "#9c755f"};

}  // namespace

namespace {

// The memory chart's frame: the plot area, the axes' scales and units, and the time and bytes
// to pixel mappings every part of the drawing uses.
struct Chart {
  static constexpr double W = 960, H = 520, L = 84, R = 220, T = 48, B = 56;
  static constexpr double pw = W - L - R, ph = H - T - B;
  double t0 = 0, t1 = 0, span_ms = 0, xstep = 0;
  double unit = 1, ystep = 1, ytop = 1;
  const char* unit_name = "KiB";
  double X(double t) const { return L + (t - t0) * 1e3 / span_ms * pw; }
  double Y(double bytes) const { return T + ph - bytes / unit / ytop * ph; }
  static std::string P(double v) { return fmt("%.2f", v); }
};

Chart chart_frame(double t0, double t1, int64_t ymax_b) {
  Chart c;
  c.t0 = t0, c.t1 = t1;
  c.span_ms = (t1 - t0) * 1e3;
  c.xstep = nice_step(c.span_ms, 8);
  const double gib = 1024.0 * 1024 * 1024, mib = 1024.0 * 1024;
  const bool in_gib = ymax_b >= 2 * gib;
  c.unit = in_gib ? gib : ymax_b >= 2 * mib ? mib : 1024.0;
  c.unit_name = in_gib ? "GiB" : ymax_b >= 2 * mib ? "MiB" : "KiB";
  c.ystep = nice_step(ymax_b / c.unit * 1.05, 6);
  c.ytop = std::ceil(ymax_b / c.unit * 1.05 / c.ystep) * c.ystep;
  return c;
}

// States to draw: all of them, or, when there are many more than pixels, per pixel column the
// state where the total is highest (so peaks stay visible), in time order.
std::vector<const State*> drawn_states(const Chart& c, const Timeline& tl) {
  std::vector<const State*> pts;
  const size_t cols = static_cast<size_t>(Chart::pw);
  if (tl.states.size() <= 4 * cols) {
    for (const State& s : tl.states) pts.push_back(&s);
    return pts;
  }
  std::vector<const State*> best(cols + 1, nullptr);
  for (const State& s : tl.states) {
    const size_t col = std::min(cols, static_cast<size_t>((c.X(s.t) - Chart::L)));
    if (!best[col] || s.total() > best[col]->total()) best[col] = &s;
  }
  pts.push_back(&tl.states[0]);
  for (const State* s : best)
    if (s && s != &tl.states[0]) pts.push_back(s);
  pts.push_back(&tl.states.back());
  return pts;
}

// Grid, axes and their labels.
std::string chart_axes(const Chart& c) {
  const auto P = Chart::P;
  const double L = Chart::L, T = Chart::T, pw = Chart::pw, ph = Chart::ph;
  std::string o;
  for (double v = 0; v <= c.ytop + c.ystep * 1e-6; v += c.ystep) {
    const double y = T + ph - v / c.ytop * ph;
    o += "<line x1=\"" + P(L) + "\" y1=\"" + P(y) + "\" x2=\"" + P(L + pw) + "\" y2=\"" + P(y) +
         "\" stroke=\"#e0e0e0\"/>\n";
    o += "<text x=\"" + P(L - 6) + "\" y=\"" + P(y + 4) + "\" text-anchor=\"end\">" +
         fmt(c.ystep < 1 ? "%.1f" : "%.0f", v) + "</text>\n";
  }
  for (double v = 0; v <= c.span_ms + c.xstep * 1e-6; v += c.xstep) {
    const double x = L + v / c.span_ms * pw;
    o += "<line x1=\"" + P(x) + "\" y1=\"" + P(T + ph) + "\" x2=\"" + P(x) + "\" y2=\"" +
         P(T + ph + 5) + "\" stroke=\"#333\"/>\n";
    o += "<text x=\"" + P(x) + "\" y=\"" + P(T + ph + 19) + "\" text-anchor=\"middle\">" +
         fmt(c.xstep < 1 ? "%.2f" : "%.0f", v) + "</text>\n";
  }
  o += "<text x=\"" + P(L + pw / 2) + "\" y=\"" + P(Chart::H - 12) +
       "\" text-anchor=\"middle\">time since recording began (ms)</text>\n";
  o += "<text transform=\"translate(20," + P(T + ph / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">memory in use (" + c.unit_name + ")</text>\n";
  return o;
}

// Step boundaries (the first action of each step), dashed and labelled.
std::string chart_steps(const Chart& c, const ProfileData& d) {
  const auto P = Chart::P;
  std::map<int, double> step_begin;
  for (const TraceAction& a : d.actions)
    if (!step_begin.count(a.step) || a.t_begin < step_begin[a.step]) step_begin[a.step] = a.t_begin;
  std::string o;
  for (const auto& [s, tb] : step_begin) {
    const double x = c.X(tb);
    o += "<line x1=\"" + P(x) + "\" y1=\"" + P(Chart::T) + "\" x2=\"" + P(x) + "\" y2=\"" +
         P(Chart::T + Chart::ph) + "\" stroke=\"#999\" stroke-dasharray=\"2,3\"/>\n";
    o += "<text x=\"" + P(x + 3) + "\" y=\"" + P(Chart::T + 12) +
         "\" fill=\"#666\" font-size=\"10\">step " + std::to_string(s) + "</text>\n";
  }
  return o;
}

// Stacked step areas, bottom category first: layer i spans cumulative[i-1] .. cumulative[i].
std::string chart_areas(const Chart& c, const Timeline& tl, const std::vector<const State*>& pts) {
  const auto P = Chart::P;
  const size_t C = tl.categories.size();
  std::string o;
  for (size_t i = 0; i < C; ++i) {
    auto cum = [&](const State* s, size_t upto) {
      int64_t v = 0;
      for (size_t k = 0; k <= upto && k < C; ++k) v += s->bytes[k];
      return v;
    };
    std::string upper, lower;
    for (size_t j = 0; j < pts.size(); ++j) {
      const double xa = c.X(pts[j]->t), xb = c.X(j + 1 < pts.size() ? pts[j + 1]->t : c.t1);
      const double yu = c.Y(static_cast<double>(cum(pts[j], i)));
      upper += P(xa) + "," + P(yu) + " " + P(xb) + "," + P(yu) + " ";
    }
    for (size_t j = pts.size(); j-- > 0;) {
      const double xa = c.X(pts[j]->t), xb = c.X(j + 1 < pts.size() ? pts[j + 1]->t : c.t1);
      const double yl = i == 0 ? c.Y(0) : c.Y(static_cast<double>(cum(pts[j], i - 1)));
      lower += P(xb) + "," + P(yl) + " " + P(xa) + "," + P(yl) + " ";
    }
    o += "<polygon fill=\"" + std::string(kColors[i % 8]) +
         "\" fill-opacity=\"0.85\" stroke=\"none\" points=\"" + upper + lower + "\"><title>" +
         xml_escape(tl.categories[i]) + "</title></polygon>\n";
  }
  return o;
}

// The predicted total, dashed.
std::string chart_predicted(const Chart& c, const Timeline& pred) {
  const auto P = Chart::P;
  std::string pl;
  for (size_t j = 0; j < pred.states.size(); ++j) {
    const double xa = c.X(pred.states[j].t);
    const double xb = c.X(j + 1 < pred.states.size() ? pred.states[j + 1].t : c.t1);
    const double y = c.Y(static_cast<double>(pred.states[j].total()));
    pl += P(xa) + "," + P(y) + " " + P(xb) + "," + P(y) + " ";
  }
  return "<polyline fill=\"none\" stroke=\"#000\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\" "
         "points=\"" + pl + "\"/>\n";
}

// Legend: top category first (as stacked), with its own peak and its bytes at the total's.
std::string chart_legend(const Timeline& tl, const Peaks& pk, bool predicted) {
  const auto P = Chart::P;
  const double lx = Chart::L + Chart::pw + 16;
  double ly = Chart::T + 4;
  std::string o = "<text x=\"" + P(lx) + "\" y=\"" + P(ly + 8) +
                  "\" font-weight=\"bold\">category: at peak / own peak</text>\n";
  ly += 20;
  for (size_t i = tl.categories.size(); i-- > 0;) {
    const std::string& c = tl.categories[i];
    o += "<rect x=\"" + P(lx) + "\" y=\"" + P(ly) + "\" width=\"12\" height=\"12\" fill=\"" +
         kColors[i % 8] + "\"/>\n";
    o += "<text x=\"" + P(lx + 18) + "\" y=\"" + P(ly + 10) + "\">" + xml_escape(c) + "</text>\n";
    o += "<text x=\"" + P(lx + 18) + "\" y=\"" + P(ly + 24) + "\" fill=\"#555\" font-size=\"10\">" +
         xml_escape(format_bytes(pk.at_peak.at(c)) + " / " +
                    format_bytes(pk.peak_per_category.at(c))) +
         "</text>\n";
    ly += 34;
  }
  if (predicted) {
    o += "<line x1=\"" + P(lx) + "\" y1=\"" + P(ly + 6) + "\" x2=\"" + P(lx + 12) + "\" y2=\"" +
         P(ly + 6) + "\" stroke=\"#000\" stroke-width=\"1.5\" stroke-dasharray=\"4,2\"/>\n";
    o += "<text x=\"" + P(lx + 18) + "\" y=\"" + P(ly + 10) + "\">predicted total</text>\n";
  }
  return o;
}

}  // namespace

std::string memory_svg(const ProfileData& d, const std::vector<MemSample>* predicted) {
  const Timeline tl = timeline(d, d.mem);
  const Peaks pk = compute_peaks(d);
  const double t0 = tl.states[0].t;
  double t1 = tl.states.back().t;
  for (const TraceAction& a : d.actions) t1 = std::max(t1, a.t_end);
  Timeline pred;
  if (predicted) {
    pred = timeline(d, *predicted);
    t1 = std::max(t1, pred.states.back().t);
  }
  if (!(t1 > t0)) t1 = t0 + 1e-3;
  int64_t ymax_b = pk.peak_bytes;
  for (const State& s : pred.states) ymax_b = std::max(ymax_b, s.total());
  if (ymax_b <= 0) ymax_b = 1;
  const Chart c = chart_frame(t0, t1, ymax_b);
  const auto P = Chart::P;
  const double W = Chart::W, H = Chart::H, L = Chart::L, T = Chart::T;

  std::string o;
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + P(W) + "\" height=\"" + P(H) +
       "\" viewBox=\"0 0 " + P(W) + " " + P(H) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o += "<rect x=\"0\" y=\"0\" width=\"" + P(W) + "\" height=\"" + P(H) + "\" fill=\"white\"/>\n";
  o += "<text x=\"" + P(L) + "\" y=\"24\" font-size=\"15\" font-weight=\"bold\">" +
       xml_escape("Memory in use, rank " + std::to_string(d.rank) + " of " +
                  std::to_string(d.world) + " (peak " + format_bytes(pk.peak_bytes) +
                  (pk.peak_action >= 0 ? ", action " + std::to_string(pk.peak_action) : "") +
                  ")") +
       "</text>\n";
  o += chart_axes(c);
  o += chart_steps(c, d);
  o += chart_areas(c, tl, drawn_states(c, tl));
  if (predicted) o += chart_predicted(c, pred);
  {  // the total's peak
    const double x = c.X(pk.peak_time), y = c.Y(static_cast<double>(pk.peak_bytes));
    o += "<circle cx=\"" + P(x) + "\" cy=\"" + P(y) + "\" r=\"3.5\" fill=\"#c00\"/>\n";
    o += "<text x=\"" + P(std::min(x + 6, L + Chart::pw - 120)) + "\" y=\"" + P(y - 6) +
         "\" fill=\"#c00\">peak " + xml_escape(format_bytes(pk.peak_bytes)) + "</text>\n";
  }
  o += "<rect x=\"" + P(L) + "\" y=\"" + P(T) + "\" width=\"" + P(Chart::pw) + "\" height=\"" +
       P(Chart::ph) + "\" fill=\"none\" stroke=\"#333\"/>\n";
  o += chart_legend(tl, pk, predicted != nullptr);
  o += "</svg>\n";
  return o;
}

void write_memory_svg(const ProfileData& d, const std::string& path,
                      const std::vector<MemSample>* predicted) {
  write_file_impl(path, memory_svg(d, predicted));
}

void write_profile_file(const std::string& path, const std::string& text) {
  write_file_impl(path, text);
}

}  // namespace sw
