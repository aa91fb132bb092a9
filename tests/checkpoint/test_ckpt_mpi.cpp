// Resharding matrix, run by ctest as `mpirun -np 4` (label mpi). One launch covers every pair
// (N, M) in {1,2,3,4}^2 and every pair of strategies: the first N ranks split off a group,
// build a tiny GPT-2 with strategy A over it and set its state (master, m, v) from a pure
// function of (unit, kind, flat index), save; then the first M ranks build the model with
// strategy B and load each checkpoint. What every rank holds afterwards must equal the pure
// function bit for bit: that is exactly the 1-rank full state. Also: a rank that fails its
// write makes commit_checkpoint return false everywhere and leaves no step directory.
// Only CHECK is used, and load_checkpoint never communicates, so a failure cannot hang ranks.
// Partial reads: a model whose units span many checksum blocks (256 KiB), saved on 1 rank, loaded
// on 4: LoadStats must equal what metadata.json and held_range imply (block-rounded overlaps),
// FULL_SHARD ranks must read about a quarter each, NO_SHARD ranks everything, and together the
// ranks must read every block.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/safetensors.h"
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

TEST_CASE("checkpoint: state on a device (2 sim ranks), any strategy, to and from the CPU",
          "[ckpt_mpi][device]") {
  // The simulated accelerator (tests/common/sim_device.h): its memory faults on a host access,
  // so saves must copy the state out and loads copy it in. Saved on 2 sim ranks with every
  // strategy (fp32 and bf16 mixed precision: split fp32 masters), loaded on 1-4 CPU ranks and
  // on 2 sim ranks; a 4-rank CPU checkpoint loaded on 2 sim ranks; and a resumed 2-rank sim run
  // equals the uninterrupted one.
  GroupPtr w = world();
  const int rank = w->rank();
  const std::string base = base_dir() + "/device";
  if (rank == 0) {
    std::filesystem::remove_all(base);
    std::filesystem::create_directories(base);
  }
  w->barrier();
  Model model = build_model(tiny());
  const Ops& sim = ops_for(Device::sim(0));
  auto pol = [](const Strat& st, int n, DType pdt) {
    ShardingPolicy p = policy(st, n);
    p.mixed_precision.param_dtype = pdt;
    return p;
  };
  auto set_state = [](ShardedModel& sm) {
    for (int u = 0; u < sm.num_units(); ++u)
      for (int k = 0; k < 3; ++k) {
        const FlatRange h = sm.held_range(u, static_cast<SK>(k));
        std::vector<float> v(static_cast<size_t>(h.size()));
        for (int64_t i = h.lo; i < h.hi; ++i) v[size_t(i - h.lo)] = value(u, k, i);
        sm.write_state(u, static_cast<SK>(k), h, v.data());
      }
  };
  auto scribble = [](ShardedModel& sm) {  // so that a load missing a range is caught
    for (int u = 0; u < sm.num_units(); ++u)
      for (int k = 0; k < 3; ++k) {
        const FlatRange h = sm.held_range(u, static_cast<SK>(k));
        std::vector<float> junk(static_cast<size_t>(h.size()), NAN);
        sm.write_state(u, static_cast<SK>(k), h, junk.data());
      }
  };
  // Values that differ from value(): the count. A split fp32 master is read where it exists
  // (this rank's shard: owned_range), everything else over held_range.
  auto bad_values = [](const ShardedModel& sm, bool split) {
    int bad = 0;
    for (int u = 0; u < sm.num_units(); ++u)
      for (int k = 0; k < 3; ++k) {
        const FlatRange h = split && k == 0 && sm.world() > 1
                                ? sm.owned_range(u)
                                : sm.held_range(u, static_cast<SK>(k));
        std::vector<float> v(static_cast<size_t>(h.size()));
        sm.read_state(u, static_cast<SK>(k), h, v.data());
        for (int64_t i = h.lo; i < h.hi; ++i) {
          const float want = value(u, k, i);
          bad += std::memcmp(&v[size_t(i - h.lo)], &want, 4) != 0;
        }
      }
    return bad;
  };
  const DType kDtypes[] = {DType::F32, DType::BF16};
  auto dir_of = [&](const Strat& st, DType pdt) {
    return base + "/sim2_" + st.name + "_" + dtype_name(pdt);
  };
  {  // Save on 2 sim ranks; a CPU checkpoint on 4 ranks.
    GroupPtr g = w->split(rank < 2 ? 0 : 1, rank);
    if (rank < 2)
      for (const Strat& st : kStrats)
        for (DType pdt : kDtypes) {
          ShardedModel sm(model, sim, 123, g, pol(st, 2, pdt));
          REQUIRE(sm.state_on_device());
          set_state(sm);
          TrainState ts;
          ts.step = static_cast<int>(&st - kStrats);
          try {
            save_checkpoint(sm, ts, dir_of(st, pdt));
          } catch (const std::exception& e) {
            FAIL_CHECK("save " << dir_of(st, pdt) << ": " << e.what());
          }
        }
    ShardedModel sm(model, cpu(), 123, w, pol(kStrats[4], w->size(), DType::F32));
    set_state(sm);
    save_checkpoint(sm, TrainState{}, base + "/cpu_all");
  }
  w->barrier();
  // Load the sim checkpoints on 1..4 CPU ranks (FULL_SHARD) and on 2 sim ranks (every
  // strategy); the CPU one on 2 sim ranks.
  int mismatches = 0, loads = 0;
  for (int m = 1; m <= w->size(); ++m) {
    GroupPtr g = w->split(rank < m ? 0 : 1, rank);
    if (rank >= m) continue;
    ShardedModel on_cpu(model, cpu(), 456, g, pol(kStrats[0], m, DType::F32));
    for (const Strat& st : kStrats)
      for (DType pdt : kDtypes) {
        scribble(on_cpu);
        const TrainState ts = load_checkpoint(on_cpu, dir_of(st, pdt));
        CHECK(ts.step == static_cast<int>(&st - kStrats));
        ++loads;
        if (bad_values(on_cpu, false)) {
          ++mismatches;
          FAIL_CHECK(dir_of(st, pdt) << " on " << m << " CPU ranks (rank " << rank << ")");
        }
      }
    if (m != 2) continue;
    for (const Strat& sb : kStrats)
      for (DType pdt : kDtypes) {
        ShardedModel on_sim(model, sim, 456, g, pol(sb, 2, pdt));
        for (const Strat& sa : kStrats) {
          scribble(on_sim);
          load_checkpoint(on_sim, dir_of(sa, pdt));
          ++loads;
          if (bad_values(on_sim, pdt != DType::F32)) {
            ++mismatches;
            FAIL_CHECK(dir_of(sa, pdt) << " on 2 sim ranks as " << sb.name << " (rank " << rank << ")");
          }
        }
        scribble(on_sim);
        load_checkpoint(on_sim, base + "/cpu_all");
        ++loads;
        if (bad_values(on_sim, pdt != DType::F32)) {
          ++mismatches;
          FAIL_CHECK("cpu_all on 2 sim ranks as " << sb.name << " (rank " << rank << ")");
        }
      }
  }
  CHECK(mismatches == 0);
  if (rank == 0) CHECK(loads == 4 * 10 + 10 * 6);
  w->barrier();

  {  // Resume on 2 sim ranks (FULL_SHARD, bf16): equals the uninterrupted run bit for bit.
    GroupPtr g = w->split(rank < 2 ? 0 : 1, rank);
    if (rank < 2) {
      const ShardingPolicy p = pol(kStrats[0], 2, DType::BF16);
      std::vector<int32_t> in(16), tg(16);
      auto steps = [&](ShardedModel& sm, int first, int last) {
        for (int s = first + 1; s <= last; ++s) {
          for (int i = 0; i < 16; ++i)
            in[size_t(i)] = (i * 7 + s + rank) % 40, tg[size_t(i)] = (i * 3 + s) % 40;
          Batch b;
          b.B = 2, b.T = 8, b.tokens = in.data(), b.targets = tg.data();
          sm.zero_grads();
          sm.forward_backward(b);
          sm.optimizer_step(AdamWParams{}, 1e-2f, 1.f, s);
        }
      };
      auto all_params = [](const ShardedModel& sm) {
        std::vector<float> all;
        sm.for_each_param([&](const ParamSpec& s, const float* x) {
          all.insert(all.end(), x, x + numel(s.shape));
        });
        return all;
      };
      ShardedModel a(model, sim, 7, g, p);
      steps(a, 0, 2);
      TrainState ts;
      ts.step = 2;
      save_checkpoint(a, ts, base + "/resume");
      steps(a, 2, 4);
      ShardedModel b(model, sim, 8, g, p);
      CHECK(load_checkpoint(b, base + "/resume").step == 2);
      steps(b, 2, 4);
      const std::vector<float> pa = all_params(a), pb = all_params(b);
      REQUIRE(pa.size() == pb.size());
      CHECK(std::memcmp(pa.data(), pb.data(), pa.size() * 4) == 0);
      for (int u = 0; u < a.num_units(); ++u)
        for (int k = 0; k < 3; ++k) {
          const FlatRange r = a.owned_range(u);
          std::vector<float> va(size_t(r.size())), vb(size_t(r.size()));
          a.read_state(u, static_cast<SK>(k), r, va.data());
          b.read_state(u, static_cast<SK>(k), r, vb.data());
          CHECK(std::memcmp(va.data(), vb.data(), va.size() * 4) == 0);
        }
    }
  }
  w->barrier();
}

