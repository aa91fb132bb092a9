// Activations on NVMe (activation_checkpointing.offload nvme): one file per rank
// (<nvme_path>/rank_<r>/activations.bin) that each micro-step fills from its start. A call's
// kept input and Saved go to consecutive bytes from a 4096-aligned offset (place), written after
// its forward and read back one call ahead of its backward, on the file's own io queue.
// The file's blocks are reserved ahead (reserve: the free-space check, then fallocate; grown by
// doubling, rarely after the first micro-step), so a full disk is an error before a step, not
// in the middle of one.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "offload/io_stream.h"
#include "offload/offload_file.h"

namespace sw {

class ActivationFile {
 public:
  // Throws sw::Error naming activation_checkpointing.nvme_path (directory, creation).
  ActivationFile(const AioConfig& aio, const std::string& nvme_path, int rank);
  ~ActivationFile();  // finishes the io, then removes the file
  ActivationFile(const ActivationFile&) = delete;
  ActivationFile& operator=(const ActivationFile&) = delete;

  // Makes sure [0, end) is reserved (sw::Error naming the key when the disk has no room).
  void reserve(int64_t end);
  // Where the micro-step's next `bytes` go (4096-aligned), reserved; rewind() starts over.
  int64_t place(int64_t bytes);
  void rewind() { next_ = 0; }

  IoEventPtr write(const void* buf, size_t bytes, int64_t off, std::shared_ptr<Event> after);
  IoEventPtr read(void* buf, size_t bytes, int64_t off);

 private:
  IoStream io_;
  OffloadFile file_;
  int64_t reserved_ = 0;  // bytes of the file reserved (the NVMe tracker's Activations)
  int64_t next_ = 0;      // where the next placed bytes go
};

}  // namespace sw
