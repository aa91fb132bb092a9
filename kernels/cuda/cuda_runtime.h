// Host-side entry points of the CUDA backend (no CUDA headers here).
#pragma once
#include <cstddef>

namespace sw {
int cuda_device_count();  // 0 when no driver or no GPU
void cuda_copy_to_device(void* dst, const void* src, size_t bytes);
void cuda_copy_to_host(void* dst, const void* src, size_t bytes);
}  // namespace sw
