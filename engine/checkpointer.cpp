#include "engine/checkpointer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/file_io.h"
#include "core/env.h"
#include "core/error.h"
#include "engine/clock.h"
#include "sharding/comm/group.h"

namespace sw {

namespace fs = std::filesystem;

namespace {

int test_delay_ms() { return int(env_int("SHARDWISE_CKPT_TEST_DELAY_MS").value_or(0)); }

// "step_<N>" with N a non-negative decimal (no sign, no leading '+'); -1 otherwise.
int64_t parse_step_name(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return -1;
  int64_t n = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

// Renames `p` to a '.'-prefixed name (so it no longer counts as complete), then deletes it.
void retire(const fs::path& p, const char* suffix) {
  std::string name = ".";  // appended: GCC 12 warns (-Wrestrict) at "." + string&&
  name += p.filename().string();
  name += suffix;
  const fs::path aside = p.parent_path() / name;
  std::error_code ec;
  fs::remove_all(aside, ec);
  fs::rename(p, aside, ec);
  if (ec) fail("checkpoint", p.string() + ": cannot rename it aside (" + ec.message() + ")");
  fs::remove_all(aside, ec);
}

}  // namespace

void CkptEvents::add(const CkptEvents& o) {
  stall_s += o.stall_s;
  if (o.committed >= 0) committed = o.committed;
  if (o.failed >= 0) failed = o.failed, error = o.error;
}

std::string Checkpointer::step_name(int64_t step) { return "step_" + std::to_string(step); }

std::string read_latest(const std::string& ckpt_dir) {
  const fs::path p = fs::path(ckpt_dir) / "latest";
  std::error_code ec;
  if (!fs::exists(p, ec)) return "";
  std::ifstream f(p);
  if (!f) fail("checkpoint", p.string() + ": cannot read (" + std::strerror(errno) + ")");
  std::string name;
  std::getline(f, name);
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
  if (parse_step_name(name) < 0)
    fail("checkpoint",
         p.string() + ": expected a line 'step_<N>', got '" + name.substr(0, 40) + "'");
  return (fs::path(ckpt_dir) / name).string();
}

void write_latest(const std::string& ckpt_dir, const std::string& step_name) {
  const std::string tmp = (fs::path(ckpt_dir) / ".latest.tmp").string();
  const std::string dst = (fs::path(ckpt_dir) / "latest").string();
  try {
    write_file_synced(tmp, step_name + "\n");
  } catch (const Error&) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), dst.c_str()) != 0)
    fail("checkpoint", dst + ": rename failed (" + std::strerror(errno) + ")");
  fsync_dir(ckpt_dir);
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& ckpt_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(ckpt_dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
    const int64_t n = parse_step_name(e.path().filename().string());
    if (n >= 0 && e.is_directory(ec)) out.emplace_back(n, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> prune_checkpoints(const std::string& ckpt_dir, int keep_last) {
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  const auto all = list_checkpoints(ckpt_dir);
  std::string latest;
  try {
    latest = read_latest(ckpt_dir);
  } catch (const Error&) {
    return removed;  // an unreadable `latest`: delete nothing
  }
  const fs::path keep = latest.empty() ? fs::path() : fs::path(latest).filename();
  const size_t n = all.size();
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < n; ++i) {
    const fs::path p(all[i].second);
    if (p.filename() == keep) continue;
    retire(p, ".deleting");
    removed.push_back(p.filename().string());
  }
  return removed;
}

std::vector<std::string> remove_stale(const std::string& ckpt_dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(ckpt_dir, ec)) return removed;
  std::vector<fs::path> victims;
  for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool dot_step = name.rfind(".step_", 0) == 0;
    auto ends_with = [&](const char* suf) {
      const size_t n = std::strlen(suf);
      return name.size() > n && name.compare(name.size() - n, n, suf) == 0;
    };
    const bool tmp_step = name.rfind("step_", 0) == 0 && (ends_with(".tmp") || ends_with(".old"));
    if (dot_step || tmp_step || name == ".latest.tmp") victims.push_back(e.path());
  }
  for (const fs::path& p : victims) {
    fs::remove_all(p, ec);
    if (ec) fail("checkpoint", p.string() + ": cannot remove a stale save (" + ec.message() + ")");
    removed.push_back(p.filename().string());
  }
  return removed;
}

std::string resolve_resume(const std::string& resume, const std::string& ckpt_dir) {
  if (resume.empty()) return "";
  if (resume == "auto") {
    const std::string latest = read_latest(ckpt_dir);
    std::error_code ec;
    if (!latest.empty() && fs::exists(fs::path(latest) / "metadata.json", ec)) return latest;
    const auto all = list_checkpoints(ckpt_dir);
    return all.empty() ? "" : all.back().second;
  }
  std::error_code ec;
  if (!fs::exists(resume, ec))
    fail("resume", resume +
                       ": no such checkpoint (expected a step directory such as "
                       "<dir>/step_100, a checkpoint directory holding 'latest', or 'auto')");
  if (!fs::is_directory(resume, ec))
    fail("resume", resume + ": is a file, not a checkpoint directory");
  if (fs::exists(fs::path(resume) / "latest", ec)) {
    const std::string latest = read_latest(resume);
    if (!fs::exists(fs::path(latest) / "metadata.json", ec))
      fail("resume",
           resume + ": 'latest' names " + latest + ", which is not a complete checkpoint");
    return latest;
  }
  if (fs::exists(fs::path(resume) / "metadata.json", ec)) return resume;
  if (const auto all = list_checkpoints(resume); !all.empty())
    fail("resume", resume + ": has no 'latest' file; name a step directory (newest: " +
                       all.back().second + ")");
  fail("resume", resume + ": not a checkpoint (no metadata.json and no 'latest' file)");
}

