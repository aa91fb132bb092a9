// export_hf_safetensors / import_safetensors on a tiny GPT-2: round trip into a model with
// another seed, HF names and Conv1D transposes in the file, config metadata, and clear errors
// for missing, mis-shaped and unknown tensors (the model is left unchanged on error).
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/export.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"
#include "st_test_util.h"

using namespace sw;

namespace {

ModelConfig tiny() {
  ModelConfig c;
  c.type = "gpt2";
  c.vocab_size = 48;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = 8;
  return c;
}

std::map<std::string, std::vector<float>> params_of(const ShardedModel& sm) {
  std::map<std::string, std::vector<float>> r;
  sm.for_each_param(
      [&](const ParamSpec& s, const float* p) { r[s.name].assign(p, p + numel(s.shape)); });
  return r;
}

// Every tensor of a file, in memory (for writing altered copies).
struct FileTensors {
  std::vector<StTensorDesc> descs;
  std::vector<std::vector<uint8_t>> data;
  std::map<std::string, std::string> meta;
  explicit FileTensors(const std::string& path) {
    SafeTensorsReader r(path);
    meta = r.metadata();
    for (const StTensorInfo& t : r.tensors()) {
      descs.push_back({t.name, t.dtype, t.shape});
      data.emplace_back(t.bytes());
      r.read_bytes(t.name, data.back().data());
    }
  }
  void save(const std::string& path) const {
    std::vector<StTensorRef> refs;
    for (size_t i = 0; i < descs.size(); ++i) refs.push_back({descs[i], data[i].data()});
    save_safetensors(path, refs, meta);
  }
  size_t index(const std::string& name) const {
    for (size_t i = 0; i < descs.size(); ++i)
      if (descs[i].name == name) return i;
    FAIL("no tensor " << name);
    return 0;
  }
};

}  // namespace

TEST_CASE("export: round trip into a model with another seed", "[export]") {
  sttest::TempDir dir("export_rt");
  const std::string path = dir.file("model.safetensors");
  Model ma = build_model(tiny()), mb = build_model(tiny());
  ShardedModel a(ma, ops_for(Device::cpu()), 1), b(mb, ops_for(Device::cpu()), 2);
  auto pa = params_of(a);
  REQUIRE(params_of(b) != pa);
  export_hf_safetensors(a, path);
  CHECK(dir.count() == 1);
  import_safetensors(b, path);
  auto pb = params_of(b);
  REQUIRE(pb.size() == pa.size());
  for (const auto& [name, v] : pa) {
    INFO(name);
    CHECK(std::memcmp(v.data(), pb.at(name).data(), v.size() * 4) == 0);
  }
}

TEST_CASE("export: HF names, Conv1D weights transposed, config in metadata", "[export]") {
  sttest::TempDir dir("export_layout");
  const std::string path = dir.file("model.safetensors");
  const ModelConfig cfg = tiny();
  Model m = build_model(cfg);
  ShardedModel sm(m, ops_for(Device::cpu()), 7);
  export_hf_safetensors(sm, path);

  SafeTensorsReader r(path);
  CHECK(r.metadata().at("format") == "pt");
  const auto meta = nlohmann::json::parse(r.metadata().at("model_config"));
  CHECK(meta.at("type") == "gpt2");
  CHECK(meta.at("d_model") == cfg.d_model);
  CHECK(meta.at("n_layer") == cfg.n_layer);
  CHECK(meta.at("vocab_size") == cfg.vocab_size);

  size_t transposed = 0, files = 0;
  sm.for_each_param([&](const ParamSpec& s, const float* p) {
    const std::string fname = s.hf_name.empty() ? s.name : s.hf_name;
    INFO(s.name << " -> " << fname);
    const StTensorInfo& t = r.at(fname);
    ++files;
    CHECK(t.dtype == StDType::F32);
    std::vector<float> f(size_t(numel(s.shape)));
    r.read_f32(fname, f.data());
    if (s.hf_transpose) {
      ++transposed;
      const int64_t rows = s.shape[0], cols = s.shape[1];  // ours (out, in)
      REQUIRE(t.shape == Shape{cols, rows});
      bool ok = true;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) ok &= f[size_t(j * rows + i)] == p[i * cols + j];
      CHECK(ok);
      if (rows == cols) CHECK(std::memcmp(f.data(), p, f.size() * 4) != 0);  // really moved
    } else {
      CHECK(t.shape == s.shape);
      CHECK(std::memcmp(f.data(), p, f.size() * 4) == 0);
    }
  });
  CHECK(transposed == size_t(4 * cfg.n_layer));  // c_attn, attn.c_proj, c_fc, mlp.c_proj
  CHECK(r.tensors().size() == files);
  CHECK(r.find("h.0.attn.c_attn.weight") != nullptr);
  CHECK(r.at("h.0.attn.c_attn.weight").shape == Shape{cfg.d_model, 3 * cfg.d_model});
  CHECK(r.find("wte.weight") != nullptr);
}

