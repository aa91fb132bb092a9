#include "fuzz/targets.h"

#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/crc32c.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "core/json_depth.h"
#include "engine/config.h"
#include "engine/data.h"

namespace sw::fuzz {

namespace {

// An anonymous in-memory file holding `data`, closed on destruction; path() opens it again.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = ::memfd_create("sw-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) return;
    size_t done = 0;
    while (done < size) {
      const ssize_t w = ::write(fd_, data + done, size - done);
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
  }
  ~MemFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

}  // namespace

int safetensors(const uint8_t* data, size_t size) {
  MemFile f(data, size);
  if (!f.ok()) return 0;
  try {
    SafeTensorsReader r(f.path());
    std::vector<unsigned char> buf;
    std::vector<float> vals;
    for (const StTensorInfo& t : r.tensors()) {
      // The reader has checked every span against the file, so these sizes are bounded by
      // the input's size.
      buf.resize(t.bytes());
      r.read_bytes(t.name, buf.data());
      r.prefetch(t.name, 0, t.bytes());
      if (t.dtype == StDType::F32 || t.dtype == StDType::BF16 || t.dtype == StDType::F16) {
        vals.resize(static_cast<size_t>(t.numel()));
        r.read_f32(t.name, vals.data());
      }
    }
    (void)r.metadata().size();
  } catch (const Error&) {
  }
  return 0;
}

int ckpt_metadata(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  if (json_depth_exceeded(text) == std::string::npos) {  // (the harness's own dump recurses)
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception&) {
    }
    if (j.is_object()) {
      j.erase("metadata_crc32c");
      const std::string body = j.dump();
      j["metadata_crc32c"] = crc32c(body.data(), body.size());
      text = j.dump(1);
    }
  }
  try {
    check_checkpoint_metadata("fuzz/step_1/metadata.json", text);
  } catch (const Error&) {
  }
  return 0;
}

int config(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t at = 0;
  for (;;) {
    const size_t nul = all.find('\0', at);
    parts.push_back(all.substr(at, nul == std::string::npos ? std::string::npos : nul - at));
    if (nul == std::string::npos) break;
    at = nul + 1;
  }
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  try {
    const TrainConfig cfg = parse_config(parts[0], "fuzz.json", overrides, 2);
    // The resolved config must read back (the run directory gets it).
    parse_config(cfg.resolved_json, "resolved.json", {}, 2);
  } catch (const Error&) {
  }
  return 0;
}

int token_header(const uint8_t* data, size_t size) {
  try {
    double entropy = 0;
    check_token_shard("fuzz.bin", data, size, 50257, 2, &entropy);
  } catch (const Error&) {
  }
  return 0;
}

Entry entry(const std::string& name) {
  if (name == "safetensors") return safetensors;
  if (name == "ckpt_metadata") return ckpt_metadata;
  if (name == "config") return config;
  if (name == "token_header") return token_header;
  return nullptr;
}

}  // namespace sw::fuzz
