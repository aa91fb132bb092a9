// Nesting depth of JSON text, measured by a scan that neither recurses nor allocates.
// nlohmann's parser is iterative, but dump(), copies and comparisons of the value it builds
// recurse once per level, so a document nested 10,000 levels deep can overflow the stack long
// after parsing. Every reader of untrusted JSON (config, metadata.json, safetensors headers)
// refuses text nested deeper than kJsonMaxDepth before handing it to the parser.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace sw {

// Far more than any document Shardwise reads (metadata.json nests 6 levels, configs 4).
constexpr size_t kJsonMaxDepth = 64;

// Byte offset of the first '[' or '{' that opens level max_depth + 1 (brackets inside strings
// do not count), or std::string_view::npos when the text never nests deeper.
size_t json_depth_exceeded(std::string_view text, size_t max_depth = kJsonMaxDepth);

// "line L, column C" of a byte offset (1-based, as editors count).
std::string json_position(std::string_view text, size_t offset);

}  // namespace sw
