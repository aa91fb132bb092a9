// metrics.jsonl lines and the progress line.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "engine/metrics.h"

using namespace sw;
using Catch::Matchers::Contains;

TEST_CASE("metrics: one flushed JSON object per line with the required keys") {
  const auto p = (std::filesystem::temp_directory_path() / "sw_test_metrics.jsonl").string();
  {
    MetricsLog log(p);
    StepMetrics m;
    m.step = 1, m.loss = 2.5, m.lr = 1e-3, m.grad_norm = 0.75, m.tokens_per_s = 1234.5;
    m.peak_mem_bytes = 4096, m.step_time_s = 0.25, m.comm_s = 0.125, m.exposed_comm_s = 0.0625;
    log.write(m);
    // Flushed before the log is closed.
    std::ifstream f(p);
    std::string line;
    REQUIRE(std::getline(f, line));
    const auto j = nlohmann::json::parse(line);
    for (const char* k :
         {"step", "loss", "lr", "grad_norm", "tokens_per_s", "peak_mem_bytes", "step_time_s",
          "comm_s", "exposed_comm_s"})
      CHECK(j.contains(k));
    CHECK(j["comm_s"].get<double>() == 0.125);
    CHECK(j["exposed_comm_s"].get<double>() == 0.0625);
    CHECK(!j.contains("val_loss"));
    CHECK(!j.contains("minor_faults"));  // not measured
    CHECK(!j.contains("sys_s"));
    CHECK(j["loss"].get<double>() == 2.5);
    CHECK(j["peak_mem_bytes"].get<size_t>() == 4096);
    m.step = 2, m.has_val = true, m.val_loss = 3.0, m.loss = NAN;
    const CpuUsage u0 = cpu_usage();
    std::vector<char> touch(size_t{8} << 20, 1);  // faults some pages in
    asm volatile("" : : "r"(touch.data()) : "memory");
    set_cpu_usage(m, u0, cpu_usage());
    log.write(m);
  }
  std::ifstream f(p);
  std::string a, b;
  std::getline(f, a);
  std::getline(f, b);
  const auto j = nlohmann::json::parse(b);
  CHECK(j["val_loss"].get<double>() == 3.0);
  CHECK(j["loss"].is_null());  // non-finite -> null (valid JSON)
  CHECK(j["minor_faults"].get<int64_t>() > 0);
  CHECK(j["user_s"].get<double>() >= 0);
  CHECK(j["sys_s"].get<double>() >= 0);
  std::filesystem::remove(p);
  CHECK_THROWS_WITH(MetricsLog("/nonexistent-dir/m.jsonl"),
                    Contains("metrics: /nonexistent-dir/m.jsonl: cannot create"));
}

TEST_CASE(
    "metrics: progress prints every log_every steps off a terminal and rewrites in place on one") {
  auto run = [](int tty, int every) {
    FILE* f = std::tmpfile();
    Progress pr(10, every, true, f, tty);
    StepMetrics m;
    for (int s = 1; s <= 10; ++s) {
      m.step = s, m.loss = 1.0 / s, m.tokens_per_s = 2500, m.step_time_s = 0.1;
      m.has_val = (s == 5), m.val_loss = 0.5;
      pr.update(m, 0.1 * s);
    }
    pr.finish();
    std::rewind(f);
    std::string out;
    for (int c; (c = std::fgetc(f)) != EOF;) out += static_cast<char>(c);
    std::fclose(f);
    return out;
  };
  const std::string plain = run(0, 4);
  CHECK(std::count(plain.begin(), plain.end(), '\n') == 3);  // steps 4, 8, 10
  CHECK_THAT(
      plain,
      Contains("step 4/10 | loss 0.2500 | val - | 2.5k tok/s | ETA 1s"));  // 6 steps of 0.1 s left
  CHECK_THAT(plain, Contains("step 8/10 | loss 0.1250 | val 0.5000"));
  CHECK(plain.find('\r') == std::string::npos);
  const std::string tty = run(1, 4);
  CHECK(std::count(tty.begin(), tty.end(), '\r') == 10);
  CHECK(std::count(tty.begin(), tty.end(), '\n') == 1);
  CHECK(format_duration(75) == "1m15s");
  CHECK(format_duration(3725) == "1h02m");
}