TEST_CASE("import: missing, mis-shaped and unknown tensors are named", "[export]") {
  sttest::TempDir dir("export_bad");
  const std::string good = dir.file("good.safetensors"), bad = dir.file("bad.safetensors");
  Model ma = build_model(tiny()), mb = build_model(tiny());
  ShardedModel a(ma, ops_for(Device::cpu()), 1), b(mb, ops_for(Device::cpu()), 2);
  export_hf_safetensors(a, good);
  const auto before = params_of(b);

  auto error_of = [&](const std::string& path) {
    try {
      import_safetensors(b, path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };

  SECTION("missing tensor") {
    FileTensors ft(good);
    const size_t i = ft.index("h.1.ln_2.bias");
    ft.descs.erase(ft.descs.begin() + long(i));
    ft.data.erase(ft.data.begin() + long(i));
    ft.save(bad);
    const std::string m = error_of(bad);
    CHECK_THAT(m, Catch::StartsWith("import: " + bad) && Catch::Contains("missing 1 of") &&
                      Catch::Contains("'h.1.ln_2.bias'"));
  }
  SECTION("wrong shape") {
    FileTensors ft(good);
    const size_t i = ft.index("h.0.attn.c_attn.weight");
    ft.descs[i].shape = {3 * 16, 16};  // our layout, not HF's: must be rejected
    ft.save(bad);
    const std::string m = error_of(bad);
    CHECK_THAT(
        m, Catch::StartsWith("import: " + bad) &&
               Catch::Contains("'h.0.attn.c_attn.weight' is (48, 16), the model expects (16, 48)"));
  }
  SECTION("unknown tensor") {
    FileTensors ft(good);
    ft.descs.push_back({"h.0.mlp.extra", StDType::F32, {2}});
    ft.data.emplace_back(8, 0);
    ft.save(bad);
    CHECK_THAT(error_of(bad),
               Catch::Contains("unexpected tensors") && Catch::Contains("'h.0.mlp.extra'"));
  }
  SECTION("malformed file") {
    auto bytes = sttest::read_all(good);
    bytes.resize(bytes.size() - 4);
    std::ofstream(bad, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    CHECK_THAT(error_of(bad), Catch::StartsWith("safetensors: " + bad) &&
                                  Catch::Contains("exceed the file's data section"));
  }
  CHECK(params_of(b) == before);  // a failed import changes nothing

  SECTION("HF GPT-2 mask buffers are ignored; bf16 tensors are converted") {
    FileTensors ft(good);
    ft.descs.push_back({"h.0.attn.bias", StDType::F32, {1, 1, 2, 2}});
    ft.data.emplace_back(16, 0);
    ft.descs.push_back({"h.1.attn.masked_bias", StDType::F32, {}});
    ft.data.emplace_back(4, 0);
    const size_t i = ft.index("ln_f.weight");
    std::vector<float> v(16);
    std::memcpy(v.data(), ft.data[i].data(), 64);
    std::vector<uint8_t> bf(32);
    for (int k = 0; k < 16; ++k) {
      v[size_t(k)] = 1.5f + 0.25f * float(k);  // exact in bf16
      const uint16_t h = f32_to_bf16(v[size_t(k)]);
      std::memcpy(bf.data() + 2 * k, &h, 2);
    }
    ft.descs[i].dtype = StDType::BF16;
    ft.data[i] = bf;
    ft.save(bad);
    CHECK(error_of(bad) == "(no error)");
    auto pb = params_of(b);
    CHECK(pb.at("ln_f.weight") == v);
    CHECK(pb.at("h.0.attn.c_attn.weight") == params_of(a).at("h.0.attn.c_attn.weight"));
  }
}
