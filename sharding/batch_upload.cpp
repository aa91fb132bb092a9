#include "sharding/batch_upload.h"

#include <cstring>

namespace sw {

const Batch& BatchUpload::on_device(const Batch& b) {
  if (ops_.device().is_cpu()) return b;
  const size_t n = static_cast<size_t>(b.B) * static_cast<size_t>(b.T) * sizeof(int32_t);
  // A host copy is written again kRing batches later, once its upload is done (only then may
  // the host wait). The kept device buffers are overwritten only after the compute stream's work
  // so far (which read them last).
  const int r = next_;
  next_ = (next_ + 1) % kRing;
  auto upload = [&](int k, Buffer& buf, const int32_t* src) -> const int32_t* {
    if (!src) return nullptr;
    Upload& up = ring_[k][r];
    if (up.done && !up.done->query()) up.done->synchronize();
    if (up.host.bytes() < n) up.host = Buffer(n, Mem::Activations, Device::cpu(), Tier::Host);
    std::memcpy(up.host.data(), src, n);
    if (buf.bytes() < n) buf = Buffer(n, Mem::Activations, ops_.device());
    up.done = copy_bytes_async(buf.data(), buf.device(), up.host.data(), Device::cpu(), n);
    ops_.stream().wait_event(*up.done);
    return buf.as<int32_t>();
  };
  dev_batch_ = b;
  dev_batch_.counted = count_targets(b);
  dev_batch_.tokens = upload(0, tokens_, b.tokens);
  dev_batch_.targets = upload(1, targets_, b.targets);
  return dev_batch_;
}

void BatchUpload::quiesce() noexcept {
  for (auto& ring : ring_)
    for (Upload& up : ring) {
      try {
        if (up.done) up.done->synchronize();
      } catch (...) {
      }
      up.done = nullptr;
    }
}

}  // namespace sw
