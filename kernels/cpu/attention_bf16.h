// attention.cpp's native bf16 path (the kernels themselves: cpu_kernels.h attention_forward /
// attention_backward): whether it runs, a switch for tests and benchmarks, and its scratch.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace sw::cpu {

// BF16 compute runs the tile products on vdpbf16ps (AVX512-BF16) where the CPU has it, reading
// 16-bit qkv / out / dout in place. False where the CPU lacks it or after
// set_attention_bf16_native(false) (tests, benchmarks: then BF16 takes the fp32-FMA products on
// rounded operands, the path of CPUs without it). Process-wide; not for concurrent calls.
bool attention_bf16_native();
void set_attention_bf16_native(bool allowed);
// Whether the native path writes attention's 16-bit outputs itself (bf16 out / dqkv = narrow()
// of the fp32 values, no fp32 copy): the forward wherever it runs; the backward with MHA (grouped
// heads sum their dK/dV partials in fp32 first).
bool attention_bf16_writes16(DType compute, int H, int KVH, bool backward);
// attention_forward / attention_backward (set) with those 16-bit outputs (16-bit qkv, out, and
// dout in either form), where attention_bf16_writes16 says so; sw::Error elsewhere.
void attention_forward_bf16_out(uint16_t* out16, float* lse, const uint16_t* qkv16, int B, int T,
                                int H, int KVH, int hd);
void attention_backward_bf16_out(uint16_t* dqkv16, const float* dout, const uint16_t* dout16,
                                 const uint16_t* qkv16, const uint16_t* out16, const float* lse,
                                 int B, int T, int H, int KVH, int hd);
// attention_tile_floats (cpu_kernels.h) at that compute: the native path's scratch for BF16
// where it runs, else the FMA path's.
size_t attention_tile_floats(int T, int hd, DType compute);

}  // namespace sw::cpu
