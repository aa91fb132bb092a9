// attention.cpp's native bf16 path (the kernels themselves: cpu_kernels.h attention_forward /
// attention_backward): whether it runs, a switch for tests and benchmarks, and its scratch.
#pragma once
#include <cstddef>

#include "core/dtype.h"

namespace sw::cpu {

// BF16 compute runs the tile products on vdpbf16ps (AVX512-BF16) where the CPU has it, reading
// 16-bit qkv / out / dout in place. False where the CPU lacks it or after
// set_attention_bf16_native(false) (tests, benchmarks: then BF16 takes the fp32-FMA products on
// rounded operands, the path of CPUs without it). Process-wide; not for concurrent calls.
bool attention_bf16_native();
void set_attention_bf16_native(bool allowed);
// attention_tile_floats (cpu_kernels.h) at that compute: the native path's scratch for BF16
// where it runs, else the FMA path's.
size_t attention_tile_floats(int T, int hd, DType compute);

}  // namespace sw::cpu
