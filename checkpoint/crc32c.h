// CRC-32C (Castagnoli, the iSCSI/ext4 checksum): reflected polynomial 0x82F63B78, initial and
// final XOR 0xFFFFFFFF, so crc32c("123456789") = 0xE3069283. Uses the SSE4.2 crc32
// instruction when the CPU has it (three interleaved streams, ~10+ GB/s), a table otherwise.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sw {

// CRC of `n` bytes continuing from `crc` (the CRC of the bytes before; 0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// Copies n bytes from src to dst (not overlapping) and returns their CRC continuing from
// `crc`, reading the source once: what crc32c(src, n, crc) returns.
uint32_t crc32c_copy(void* dst, const void* src, size_t n, uint32_t crc = 0);
// CRC of A followed by B, from crc(A), crc(B) and B's length, in O(log len_b): lets per-block
// CRCs make up per-tensor and per-file CRCs without reading the data twice.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

}  // namespace sw
