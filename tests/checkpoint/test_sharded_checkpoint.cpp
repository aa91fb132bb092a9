// Sharded checkpoints at world size 1 (the multi-rank resharding matrix is in
// test_ckpt_mpi.cpp): CRC-32C against a bitwise reference; save -> load bit-identity of the
// master parameters and AdamW moments of a trained model (GPT-2 and Llama); verify / inspect;
// every fault the format must catch (truncated shard, flipped bit in a shard or metadata,
// garbage metadata, a shard header lying about offsets, a different model shape) with the file
// and tensor named; export from a checkpoint == export_hf_safetensors of the same model (byte
// for byte), and export -> import round trip.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/crc32c.h"
#include "checkpoint/export.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/save_memory.h"
#include "checkpoint/sharded_checkpoint.h"
#include "tests/checkpoint/ckpt_state_util.h"
#include "core/alloc.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"
#include "st_test_util.h"

using namespace sw;
using SK = ShardedModel::StateKind;

namespace {

const Ops& cpu() { return ops_for(Device::cpu()); }

ModelConfig tiny(const std::string& type = "gpt2") {
  ModelConfig c;
  c.type = type;
  c.vocab_size = 48;
  c.n_layer = 2;
  c.n_head = type == "gpt2" ? 2 : 4;
  c.n_kv_head = type == "gpt2" ? 0 : 2;
  c.d_ff = type == "gpt2" ? 0 : 32;
  c.d_model = 16;
  c.seq_len = 8;
  return c;
}

// Tensors spanning several checksum blocks (256 KiB) and ending mid-block, a file of several
// write chunks: wte is 4099 x 128 floats = 2.0 MiB + a partial block.
ModelConfig wide() {
  ModelConfig c = tiny();
  c.vocab_size = 4099;
  c.d_model = 128;
  return c;
}

void train(ShardedModel& sm, int steps) { ckpttest::train(sm, steps, 48); }
using ckpttest::bit_equal;
using ckpttest::state;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<char> slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
void spit(const std::string& p, const std::vector<char>& d) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(d.data(), static_cast<std::streamsize>(d.size()));
}

uint32_t crc_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
  }
  return ~c;
}

// A checkpoint of a trained tiny model in dir/step_3.
struct SavedCkpt {
  sttest::TempDir dir;
  std::string step;
  Model m;
  ShardedModel sm;
  explicit SavedCkpt(const std::string& tag, const std::string& type = "gpt2")
      : dir(tag), step(dir.file("step_3")), m(build_model(tiny(type))), sm(m, cpu(), 7) {
    train(sm, 3);
    TrainState st;
    st.step = 3;
    st.seed = 7;
    st.loss_scale = 1024;
    st.scaler_good_steps = 5;
    st.scaler_hysteresis_left = 2;
    st.config_json = "{\"x\": 1}";
    save_checkpoint(sm, st, step);
  }
};

}  // namespace

TEST_CASE("crc32c: check value, bitwise reference, combine", "[checkpoint][crc]") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  std::vector<unsigned char> d(100000 + 13);
  std::mt19937 g(3);
  for (auto& x : d) x = static_cast<unsigned char>(g());
  // Lengths that exercise the three-stream path, the 8-byte loop and the tail.
  for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(12288), size_t(12289), size_t(40000), d.size()})
    CHECK(crc32c(d.data(), n) == crc_bitwise(d.data(), n));
  // Continuation and combine.
  for (size_t cut : {size_t(0), size_t(5), size_t(4096), size_t(77777)}) {
    const uint32_t a = crc32c(d.data(), cut), b = crc32c(d.data() + cut, d.size() - cut);
    CHECK(crc32c(d.data() + cut, d.size() - cut, a) == crc_bitwise(d.data(), d.size()));
    CHECK(crc32c_combine(a, b, d.size() - cut) == crc_bitwise(d.data(), d.size()));
  }
}