namespace {

// One tensor of a shard file as metadata.json describes it (parsed here, not by the loader).
struct MetaTensor {
  std::string file;
  int unit = 0, kind = 0;
  int64_t lo = 0, hi = 0;
  uint64_t offset = 0, bytes = 0;
};

std::vector<MetaTensor> meta_tensors(const std::string& dir, uint64_t* block_bytes) {
  std::ifstream in(dir + "/metadata.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  *block_bytes = j.at("block_bytes").get<uint64_t>();
  const std::map<std::string, int> kinds{{"master", 0}, {"exp_avg", 1}, {"exp_avg_sq", 2}};
  std::vector<MetaTensor> out;
  for (const auto& f : j.at("files"))
    for (const auto& t : f.at("tensors"))
      out.push_back({f.at("file").get<std::string>(), t.at("unit").get<int>(),
                     kinds.at(t.at("kind").get<std::string>()), t.at("lo").get<int64_t>(),
                     t.at("hi").get<int64_t>(), t.at("offset").get<uint64_t>(),
                     t.at("bytes").get<uint64_t>()});
  return out;
}

}  // namespace

TEST_CASE("checkpoint: a rank reads only the blocks overlapping what it holds", "[ckpt_mpi]") {
  GroupPtr w = world();
  const int rank = w->rank(), W = w->size();
  const std::string dir = base_dir() + "_io/step";
  ModelConfig c;
  c.vocab_size = 4096;
  c.n_layer = 4;
  c.n_head = 4;
  c.d_model = 512;  // units of 8-12 MiB per kind: a quarter spans many checksum blocks
  c.seq_len = 64;
  Model model = build_model(c);
  {
    GroupPtr g = w->split(rank == 0 ? 0 : 1, rank);
    if (rank == 0) {
      std::filesystem::remove_all(base_dir() + "_io");
      ShardedModel sm(model, cpu(), 7, g, ShardingPolicy::for_strategy(ShardingStrategy::FullShard));
      save_checkpoint(sm, TrainState{}, dir);
    }
  }
  w->barrier();

  uint64_t B = 0;
  const std::vector<MetaTensor> ts = meta_tensors(dir, &B);
  REQUIRE(B > 0);
  // The checkpoint's payload, from metadata.json and, independently, from the files' own
  // safetensors headers (the shard files hold nothing but these tensors).
  int64_t total = 0, total_files = 0, headers = 0;
  std::map<std::string, int64_t> header_of;
  for (const MetaTensor& t : ts) total += static_cast<int64_t>(t.bytes);
  for (const MetaTensor& t : ts)
    if (!header_of.count(t.file)) {
      SafeTensorsReader r(dir + "/" + t.file);
      header_of[t.file] = static_cast<int64_t>(r.data_start());
      headers += static_cast<int64_t>(r.data_start());
      total_files += static_cast<int64_t>(r.file_size() - r.data_start());
    }
  CHECK(total_files == total);

  for (ShardingStrategy strat : {ShardingStrategy::FullShard, ShardingStrategy::NoShard}) {
    const bool full = strat == ShardingStrategy::FullShard;
    ShardedModel sm(model, cpu(), 8, w, ShardingPolicy::for_strategy(strat));
    // Expected reads: per tensor, its overlap with held_range rounded out to whole blocks
    // (relative to the tensor's start, clipped to its end).
    int64_t want = 0, held = 0, touched = 0;
    std::set<std::string> files;
    std::vector<std::vector<float>> mine(ts.size());  // blocks this rank must read, per tensor
    for (size_t i = 0; i < ts.size(); ++i) {
      const MetaTensor& t = ts[i];
      mine[i].assign(static_cast<size_t>((t.bytes + B - 1) / B), 0.f);
      const FlatRange h = sm.held_range(t.unit, static_cast<SK>(t.kind));
      const int64_t a = std::max(h.lo, t.lo), b = std::min(h.hi, t.hi);
      if (a >= b) continue;
      const uint64_t b0 = static_cast<uint64_t>(a - t.lo) * 4 / B;
      const uint64_t b1 = (static_cast<uint64_t>(b - t.lo) * 4 + B - 1) / B;
      want += static_cast<int64_t>(std::min(b1 * B, t.bytes) - b0 * B);
      held += (b - a) * 4;
      ++touched;
      files.insert(t.file);
      for (uint64_t k = b0; k < b1; ++k) mine[i][k] = 1.f;
    }
    int64_t want_headers = 0;
    for (const std::string& f : files) want_headers += header_of[f];
    int units = sm.num_units();

    LoadStats st;
    load_checkpoint(sm, dir, &st);
    std::printf("load %s on %d ranks, rank %d: payload %lld of %lld bytes (held %lld), %lld "
                "blocks, %lld files, header %lld bytes, metadata.json %lld bytes\n",
                full ? "FULL_SHARD" : "NO_SHARD", W, rank, static_cast<long long>(st.payload_bytes),
                static_cast<long long>(total), static_cast<long long>(held),
                static_cast<long long>(st.blocks_read), static_cast<long long>(st.files_opened),
                static_cast<long long>(st.header_bytes), static_cast<long long>(st.metadata_bytes));
    CHECK(st.payload_bytes == want);
    CHECK(st.files_opened == static_cast<int64_t>(files.size()));
    CHECK(st.header_bytes == want_headers);
    CHECK(st.metadata_bytes == static_cast<int64_t>(std::filesystem::file_size(dir + "/metadata.json")));
    int64_t span_sum = 0;
    std::vector<std::vector<float>> seen(ts.size());  // blocks the loader says it read
    for (size_t i = 0; i < ts.size(); ++i) seen[i].assign(mine[i].size(), 0.f);
    for (const LoadStats::Span& sp : st.spans) {
      span_sum += static_cast<int64_t>(sp.end - sp.begin);
      bool found = false;
      for (size_t i = 0; i < ts.size() && !found; ++i) {
        const MetaTensor& t = ts[i];
        if (t.file != sp.file || sp.begin < t.offset || sp.end > t.offset + t.bytes) continue;
        found = true;
        CHECK((sp.begin - t.offset) % B == 0);  // whole blocks only
        for (uint64_t k = (sp.begin - t.offset) / B; k * B < sp.end - t.offset; ++k) seen[i][k] += 1.f;
      }
      CHECK(found);
    }
    CHECK(span_sum == st.payload_bytes);
    CHECK(st.blocks_read == [&] {
      int64_t n = 0;
      for (const auto& v : mine) for (float f : v) n += f > 0;
      return n;
    }());
    bool same_blocks = true;
    for (size_t i = 0; i < ts.size(); ++i) same_blocks &= seen[i] == mine[i];
    CHECK(same_blocks);  // every needed block once, nothing else

    if (full) {
      // About a quarter each: the held share plus at most 2 partial blocks per tensor touched
      // (bounded by 2 blocks x 3 kinds x units per file), and well below the whole checkpoint.
      CHECK(held <= (total + W - 1) / W + 3 * units * static_cast<int64_t>(kAlign) * 4);
      CHECK(st.payload_bytes <= held + 2 * static_cast<int64_t>(B) * touched);
      CHECK(touched <= 3 * units * static_cast<int64_t>(files.size()));
      if (W == 4) CHECK(st.payload_bytes * 5 < total * 2);  // < 40% (measured: 25-34%)
    } else {
      CHECK(st.payload_bytes == total);  // NO_SHARD: every rank holds, so reads, everything
      CHECK(st.files_opened == static_cast<int64_t>(header_of.size()));
    }
    // Together the ranks read every block of every tensor.
    std::vector<float> flat, sum;
    for (const auto& v : seen) flat.insert(flat.end(), v.begin(), v.end());
    sum.resize(flat.size());
    w->all_reduce(flat.data(), sum.data(), static_cast<int64_t>(flat.size()), ReduceOp::Sum);
    int64_t missed = 0;
    for (float f : sum) missed += f < 1.f;
    CHECK(missed == 0);
  }
  w->barrier();
  if (rank == 0) std::filesystem::remove_all(base_dir() + "_io");
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
