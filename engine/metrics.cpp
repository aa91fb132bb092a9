#include "engine/metrics.h"

#include <dirent.h>
#include <sys/resource.h>

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sw {

namespace {
nlohmann::json num(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}
nlohmann::json num(float x) {
  if (!std::isfinite(x)) return nullptr;
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return nlohmann::json::parse(std::string(buf, r.ptr));
}
}  // namespace

std::string metrics_json_line(const StepMetrics& m) {
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["loss"] = num(m.loss);
  j["lr"] = num(m.lr);
  j["grad_norm"] = num(m.grad_norm);
  j["tokens_per_s"] = num(m.tokens_per_s);
  j["peak_mem_bytes"] = m.peak_mem_bytes;
  if (m.host_peak_mem_bytes >= 0) j["host_peak_mem_bytes"] = m.host_peak_mem_bytes;
  if (m.reserved_peak_bytes >= 0) j["reserved_peak_bytes"] = m.reserved_peak_bytes;
  j["step_time_s"] = num(m.step_time_s);
  if (m.norm_read_s >= 0) j["norm_read_s"] = num(m.norm_read_s);
  j["comm_s"] = num(m.comm_s);
  j["exposed_comm_s"] = num(m.exposed_comm_s);
  j["overflow"] = m.overflow;
  j["skipped_steps"] = m.skipped_steps;
  if (m.epoch >= 0) j["epoch"] = m.epoch;
  if (std::isfinite(m.loss_scale)) j["loss_scale"] = m.loss_scale;
  if (m.has_val) j["val_loss"] = num(m.val_loss);
  if (m.ckpt_stall_s >= 0) j["ckpt_stall_s"] = num(m.ckpt_stall_s);
  if (m.ckpt_saved >= 0) j["ckpt_saved"] = m.ckpt_saved;
  if (m.ckpt_failed >= 0) j["ckpt_failed"] = m.ckpt_failed;
  if (m.minor_faults >= 0) j["minor_faults"] = m.minor_faults;
  if (m.user_s >= 0) j["user_s"] = num(m.user_s);
  if (m.sys_s >= 0) j["sys_s"] = num(m.sys_s);
  if (m.rss_bytes >= 0) j["rss_bytes"] = m.rss_bytes;
  if (m.max_rss_bytes >= 0) j["max_rss_bytes"] = m.max_rss_bytes;
  if (m.open_fds >= 0) j["open_fds"] = m.open_fds;
  return j.dump();
}

CpuUsage cpu_usage() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  CpuUsage u;
  u.user_s = static_cast<double>(r.ru_utime.tv_sec) + 1e-6 * static_cast<double>(r.ru_utime.tv_usec);
  u.sys_s = static_cast<double>(r.ru_stime.tv_sec) + 1e-6 * static_cast<double>(r.ru_stime.tv_usec);
  u.minor_faults = r.ru_minflt;
  u.max_rss_bytes = static_cast<int64_t>(r.ru_maxrss) * 1024;  // Linux: KiB
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    long size = 0, resident = 0;
    if (std::fscanf(f, "%ld %ld", &size, &resident) == 2)
      u.rss_bytes = static_cast<int64_t>(resident) * ::sysconf(_SC_PAGESIZE);
    std::fclose(f);
  }
  if (DIR* d = ::opendir("/proc/self/fd")) {
    int64_t n = 0;
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
    u.open_fds = n - 1;  // the directory's own descriptor
  }
  return u;
}

void set_cpu_usage(StepMetrics& m, const CpuUsage& a, const CpuUsage& b) {
  m.minor_faults = b.minor_faults - a.minor_faults;
  m.user_s = b.user_s - a.user_s;
  m.sys_s = b.sys_s - a.sys_s;
  m.rss_bytes = b.rss_bytes;
  m.max_rss_bytes = b.max_rss_bytes;
  m.open_fds = b.open_fds;
}

