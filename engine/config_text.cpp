// A config as text: parsing with positions, --set overrides, and the messages that point at the
// file, the key path and the override (config_text.h).
#include "engine/config_text.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/json_depth.h"

namespace sw::config {

namespace {

// Optimal string alignment distance (Levenshtein plus adjacent transpositions).
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost =
          std::tolower((unsigned char)a[i - 1]) == std::tolower((unsigned char)b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

// Every full key path in the schema whose last component is `key` (for keys put at the wrong
// level, e.g. a top-level "lr").
void find_key(const Node& n, const std::string& path, const std::string& key,
              std::vector<std::string>& out) {
  for (const Node& k : n.kids) {
    const std::string p = join_path(path, k.name);
    if (k.name == key) out.push_back(p);
    if (k.kind == Kind::Obj) find_key(k, p, key, out);
  }
}

// The key path of the object the parser is in ("a.b"), from the keys of the open objects.
std::string open_path(const std::vector<std::string>& keys) {
  std::string p;
  for (size_t i = 1; i < keys.size(); ++i) p = join_path(p, keys[i]);
  return p;
}

// nlohmann's parse error as "source:line:column: invalid JSON: <reason>".
[[noreturn]] void syntax_error(const json::parse_error& e, const std::string& text,
                               const std::string& source) {
  // Position from the byte offset; the reason is nlohmann's text after the position.
  size_t line = 1, col = 1;
  const size_t end = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
  for (size_t i = 0; i < end; ++i) {
    if (text[i] == '\n')
      ++line, col = 1;
    else
      ++col;
  }
  std::string why = e.what();
  const size_t p = why.find(": ", why.find("column"));
  if (p != std::string::npos)
    why = why.substr(p + 2);
  else if (why.find(']') != std::string::npos)
    why = why.substr(why.find(']') + 2);
  fail("config", source + ":" + std::to_string(line) + ":" + std::to_string(col) +
                     ": invalid JSON: " + why);
}

}  // namespace

std::string Ctx::origin(const std::string& path) const {
  for (const auto& [k, o] : origins)  // an override of the key or of an enclosing object
    if (path == k || path.rfind(k + ".", 0) == 0) return o;
  return "";
}

bool Ctx::given(const std::string& path) const {
  const json* v = input ? at(*input, path) : nullptr;
  return v && !v->is_null() && !is_auto(*v);
}

void Ctx::bad(const std::string& path, const std::string& problem) const {
  fail("config", source + ": " + path + ": " + problem + origin(path));
}

void unknown_key(const std::string& source, const Node& level, const std::string& parent,
                 const std::string& key, const std::string& origin) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const Node& k : level.kids) {
    const size_t d = edit_distance(key, k.name);
    if (d < best_d) best_d = d, best = k.name;
  }
  std::string msg = source + ": unknown key '" + join_path(parent, key) + "'" + origin;
  const size_t limit = std::max<size_t>(2, key.size() / 3);
  std::vector<std::string> elsewhere;
  find_key(schema(), "", key, elsewhere);
  if (!best.empty() && best_d <= limit) {
    msg += " (did you mean '" + join_path(parent, best) + "'?)";
  } else if (!elsewhere.empty()) {
    msg += " (did you mean '" + elsewhere.front() + "'?)";
  } else {
    msg += " (valid keys here: ";
    for (size_t i = 0; i < level.kids.size(); ++i) msg += (i ? ", " : "") + level.kids[i].name;
    msg += ")";
  }
  fail("config", msg);
}

