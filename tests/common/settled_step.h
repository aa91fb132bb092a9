// One step recorded and settled (ShardedModel::set_recorder, settle_recorder), and the checks
// the simulated accelerator's records share: the profile-settle tests on the sim
// (tests/sharding/test_device*.cpp) and on a GPU (tests/cuda/test_cuda_train.cpp) compare each
// record's settled times with the host's.
#pragma once
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "sharding/sharded_model.h"
#include "sharding/step_plan.h"

namespace swtest {

// The clock tie's error on the simulated accelerator: the host's wake-up after the reference
// event (microseconds; more if the thread is preempted there on a loaded machine). The sim's
// device clock is 1e4 s off the host's, so a time not brought over by the tie is still far
// outside the bounds.
constexpr double kSimClockTie = 0.1;

// A recorded step: its records as the host wrote them (host times) and as settle_recorder()
// left them, one per action in the same order; trace_clock() before the recorder was attached
// and after the settle.
struct SettledStep {
  std::vector<sw::ActionRecord> host, settled;
  double before = 0, after = 0;
};

// How a settle that changed the number of records fails: Stop (REQUIRE) ends the test case;
// Continue (CHECK) lets it go on, for a test whose ranks must all reach their next collective.
enum class OnCountMismatch { Stop, Continue };

// Records sm.forward_backward(batch), then sm.optimizer_step(AdamWParams{}, 1e-3, 1, opt_step)
// when opt_step > 0, settles the records, detaches the recorder and checks that the settle kept
// one record per action (the caller warms up first and sets SHARDWISE_PROFILE_DEVICE_TIMES
// before building sm where it wants device times on the sim).
inline SettledStep record_settled_step(sw::ShardedModel& sm, const sw::Batch& batch, int opt_step,
                                       OnCountMismatch on = OnCountMismatch::Stop) {
  SettledStep s;
  sw::StepRecorder rec;
  s.before = sw::trace_clock();
  sm.set_recorder(&rec);
  sm.forward_backward(batch);
  if (opt_step > 0) sm.optimizer_step(sw::AdamWParams{}, 1e-3f, 1.f, opt_step);
  const std::vector<sw::ActionRecord>& host = s.host = rec.records;
  sm.settle_recorder();
  s.after = sw::trace_clock();
  sm.set_recorder(nullptr);
  s.settled = rec.records;
  // (The same expression either way: the failure reads as the tests' own did.)
  if (on == OnCountMismatch::Stop)
    REQUIRE(rec.records.size() == host.size());
  else
    CHECK(rec.records.size() == host.size());
  return s;
}

// Checks settled record i of a step on the simulated accelerator, one that names a stream,
// against the host's record: it keeps the host's times as host_begin/host_end; a gather's or
// reduction's interval on "staged comm" lies inside the host's; an activation copy ran on its
// lane ("sim copy d2h" / "sim copy h2d") once waited for or queried, in a later compute action
// than its issue. Returns false, checking only the host times, for the other kinds (compute,
// regathers): the caller checks those.
inline bool check_sim_stream_record(const std::vector<sw::ActionRecord>& host,
                                    const std::vector<sw::ActionRecord>& settled, size_t i) {
  using sw::ActionKind;
  const sw::ActionRecord &h = host[i], &d = settled[i];
  CHECK(d.host_begin == h.t_begin);
  CHECK(d.host_end == h.t_end);
  if (d.kind == ActionKind::Gather || d.kind == ActionKind::ReduceScatter) {
    CHECK(std::string(d.stream) == "staged comm");
    CHECK(d.t_begin >= h.t_begin);
    CHECK(d.t_end <= h.t_end);
    return true;
  }
  if (d.kind == ActionKind::EvictActs || d.kind == ActionKind::FetchActs) {
    CHECK(std::string(d.stream) ==
          (d.kind == ActionKind::EvictActs ? "sim copy d2h" : "sim copy h2d"));
    size_t next = i + 1;
    while (next < host.size() && host[next].queue != sw::Queue::Compute) ++next;
    CHECK(next < host.size());
    if (next < host.size()) CHECK(d.t_begin >= host[next].t_begin);
    return true;
  }
  return false;
}

}  // namespace swtest