TEST_CASE("checkpoint: save -> load is bit-identical (master, m, v, train state)", "[checkpoint]") {
  for (const char* type : {"gpt2", "llama"}) {
    SavedCkpt s(std::string("ckpt_rt_") + type, type);
    CHECK(std::filesystem::exists(s.step + "/metadata.json"));
    CHECK(std::filesystem::exists(s.step + "/rank_0.safetensors"));
    CHECK(!std::filesystem::exists(s.step + ".tmp"));
    Model m2 = build_model(tiny(type));
    ShardedModel b(m2, cpu(), 99);
    REQUIRE(!bit_equal(state(b, SK::Master), state(s.sm, SK::Master)));
    const TrainState st = load_checkpoint(b, s.step);
    CHECK(st.step == 3);
    CHECK(st.seed == 7);
    CHECK(st.loss_scale == 1024);
    CHECK(st.scaler_good_steps == 5);
    CHECK(st.scaler_hysteresis_left == 2);
    CHECK(st.config_json == "{\"x\": 1}");
    for (SK k : {SK::Master, SK::ExpAvg, SK::ExpAvgSq}) CHECK(bit_equal(state(b, k), state(s.sm, k)));
    // The moments are really trained state, not zeros.
    CHECK(state(b, SK::ExpAvgSq)[1][0] != 0.f);
    // And training continues identically from both.
    train(s.sm, 1);
    train(b, 1);
    CHECK(bit_equal(state(b, SK::Master), state(s.sm, SK::Master)));
    verify_checkpoint(s.step);
    const std::string table = inspect_checkpoint(s.step);
    CHECK_THAT(table, Catch::Contains("step         3"));
    CHECK_THAT(table, Catch::Contains("world size   1"));
    CHECK_THAT(table, Catch::Contains("rank_0.safetensors"));
    CHECK_THAT(table, Catch::Contains("F32"));
    // Saving the same step again replaces it.
    save_checkpoint(b, st, s.step);
    verify_checkpoint(s.step);
  }
}

// The two write paths (save_checkpoint straight from the model; snapshot_checkpoint then
// write_snapshot) must produce the same bytes. The model is large enough that tensors span
// several checksum blocks (256 KiB), end mid-block, and the file spans several write chunks.
TEST_CASE("checkpoint: direct save and (reused) snapshot write identical files", "[checkpoint]") {
  sttest::TempDir dir("ckpt_paths");
  Model m = build_model(wide());
  ShardedModel sm(m, cpu(), 5);
  train(sm, 1);
  TrainState st;
  st.step = 1;
  SnapshotPtr first = snapshot_checkpoint(sm, st);
  REQUIRE(snapshot_bytes(*first) > (int64_t{9} << 20));
  train(sm, 1);
  st.step = 2;
  // Reusing `first`'s memory: no second full-size buffer is ever allocated.
  MemTracker::of(Tier::Host).reset_peaks();
  const size_t before = MemTracker::of(Tier::Host).current(Mem::Checkpoint);
  CHECK(before >= static_cast<size_t>(snapshot_bytes(*first)));  // checkpoint, host tier
  SnapshotPtr snap = snapshot_checkpoint(sm, st, std::move(first));
  CHECK(MemTracker::of(Tier::Host).peak(Mem::Checkpoint) == before);
  save_checkpoint(sm, st, dir.file("direct"));
  const auto master2 = state(sm, SK::Master);
  train(sm, 1);  // the snapshot must not see this step
  write_snapshot(*snap, dir.file("snap.tmp"));
  REQUIRE(commit_checkpoint(sm.group(), *snap, true, dir.file("snap.tmp"), dir.file("snap")));
  for (const char* f : {"/rank_0.safetensors", "/metadata.json"})
    CHECK(slurp(dir.file("direct") + f) == slurp(dir.file("snap") + f));
  verify_checkpoint(dir.file("snap"));
  Model m2 = build_model(wide());
  ShardedModel b(m2, cpu(), 99);
  CHECK(load_checkpoint(b, dir.file("snap")).step == 2);
  CHECK(bit_equal(state(b, SK::Master), master2));
  CHECK(!bit_equal(state(b, SK::Master), state(sm, SK::Master)));
}

