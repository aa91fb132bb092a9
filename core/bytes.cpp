#include "core/bytes.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <limits>

#include "core/error.h"

namespace sw {

namespace {

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  fail("bytes", "'" + text + "': " + why +
                    " (expected a byte count or a number with a unit: B, KB, MB, GB, TB, KiB, "
                    "MiB, GiB, TiB)");
}

bool iequals(const std::string& a, const char* b) {
  size_t i = 0;
  for (; i < a.size() && b[i]; ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return i == a.size() && !b[i];
}

}  // namespace

size_t parse_bytes(const std::string& text) {
  using u128 = unsigned __int128;
  size_t i = 0;
  const size_t n = text.size();
  if (n == 0) bad(text, "empty size");
  if (text[0] == '-') bad(text, "a size cannot be negative");
  if (text[0] == '+') ++i;
  u128 whole = 0, frac = 0, frac_scale = 1;
  size_t digits = 0;
  constexpr u128 kCap = u128{1} << 100;  // far beyond size_t; stops accumulating overflow
  for (; i < n && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++digits) {
    whole = whole * 10 + static_cast<unsigned>(text[i] - '0');
    if (whole > kCap) bad(text, "too large");
  }
  bool has_frac = false;
  if (i < n && text[i] == '.') {
    has_frac = true;
    for (++i; i < n && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++digits)
      if (frac_scale < u128{1000000000000000000ull}) {  // 18 fractional digits are plenty
        frac = frac * 10 + static_cast<unsigned>(text[i] - '0');
        frac_scale *= 10;
      }
  }
  if (digits == 0) bad(text, "no number");
  if (i < n && text[i] == ' ') ++i;
  const std::string unit = text.substr(i);
  u128 mult = 0;
  static const struct {
    const char* name;
    uint64_t mult;
  } units[] = {{"", 1},
               {"b", 1},
               {"kb", 1000ull},
               {"mb", 1000ull * 1000},
               {"gb", 1000ull * 1000 * 1000},
               {"tb", 1000ull * 1000 * 1000 * 1000},
               {"kib", 1ull << 10},
               {"mib", 1ull << 20},
               {"gib", 1ull << 30},
               {"tib", 1ull << 40}};
  for (const auto& u : units)
    if (iequals(unit, u.name)) mult = u.mult;
  if (mult == 0) bad(text, "unknown unit '" + unit + "'");
  if (has_frac && mult == 1 && frac != 0) bad(text, "a byte count must be whole");
  const u128 value = whole * mult + (frac * mult + frac_scale / 2) / frac_scale;
  if (value > std::numeric_limits<size_t>::max()) bad(text, "too large");
  return static_cast<size_t>(value);
}

size_t parse_budget_bytes(const std::string& text) {
  try {
    return parse_bytes(text);
  } catch (const Error&) {
    // A plain number in exponent or decimal form: 8e9, 8.5e9 (whole bytes after rounding).
    const char* s = text.c_str();
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (!text.empty() && end && *end == '\0' && std::isfinite(v) && v >= 0 && v < 9.2e18 &&
        std::isdigit(static_cast<unsigned char>(text[0])))
      return static_cast<size_t>(std::llround(v));
    throw;
  }
}

std::string format_bytes(size_t bytes) {
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace sw
