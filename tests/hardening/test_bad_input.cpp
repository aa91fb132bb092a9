// Bad input (issue 13, "Bad input"): every named case runs the built `shardwise` binary as a
// user would, next to a run directory that already holds a trained model, a checkpoint and
// metrics. Each must end with exit code 1, exactly one line on stderr naming the offending
// file or key, and the run directory byte-for-byte and timestamp-for-timestamp as it was.
// The fuzzers (fuzz/) cover the same readers with random input; these are the cases a person
// meets (or an attacker crafts) that must stay errors.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "tests/common/cli_run.h"
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/crc32c.h"

namespace fs = std::filesystem;

namespace {

using clitest::lines;
using clitest::q;
using clitest::Result;
using clitest::slurp;
using clitest::spit;
Result sw_run(const fs::path& dir, const std::vector<std::string>& args) {
  return clitest::sw_run(dir, args, 1);
}

// Every file and directory under `root`: size, modification time and content.
using Fingerprint = std::map<std::string, std::string>;
Fingerprint fingerprint(const fs::path& root) {
  Fingerprint fp;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string rel = fs::relative(e.path(), root).string();
    const auto t = e.last_write_time().time_since_epoch().count();
    fp[rel] = e.is_regular_file()
                  ? std::to_string(e.file_size()) + "@" + std::to_string(t) + ":" +
                        std::to_string(std::hash<std::string>{}(slurp(e.path())))
                  : "dir";
  }
  return fp;
}

// A scratch directory holding train.bin, cfg.json and run/ — a finished 2-step run with its
// checkpoint (run/checkpoints/step_2), metrics, config and exported weights.
struct Workspace {
  fs::path dir, run;
  Fingerprint saved;

  explicit Workspace(const std::string& name) {
    dir = fs::path(SW_BINARY_DIR) / "tests" / "hardening_tmp" / name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    run = dir / "run";
    spit(dir / "train.bin", token_file(64, 64));
    spit(dir / "cfg.json", config().dump(1));
    const Result r = sw_run(dir, {"train", "cfg.json"});
    INFO("stderr: " << r.err);
    REQUIRE(r.rc == 0);
    REQUIRE(fs::exists(run / "checkpoints" / "step_2" / "metadata.json"));
    saved = fingerprint(run);
  }

  nlohmann::ordered_json config() const {
    return {{"model", {{"type", "gpt2"}, {"vocab_size", 64}, {"n_layer", 1}, {"n_head", 2},
                       {"d_model", 16}, {"seq_len", 8}}},
            {"data", {{"train", (dir / "train.bin").string()}}},
            {"train_micro_batch_size_per_gpu", 2},
            {"train_steps", 2},
            {"run_dir", run.string()},
            {"checkpoint", {{"every_steps", 2}}}};
  }

  // llm.c's layout: 256 int32 (magic, version, count), then `n` uint16 tokens, with the
  // header's count set to `count`.
  static std::string token_file(int32_t count, int n) {
    std::vector<int32_t> h(256, 0);
    h[0] = 20240520, h[1] = 1, h[2] = count;
    std::string s(reinterpret_cast<const char*>(h.data()), h.size() * 4);
    for (int i = 0; i < n; ++i) {
      const uint16_t t = static_cast<uint16_t>((i * 7) % 64);
      s.append(reinterpret_cast<const char*>(&t), 2);
    }
    return s;
  }

  // The command must be refused: exit 1, one line naming every needle, run/ untouched.
  void expect_refused(const std::vector<std::string>& args,
                      const std::vector<std::string>& needles) const {
    const Result r = sw_run(dir, args);
    std::string cmd;
    for (const auto& a : args) cmd += " " + (a.size() > 120 ? a.substr(0, 120) + "..." : a);
    INFO("shardwise" << cmd << "\nstderr: " << r.err.substr(0, 2000));
    CHECK(r.rc == 1);
    const auto ls = lines(r.err);
    REQUIRE(ls.size() == 1);
    CHECK(ls[0].rfind("shardwise: error: ", 0) == 0);
    for (const auto& n : needles) CHECK(ls[0].find(n) != std::string::npos);
    const Fingerprint now = fingerprint(run);
    std::string changed;
    for (const auto& [k, v] : now)
      if (!saved.count(k) || saved.at(k) != v) changed += " " + k;
    for (const auto& [k, v] : saved)
      if (!now.count(k)) changed += " -" + k;
    INFO("changed in run/:" << changed);
    CHECK(now == saved);
  }
};