TEST_CASE("checkpoint: resolve_checkpoint_dir", "[checkpoint]") {
  SavedCkpt s("ckpt_resolve");
  CHECK(resolve_checkpoint_dir(s.step) == s.step);
  std::ofstream(s.dir.file("latest")) << "step_3\n";
  CHECK(resolve_checkpoint_dir(s.dir.path.string()) == s.dir.file("step_3"));
  CHECK_THAT(error_of([&] { resolve_checkpoint_dir(s.dir.file("nope")); }),
             Catch::Contains("no such file"));
  std::ofstream(s.dir.file("latest")) << "step_9\n";
  CHECK_THAT(error_of([&] { resolve_checkpoint_dir(s.dir.path.string()); }),
             Catch::Contains("step_9"));
}

TEST_CASE("checkpoint: faults name the file and tensor", "[checkpoint][faults]") {
  SavedCkpt s("ckpt_faults");
  const std::string shard = s.step + "/rank_0.safetensors", meta = s.step + "/metadata.json";
  const std::vector<char> good = slurp(shard), good_meta = slurp(meta);
  Model m2 = build_model(tiny());
  ShardedModel b(m2, cpu(), 99);
  const std::function<void()> load = [&] { load_checkpoint(b, s.step); };
  const std::function<void()> verify = [&] { verify_checkpoint(s.step); };

  SECTION("truncated shard") {
    std::vector<char> d = good;
    d.resize(d.size() - 100);
    spit(shard, d);
    for (const auto& f : {load, verify}) {
      const std::string e = error_of(f);
      CHECK_THAT(e, Catch::Contains("rank_0.safetensors"));
      CHECK_THAT(e, Catch::Contains("tensor 'u"));
      CHECK(e.find('\n') == std::string::npos);
    }
  }
  SECTION("flipped bit in a shard") {
    SafeTensorsReader r(shard);
    const StTensorInfo& t = r.tensors()[4];  // some tensor in the middle
    std::vector<char> d = good;
    d[r.data_start() + t.begin + t.bytes() / 2] ^= 0x10;
    spit(shard, d);
    for (const auto& f : {load, verify}) {
      const std::string e = error_of(f);
      CHECK_THAT(e, Catch::Contains("rank_0.safetensors") &&
                        Catch::Contains("tensor '" + t.name + "'") &&
                        Catch::Contains("checksum mismatch"));
    }
  }
  SECTION("flipped bit in the shard's header") {
    std::vector<char> d = good;
    // A digit of the first data_offsets: still valid JSON, different offsets.
    const std::string text(d.begin(), d.begin() + 200);
    const size_t at = text.find("data_offsets\":[") + 15;
    d[at + 2] = d[at + 2] == '1' ? '2' : '1';
    spit(shard, d);
    const std::string e = error_of(load);
    CHECK_THAT(e, Catch::Contains("rank_0.safetensors"));
    CHECK_THAT(e, Catch::Contains("tensor '"));
  }
  SECTION("a header that lies about offsets (past the end, overlapping) is rejected") {
    SafeTensorsReader r(shard);
    std::vector<StTensorInfo> ts = r.tensors();
    // Rewrite the header with the last tensor claiming a range past the end of the file,
    // keeping the same header length so the data stays where it was.
    nlohmann::json h = nlohmann::json::parse(std::string(good.begin() + 8, good.begin() + r.data_start()));
    const std::string last = ts.back().name;
    h[last]["data_offsets"] = {ts.back().begin, ts.back().end + 4096};
    h[last]["shape"] = {(ts.back().end + 4096 - ts.back().begin) / 4};
    std::string hs = h.dump();
    REQUIRE(hs.size() <= r.data_start() - 8);
    hs.append(r.data_start() - 8 - hs.size(), ' ');
    std::vector<char> d = good;
    std::memcpy(d.data() + 8, hs.data(), hs.size());
    spit(shard, d);
    CHECK_THAT(error_of(load), Catch::Contains("tensor '" + last + "'") &&
                                   Catch::Contains("exceed the file"));
    // Offsets inside the file but moved: the shard disagrees with metadata.json.
    h = nlohmann::json::parse(std::string(good.begin() + 8, good.begin() + r.data_start()));
    const std::string first = ts.front().name;
    h[first]["data_offsets"] = {ts.front().begin + 4, ts.front().end + 4};
    h.erase(ts[1].name);  // no overlap with the next one
    hs = h.dump();
    hs.append(r.data_start() - 8 - hs.size(), ' ');
    d = good;
    std::memcpy(d.data() + 8, hs.data(), hs.size());
    spit(shard, d);
    CHECK_THAT(error_of(load), Catch::Contains("rank_0.safetensors") && Catch::Contains("tensor '"));
    CHECK_THAT(error_of(verify), Catch::Contains("rank_0.safetensors") && Catch::Contains("tensor '"));
  }
  SECTION("metadata: garbage, flipped bit, lying offsets") {
    spit(meta, {'{', 'x'});
    CHECK_THAT(error_of(load), Catch::Contains("metadata.json: not valid JSON"));
    spit(meta, std::vector<char>(good_meta.begin(), good_meta.begin() + good_meta.size() / 2));
    CHECK_THAT(error_of(load), Catch::Contains("metadata.json"));
    std::vector<char> d = good_meta;
    const std::string text(d.begin(), d.end());
    const size_t at = text.find("\"step\": ") + 8;  // "step": 3 -> 7
    d[at] = '7';
    spit(meta, d);
    CHECK_THAT(error_of(load), Catch::Contains("metadata.json: checksum mismatch"));
    CHECK_THAT(error_of(verify), Catch::Contains("metadata.json: checksum mismatch"));
    // A metadata.json whose checksum is right but whose offsets lie (beyond the file).
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(good_meta);
    j["files"][0]["tensors"][0]["offset"] = 1ull << 40;
    j.erase("metadata_crc32c");
    j["metadata_crc32c"] = crc32c(j.dump().data(), j.dump().size());
    const std::string t2 = j.dump();
    spit(meta, std::vector<char>(t2.begin(), t2.end()));
    CHECK_THAT(error_of(load), Catch::Contains("metadata.json: files[0].tensors[0].offset must be "
                                               "an integer in [0, "));
  }
  SECTION("intact files still load afterwards") {
    load();
    CHECK(bit_equal(state(b, SK::ExpAvg), state(s.sm, SK::ExpAvg)));
  }
}