Checkpointer::Checkpointer(std::string dir, int keep_last, bool async, Group& group)
    : dir_(std::move(dir)), keep_last_(keep_last), async_(async), group_(group) {
  if (group_.rank() == 0) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec)
      fail("checkpoint", "checkpoint.dir '" + dir_ + "': cannot create it (" + ec.message() + ")");
    remove_stale(dir_);
  }
  group_.barrier();
}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();
  if (prefault_.joinable()) prefault_.join();
}

void Checkpointer::reserve(const ShardedModel& sm) {
  if (!async_ || snap_ || prefault_.joinable()) return;
  snap_ = reserve_snapshot(sm);
  prefault_ = std::thread([s = snap_.get()] { prefault_snapshot(*s); });
}

void Checkpointer::write(const std::string& tmp) {
  try {
    const int delay = test_delay_ms();
    if (delay > 0) {
      fs::create_directories(tmp);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    }
    write_snapshot(*snap_, tmp);
    if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  } catch (const std::exception& e) {
    error_ = e.what();
    if (error_.empty()) error_ = "unknown error";
  }
  written_.store(true, std::memory_order_release);
}

CkptEvents Checkpointer::save(const ShardedModel& sm, const TrainState& state) {
  const auto t0 = Clock::now();
  CkptEvents ev = finish();  // at most one save in flight
  if (prefault_.joinable()) prefault_.join();  // reserve()'s memory, normally long faulted in
  pending_step_ = state.step;
  // Async: an in-memory copy (reusing the previous snapshot's memory), written in the
  // background; sync: written straight from the model's memory before training goes on.
  snap_ = async_ ? snapshot_checkpoint(sm, state, std::move(snap_)) : view_checkpoint(sm, state);
  error_.clear();
  written_.store(false);
  pending_ = true;
  std::string tmp_name = ".";  // appended, as in retire()
  tmp_name += step_name(state.step);
  tmp_name += ".tmp";
  const std::string tmp = (fs::path(dir_) / tmp_name).string();
  if (async_) {
    writer_ = std::thread([this, tmp] { write(tmp); });
  } else {
    write(tmp);
    ev.add(commit_pending());
  }
  ev.stall_s = seconds_since(t0);
  return ev;
}

CkptEvents Checkpointer::poll() {
  CkptEvents ev;
  if (!pending_) return ev;
  const auto t0 = Clock::now();
  float done = written_.load(std::memory_order_acquire) ? 1.f : 0.f;
  if (group_.size() > 1) group_.all_reduce(&done, &done, 1, ReduceOp::Sum);
  if (done == static_cast<float>(group_.size())) {
    ev = finish();
  }
  ev.stall_s = seconds_since(t0);
  return ev;
}

CkptEvents Checkpointer::finish() {
  CkptEvents ev;
  if (!pending_) return ev;
  const auto t0 = Clock::now();
  if (writer_.joinable()) writer_.join();
  ev = commit_pending();
  ev.stall_s = seconds_since(t0);
  return ev;
}

CkptEvents Checkpointer::commit_pending() {
  CkptEvents ev;
  const std::string name = step_name(pending_step_);
  const std::string tmp = (fs::path(dir_) / ("." + name + ".tmp")).string();
  const std::string final_dir = (fs::path(dir_) / name).string();
  const bool lead = group_.rank() == 0;
  std::string err = error_;
  // A step directory of the same name (from a run resumed at an earlier step) is replaced by
  // commit_checkpoint.
  bool ok = false;
  try {
    ok = commit_checkpoint(group_, *snap_, err.empty(), tmp, final_dir);
  } catch (const std::exception& e) {
    if (err.empty()) err = e.what();
  }
  const bool committed = ok;  // the same on every rank
  if (ok && lead) {
    try {
      write_latest(dir_, name);
      prune_checkpoints(dir_, keep_last_);
    } catch (const std::exception& e) {
      ok = false;  // the step directory is complete, but `latest` may name the previous one
      err = e.what();
    }
  }
  // Every rank reports what rank 0 saw. On `committed`, not `ok`: rank 0's `ok` may have
  // turned false above, and it must still take part in the broadcast.
  if (committed && group_.size() > 1) {
    float f = ok ? 1.f : 0.f;
    group_.broadcast(&f, 1, 0);
    ok = f == 1.f;
  }
  // Async: the snapshot's memory stays as the staging buffer of the next save (no page faults
  // in its copy; the host memory of one checkpoint share is held for the run, as async
  // checkpointers' staging buffers are). Sync: a view of the model, dropped.
  if (!async_) snap_.reset();
  pending_ = false;
  if (ok) {
    ev.committed = pending_step_;
  } else {
    ev.failed = pending_step_;
    ev.error = err;
  }
  return ev;
}

}  // namespace sw
