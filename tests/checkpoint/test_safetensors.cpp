// safetensors reader/writer: round trips, streaming, atomic replace, and every malformed-file
// case rejected with a one-line error naming the file (and the tensor where one is at fault).
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "checkpoint/safetensors.h"
#include "core/dtype.h"
#include "core/error.h"
#include "st_test_util.h"

using namespace sw;
using sttest::TempDir;
using sttest::write_raw;

namespace {

// Runs f, expects sw::Error, and returns its message (checked to be a single line).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find('\n') == std::string::npos);
    CHECK(m.rfind("safetensors: ", 0) == 0);
    return m;
  }
  FAIL("no sw::Error thrown");
  return {};
}

std::vector<uint8_t> bytes_of(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return {b, b + n};
}

}  // namespace

TEST_CASE("safetensors: round trip of several dtypes and shapes", "[safetensors]") {
  TempDir dir("st_roundtrip");
  const std::string path = dir.file("t.safetensors");
  std::vector<float> f32(6);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = 0.25f * float(i) - 1.f;
  std::vector<uint16_t> bf(4), hf(6);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = f32_to_bf16(0.5f * float(i) + 0.5f);
  for (size_t i = 0; i < hf.size(); ++i) hf[i] = f32_to_f16(-0.125f * float(i));
  std::vector<int32_t> i32 = {-3, 4, 11, 18, 2147483647};
  const float scalar = 3.5f;

  std::vector<StTensorRef> ts = {
      {{"a.f32", StDType::F32, {2, 3}}, f32.data()},
      {{"b.bf16", StDType::BF16, {4}}, bf.data()},
      {{"empty", StDType::F32, {0, 4}}, nullptr},
      {{"c.f16", StDType::F16, {3, 1, 2}}, hf.data()},
      {{"d.i32", StDType::I32, {5}}, i32.data()},
      {{"scalar", StDType::F32, {}}, &scalar},
  };
  save_safetensors(path, ts, {{"format", "pt"}, {"note", "x \"quoted\" y"}});
  CHECK(dir.count() == 1);  // no temporary left behind

  SafeTensorsReader r(path);
  CHECK(r.data_start() % 8 == 0);
  CHECK(r.metadata().at("format") == "pt");
  CHECK(r.metadata().at("note") == "x \"quoted\" y");
  REQUIRE(r.tensors().size() == ts.size());
  for (const StTensorRef& t : ts) {
    const StTensorInfo& info = r.at(t.desc.name);
    CHECK(info.dtype == t.desc.dtype);
    CHECK(info.shape == t.desc.shape);
    const size_t n = size_t(numel(t.desc.shape)) * st_dtype_size(t.desc.dtype);
    CHECK(info.bytes() == n);
    std::vector<uint8_t> got(n);
    r.read_bytes(t.desc.name, got.data());
    if (n) CHECK(std::memcmp(got.data(), t.data, n) == 0);
  }
  // Conversions to f32 and partial reads.
  std::vector<float> out(6);
  r.read_f32("b.bf16", out.data());
  for (int i = 0; i < 4; ++i) CHECK(out[i] == 0.5f * float(i) + 0.5f);
  r.read_f32("c.f16", out.data(), 2, 3);
  for (int i = 0; i < 3; ++i) CHECK(out[i] == -0.125f * float(i + 2));
  r.read_f32("a.f32", out.data(), 1, 4);
  for (int i = 0; i < 4; ++i) CHECK(out[i] == f32[i + 1]);
  int32_t two[2];
  r.read_bytes("d.i32", two, 12, 8);
  CHECK(two[0] == 18);
  CHECK(two[1] == 2147483647);
  CHECK(r.find("nope") == nullptr);
  CHECK_THROWS_WITH(r.at("nope"), Catch::Contains("no tensor 'nope'"));
  CHECK_THROWS_WITH(r.read_bytes("d.i32", two, 16, 8), Catch::Contains("past its end"));
  CHECK_THROWS_WITH(r.read_f32("d.i32", out.data()), Catch::Contains("cannot be read as f32"));

  // Overwriting replaces the file atomically (same name, new contents).
  save_safetensors(path, {{{"only", StDType::I32, {1}}, &i32[0]}});
  SafeTensorsReader r2(path);
  CHECK(r2.tensors().size() == 1);
  CHECK(r2.metadata().empty());
  CHECK(dir.count() == 1);
}

