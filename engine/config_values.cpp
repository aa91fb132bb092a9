// A config key's value: its JSON kind, the declared range or choices it is checked against,
// and the message a value outside them gets (config_schema.h). The reader applies these to the
// value as written; validate_config applies check_value to a TrainConfig's fields.
#include <algorithm>
#include <charconv>
#include <climits>
#include <filesystem>
#include <sstream>

#include "core/bytes.h"
#include "core/error.h"
#include "engine/config_schema.h"
#include "engine/config_text.h"

namespace sw::config {

std::string num_str(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
std::string num_str(float v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string Range::str() const {
  if (std::isinf(hi)) return std::string(lo_open ? "> " : ">= ") + num_str(lo);
  return std::string(lo_open ? "(" : "[") + num_str(lo) + ", " + num_str(hi) +
         (hi_open ? ")" : "]");
}

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Obj:
      return "an object";
    case Kind::Int:
      return "an integer";
    case Kind::Num:
      return "a number";
    case Kind::Bool:
      return "true or false";
    case Kind::Str:
      return "a string";
    case Kind::Betas:
      return "an array of two numbers [beta1, beta2]";
    case Kind::Any:
      return "any value";
  }
  return "?";
}

std::string describe(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  switch (v.type()) {
    case json::value_t::string:
      return "string " + s;
    case json::value_t::boolean:
      return "boolean " + s;
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "array " + s;
    default:
      return "number " + s;
  }
}

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

bool kind_matches(Kind k, const json& v) {
  switch (k) {
    case Kind::Obj:
      return v.is_object();
    case Kind::Int:
      if (v.is_number_integer()) return true;
      if (v.is_number_float()) {  // 1e4 is an integer written in float syntax
        const double d = v.get<double>();
        return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18;
      }
      return false;
    case Kind::Num:
      return v.is_number();
    case Kind::Bool:
      return v.is_boolean();
    case Kind::Str:
      return v.is_string();
    case Kind::Betas:
      return v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number();
    case Kind::Any:
      return true;
  }
  return false;
}

json fjson(float f) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  return json::parse(std::string(buf, r.ptr));
}

const json* at(const json& root, const std::string& path) {
  const json* cur = &root;
  std::stringstream ss(path);
  std::string k;
  while (std::getline(ss, k, '.')) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(k);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

long long read_int(const Node& n, const json& v, const std::string& path, const Ctx& c) {
  // A Kind::Any key's integers (blocks_per_unit) have always read true as 1 and a fraction
  // truncated: kept, so that every config that loaded still loads the same. Other values of
  // such a key are errors (Kind::Int keys are checked on entry).
  const bool lax = n.kind == Kind::Any && (v.is_boolean() || v.is_number_float());
  if (!kind_matches(Kind::Int, v) && !lax) {
    std::string want = n.accepts.empty() ? kind_name(Kind::Int) : n.accepts;
    want.erase(std::remove(want.begin(), want.end(), '`'), want.end());
    c.bad(path, "expected " + want + ", got " + describe(v));
  }
  long long x;
  if (v.is_boolean()) {
    x = v.get<bool>() ? 1 : 0;
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    x = std::fabs(d) < 9.2e18 ? (long long)d : d > 0 ? LLONG_MAX : LLONG_MIN;
  } else if (v.is_number_unsigned() &&
             v.get<unsigned long long>() > (unsigned long long)LLONG_MAX) {
    x = LLONG_MAX;
  } else {
    x = v.get<long long>();
  }
  if (x < n.lo || x > n.hi) {
    // No upper bound below int32's: ">= lo", or "<= 2147483647" for a value beyond it.
    const std::string range = n.hi < INT32_MAX ? "in [" + std::to_string(n.lo) + ", " +
                                                     std::to_string(n.hi) + "]"
                              : x > n.hi       ? "<= " + std::to_string(n.hi)
                                               : ">= " + std::to_string(n.lo);
    c.bad(path, "must be " + range + " (got " + v.dump() + ")");
  }
  return x;
}

double check_num(double x, const std::string& path, Range r, const Ctx& c) {
  if (!r.ok(x)) c.bad(path, "must be " + r.str() + " (got " + num_str(x) + ")");
  return x;
}

double read_num(const Node& n, const json& v, const std::string& path, const Ctx& c) {
  return check_num(v.get<double>(), path, n.range, c);
}

float to_float(double x, const std::string& path, Range r, const Ctx& c) {
  const float f = static_cast<float>(x);
  if (!r.ok(static_cast<double>(f)))
    c.bad(path, "must be " + r.str() + " as a 32-bit float (got " + num_str(x) + ", which is " +
                    num_str(f) + " as a float)");
  return f;
}

std::string read_str(const Node& n, const json& v, const std::string& path, const Ctx& c) {
  std::string s = v.get<std::string>();
  const std::vector<std::string>& choices = n.choices;
  if (!choices.empty() && std::find(choices.begin(), choices.end(), s) == choices.end()) {
    std::string list;
    for (size_t i = 0; i < choices.size(); ++i) list += (i ? ", " : "") + choices[i];
    c.bad(path, "'" + s + "' is not one of " + list);
  }
  return s;
}

void check_value(const Node& n, const json& v, const std::string& path, const Ctx& c) {
  if (v.is_null() || is_auto(v)) return;
  switch (n.kind) {
    case Kind::Int:
      read_int(n, v, path, c);
      break;
    case Kind::Num:
      if (v.is_number()) read_num(n, v, path, c);
      break;
    case Kind::Betas:
      for (size_t i = 0; i < v.size() && i < 2; ++i)
        check_num(v[i].get<double>(), path + "[" + std::to_string(i) + "]", n.range, c);
      break;
    case Kind::Str:
      if (v.is_string()) read_str(n, v, path, c);
      break;
    case Kind::Any:
      if (n.int_range && kind_matches(Kind::Int, v)) read_int(n, v, path, c);
      break;
    case Kind::Obj:
    case Kind::Bool:
      break;
  }
}

std::string default_checkpoint_dir(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "checkpoints").string();
}
std::string default_profile_dir(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "profile").string();
}

