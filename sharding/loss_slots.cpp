#include "sharding/loss_slots.h"

#include <utility>

namespace sw {

double* LossSlots::at(int i) {
  if (sums_.empty())
    sums_ = Buffer(sizeof(double) * (2 * kSlots + units_), Mem::Workspace, ops_.device());
  return sums_.as<double>() + i;
}

void LossSlots::make_room() {
  if (unread_ == kSlots) read_with(0);
}

double* LossSlots::next_micro() { return at(unread_); }

void LossSlots::add_micro(double host_sum, int64_t count) {
  losses_.push_back({host_sum, count});
  ++unread_;
}

std::vector<double> LossSlots::read_with(int k) {
  std::vector<double> h(static_cast<size_t>(kSlots + k));
  copy_bytes(h.data(), Device::cpu(), at(0), ops_.device(), h.size() * sizeof(double));
  const size_t first = losses_.size() - static_cast<size_t>(unread_);
  for (int i = 0; i < unread_; ++i) losses_[first + static_cast<size_t>(i)].sum += h[size_t(i)];
  unread_ = 0;
  return std::vector<double>(h.begin() + kSlots, h.end());
}

std::vector<double> LossSlots::take_micro() {
  if (unread_ > 0) read_with(0);
  std::vector<double> out;
  out.reserve(losses_.size());
  for (const StepLoss& l : losses_)
    out.push_back(l.count > 0 ? l.sum / static_cast<double>(l.count) : 0.0);
  losses_.clear();
  return out;
}

double* LossSlots::next_eval() {
  if (eval_pending_.size() == size_t(kSlots)) read_evals();
  return at(kSlots + static_cast<int>(units_) + static_cast<int>(eval_pending_.size()));
}

void LossSlots::add_eval(double host_sum, int64_t count) { eval_pending_.push_back({host_sum, count}); }

void LossSlots::read_evals() {
  if (eval_pending_.empty()) return;
  std::vector<double> h(eval_pending_.size());
  copy_bytes(h.data(), Device::cpu(), at(kSlots + static_cast<int>(units_)), ops_.device(),
             h.size() * sizeof(double));
  for (size_t i = 0; i < h.size(); ++i) {
    const StepLoss& p = eval_pending_[i];
    eval_done_.push_back(p.count > 0 ? (p.sum + h[i]) / static_cast<double>(p.count) : 0.0);
  }
  eval_pending_.clear();
}

std::vector<double> LossSlots::take_eval() {
  read_evals();
  return std::exchange(eval_done_, {});
}

}  // namespace sw