TEST_CASE("safetensors: streaming writer", "[safetensors]") {
  TempDir dir("st_stream");
  const std::string path = dir.file("s.safetensors");
  std::vector<float> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = float(i);
  {
    SafeTensorsWriter w(path, {{"x", StDType::F32, {10, 50}}, {"y", StDType::F32, {500}}});
    // Chunks that straddle the tensor boundary.
    size_t done = 0;
    for (size_t chunk : {7u, 300u, 1000u, 1693u, 1000u}) {
      CHECK(w.next_tensor() == (done < 2000 ? "x" : "y"));
      w.append(reinterpret_cast<const char*>(big.data()) + done, chunk);
      done += chunk;
    }
    CHECK(w.next_tensor().empty());
    w.finish();
  }
  SafeTensorsReader r(path);
  std::vector<float> y(500);
  r.read_f32("y", y.data());
  for (int i = 0; i < 500; ++i) CHECK(y[i] == float(500 + i));

  // An unfinished writer leaves nothing behind (and the old file stays).
  {
    SafeTensorsWriter w(dir.file("u.safetensors"), {{"x", StDType::F32, {4}}});
    w.append(big.data(), 8);
  }
  CHECK(dir.count() == 1);
  // Writer misuse is reported with the tensor's name.
  {
    SafeTensorsWriter w(dir.file("m.safetensors"),
                        {{"x", StDType::F32, {4}}, {"y", StDType::F32, {2}}});
    w.write_tensor("x", big.data());
    CHECK_THROWS_WITH(w.finish(),
                      Catch::Contains("tensor 'y'") && Catch::Contains("8 bytes missing"));
  }
  {
    SafeTensorsWriter w(dir.file("m.safetensors"),
                        {{"x", StDType::F32, {4}}, {"y", StDType::F32, {2}}});
    CHECK_THROWS_WITH(w.write_tensor("y", big.data()), Catch::Contains("out of order"));
  }
  {
    SafeTensorsWriter w(dir.file("m.safetensors"), {{"x", StDType::F32, {1}}});
    CHECK_THROWS_WITH(w.append(big.data(), 8), Catch::Contains("past the declared data"));
  }
  CHECK_THROWS_WITH(SafeTensorsWriter(dir.file("d.safetensors"),
                                      {{"x", StDType::F32, {1}}, {"x", StDType::F32, {1}}}),
                    Catch::Contains("tensor 'x' is declared twice"));
  CHECK(dir.count() == 1);
  CHECK_THROWS_WITH(
      save_safetensors(dir.file("no/such/dir/x.safetensors"), {}),
      Catch::Contains("no/such/dir/x.safetensors") && Catch::Contains("cannot create"));
}

TEST_CASE("safetensors: hand-built files in any offset order are read", "[safetensors]") {
  TempDir dir("st_order");
  const std::string path = dir.file("o.safetensors");
  // b's bytes come first; a is declared first; header not padded; a 4-byte hole at the end.
  std::vector<float> vals = {1.f, 2.f, 3.f, 4.f};
  auto data = bytes_of(vals.data(), 16);
  data.resize(20, 0xAB);
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
            R"("b":{"data_offsets":[0,8],"shape":[1,2],"dtype":"F32"},"__metadata__":{"k":"v"}})",
            data);
  SafeTensorsReader r(path);
  REQUIRE(r.tensors().size() == 2);
  CHECK(r.tensors()[0].name == "b");  // listed in data order
  float a[2], b[2];
  r.read_f32("a", a);
  r.read_f32("b", b);
  CHECK((a[0] == 3.f && a[1] == 4.f && b[0] == 1.f && b[1] == 2.f));
  CHECK(r.metadata().at("k") == "v");
}