TEST_CASE("checkpoint: another model shape lists every difference", "[checkpoint][faults]") {
  SavedCkpt s("ckpt_shape");
  ModelConfig c = tiny();
  c.d_model = 32;
  c.n_layer = 3;
  Model m2 = build_model(c);
  ShardedModel b(m2, cpu(), 1);
  const std::string e = error_of([&] { load_checkpoint(b, s.step); });
  CHECK_THAT(e, Catch::Contains("differs from this one"));
  CHECK_THAT(e, Catch::Contains("model_config.n_layer: checkpoint 2, model 3"));
  CHECK_THAT(e, Catch::Contains("model_config.d_model: checkpoint 16, model 32"));
  CHECK_THAT(e, Catch::Contains("units: checkpoint has 3, model has 4"));
  CHECK_THAT(e, Catch::Contains("parameter 'wte': checkpoint (48, 16), model (48, 32)"));
  CHECK(e.find('\n') == std::string::npos);
  // Another model type.
  Model ml = build_model(tiny("llama"));
  ShardedModel l(ml, cpu(), 1);
  const std::string e2 = error_of([&] { load_checkpoint(l, s.step); });
  CHECK_THAT(e2, Catch::Contains("model_config.type: checkpoint \"gpt2\", model \"llama\""));
  CHECK_THAT(e2, Catch::Contains("is not in the model"));
}

TEST_CASE("checkpoint: export equals export_hf_safetensors, and imports back", "[checkpoint][export]") {
  for (const char* type : {"gpt2", "llama"}) {
    SavedCkpt s(std::string("ckpt_export_") + type, type);
    const std::string a = s.dir.file("from_ckpt.safetensors"), b = s.dir.file("from_model.safetensors");
    export_checkpoint(s.step, a);
    export_hf_safetensors(s.sm, b);
    const std::vector<char> fa = slurp(a), fb = slurp(b);
    CHECK(fa.size() == fb.size());
    CHECK(fa == fb);  // the same header and the same bytes of every tensor
    {
      SafeTensorsReader r(a);
      if (std::string(type) == "gpt2") {
        CHECK(r.at("h.0.attn.c_attn.weight").shape == Shape{16, 48});  // Conv1D (in, out)
        CHECK(r.find("wte.weight"));
      } else {
        CHECK(r.find("model.layers.0.self_attn.q_proj.weight"));
      }
    }
    Model m2 = build_model(tiny(type));
    ShardedModel c(m2, cpu(), 5);
    import_safetensors(c, a);
    CHECK(bit_equal(state(c, SK::Master), state(s.sm, SK::Master)));
  }
}