// Syntax errors with line:column; duplicate keys rejected (JSON allows them, nlohmann keeps the
// last one silently, which hides mistakes).
json parse_text(const std::string& text, const std::string& source) {
  // nlohmann builds any depth, but copying, comparing or dumping the value recurses once per
  // level: a config nested 10,000 deep must be refused before it is parsed.
  if (const size_t at = json_depth_exceeded(text); at != std::string::npos) {
    const std::string pos = json_position(text, at);  // "line L, column C"
    fail("config", source + ":" + pos.substr(5, pos.find(',') - 5) + ":" +
                       pos.substr(pos.rfind(' ') + 1) + ": nested deeper than " +
                       std::to_string(kJsonMaxDepth) + " levels");
  }
  std::vector<std::set<std::string>> seen;  // keys of each open object
  std::vector<std::string> keys;            // key path of the open objects
  std::string last_key, dup;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        keys.push_back(last_key);
        seen.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!seen.empty()) seen.pop_back();
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        last_key = parsed.get<std::string>();
        if (!seen.empty() && !seen.back().insert(last_key).second && dup.empty())
          dup = join_path(open_path(keys), last_key);
        break;
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, cb);
  } catch (const json::parse_error& e) {
    syntax_error(e, text, source);
  } catch (const json::exception& e) {  // out_of_range: a number beyond double (1e400)
    std::string why = e.what();
    if (why.find(']') != std::string::npos) why = why.substr(why.find(']') + 2);
    fail("config", source + ": invalid JSON: " + why);
  }
  if (!dup.empty()) fail("config", source + ": duplicate key '" + dup + "'");
  if (!j.is_object())
    fail("config", source + ": the top level must be a JSON object, got " + describe(j));
  return j;
}

void apply_override(json& root, const std::string& ov, Ctx& c) {
  const std::string& source = c.source;
  const size_t eq = ov.find('=');
  if (eq == std::string::npos || eq == 0)
    fail("config",
         source + ": --set '" + ov + "': expected KEY=VALUE, e.g. optimizer.params.lr=1e-3");
  try {  // keys and string values end up in the resolved config, which must dump as JSON
    (void)json(ov).dump();
  } catch (const json::type_error&) {
    fail("config", source + ": --set " +
                       json(ov).dump(-1, ' ', false, json::error_handler_t::replace) +
                       ": not valid UTF-8");
  }
  const std::string path = ov.substr(0, eq), text = ov.substr(eq + 1);
  std::vector<std::string> parts;
  {
    std::stringstream ss(path);
    std::string p;
    while (std::getline(ss, p, '.')) parts.push_back(p);
    if (path.back() == '.') parts.push_back("");
  }
  const std::string origin = " (from --set " + ov + ")";
  const Node* level = &schema();
  json* cur = &root;
  std::string sofar;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& k = parts[i];
    if (k.empty())
      fail("config", source + ": --set '" + ov + "': empty component in key path '" + path + "'");
    const Node* n = level->kind == Kind::Obj ? level->kid(k) : nullptr;
    if (level->kind == Kind::Obj && !n) unknown_key(source, *level, sofar, k, origin);
    if (level->kind != Kind::Obj && level->kind != Kind::Any)
      fail("config", source + ": --set '" + ov + "': '" + sofar + "' is " + kind_name(level->kind) +
                         ", it has no key '" + k + "'");
    sofar = join_path(sofar, k);
    if (!cur->is_object())
      fail("config", source + ": --set '" + ov + "': cannot set '" + sofar +
                         "' because its parent is " + describe(*cur) + ", not an object");
    if (i + 1 < parts.size()) {
      json& next = (*cur)[k];
      if (next.is_null()) next = json::object();  // creates intermediate objects
      cur = &next;
      if (n) level = n;
      continue;
    }
    if (json_depth_exceeded(text) != std::string::npos)
      fail("config", source + ": --set '" + sofar + "': the value is nested deeper than " +
                         std::to_string(kJsonMaxDepth) + " levels");
    json v;
    try {
      v = json::parse(text);
    } catch (const json::parse_error&) {
      v = text;
    } catch (const json::exception&) {  // out_of_range: a number beyond double (1e400)
      fail("config",
           source + ": --set '" + sofar + "': the number " + text + " is out of range");
    }
    (*cur)[k] = v;
    c.origins[sofar] = origin;
  }
}

}  // namespace sw::config
