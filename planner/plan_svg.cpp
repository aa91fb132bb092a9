#include "planner/plan_svg.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "core/bytes.h"
#include "core/xml.h"
#include "core/alloc.h"
#include "core/error.h"
#include "planner/search.h"

namespace sw {

namespace {


std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string fmt(int64_t b) { return format_bytes(static_cast<size_t>(std::max<int64_t>(b, 0))); }

// Distinct colours for the categories in order of first appearance (the six memory
// categories first, as `plan` lists them), then repeating.
const char* const kColors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                               "#edc948", "#b07aa1", "#9c755f", "#ff9da7", "#bab0ac"};

int64_t bar_total(const PlanSvgBar& b) {
  int64_t t = 0;
  for (const auto& p : b.parts) t += std::max<int64_t>(p.second, 0);
  return t;
}

// A round axis step near span / n: 1, 2 or 5 times a power of two's worth of bytes (MiB
// steps read better than decimal ones).
double axis_step(double span, int n) {
  if (!(span > 0)) return 1;
  const double raw = span / n;
  double p = 1;
  for (const double unit : {1024.0 * 1024 * 1024, 1024.0 * 1024, 1024.0, 1.0})
    if (raw >= unit) {
      p = unit;
      break;
    }
  const double f = raw / p;
  const double m = std::pow(10.0, std::floor(std::log10(f)));
  const double g = f / m;
  return (g <= 1 ? 1 : g <= 2 ? 2 : g <= 5 ? 5 : 10) * m * p;
}

}  // namespace

std::vector<PlanSvgBar> equal_rank_bars(int world,
                                        const std::vector<std::pair<std::string, int64_t>>& parts) {
  std::vector<PlanSvgBar> bars;
  if (world > kPlanSvgMaxBars) {
    bars.push_back({"ranks 0-" + std::to_string(world - 1), 0, parts});
    return bars;
  }
  for (int r = 0; r < world; ++r) bars.push_back({"rank " + std::to_string(r), r, parts});
  return bars;
}

std::string plan_svg(const PlanSvg& s) {
  // Colours by category, in order of first appearance over all panels.
  std::map<std::string, std::string> color;
  std::vector<std::string> legend;
  for (const PlanSvgPanel& p : s.panels)
    for (const PlanSvgBar& b : p.bars)
      for (const auto& part : b.parts)
        if (part.second > 0 && !color.count(part.first)) {
          color[part.first] = kColors[legend.size() % std::size(kColors)];
          legend.push_back(part.first);
        }

  const double bar_w = 56, gap = 24, axis_w = 78, plot_h = 360, top = 64, pad = 20;
  std::vector<double> panel_w;
  double width = pad;
  for (const PlanSvgPanel& p : s.panels) {
    const double w = axis_w + std::max<size_t>(p.bars.size(), 1) * (bar_w + gap) + gap;
    panel_w.push_back(std::max(w, 200.0));
    width += panel_w.back() + pad;
  }
  width = std::max(width, 480.0);
  const double legend_y = top + plot_h + 58;
  const double height = legend_y + 20 * double(legend.size()) + 20;

  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" +
       num(height) + "\" viewBox=\"0 0 " + num(width) + " " + num(height) +
       "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o += "<rect x=\"0\" y=\"0\" width=\"" + num(width) + "\" height=\"" + num(height) +
       "\" fill=\"#fff\"/>\n";
  o += "<text x=\"" + num(pad) + "\" y=\"22\" font-size=\"14\" font-weight=\"bold\">" +
       xml_escape(s.title) + "</text>\n";

  double x0 = pad;
  for (size_t pi = 0; pi < s.panels.size(); ++pi) {
    const PlanSvgPanel& p = s.panels[pi];
    int64_t ymax = 0;
    for (const PlanSvgBar& b : p.bars) ymax = std::max(ymax, bar_total(b));
    const double step = axis_step(double(std::max<int64_t>(ymax, 1)), 4);
    const double top_v = std::max(step, std::ceil(double(ymax) / step) * step);
    auto Y = [&](double v) { return top + plot_h - v / top_v * plot_h; };
    o += "<g class=\"panel\" data-tier=\"" + xml_escape(p.tier) + "\">\n";
    o += "<text x=\"" + num(x0) + "\" y=\"" + num(top - 26) + "\" font-size=\"12\" font-weight=\"bold\">" +
         xml_escape(p.title) + "</text>\n";
    // Axis and grid.
    const double ax = x0 + axis_w - 8;
    for (double v = 0; v <= top_v * 1.0001; v += step) {
      o += "<line x1=\"" + num(ax) + "\" x2=\"" + num(x0 + panel_w[pi]) + "\" y1=\"" + num(Y(v)) +
           "\" y2=\"" + num(Y(v)) + "\" stroke=\"#ddd\"/>\n";
      o += "<text x=\"" + num(ax - 4) + "\" y=\"" + num(Y(v) + 4) + "\" text-anchor=\"end\">" +
           xml_escape(fmt(int64_t(v))) + "</text>\n";
    }
    o += "<line x1=\"" + num(ax) + "\" x2=\"" + num(ax) + "\" y1=\"" + num(top) + "\" y2=\"" +
         num(top + plot_h) + "\" stroke=\"#444\"/>\n";
    if (ymax == 0)
      o += "<text x=\"" + num(ax + 12) + "\" y=\"" + num(top + plot_h - 8) + "\" fill=\"#888\">(empty)</text>\n";
    for (size_t bi = 0; bi < p.bars.size(); ++bi) {
      const PlanSvgBar& b = p.bars[bi];
      const double bx = x0 + axis_w + gap + double(bi) * (bar_w + gap);
      double acc = 0;
      for (const auto& part : b.parts) {
        if (part.second <= 0) continue;
        const double y1 = Y(acc), y2 = Y(acc + double(part.second));
        acc += double(part.second);
        o += "<rect class=\"seg\" data-tier=\"" + xml_escape(p.tier) + "\" data-rank=\"" +
             std::to_string(b.rank) + "\" data-category=\"" + xml_escape(part.first) +
             "\" data-bytes=\"" + std::to_string(part.second) + "\" x=\"" + num(bx) + "\" y=\"" +
             num(y2) + "\" width=\"" + num(bar_w) + "\" height=\"" + num(std::max(y1 - y2, 0.5)) +
             "\" fill=\"" + color[part.first] + "\" stroke=\"#fff\" stroke-width=\"0.5\"><title>" +
             xml_escape(b.label + ": " + part.first + " " + fmt(part.second)) + "</title></rect>\n";
        if (y1 - y2 >= 13)
          o += "<text x=\"" + num(bx + bar_w / 2) + "\" y=\"" + num((y1 + y2) / 2 + 4) +
               "\" text-anchor=\"middle\" font-size=\"9\" fill=\"#fff\">" + xml_escape(fmt(part.second)) +
               "</text>\n";
      }
      const int64_t tot = bar_total(b);
      o += "<text class=\"total\" data-bytes=\"" + std::to_string(tot) + "\" x=\"" +
           num(bx + bar_w / 2) + "\" y=\"" + num(Y(double(tot)) - 4) +
           "\" text-anchor=\"middle\" font-weight=\"bold\">" + xml_escape(fmt(tot)) + "</text>\n";
      o += "<text x=\"" + num(bx + bar_w / 2) + "\" y=\"" + num(top + plot_h + 16) +
           "\" text-anchor=\"middle\">" + xml_escape(b.label) + "</text>\n";
    }
    o += "</g>\n";
    x0 += panel_w[pi] + pad;
  }
  // Legend: one swatch per category, in stacking order (bottom first).
  o += "<g class=\"legend\">\n";
  o += "<text x=\"" + num(pad) + "\" y=\"" + num(legend_y - 12) +
       "\" font-weight=\"bold\">category (stacked bottom-up in this order)</text>\n";
  for (size_t i = 0; i < legend.size(); ++i) {
    const double y = legend_y + 20 * double(i);
    o += "<rect class=\"swatch\" x=\"" + num(pad) + "\" y=\"" + num(y - 10) +
         "\" width=\"12\" height=\"12\" fill=\"" + color[legend[i]] + "\"/>\n";
    o += "<text x=\"" + num(pad + 18) + "\" y=\"" + num(y) + "\">" + xml_escape(legend[i]) + "</text>\n";
  }
  o += "</g>\n</svg>\n";
  return o;
}

