// Copies between memory tiers that complete after the action that issued them (activation
// offload on a device: copies run on the copy streams). Per issuing plan action, its copies'
// events and, index for index, the buffers they copy from, kept until the action's wait sees
// them: a device buffer goes once the compute stream has waited for its copy (stream order makes
// its reuse safe, the host never waits), a host buffer once the host sees its copy complete
// (kept until then by keep_until).
#pragma once
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "core/stream.h"

namespace sw {

class TierCopies {
 public:
  struct InFlight {
    std::vector<std::shared_ptr<Event>> ev;
    std::vector<Buffer> from;
  };
  ~TierCopies() { settle(); }

  // The copies of plan action `action` (made on first use).
  InFlight& of(int action) { return in_flight_[action]; }
  // Forgets action's copies (the CPU's, which were done when issued).
  void forget(int action) { in_flight_.erase(action); }
  bool pending() const { return !in_flight_.empty(); }
  // `compute` waits for action's copies (no host wait); the buffers they read are released as
  // above. A no-op for an action without copies.
  void wait(int action, Stream& compute);
  // Keeps `host` until `ev` completes (a host buffer a copy still reads).
  void keep_until(std::shared_ptr<Event> ev, Buffer host);
  // Releases the kept host buffers whose copies are complete (wait: all, waiting for them).
  void release_done(bool wait);
  // Waits for every copy in flight (errors swallowed) and releases what they copied from.
  void settle() noexcept;

 private:
  std::unordered_map<int, InFlight> in_flight_;
  std::vector<std::pair<std::shared_ptr<Event>, Buffer>> kept_;
};

}  // namespace sw
