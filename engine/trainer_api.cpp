// The C++ facade (shardwise/trainer.h, shardwise/run_config.h) over engine/trainer.h's
// TrainSession: a RunConfig becomes a JSON document read by the config reader (as a file is),
// a user's model is checked here before any rank communicates, and the session is set up
// lazily, so that resume() can still name the checkpoint.
#include "shardwise/trainer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"
#include "engine/config.h"
#include "engine/trainer.h"
#include "models/model.h"

namespace sw {

namespace fs = std::filesystem;

// ---- RunConfig ---------------------------------------------------------------------------------

RunConfig RunConfig::from_json(const std::string& json_text) {
  RunConfig c;
  c.base_ = json_text;
  return c;
}

RunConfig& RunConfig::set(const std::string& key, const std::string& value) {
  return set_json(key, nlohmann::json(value).dump());
}
RunConfig& RunConfig::set(const std::string& key, const char* value) {
  return set(key, std::string(value ? value : ""));
}
RunConfig& RunConfig::set(const std::string& key, bool value) {
  return set_json(key, value ? "true" : "false");
}
RunConfig& RunConfig::set(const std::string& key, int value) {
  return set_json(key, std::to_string(value));
}
RunConfig& RunConfig::set(const std::string& key, int64_t value) {
  return set_json(key, std::to_string(value));
}
RunConfig& RunConfig::set(const std::string& key, uint64_t value) {
  return set_json(key, std::to_string(value));
}
RunConfig& RunConfig::set(const std::string& key, double value) {
  return set_json(key, nlohmann::json(value).dump());  // the shortest text that reads back
}
RunConfig& RunConfig::set_json(const std::string& key, const std::string& json_value) {
  keys_.emplace_back(key, json_value);
  return *this;
}

std::string RunConfig::to_json() const {
  // (ordered: the document reads as written, keys in the order they were first set)
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(base_, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    fail("config", source_ + ": from_json: not a JSON object");
  for (const auto& [key, text] : keys_) {
    const nlohmann::ordered_json v = nlohmann::ordered_json::parse(text, nullptr, false);
    if (v.is_discarded()) fail("config", source_ + ": " + key + ": not a JSON value: " + text);
    nlohmann::ordered_json* at = &doc;
    size_t from = 0;
    while (true) {
      const size_t dot = key.find('.', from);
      const std::string part = key.substr(from, dot == std::string::npos ? dot : dot - from);
      if (part.empty()) fail("config", source_ + ": '" + key + "': empty component in key path");
      if (!at->is_object())
        fail("config", source_ + ": " + key.substr(0, from - 1) + ": is not an object, cannot set '" +
                           key + "'");
      at = &(*at)[part];
      if (dot == std::string::npos) break;
      if (at->is_null()) *at = nlohmann::ordered_json::object();
      from = dot + 1;
    }
    *at = v;
  }
  return doc.dump(2);
}

// ---- A user's model ----------------------------------------------------------------------------

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? " x " : "") + std::to_string(s[i]);
  return out.empty() ? "scalar" : out;
}

// The part of its logical tensor (rows x columns, a matrix of dim 0 x the rest) that a local
// tensor holds.
struct Part {
  std::vector<std::array<int64_t, 2>> rows;
  int64_t col_lo = 0, col_hi = 0;
};

