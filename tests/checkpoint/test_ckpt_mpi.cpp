// Resharding matrix, run by ctest as `mpirun -np 4` (label mpi). One launch covers every pair
// (N, M) in {1,2,3,4}^2 and every pair of strategies: the first N ranks split off a group,
// build a tiny GPT-2 with strategy A over it and set its state (master, m, v) from a pure
// function of (unit, kind, flat index), save; then the first M ranks build the model with
// strategy B and load each checkpoint. What every rank holds afterwards must equal the pure
// function bit for bit: that is exactly the 1-rank full state. Also: a rank that fails its
// write makes commit_checkpoint return false everywhere and leaves no step directory.
// Only CHECK is used, and load_checkpoint never communicates, so a failure cannot hang ranks.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "tests/common/mpi_test_util.h"

using namespace sw;
using SK = ShardedModel::StateKind;

namespace {

using swtest::cpu;
using swtest::world;

ModelConfig tiny() {
  ModelConfig c;
  c.vocab_size = 40;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 24;  // unit sizes not multiples of the shard counts: ragged ranges
  c.seq_len = 8;
  return c;
}

// The reference state: distinct, exactly representable values per (unit, kind, index).
float value(int u, int k, int64_t i) {
  return static_cast<float>((u * 7919 + k * 104729 + i) % 1000003) * 0.001f - 17.f;
}

struct Strat {
  const char* name;
  ShardingStrategy s;
  int group;  // HYBRID_SHARD's shard_group_size for world n: 2 when it divides, else 1
};
const Strat kStrats[] = {{"FULL_SHARD", ShardingStrategy::FullShard, 0},
                         {"SHARD_GRAD_OP", ShardingStrategy::ShardGradOp, 0},
                         {"SHARD_OPTIMIZER", ShardingStrategy::ShardOptimizer, 0},
                         {"NO_SHARD", ShardingStrategy::NoShard, 0},
                         {"HYBRID_SHARD", ShardingStrategy::HybridShard, 2}};

ShardingPolicy policy(const Strat& st, int n) {
  ShardingPolicy p = ShardingPolicy::for_strategy(st.s);
  if (st.s == ShardingStrategy::HybridShard) p.shard_group_size = n % 2 == 0 ? 2 : 1;
  return p;
}

std::string base_dir() { return std::string(SW_BINARY_DIR) + "/ckpt_test_mpi"; }

}  // namespace