MetricsLog::MetricsLog(const std::string& path, int64_t keep_through_step) : path_(path) {
  if (keep_through_step >= 0) {
    std::string kept;
    if (FILE* in = std::fopen(path.c_str(), "r")) {
      std::string line;
      for (int c; (c = std::fgetc(in)) != EOF;) {
        if (c != '\n') {
          line += static_cast<char>(c);
          continue;
        }
        const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
            j["step"].get<int64_t>() <= keep_through_step)
          kept += line + "\n";
        line.clear();
      }
      std::fclose(in);  // a last line without '\n' was cut by a kill: dropped
    }
    const std::string tmp = path + ".tmp";
    FILE* out = std::fopen(tmp.c_str(), "w");
    const bool ok = out && std::fwrite(kept.data(), 1, kept.size(), out) == kept.size();
    if (!out || std::fclose(out) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0)
      fail("metrics", path + ": cannot rewrite for resume (" + std::string(std::strerror(errno)) +
                          ")");
    f_ = std::fopen(path.c_str(), "a");
    if (!f_) fail("metrics", path + ": cannot append (" + std::string(std::strerror(errno)) + ")");
    return;
  }
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) fail("metrics", path + ": cannot create (" + std::string(std::strerror(errno)) + ")");
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const StepMetrics& m) {
  const std::string line = metrics_json_line(m) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    fail("metrics", path_ + ": write failed (" + std::string(std::strerror(errno)) + ")");
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

Progress::Progress(int total_steps, int log_every, bool enabled, FILE* out, int tty,
                   int start_step)
    : total_(total_steps),
      every_(log_every < 1 ? 1 : log_every),
      start_(start_step),
      enabled_(enabled),
      out_(out) {
  tty_ = tty < 0 ? (out && ::isatty(::fileno(out))) : tty > 0;
}

void Progress::update(const StepMetrics& m, double elapsed_s) {
  if (m.has_val) last_val_ = m.val_loss;
  if (first_step_s_ < 0) first_step_s_ = m.step_time_s;
  if (!enabled_) return;
  const bool last = m.step >= total_;
  if (!tty_ && !last && m.step % every_ != 0) return;
  // On a terminal at most ~20 updates a second (tiny models run thousands of steps a second).
  if (tty_ && !last && !m.has_val && last_print_s_ >= 0 && elapsed_s - last_print_s_ < 0.05) return;
  last_print_s_ = elapsed_s;
  // ETA from the mean step time after the first step (which includes warm-up).
  const int done = m.step, done_here = m.step - start_;
  double per_step = done_here > 1 ? (elapsed_s - first_step_s_) / (done_here - 1) : elapsed_s;
  const double eta = per_step * (total_ - done);
  char tps[32];
  if (m.tokens_per_s >= 1e6)
    std::snprintf(tps, sizeof tps, "%.2fM", m.tokens_per_s / 1e6);
  else if (m.tokens_per_s >= 1e3)
    std::snprintf(tps, sizeof tps, "%.1fk", m.tokens_per_s / 1e3);
  else
    std::snprintf(tps, sizeof tps, "%.0f", m.tokens_per_s);
  char val[32] = "val -";
  if (std::isfinite(last_val_)) std::snprintf(val, sizeof val, "val %.4f", last_val_);
  char skipped[48] = "";
  if (m.skipped_steps > 0) std::snprintf(skipped, sizeof skipped, " | skipped %d", m.skipped_steps);
  char line[256];
  std::snprintf(line, sizeof line, "step %d/%d | loss %.4f | %s | %s tok/s%s | ETA %s", m.step,
                total_, m.loss, val, tps, skipped, last ? "0s" : format_duration(eta).c_str());
  if (tty_) {
    std::fprintf(out_, "\r%s\x1b[K", line);
    open_line_ = true;
    if (last) finish();
  } else {
    std::fprintf(out_, "%s\n", line);
  }
  std::fflush(out_);
}

void Progress::finish() {
  if (open_line_) {
    std::fputc('\n', out_);
    std::fflush(out_);
    open_line_ = false;
  }
}

}  // namespace sw