// Checks what the engine relies on and would otherwise meet late or not at all, naming the
// unit and the parameter: every slice's parameter names unique, and, with tensor parallelism,
// each split parameter's parts matching their local shapes and together covering the logical
// tensor (a dimension the degree does not divide leaves rows no rank holds).
void check_model(const ModelFactory& make, const TrainConfig& cfg) {
  const std::string& src = cfg.source;
  const int t = std::max(1, cfg.parallelism.tensor);
  struct Seen {
    std::string unit;
    std::vector<int64_t> logical;
    std::vector<Part> parts;
  };
  std::map<std::string, Seen> split;  // logical name -> its parts over the tensor ranks
  for (int k = 0; k < t; ++k) {
    const Model m = make(TensorSlice{k, t});
    const std::string on = t > 1 ? " (tensor rank " + std::to_string(k) + " of " +
                                       std::to_string(t) + ")"
                                 : "";
    if (m.units.empty()) fail("model", src + ": the model has no units" + on);
    if (m.schedule.empty()) fail("model", src + ": the model's schedule is empty" + on);
    if (m.config.vocab_size > 0 && m.config.vocab_size != cfg.model.vocab_size)
      fail("config", src + ": model.vocab_size: " + std::to_string(cfg.model.vocab_size) +
                         ", but the model's units are built for " +
                         std::to_string(m.config.vocab_size) + " tokens");
    std::map<std::string, std::string> owner;  // parameter -> unit
    for (size_t u = 0; u < m.units.size(); ++u) {
      const std::string unit = m.units[u]->name();
      for (const ParamSpec& p : m.units[u]->params()) {
        const auto [it, fresh] = owner.emplace(p.name, unit);
        if (!fresh)
          fail("model", src + ": unit '" + unit + "' (unit " + std::to_string(u) +
                            "): parameter '" + p.name + "' is declared twice" +
                            (it->second != unit ? " (unit '" + it->second + "' declares it too)"
                                                : "") +
                            on + "; parameter names must be unique in the model");
        if (t == 1 || !p.split.split()) continue;
        const TensorSplit& sp = p.split;
        const std::vector<int64_t>& L = sp.logical;
        const int64_t rows = L.empty() ? 1 : L[0];
        const int64_t cols = L.size() >= 2 ? L[1] : 1;
        Part part{sp.rows, sp.col_lo, sp.col_hi};
        if (part.rows.empty()) part.rows = {{0, rows}};
        if (part.col_hi == 0) part.col_lo = 0, part.col_hi = cols;
        int64_t held_rows = 0;
        for (const auto& r : part.rows) held_rows += r[1] - r[0];
        std::vector<int64_t> want = L;
        if (!want.empty()) want[0] = held_rows;
        if (want.size() >= 2) want[1] = part.col_hi - part.col_lo;
        bool inside = part.col_lo >= 0 && part.col_hi <= cols && part.col_lo < part.col_hi;
        for (const auto& r : part.rows) inside = inside && r[0] >= 0 && r[0] < r[1] && r[1] <= rows;
        if (!inside || want != p.shape)
          fail("model", src + ": unit '" + unit + "': parameter '" + p.name + "'" + on +
                            ": local shape " + shape_text(p.shape) +
                            " is not the part of logical shape " + shape_text(L) +
                            " its split declares (" + std::to_string(held_rows) + " rows, " +
                            std::to_string(part.col_hi - part.col_lo) + " columns)");
        Seen& s = split[p.name];
        if (s.unit.empty()) s.unit = unit, s.logical = L;
        s.parts.push_back(part);
      }
    }
  }
  // Every logical element held by some tensor rank: for each column band between the parts'
  // column bounds, the union of the rows of the parts spanning it.
  for (const auto& [name, s] : split) {
    const int64_t rows = s.logical.empty() ? 1 : s.logical[0];
    const int64_t cols = s.logical.size() >= 2 ? s.logical[1] : 1;
    std::set<int64_t> bounds = {0, cols};
    for (const Part& p : s.parts) bounds.insert(p.col_lo), bounds.insert(p.col_hi);
    int64_t covered = 0;
    for (auto b = bounds.begin(); std::next(b) != bounds.end(); ++b) {
      const int64_t lo = *b, hi = *std::next(b);
      std::vector<std::array<int64_t, 2>> rs;
      for (const Part& p : s.parts)
        if (p.col_lo <= lo && p.col_hi >= hi) rs.insert(rs.end(), p.rows.begin(), p.rows.end());
      std::sort(rs.begin(), rs.end());
      int64_t end = 0, n = 0;
      for (const auto& r : rs) {
        const int64_t a = std::max(r[0], end);
        if (r[1] > a) n += r[1] - a, end = r[1];
      }
      covered += n * (hi - lo);
    }
    if (covered != rows * cols)
      fail("model", src + ": unit '" + s.unit + "': parameter '" + name + "' (logical shape " +
                        shape_text(s.logical) + ") does not divide over " + std::to_string(t) +
                        " tensor ranks (parallelism.tensor_parallel_degree): their parts hold " +
                        std::to_string(covered) + " of its " + std::to_string(rows * cols) +
                        " rows x columns");
  }
}

}  // namespace