// A safetensors file: the 8-byte length (`hlen`, or the header's real length), the header,
// the data.
std::string st_file(const std::string& header, const std::string& data, uint64_t hlen = 0) {
  if (hlen == 0) hlen = header.size();
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = static_cast<char>(hlen >> (8 * i));
  return s + header + data;
}

// A copy of the run's checkpoint at <dir>/<name>, with metadata.json edited by `edit` and
// sealed again (metadata_crc32c recomputed), as a crafted checkpoint would be.
fs::path crafted_checkpoint(const Workspace& w, const std::string& name,
                            const std::function<void(nlohmann::ordered_json&)>& edit) {
  const fs::path src = w.run / "checkpoints" / "step_2", dst = w.dir / name / "step_2";
  fs::remove_all(w.dir / name);
  fs::create_directories(dst.parent_path());
  fs::copy(src, dst, fs::copy_options::recursive);
  auto j = nlohmann::ordered_json::parse(slurp(dst / "metadata.json"));
  j.erase("metadata_crc32c");
  edit(j);
  const std::string body = j.dump();
  j["metadata_crc32c"] = sw::crc32c(body.data(), body.size());
  spit(dst / "metadata.json", j.dump(1));
  return dst;
}

}  // namespace

TEST_CASE("bad input: a safetensors header length beyond the file", "[hardening]") {
  Workspace w("st_header_length");
  const std::string hdr = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  // 1 TiB claimed in a 70-byte file: refused before anything is allocated or read.
  spit(w.dir / "huge_len.safetensors", st_file(hdr, std::string(8, '\0'), uint64_t{1} << 40));
  w.expect_refused({"train", "cfg.json", "--init-from", "huge_len.safetensors"},
                   {"huge_len.safetensors", "header length 1099511627776 exceeds the file"});
  // One byte past the end.
  spit(w.dir / "off_by_one.safetensors", st_file(hdr, std::string(8, '\0'), hdr.size() + 9));
  w.expect_refused({"train", "cfg.json", "--init-from", "off_by_one.safetensors"},
                   {"off_by_one.safetensors", "exceeds the file"});
}

TEST_CASE("bad input: safetensors tensors that overlap", "[hardening]") {
  Workspace w("st_overlap");
  spit(w.dir / "overlap.safetensors",
       st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               std::string(12, '\0')));
  w.expect_refused({"train", "cfg.json", "--init-from", "overlap.safetensors"},
                   {"overlap.safetensors", "tensor 'b'", "overlap tensor 'a'"});
  // The same name twice (JSON keeps the last one silently; the reader refuses).
  spit(w.dir / "twice.safetensors",
       st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
               std::string(12, '\0')));
  w.expect_refused({"train", "cfg.json", "--init-from", "twice.safetensors"},
                   {"twice.safetensors", "tensor 'a' is declared twice"});
}

