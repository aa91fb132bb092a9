#include "offload/activation_file.h"

#include <algorithm>
#include <cerrno>

namespace sw {

ActivationFile::ActivationFile(const AioConfig& aio, const std::string& nvme_path, int rank)
    : io_(aio),
      file_("activation_checkpointing.nvme_path", nvme_path, rank, "activations.bin", aio.o_direct,
            0, nullptr) {
  io_.attach(file_.file());
}

ActivationFile::~ActivationFile() {
  io_.drain();
  io_.detach(file_.fd());
}

void ActivationFile::reserve(int64_t end) {
  if (end <= reserved_) return;
  const int64_t want = std::max(end, reserved_ * 2);  // grows rarely (the first micro-step)
  file_.check_room(end - reserved_, "offloaded activations");
  int err = file_.reserve(want);
  if (err == ENOSPC && want > end) {  // the doubling asked too much: exactly what is needed
    err = file_.reserve(end);
    if (err == 0) {
      file_.track(Mem::Activations, end - reserved_);
      reserved_ = end;
      return;
    }
  }
  if (err != 0) file_.reserve_failed(want, err);
  file_.track(Mem::Activations, want - reserved_);
  reserved_ = want;
}

int64_t ActivationFile::place(int64_t bytes) {
  const int64_t at = next_;
  next_ = aio_align_up(next_ + bytes);
  reserve(next_);
  return at;
}

IoEventPtr ActivationFile::write(const void* buf, size_t bytes, int64_t off,
                                 std::shared_ptr<Event> after) {
  return io_.write(file_.fd(), file_.path(), buf, bytes, off, std::move(after));
}

IoEventPtr ActivationFile::read(void* buf, size_t bytes, int64_t off) {
  return io_.read(file_.fd(), file_.path(), buf, bytes, off);
}

}  // namespace sw
