// The asynchronous I/O engine's settings (DeepSpeed's "aio" block): a plain value type, so that
// what carries it (ShardingPolicy, the train config) includes nothing of the engine itself.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace sw {

enum class AioBackend : uint8_t { Auto, IoUring, Threads };
const char* aio_backend_name(AioBackend b);  // "auto", "io_uring", "threads"

// DeepSpeed's "aio" section, plus the backend choice and O_DIRECT.
struct AioConfig {
  size_t block_size = size_t{1} << 20;  // bytes per piece
  int queue_depth = 8;                  // pieces in flight (io_uring)
  int intra_op_parallelism = 1;         // threads of the thread backend (alias thread_count)
  bool single_submit = false;           // io_uring: one io_uring_submit per piece, not per batch
  bool overlap_events = true;           // io_uring: refill on each completion, not once drained
  AioBackend backend = AioBackend::Auto;
  bool o_direct = true;  // where the filesystem supports it (AioFile probes)
  // Tests only (not JSON keys): the piece crossing this many bytes fails with fail_errno.
  uint64_t fail_after_bytes = UINT64_MAX;
  int fail_errno = 5;  // EIO

  // Reads an "aio" object: block_size (bytes or "1MiB"), queue_depth, intra_op_parallelism /
  // thread_count, single_submit, overlap_events, backend ("auto" | "io_uring" | "threads"),
  // o_direct. Unknown keys and bad values throw one sw::Error line "aio: <where>.<key>: ...".
  static AioConfig from_json(const nlohmann::json& j, const std::string& where);
};

}  // namespace sw
