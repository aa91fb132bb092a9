// `shardwise plan --svg FILE`: the predicted peak drawn as stacked bars, one panel per tier
// (device at its peak, host, NVMe, and the process's predicted resident set), one bar per
// rank, each stacked by category bottom-up in the order given, with a legend (category
// colours) and byte labels (each segment tall enough for text, and every bar's total on top).
//
// Plain data in, a string out: the caller (tools/plan_cmd.cpp) fills PlanSvg from the same
// prediction it prints and writes as JSON, so the drawing and the numbers cannot disagree.
// Every nonzero segment is one <rect class="seg"> with data-tier, data-rank, data-category
// and data-bytes attributes (tests read them back); zero segments are not drawn. More than
// kMaxBars equal ranks are drawn as one bar labelled "ranks 0-(N-1)".
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sw {

struct PlanSvgBar {
  std::string label;  // "rank 0", "ranks 0-63"
  int rank = 0;       // data-rank of its segments (the first rank of a merged bar)
  std::vector<std::pair<std::string, int64_t>> parts;  // category, bytes; bottom first
};

struct PlanSvgPanel {
  std::string tier;   // "device", "host", "nvme", "rss"
  std::string title;  // "device (peak at backward h.3)"
  std::vector<PlanSvgBar> bars;
};

struct PlanSvg {
  std::string title;  // first line of the drawing
  std::vector<PlanSvgPanel> panels;
};

constexpr int kPlanSvgMaxBars = 16;

// Bars for `world` ranks whose figures are all `parts` (the planner's ranks hold equal
// shards): one bar per rank up to kPlanSvgMaxBars, else one bar for all of them.
std::vector<PlanSvgBar> equal_rank_bars(int world,
                                        const std::vector<std::pair<std::string, int64_t>>& parts);

// The SVG document (UTF-8, one <svg> root). Panels whose bars are all empty are drawn with an
// "(empty)" note rather than left out, so the layout does not depend on the data.
std::string plan_svg(const PlanSvg& s);

// plan_svg written to `path` (via path.tmp, renamed); throws sw::Error("plan: <path>: ...").
void write_plan_svg(const PlanSvg& s, const std::string& path);

struct PlanPrediction;
// The drawing of a prediction for `world` ranks: the device tier at its peak (the plan's
// categories there, then "kernel_workspace"), the host tier's categories, the NVMe files, and
// the predicted RSS (device, host, allocator rounding, process baseline). The numbers are the
// ones `plan --json` prints: tiers.device.categories (kernel_workspace included),
// tiers.host.categories, tiers.nvme.peak_bytes, rss.
PlanSvg plan_svg_of(const PlanPrediction& p, int world, const std::string& title);

}  // namespace sw