TEST_CASE("bad input: a safetensors dtype x shape whose byte size overflows 64 bits", "[hardening]") {
  Workspace w("st_overflow");
  // 4 bytes * 2^62 * 4 = 2^66 bytes, which is 0 modulo 2^64: a reader multiplying in 64 bits
  // would find the 0-byte span consistent.
  spit(w.dir / "wrap.safetensors",
       st_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", ""));
  w.expect_refused({"train", "cfg.json", "--init-from", "wrap.safetensors"},
                   {"wrap.safetensors", "tensor 'a'", "needs more bytes than the file has"});
  // 8 * 2^32 * 2^32 = 2^67.
  spit(w.dir / "f64.safetensors",
       st_file(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
               std::string(8, '\0')));
  w.expect_refused({"train", "cfg.json", "--init-from", "f64.safetensors"},
                   {"f64.safetensors", "tensor 'a'", "needs more bytes than the file has"});
}

TEST_CASE("bad input: a checkpoint metadata file entry that is a path", "[hardening]") {
  Workspace w("ckpt_file_path");
  spit(w.dir / "x", "not a shard");
  for (const std::string bad : {"../x", "a/b", "/etc/passwd", ".hidden"}) {
    const fs::path step = crafted_checkpoint(w, "crafted", [&](nlohmann::ordered_json& j) {
      j["files"][0]["file"] = bad;
    });
    const std::string meta = (step / "metadata.json").string();
    w.expect_refused({"ckpt", "verify", step.string()},
                     {meta, "files[0].file", "'" + bad + "' is not a plain, unique file name"});
    w.expect_refused({"train", "cfg.json", "--resume", step.string()},
                     {meta, "files[0].file"});
  }
}

TEST_CASE("bad input: checkpoint metadata numbers are never truncated", "[hardening]") {
  Workspace w("ckpt_numbers");
  // d_model = 2^40 was read as 0 (an int), and `ckpt verify` said ok.
  fs::path step = crafted_checkpoint(w, "d_model", [](nlohmann::ordered_json& j) {
    j["model_config"]["d_model"] = uint64_t{1} << 40;
  });
  w.expect_refused({"ckpt", "verify", step.string()},
                   {"metadata.json", "model_config.d_model must be an integer in [1, 2147483647]",
                    "1099511627776"});
  w.expect_refused({"train", "cfg.json", "--resume", step.string()}, {"model_config.d_model"});
  // A unit index of 2^32 would be unit 0 as an int.
  step = crafted_checkpoint(w, "unit", [](nlohmann::ordered_json& j) {
    j["files"][0]["tensors"][0]["unit"] = uint64_t{1} << 32;
  });
  w.expect_refused({"ckpt", "verify", step.string()}, {"files[0].tensors[0].unit must be an integer"});
  // A CRC of 2^32 + x would be x as a uint32.
  step = crafted_checkpoint(w, "crc", [](nlohmann::ordered_json& j) {
    const uint64_t c = j["files"][0]["crc32c"].get<uint64_t>();
    j["files"][0]["crc32c"] = c + (uint64_t{1} << 32);
  });
  w.expect_refused({"ckpt", "verify", step.string()}, {"files[0].crc32c must be an integer in [0, 4294967295]"});
  // A step count of 2^63 (as unsigned) would be negative as an int64.
  step = crafted_checkpoint(w, "step", [](nlohmann::ordered_json& j) {
    j["train_state"]["step"] = uint64_t{1} << 63;
  });
  w.expect_refused({"ckpt", "verify", step.string()}, {"train_state.step must be an integer"});
  // A 1.5-step count, a float d_model and a negative world size.
  step = crafted_checkpoint(w, "float", [](nlohmann::ordered_json& j) {
    j["model_config"]["n_layer"] = 1.5;
  });
  w.expect_refused({"ckpt", "verify", step.string()}, {"model_config.n_layer must be an integer"});
  step = crafted_checkpoint(w, "world", [](nlohmann::ordered_json& j) { j["world_size"] = -1; });
  w.expect_refused({"ckpt", "verify", step.string()}, {"world_size must be an integer in [1, "});
  // A checksum block of 1 TiB would be allocated by verify.
  step = crafted_checkpoint(w, "block", [](nlohmann::ordered_json& j) {
    j["block_bytes"] = uint64_t{1} << 40;
  });
  w.expect_refused({"ckpt", "verify", step.string()}, {"block_bytes must be an integer in [4, "});
}

TEST_CASE("bad input: a token shard whose count disagrees with its size", "[hardening]") {
  Workspace w("token_count");
  spit(w.dir / "long_count.bin", Workspace::token_file(100, 64));  // claims more than it holds
  w.expect_refused({"train", "cfg.json", "--set", "data.train=long_count.bin"},
                   {"long_count.bin", "header says 100 tokens but the file holds 64"});
  spit(w.dir / "short_count.bin", Workspace::token_file(40, 64));  // holds more than it claims
  w.expect_refused({"train", "cfg.json", "--set", "data.train=short_count.bin"},
                   {"short_count.bin", "header says 40 tokens but the file holds 64"});
  spit(w.dir / "negative.bin", Workspace::token_file(-1, 64));
  w.expect_refused({"train", "cfg.json", "--set", "data.train=negative.bin"},
                   {"negative.bin", "header says -1 tokens"});
  spit(w.dir / "odd.bin", Workspace::token_file(64, 64) + "x");
  w.expect_refused({"train", "cfg.json", "--set", "data.train=odd.bin"},
                   {"odd.bin", "holds 64 and stray bytes"});
}

TEST_CASE("bad input: a config nested 10,000 levels deep", "[hardening]") {
  Workspace w("deep_config");
  const std::string deep = std::string(10000, '[') + std::string(10000, ']');
  std::string text = w.config().dump();
  text.insert(1, "\"tensorboard\": " + deep + ", ");
  spit(w.dir / "deep.json", text);
  w.expect_refused({"train", "deep.json"}, {"deep.json:1:", "nested deeper than 64 levels"});
  // The same through --set.
  w.expect_refused({"train", "cfg.json", "--set", "tensorboard=" + deep},
                   {"cfg.json", "--set 'tensorboard'", "nested deeper than 64 levels"});
  // Objects too, and in plan (which reads the config the same way).
  std::string objs;
  for (int i = 0; i < 10000; ++i) objs += "{\"a\":";
  objs += "1" + std::string(10000, '}');
  spit(w.dir / "deep_objects.json", objs);
  w.expect_refused({"plan", "deep_objects.json"}, {"deep_objects.json:1:", "nested deeper"});
}

TEST_CASE("bad input: a --set path into an array", "[hardening]") {
  Workspace w("set_array");
  w.expect_refused({"train", "cfg.json", "--set", "optimizer.params.betas.0=0.5"},
                   {"cfg.json", "optimizer.params.betas", "has no key '0'"});
  w.expect_refused({"train", "cfg.json", "--set",
                    R"(activation_checkpointing={"mode":"full","units":[0]})", "--set",
                    "activation_checkpointing.units.0=1"},
                   {"cfg.json", "activation_checkpointing.units.0", "not an object"});
  w.expect_refused({"train", "cfg.json", "--set", "tensorboard=[1,2]", "--set", "tensorboard.x.y=3"},
                   {"cfg.json", "tensorboard.x", "not an object"});
}

TEST_CASE("bad input: config numbers are checked against their type", "[hardening]") {
  Workspace w("config_numbers");
  w.expect_refused({"train", "cfg.json", "--set", "model.d_model=1099511627776"},
                   {"cfg.json", "model.d_model"});
  // A beta of 0.99999999999 is 1.0 as a float (AdamW's bias correction would divide by 0).
  w.expect_refused({"train", "cfg.json", "--set", "optimizer.params.betas=[0.9,0.99999999999]"},
                   {"cfg.json", "optimizer.params.betas[1]", "as a 32-bit float"});
  w.expect_refused({"train", "cfg.json", "--set", "optimizer.params.lr=1e300"},
                   {"cfg.json", "optimizer.params.lr", "as a 32-bit float"});
  w.expect_refused({"train", "cfg.json", "--set", "seed=-5.0"}, {"cfg.json", "seed", ">= 0"});
  // Beyond double: nlohmann throws out_of_range, which must become the config's one line.
  w.expect_refused({"train", "cfg.json", "--set", "optimizer.params.lr=1e400"},
                   {"cfg.json", "--set 'optimizer.params.lr'", "out of range"});
  spit(w.dir / "huge_number.json", R"({"optimizer": {"params": {"lr": 1e400}}})");
  w.expect_refused({"train", "huge_number.json"}, {"huge_number.json", "number overflow"});
  w.expect_refused({"train", "cfg.json", "--set", "train_micro_batch_size_per_gpu=2000000000",
                    "--set", "gradient_accumulation_steps=2000000000"},
                   {"cfg.json", "rows per step"});
}