// ---- Trainer -----------------------------------------------------------------------------------

struct Trainer::Impl {
  TrainConfig cfg;
  TrainerOptions opts;
  ModelFactory model;
  StepCallback callback;
  std::unique_ptr<TrainSession> session;
  RunSummary summary;

  TrainSession& ensure() {
    if (session) return *session;
    TrainOptions o;
    o.progress = opts.progress;
    o.export_weights = opts.export_at_end;
    if (model) o.model_factory = [f = model](TensorSlice s) { return f(s); };
    if (callback)
      o.on_step = [this](const StepMetrics& m) {
        StepInfo i;
        i.step = m.step, i.total_steps = cfg.train_steps;
        i.loss = m.loss, i.lr = m.lr, i.grad_norm = m.grad_norm, i.tokens_per_s = m.tokens_per_s;
        i.has_val_loss = m.has_val, i.val_loss = m.has_val ? m.val_loss : 0.0;
        i.skipped = m.overflow;
        return callback(i) == StepAction::Stop;
      };
    session = std::make_unique<TrainSession>(cfg, o);
    summary.checkpoint_dir = session->config().checkpoint.dir;
    summary.fp16 = session->config().fp16;
    return *session;
  }
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  if (!impl_->model) return;
  const TrainConfig& c = impl_->cfg;
  check_model(impl_->model, c);
  // What a split model of one's own cannot do yet, refused before any step is spent.
  const ParallelismConfig& p = c.parallelism;
  if (p.tensor > 1 || p.pipeline > 1) {
    const std::string split = p.tensor > 1 ? "parallelism.tensor_parallel_degree " +
                                                 std::to_string(p.tensor)
                                           : "parallelism.pipeline_parallel_degree " +
                                                 std::to_string(p.pipeline);
    if (c.checkpoint.every_steps > 0)
      fail("config", c.source + ": checkpoint.every_steps: checkpoints of a model of your own "
                                "with " + split + " are not implemented yet; set it to 0");
    if (impl_->opts.export_at_end)
      fail("trainer", c.source + ": TrainerOptions::export_at_end: the export of a model of "
                                 "your own with " + split + " is not implemented yet; set it "
                                 "to false");
  }
}

Trainer::Trainer(const RunConfig& config, TrainerOptions options)
    : Trainer(config, ModelFactory{}, options) {}

Trainer::Trainer(const RunConfig& config, ModelFactory model, TrainerOptions options)
    : Trainer([&] {
        auto impl = std::make_unique<Impl>();
        impl->cfg = parse_config(config.to_json(), config.source());
        impl->model = std::move(model);
        impl->opts = options;
        return impl;
      }()) {}

Trainer Trainer::from_file(const std::string& path, const std::vector<std::string>& overrides,
                           TrainerOptions options, ModelFactory model) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = load_config(path, overrides);
  impl->model = std::move(model);
  impl->opts = options;
  return Trainer(std::move(impl));
}

Trainer::Trainer(Trainer&&) noexcept = default;
Trainer& Trainer::operator=(Trainer&&) noexcept = default;
Trainer::~Trainer() = default;

void Trainer::on_step(StepCallback callback) {
  if (impl_->session)
    fail("trainer", "on_step: set the callback before the run is set up (the first train(), "
                    "evaluate(), save_checkpoint() or export_weights())");
  impl_->callback = std::move(callback);
}

void Trainer::resume(const std::string& dir) {
  if (impl_->session)
    fail("trainer", "resume('" + dir + "'): the run is already set up; call resume() before "
                    "train(), evaluate(), save_checkpoint() or export_weights()");
  impl_->cfg.checkpoint.resume = dir;
  impl_->cfg.resolved_json.clear();  // (rewritten from the fields by the session's checks)
}