uint64_t read_seed(const Node&, const json& v, const std::string& path, const Ctx& c) {
  // Any uint64 is a seed: the declared range is only the table's (accepts says so).
  if ((v.is_number_integer() && !v.is_number_unsigned() && v.get<long long>() < 0) ||
      (v.is_number_float() && !(v.get<double>() >= 0)))
    c.bad(path, "must be >= 0 (got " + v.dump() + ")");
  return v.is_number_float() ? (uint64_t)v.get<double>() : v.get<uint64_t>();
}

int read_prefetch(const Node& n, const json& v, const std::string& path, const Ctx& c) {
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;  // FSDP's forward_prefetch=True: 1 unit
  if (!kind_matches(Kind::Int, v))
    c.bad(path, "expected true, false or a number of units >= 0, got " + describe(v));
  return static_cast<int>(read_int(n, v, path, c));
}

std::vector<int> read_split_points(const Node&, const json& v, const std::string& path,
                                   const Ctx& c) {
  if (!v.is_array()) c.bad(path, "expected an array of schedule positions, got " + describe(v));
  std::vector<int> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    if (!e.is_number_integer() || e.get<long long>() < 1 || e.get<long long>() > (1 << 30))
      c.bad(path + "[" + std::to_string(i) + "]", "expected a schedule position >= 1, got " + describe(e));
    const int p = static_cast<int>(e.get<long long>());
    if (!out.empty() && p <= out.back())
      c.bad(path + "[" + std::to_string(i) + "]",
            "split points must increase (" + std::to_string(p) + " after " + std::to_string(out.back()) + ")");
    out.push_back(p);
  }
  return out;
}

size_t read_budget(const Node&, const json& v, const std::string& path, const Ctx& c) {
  if (v.is_number_integer()) {
    if (!v.is_number_unsigned() && v.get<long long>() < 0)
      c.bad(path, "must be >= 0 (got " + v.dump() + ")");
    return v.get<uint64_t>();
  }
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (!(x >= 0 && x < 18446744073709551616.0 && x == std::floor(x)))
      c.bad(path, "expected a whole number of bytes >= 0 or a size such as \"12GiB\" (got " +
                      v.dump() + ")");
    return static_cast<size_t>(x);
  }
  if (!v.is_string())
    c.bad(path, "expected a number of bytes or a size such as \"12GiB\", got " + describe(v));
  try {
    return parse_budget_bytes(v.get<std::string>());
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind("bytes: ", 0) == 0) msg = msg.substr(7);
    c.bad(path, msg);
  }
}

}  // namespace sw::config