TEST_CASE("checkpoint: shardwise ckpt verify / inspect / export", "[checkpoint][cli]") {
  SavedCkpt s("ckpt_cli");
  const std::string sw = std::string(SW_BINARY_DIR) + "/tools/shardwise";
  REQUIRE(std::filesystem::exists(sw));
  auto run = [&](const std::string& args, std::string* err) {
    const std::string log = s.dir.file("err.txt");
    const int rc = std::system((sw + " " + args + " >" + s.dir.file("out.txt") + " 2>" + log).c_str());
    const std::vector<char> e = slurp(log);
    *err = std::string(e.begin(), e.end());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  std::string err;
  CHECK(run("ckpt verify " + s.step, &err) == 0);
  const std::vector<char> out = slurp(s.dir.file("out.txt"));
  CHECK_THAT(std::string(out.begin(), out.end()), Catch::StartsWith("ok "));
  CHECK(run("ckpt inspect " + s.step, &err) == 0);
  CHECK(run("ckpt export " + s.step + " --out " + s.dir.file("cli.safetensors"), &err) == 0);
  export_checkpoint(s.step, s.dir.file("api.safetensors"));
  CHECK(slurp(s.dir.file("cli.safetensors")) == slurp(s.dir.file("api.safetensors")));
  CHECK(run("ckpt export " + s.step, &err) == 2);  // no --out
  CHECK_THAT(err, Catch::Contains("missing --out"));
  std::vector<char> d = slurp(s.step + "/rank_0.safetensors");
  d[d.size() - 3] ^= 1;
  spit(s.step + "/rank_0.safetensors", d);
  CHECK(run("ckpt verify " + s.step, &err) == 1);
  CHECK_THAT(err, Catch::StartsWith("shardwise: error: checkpoint: ") &&
                      Catch::Contains("rank_0.safetensors: tensor 'u") &&
                      Catch::Contains("checksum mismatch"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
}

// What a save holds in host memory, as the planner counts it (checkpoint/save_memory.h): a
// synchronous save's staging ring (mapped for the save alone: nothing stays resident or
// cached after it) and an asynchronous save's snapshot image (held), each against the shard
// file the save wrote.
TEST_CASE("checkpoint: a save's host memory is what checkpoint_save_bytes says", "[checkpoint]") {
  sttest::TempDir dir("ckpt_memory");
  Model m = build_model(wide());
  ShardedModel sm(m, cpu(), 5);
  train(sm, 1);
  TrainState st;
  st.step = 1;
  MemTracker& host = MemTracker::of(Tier::Host);
  release_cached();
  const size_t before = host.current(Mem::Checkpoint), cached0 = cached_bytes();
  host.reset_peaks();
  save_checkpoint(sm, st, dir.file("sync"));
  const int64_t file =
      int64_t(std::filesystem::file_size(dir.file("sync") + "/rank_0.safetensors"));
  REQUIRE(file > (int64_t{9} << 20));  // more than one staging chunk
  CHECK(int64_t(host.peak(Mem::Checkpoint) - before) == checkpoint_save_bytes(file, false));
  CHECK(host.current(Mem::Checkpoint) == before);
  CHECK(cached_bytes() == cached0);  // the ring went back to the OS, not to the cache

  SnapshotPtr snap = snapshot_checkpoint(sm, st);
  const int64_t held = int64_t(host.current(Mem::Checkpoint) - before);
  CHECK(held <= checkpoint_save_bytes(file, true));
  CHECK(held >= file);
  CHECK(file - snapshot_bytes(*snap) < 65536);  // (snapshot_bytes: the data, not the header)
}