const RunSummary& Trainer::train() {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& I = *impl_;
  TrainSession& s = I.ensure();
  const TrainSummary r = s.train();
  RunSummary& o = I.summary;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.steps = r.steps, o.start_step = r.start_step, o.resumed_from = r.resumed_from;
  o.stopped = r.stopped;
  o.last_loss = r.last_loss, o.last_val_loss = r.last_val_loss;
  o.tokens_per_s = r.tokens_per_s, o.unigram_entropy = r.unigram_entropy;
  o.loss_scale = r.loss_scale, o.skipped_steps = r.skipped_steps;
  o.checkpoints_saved = r.checkpoints_saved, o.checkpoints_failed = r.checkpoints_failed;
  o.last_checkpoint = r.last_checkpoint, o.checkpoint_stall_s = r.ckpt_stall_s;
  o.profile_steps = r.profile.steps_recorded, o.profile_dir = r.profile.dir;
  if (!r.weights_path.empty()) o.weights_path = r.weights_path;
  return o;
}

double Trainer::evaluate() {
  TrainSession& s = impl_->ensure();
  if (s.config().val_data.empty())
    fail("trainer", s.config().source + ": evaluate(): data.val is not set (no validation data)");
  const double v = s.evaluate();
  impl_->summary.last_val_loss = v;
  return v;
}

std::string Trainer::save_checkpoint() {
  TrainSession& s = impl_->ensure();
  const std::string dir = s.save_checkpoint();
  ++impl_->summary.checkpoints_saved;
  impl_->summary.last_checkpoint = s.step();
  return dir;
}

std::string Trainer::export_weights(const std::string& dir) {
  TrainSession& s = impl_->ensure();
  const std::string d = dir.empty() ? (fs::path(s.config().run_dir) / "hf").string() : dir;
  return impl_->summary.weights_path = s.export_weights(d);
}

int Trainer::step() const {
  return impl_->session ? impl_->session->step() : impl_->summary.steps;
}

const RunSummary& Trainer::summary() const { return impl_->summary; }

std::string Trainer::config_json() const {
  if (impl_->session) return impl_->session->config().resolved_json;
  return impl_->cfg.resolved_json.empty() ? sw::config_json(impl_->cfg) : impl_->cfg.resolved_json;
}

std::string Trainer::summary_text() const {
  const RunSummary& s = impl_->summary;
  std::string out;
  char buf[1024];
  auto line = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof buf, fmt, args...);
    out += buf;
  };
  line("shardwise: trained %d steps in %.1f s\n", s.steps, s.seconds);
  line("  final train loss   %.4f\n", s.last_loss);
  if (s.last_val_loss >= 0)
    line("  val loss           %.4f\n", s.last_val_loss);
  else
    out += "  val loss           (no validation data)\n";
  line("  unigram entropy    %.4f nats (byte-unigram loss of the training data)\n",
       s.unigram_entropy);
  line("  tokens/s           %.0f\n", s.tokens_per_s);
  if (s.fp16)
    line("  fp16 loss scale    %g (%d steps skipped on overflow)\n", s.loss_scale,
         s.skipped_steps);
  if (!s.resumed_from.empty())
    line("  resumed from       %s (step %d)\n", s.resumed_from.c_str(), s.start_step);
  if (s.checkpoints_saved > 0 || s.checkpoints_failed > 0)
    line("  checkpoints        %d saved, %d failed, last step_%lld in %s (stall %.2f s)\n",
         s.checkpoints_saved, s.checkpoints_failed, (long long)s.last_checkpoint,
         s.checkpoint_dir.c_str(), s.checkpoint_stall_s);
  if (s.profile_steps > 0)
    line("  profile            %d steps recorded in %s\n", s.profile_steps, s.profile_dir.c_str());
  if (s.stopped) line("  stopped            at step %d (on_step asked)\n", s.steps);
  line("  weights            %s\n", s.weights_path.empty() ? "(not exported)" : s.weights_path.c_str());
  return out;
}

}  // namespace sw
