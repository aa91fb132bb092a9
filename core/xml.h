// Text for XML character data and attribute values (the profiler's and the planner's SVGs).
#pragma once
#include <string>

namespace sw {

// &, <, >, " escaped; control characters (not allowed in XML 1.0) become spaces.
inline std::string xml_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
    }
  }
  return o;
}

}  // namespace sw