void write_plan_svg(const PlanSvg& s, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("plan", path + ": cannot write the SVG (" + std::strerror(errno) + ")");
    f << plan_svg(s);
    f.close();
    if (!f) fail("plan", path + ": cannot write the SVG (" + std::strerror(errno) + ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    fail("plan", path + ": cannot write the SVG (" + std::strerror(e) + ")");
  }
}

PlanSvg plan_svg_of(const PlanPrediction& p, int world, const std::string& title) {
  PlanSvg s;
  s.title = title;
  using Parts = std::vector<std::pair<std::string, int64_t>>;
  Parts dev, host;
  for (size_t c = 0; c < p.peak.at_peak.size(); ++c)
    dev.push_back({mem_name(static_cast<Mem>(c)), p.peak.at_peak[c]});
  dev.push_back({"kernel_workspace", p.workspace});  // (the backend's declaration)
  for (size_t c = 0; c < p.plan.persistent_host.size(); ++c)
    host.push_back({mem_name(static_cast<Mem>(c)), p.plan.persistent_host[c]});
  std::string at = "device peak";
  if (p.peak.action >= 0) {
    const Action& a = p.plan.actions[size_t(p.peak.action)];
    at += std::string(" at ") + action_kind_name(a.kind) +
          (a.unit >= 0 ? " " + p.plan.unit_names[size_t(a.unit)] : std::string());
  }
  s.panels.push_back({"device", at, equal_rank_bars(world, dev)});
  s.panels.push_back({"host", "host tier (offloaded state)", equal_rank_bars(world, host)});
  s.panels.push_back({"nvme", "NVMe files", equal_rank_bars(world, {{"offload files", p.nvme}})});
  s.panels.push_back({"rss", std::string("process RSS (baseline ") +
                                 (p.rss.baseline_measured ? "calibrated" : "default") + ")",
                      equal_rank_bars(world, {{p.rss.untouched ? "device tier less staging pages never written"
                                                                : "device tier",
                                               p.device - p.rss.untouched},
                                              {"host tier", p.host},
                                              {"allocator rounding", p.rss.rounding},
                                              {"token files", p.rss.data},
                                              {"process baseline", p.rss.baseline}})});
  return s;
}

}  // namespace sw