TEST_CASE("checkpoint: save on N ranks, load on M ranks, any strategies", "[ckpt_mpi]") {
  GroupPtr w = world();
  const int rank = w->rank();
  if (rank == 0) {
    std::filesystem::remove_all(base_dir());
    std::filesystem::create_directories(base_dir());
  }
  w->barrier();
  Model model = build_model(tiny());

  // Save: N ranks, every strategy.
  for (int n = 1; n <= w->size(); ++n) {
    GroupPtr g = w->split(rank < n ? 0 : 1, rank);
    if (rank >= n) continue;
    for (const Strat& st : kStrats) {
      ShardedModel sm(model, cpu(), 123, g, policy(st, n));
      for (int u = 0; u < sm.num_units(); ++u)
        for (int k = 0; k < 3; ++k) {
          const FlatRange h = sm.held_range(u, static_cast<SK>(k));
          std::vector<float> v(static_cast<size_t>(h.size()));
          for (int64_t i = h.lo; i < h.hi; ++i) v[size_t(i - h.lo)] = value(u, k, i);
          sm.write_state(u, static_cast<SK>(k), h, v.data());
        }
      TrainState ts;
      ts.step = 10 * n + static_cast<int>(&st - kStrats);
      const std::string dir = base_dir() + "/n" + std::to_string(n) + "_" + st.name;
      try {
        save_checkpoint(sm, ts, dir);
      } catch (const std::exception& e) {
        FAIL_CHECK("save " << dir << ": " << e.what());
      }
    }
  }
  w->barrier();
  if (rank == 0)
    for (int n = 1; n <= w->size(); ++n)
      for (const Strat& st : kStrats) {
        const std::string dir = base_dir() + "/n" + std::to_string(n) + "_" + st.name;
        try {
          verify_checkpoint(dir);
        } catch (const std::exception& e) {
          FAIL_CHECK(e.what());
        }
      }

  // Load: M ranks, every strategy, every checkpoint.
  int loads = 0, mismatches = 0;
  for (int m = 1; m <= w->size(); ++m) {
    GroupPtr g = w->split(rank < m ? 0 : 1, rank);
    if (rank >= m) continue;
    for (const Strat& sb : kStrats) {
      ShardedModel sm(model, cpu(), 456, g, policy(sb, m));
      for (int n = 1; n <= w->size(); ++n)
        for (const Strat& sa : kStrats) {
          const std::string dir = base_dir() + "/n" + std::to_string(n) + "_" + sa.name;
          // Scribble over the state first so a load that misses a range is caught.
          for (int u = 0; u < sm.num_units(); ++u)
            for (int k = 0; k < 3; ++k) {
              const FlatRange h = sm.held_range(u, static_cast<SK>(k));
              std::vector<float> junk(static_cast<size_t>(h.size()), NAN);
              sm.write_state(u, static_cast<SK>(k), h, junk.data());
            }
          TrainState ts;
          try {
            ts = load_checkpoint(sm, dir);
          } catch (const std::exception& e) {
            FAIL_CHECK("load " << dir << " on " << m << " ranks " << sb.name << ": " << e.what());
            continue;
          }
          ++loads;
          CHECK(ts.step == 10 * n + static_cast<int>(&sa - kStrats));
          int bad = 0;
          for (int u = 0; u < sm.num_units(); ++u)
            for (int k = 0; k < 3; ++k) {
              const FlatRange h = sm.held_range(u, static_cast<SK>(k));
              std::vector<float> v(static_cast<size_t>(h.size()));
              sm.read_state(u, static_cast<SK>(k), h, v.data());
              for (int64_t i = h.lo; i < h.hi; ++i) {
                const float want = value(u, k, i);
                bad += std::memcmp(&v[size_t(i - h.lo)], &want, 4) != 0;
              }
            }
          if (bad) {
            ++mismatches;
            FAIL_CHECK(dir << " loaded on " << m << " ranks as " << sb.name << ": " << bad
                           << " values differ (rank " << rank << ")");
          }
        }
      // Parameters gathered after a load are the loaded ones (a gather of the whole model).
      bool params_ok = true;
      sm.for_each_param([&](const ParamSpec& s, const float* p) {
        (void)s;
        params_ok &= std::isfinite(p[0]);
      });
      CHECK(params_ok);
    }
  }
  if (rank == 0) CHECK(loads == 4 * 5 * 4 * 5);
  CHECK(mismatches == 0);
  w->barrier();
}

TEST_CASE("checkpoint: a failed rank aborts the commit everywhere", "[ckpt_mpi]") {
  GroupPtr w = world();
  Model model = build_model(tiny());
  ShardedModel sm(model, cpu(), 1, w, ShardingPolicy::for_strategy(ShardingStrategy::FullShard));
  const std::string dir = base_dir() + "/failed", tmp = dir + ".tmp";
  SnapshotPtr s = snapshot_checkpoint(sm, TrainState{});
  write_snapshot(*s, tmp);
  const bool ok = w->rank() != w->size() - 1;  // the last rank "failed"
  const bool committed = commit_checkpoint(*w, *s, ok, tmp, dir);
  CHECK(committed == (w->size() == 1 ? ok : false));
  w->barrier();
  CHECK(!std::filesystem::exists(dir));
  CHECK(!std::filesystem::exists(tmp));
  w->barrier();
  if (w->rank() == 0) std::filesystem::remove_all(base_dir());
}
