// Byte sizes as users write them and as messages print them.
#pragma once
#include <cstddef>
#include <string>

namespace sw {

// "123" (bytes), "12GiB", "512 MiB", "1.5GB", "800KiB": a non-negative number with an optional
// unit, case-insensitive, an optional space before it; B, KB/MB/GB/TB (powers of 1000),
// KiB/MiB/GiB/TiB (powers of 1024). A fraction is rounded to the nearest byte (a bare number
// must be whole). Throws sw::Error("bytes: ...") naming the text when it is empty, negative,
// has another unit or overflows size_t.
size_t parse_bytes(const std::string& text);

// A memory budget as users write one, in a config's memory_budget or on the command line
// (`shardwise plan --memory-budget`): what parse_bytes reads, or a plain number in exponent or
// decimal form ("8e9", "8.5e9": whole bytes after rounding), below 9.2e18. The one parser of
// budget text, so that a budget reads the same in both places. Throws parse_bytes's
// sw::Error("bytes: ...") for text that neither form reads.
size_t parse_budget_bytes(const std::string& text);

// "512 B", "800.0 KiB", "1.5 GiB" (binary units, one decimal).
std::string format_bytes(size_t bytes);

}  // namespace sw
