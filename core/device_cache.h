// A stream-ordered caching allocator for device memory, independent of any device API (modelled
// on PyTorch's CUDACachingAllocator; docs/ARCHITECTURE.md, "The caching device allocator").
// kernels/cuda/cuda_runtime.cu gives it cudaMalloc/cudaFree/cudaEvent* and registers it as
// core's DeviceAllocator; the tests give it a fake device made of host memory.
//
// Sizes: a request of n bytes is served by a block of device_block_size(n):
//   <= 1 MiB: multiples of 512 B, reused only by requests of exactly that block size;
//   >  1 MiB: multiples of 2 MiB, reused by requests whose block size is within 25% below it
//             (best fit: the smallest free block that is large enough).
// Each block comes from one raw_alloc and goes back with one raw_free (no splitting). So a
// step that makes the same requests as the one before takes every block from the cache: no
// raw_alloc/raw_free in the steady state.
//
// Streams (opaque `void*`, for CUDA a cudaStream_t; nullptr is a stream like any other): a
// block belongs to the stream it was allocated on. Freed, it is at once reusable by later
// allocations on that stream: work that reuses it is enqueued after the work that used it.
// If record_stream(p, s) (p anywhere inside the block) named other streams, free() records an event on each of them and
// the block waits in a pending list; it becomes reusable (on its own stream) once all those
// events have completed. Pending events are polled on each allocate() and empty_cache(); the
// host never waits for the device here.
//
// Out of memory: when raw_alloc returns nullptr, every cached free block is returned with
// raw_free and raw_alloc is tried once more; if that fails too, allocate() returns nullptr
// (the caller reports it: Buffer says "out of memory on cuda:N ..."). Pending blocks are not
// freed (the device may still use them).
//
// Accounting: the tracker given at construction (by default MemTracker::of(Tier::Device))
// hears note_reserved(+block) on every raw_alloc and note_reserved(-block) on every raw_free,
// so its reserved() is the bytes this cache holds from the device (in use + cached + pending),
// as the host pool does for its tier. The bytes in use per category, and the budget, stay
// with Buffer, which adds a request to the tracker before it asks for memory.
//
// Caching off (constructor flag; the CUDA backend reads SHARDWISE_CUDA_CACHING=0): every
// allocate is a raw_alloc of exactly the request and every free a raw_free, for debugging
// with compute-sanitizer. record_stream is then ignored (cudaFree waits for the device).
//
// Thread safety: one mutex guards everything; the device API is called under it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/alloc.h"

namespace sw {

// The raw device operations. Every function gets the cache's device index.
struct DeviceApi {
  void* (*raw_alloc)(int device, size_t bytes);  // nullptr when the device is out of memory
  void (*raw_free)(int device, void* p);
  void* (*event_create)(int device);
  void (*event_record)(int device, void* event, void* stream);
  bool (*event_query)(int device, void* event);  // true once complete; never blocks
  void (*event_destroy)(int device, void* event);
};

struct DeviceCacheStats {
  bool caching = true;
  size_t allocated = 0;  // requested bytes of the blocks in use
  size_t in_use = 0;     // block bytes in use
  size_t cached = 0;     // block bytes free and reusable
  size_t pending = 0;    // block bytes freed, waiting for events on other streams
  size_t reserved = 0;   // in_use + cached + pending: raw_alloc'd and not yet raw_free'd
  size_t peak_reserved = 0;
  uint64_t allocs = 0;       // allocate() calls that returned memory
  uint64_t hits = 0;         // of which served from the cache
  uint64_t raw_allocs = 0;   // successful raw_alloc calls
  uint64_t raw_frees = 0;
  uint64_t oom_retries = 0;  // raw_alloc failures answered by emptying the cache
  uint64_t events_created = 0;  // events are kept and reused, so this stops growing too
};

// The block size serving a request of `bytes` (0 for 0); see the top of this file.
size_t device_block_size(size_t bytes);
// False when SHARDWISE_CUDA_CACHING is "0", "off" or "false".
bool device_caching_from_env();

class DeviceCache {
 public:
  // tracker: where reserved bytes are noted (nullptr: nowhere).
  DeviceCache(DeviceApi api, int device, bool caching = true,
              MemTracker* tracker = &MemTracker::of(Tier::Device));
  // Returns the cached and pending blocks and the events; blocks still in use are left alone.
  ~DeviceCache();
  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;

  // A block of at least `bytes` for work on `stream`; nullptr for 0 bytes or out of memory.
  void* allocate(size_t bytes, void* stream);
  // Gives back a block from allocate (nullptr: nothing). A pointer this cache does not hold in
  // use (a double free) is an internal error: SW_CHECK aborts.
  void free(void* p);
  // Work on `stream` (other than the block's own) uses memory at p, anywhere inside an
  // allocated block (a shard of a flat buffer, say): free() of that block makes its reuse wait
  // for that work.
  void record_stream(void* p, void* stream);
  // raw_free every cached block (pending ones whose events completed included).
  void empty_cache();
  DeviceCacheStats stats() const;
  bool caching() const { return caching_; }
  int device() const { return device_; }

 private:
  enum class State : uint8_t { InUse, Cached, Pending };
  struct Block {
    size_t size = 0;       // block bytes
    size_t requested = 0;  // while in use
    void* stream = nullptr;
    State state = State::InUse;
    std::vector<void*> streams;  // other streams recorded while in use
    std::vector<void*> events;   // while pending: one per recorded stream
  };
  using Key = std::pair<uintptr_t, size_t>;  // (stream, block size)
  static Key key(void* stream, size_t size) { return {reinterpret_cast<uintptr_t>(stream), size}; }

  void* take_cached(size_t size, void* stream);  // nullptr if no block fits
  void* raw_alloc(size_t size);                  // notes reserved; nullptr when out of memory
  void raw_free(void* p, size_t size);           // notes reserved
  void process_events();
  void release_free_blocks();
  void* get_event();

  const DeviceApi api_;
  const int device_;
  const bool caching_;
  MemTracker* const tracker_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> blocks_;  // every block raw_alloc'd and not raw_free'd
  std::map<uintptr_t, size_t> by_addr_;      // the same blocks by address: start -> size
  // (stream, size) -> cached blocks. Entries and vectors keep their capacity once created.
  std::map<Key, std::vector<void*>> free_;
  std::vector<void*> pending_;  // blocks waiting for events, in the order they were freed
  std::vector<void*> events_;   // created and idle
  DeviceCacheStats st_;
};

}  // namespace sw
