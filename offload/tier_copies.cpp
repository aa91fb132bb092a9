#include "offload/tier_copies.h"

namespace sw {

void TierCopies::wait(int action, Stream& compute) {
  auto it = in_flight_.find(action);
  if (it == in_flight_.end()) return;
  InFlight& c = it->second;
  for (size_t k = 0; k < c.ev.size(); ++k) {
    compute.wait_event(*c.ev[k]);  // device: no host wait on a GPU
    if (!c.from[k].device().is_cpu() || c.ev[k]->query())
      c.from[k].release();  // device memory: reused after the wait, in stream order
    else
      kept_.emplace_back(c.ev[k], std::move(c.from[k]));
  }
  in_flight_.erase(it);
  release_done(false);
}

void TierCopies::keep_until(std::shared_ptr<Event> ev, Buffer host) {
  kept_.emplace_back(std::move(ev), std::move(host));
}

void TierCopies::release_done(bool wait) {
  size_t k = 0;
  for (size_t j = 0; j < kept_.size(); ++j) {
    auto& [ev, buf] = kept_[j];
    if (wait) ev->synchronize();
    if (wait || ev->query()) {
      buf.release();
    } else {
      if (k != j) kept_[k] = std::move(kept_[j]);
      ++k;
    }
  }
  kept_.resize(k);
}

void TierCopies::settle() noexcept {
  for (auto& [i, c] : in_flight_)
    for (auto& e : c.ev) {
      try {
        e->synchronize();
      } catch (...) {
      }
    }
  in_flight_.clear();
  for (auto& [ev, buf] : kept_) {
    try {
      ev->synchronize();
    } catch (...) {
    }
  }
  kept_.clear();
}

}  // namespace sw