TEST_CASE("safetensors: malformed files are rejected naming the file and tensor", "[safetensors]") {
  TempDir dir("st_bad");
  const std::string p = dir.file("bad.safetensors");
  const std::vector<uint8_t> d16(16, 0);
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";

  auto expect = [&](const std::vector<std::string>& parts) {
    const std::string m = error_of([&] { SafeTensorsReader r(p); });
    INFO(m);
    CHECK(m.find(p) != std::string::npos);
    for (const std::string& s : parts) CHECK(m.find(s) != std::string::npos);
  };

  SECTION("missing file") { expect({"cannot open"}); }
  SECTION("shorter than the length field") {
    std::ofstream(p) << "abc";
    expect({"3 bytes, too short"});
  }
  SECTION("truncated inside the data") {
    write_raw(p, ok_header, std::vector<uint8_t>(10, 0));
    expect({"tensor 'w'", "data_offsets [0, 16] exceed the file's data section (10 bytes)"});
  }
  SECTION("truncated inside the header") {
    const std::string path_ok = dir.file("ok.safetensors");
    write_raw(path_ok, ok_header, d16);
    auto all = sttest::read_all(path_ok);
    all.resize(30);
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(all.data()), 30);
    expect({"header length " + std::to_string(ok_header.size()), "exceeds the file (30 bytes"});
  }
  SECTION("header length beyond the file") {
    write_raw(p, ok_header, d16, 1 << 20);
    expect({"header length 1048576 exceeds the file"});
  }
  SECTION("header length beyond the sanity limit") {
    write_raw(p, ok_header, d16, int64_t(150) << 20);
    std::filesystem::resize_file(p, uint64_t(200) << 20);  // sparse: cheap
    expect({"exceeds the limit"});
  }
  SECTION("offsets beyond the data") {
    write_raw(p, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", d16);
    expect({"tensor 'w'", "[8, 24] exceed the file's data section (16 bytes)"});
  }
  SECTION("overlapping tensors") {
    write_raw(p,
              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
              d16);
    expect({"tensor 'b'", "overlap tensor 'a'"});
  }
  SECTION("shape and size mismatch") {
    write_raw(p, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", d16);
    expect({"tensor 'w'", "shape (3) of F32 needs 12 bytes", "span 16"});
  }
  SECTION("absurd shape") {
    write_raw(p,
              R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,16]}})",
              d16);
    expect({"tensor 'w'", "more bytes than the file has"});
  }
  SECTION("bad JSON") {
    write_raw(p, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})", d16);
    expect({"header is not valid JSON"});
  }
  SECTION("not JSON at all") {
    write_raw(p, "PK\x03\x04zipfile", d16);
    expect({"does not start with '{'"});
  }
  SECTION("unknown dtype") {
    write_raw(p, R"({"w":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}})", d16);
    expect({"tensor 'w'", "unknown dtype 'F33'"});
  }
  SECTION("negative dimension") {
    write_raw(p, R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", d16);
    expect({"tensor 'w'", "not a non-negative integer"});
  }
  SECTION("offsets not a pair") {
    write_raw(p, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", d16);
    expect({"tensor 'w'", "'data_offsets' must be two"});
  }
  SECTION("offsets reversed") {
    write_raw(p, R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", d16);
    expect({"tensor 'w'", "end before they begin"});
  }
  SECTION("missing field") {
    write_raw(p, R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", d16);
    expect({"tensor 'w'", "'shape'"});
  }
  SECTION("unknown field") {
    write_raw(p, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":1}})", d16);
    expect({"tensor 'w'", "unknown field 'x'"});
  }
  SECTION("metadata value not a string") {
    write_raw(p,
              R"({"__metadata__":{"n":3},"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
              d16);
    expect({"__metadata__ value of 'n'"});
  }
  SECTION("tensor entry not an object") {
    write_raw(p, R"({"w":[1,2]})", d16);
    expect({"tensor 'w'", "not an object"});
  }
}
