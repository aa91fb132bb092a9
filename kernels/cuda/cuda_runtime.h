// Host-side entry points of the CUDA backend (no CUDA headers here).
#pragma once
#include <cstddef>

#include "core/device_cache.h"

namespace sw {
int cuda_device_count();  // 0 when no driver or no GPU
void cuda_copy_to_device(void* dst, const void* src, size_t bytes);
void cuda_copy_to_host(void* dst, const void* src, size_t bytes);
// The caching device allocator behind Buffer (cuda_runtime.cu; core/device_cache.h).
// Work on `stream` (a cudaStream_t) uses the device buffer at ptr (its data()): freeing the
// buffer then makes its reuse wait for that work. Needed for any stream but the compute stream.
void cuda_record_stream(const void* ptr, void* stream, int device = 0);
DeviceCacheStats cuda_cache_stats(int device = 0);
}  // namespace sw
