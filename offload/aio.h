// The asynchronous I/O engine offload puts on the step plan's io queue (docs/ARCHITECTURE.md,
// "Async I/O"; DeepSpeed's csrc/aio with liburing instead of libaio).
//
// One AioHandle per rank. read()/write() split a request into block_size pieces, keep up to
// queue_depth of them in flight and return an AioRequest, which is an sw::Event: query() never
// blocks, synchronize() waits and throws one sw::Error line naming the file, the offset and
// errno of the first failed piece (including a read past the end of the file and ENOSPC).
//
// Backends, chosen when the handle is made (backend_name() says which is active):
//   io_uring: one ring of queue_depth entries; the calling thread fills the submission queue,
//             one completion thread reaps and refills it (so the queue stays full while the
//             caller computes). Falls back to threads when io_uring_queue_init fails (EPERM,
//             ENOSYS in containers) unless aio.backend forces io_uring.
//   threads:  intra_op_parallelism threads doing pread/pwrite, one piece each at a time.
//
// O_DIRECT: AioFile opens the file twice, with O_DIRECT where the filesystem accepts it and
// buffered; a piece whose buffer, offset and length are 4096-aligned goes to the O_DIRECT
// descriptor, anything else (a tail) to the buffered one. aligned_staging() gives buffers that
// qualify. With a raw descriptor (read(int fd, ...)) pieces go to that descriptor as they are.
//
// Fault injection (tests): AioConfig::fail_after_bytes, or SHARDWISE_AIO_FAIL_AFTER=N[:errno]
// in the environment, makes the piece that crosses N bytes handed to the backend fail with
// fail_errno (default EIO) instead of running.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/alloc.h"
#include "core/stream.h"
#include "offload/aio_config.h"

namespace sw {

constexpr size_t kAioAlign = 4096;  // O_DIRECT alignment of buffers, offsets and lengths

namespace detail {
struct AioOp;
}

// How a request ended, for a completion callback: err is 0, or the errno of the first failed
// piece (at `offset`); eof: a read reached the end of the file at `offset`. message: the
// error line synchronize() throws ("" when ok).
struct AioStatus {
  int err = 0;
  bool eof = false;
  uint64_t offset = 0;
  std::string message;
  bool ok() const { return err == 0 && !eof; }
};
// Called once per request when its last piece completes (or fails), on an engine thread and
// possibly with the handle's lock held: it must not call into the handle, and should only
// record the status and wake someone (offload/io_stream.cpp's dispatcher does the rest).
using AioDone = std::function<void(const AioStatus&)>;

// Completion of one read() or write(): an Event. Cheap to copy (shared state).
class AioRequest final : public Event {
 public:
  AioRequest() = default;
  explicit AioRequest(std::shared_ptr<detail::AioOp> op) : op_(std::move(op)) {}
  bool query() override;        // true once every piece has completed (or failed)
  void synchronize() override;  // waits; throws sw::Error("aio: <file>: ...") on failure
  size_t bytes() const;         // the request's size
  bool valid() const { return op_ != nullptr; }

 private:
  std::shared_ptr<detail::AioOp> op_;
};

// A file for the engine: opened with O_DIRECT where the filesystem accepts it (and
// o_direct is asked for) plus a buffered descriptor for unaligned pieces. Closed at
// destruction, and unlinked if it was created as a temporary. Move-only.
class AioFile {
 public:
  AioFile() = default;
  // An existing file (writable: read-write). Throws sw::Error("aio: <path>: ...").
  static AioFile open(const std::string& path, bool writable, bool o_direct = true);
  // Creates or truncates `path` to `size` bytes, reserved with fallocate where the filesystem
  // can (ENOSPC there throws). temp: removed when closed.
  static AioFile create(const std::string& path, uint64_t size, bool o_direct = true,
                        bool temp = false);
  ~AioFile() { close(); }
  AioFile(AioFile&& o) noexcept { *this = std::move(o); }
  AioFile& operator=(AioFile&& o) noexcept;
  AioFile(const AioFile&) = delete;
  AioFile& operator=(const AioFile&) = delete;

  void close();
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }                 // the buffered descriptor
  int direct_fd() const { return direct_fd_; }   // -1 when O_DIRECT is not in use
  bool direct() const { return direct_fd_ >= 0; }
  // "O_DIRECT", "buffered (O_DIRECT refused: <strerror>)" or "buffered (not asked)".
  const std::string& io_mode() const { return mode_; }

 private:
  int fd_ = -1, direct_fd_ = -1;
  bool temp_ = false;
  std::string path_, mode_;
};

// A 4096-aligned host buffer (see aligned_staging).
class StagingBuffer {
 public:
  StagingBuffer() = default;
  void* data() const { return static_cast<char*>(buf_.data()) + off_; }
  template <class T>
  T* as() const { return static_cast<T*>(data()); }
  float* f32() const { return as<float>(); }
  size_t bytes() const { return bytes_; }     // as requested
  size_t capacity() const { return cap_; }    // rounded up to kAioAlign
  bool empty() const { return buf_.empty(); }

 private:
  friend StagingBuffer aligned_staging(size_t, Mem, Tier, bool, bool);
  Buffer buf_;
  size_t off_ = 0, bytes_ = 0, cap_ = 0;
};
// A 4096-aligned buffer of `bytes` tracked as `cat` on `tier` (default: Mem::Communication,
// Tier::Host). round_up: its capacity is `bytes` rounded up to 4096 (so a caller may transfer
// whole blocks); otherwise exactly `bytes` (the engine sends an unaligned tail buffered), and
// the tracked size is `bytes` whenever the allocator's block is already page-aligned (blocks
// above 1 MiB are mmap'd), a page more only for small ones. fresh: memory of its own
// (Buffer::fresh), not a cached block: for staging that lives as long as a model.
StagingBuffer aligned_staging(size_t bytes, Mem cat = Mem::Communication, Tier tier = Tier::Host,
                              bool round_up = true, bool fresh = false);

class AioHandle {
 public:
  // Throws sw::Error("aio: backend: io_uring unavailable: ...") when io_uring is forced and
  // the kernel refuses it.
  explicit AioHandle(AioConfig cfg = {});
  ~AioHandle();  // waits for the requests in flight
  AioHandle(const AioHandle&) = delete;
  AioHandle& operator=(const AioHandle&) = delete;

  // `label` names the file in error messages (the path when empty: "fd <n>"). `done`, when
  // given, is called once when the request completes (see AioDone).
  AioRequest read(int fd, void* buf, size_t bytes, off_t offset, const std::string& label = {},
                  AioDone done = {});
  AioRequest write(int fd, const void* buf, size_t bytes, off_t offset,
                   const std::string& label = {}, AioDone done = {});
  // Aligned pieces on the file's O_DIRECT descriptor, the rest on its buffered one.
  AioRequest read(const AioFile& f, void* buf, size_t bytes, off_t offset, AioDone done = {});
  AioRequest write(const AioFile& f, const void* buf, size_t bytes, off_t offset,
                   AioDone done = {});

  void wait_all();  // waits until nothing is in flight (does not throw)
  const char* backend_name() const;  // "io_uring" or "threads"
  // Why io_uring is not active ("" when it is): "io_uring_queue_init: <strerror>", "forced".
  const std::string& fallback_reason() const;
  const AioConfig& config() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sw
