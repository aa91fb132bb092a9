// README.md's configuration key table (config_keys_markdown; tools/config_table prints it and
// scripts/gen_config_table.sh puts it between README.md's config-keys markers) and the
// declaration as data (config_declaration_json, for tests and tools), both from schema().
#include "engine/config.h"
#include "engine/config_schema.h"

namespace sw {
namespace config {

namespace {

// A table cell: a pipe would end the cell.
std::string cell(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

std::string type_text(const Node& n) {
  std::string t;
  switch (n.kind) {
    case Kind::Int:
      t = !n.accepts.empty() ? n.accepts
          : n.hi >= IMAX     ? "integer ≥ " + std::to_string(n.lo)
                             : "integer in [" + std::to_string(n.lo) + ", " +
                               std::to_string(n.hi) + "]";
      break;
    case Kind::Num:
      t = std::isinf(n.range.hi) ? "number " + n.range.str() : "number in " + n.range.str();
      if (t.find(">= ") != std::string::npos) t.replace(t.find(">= "), 3, "≥ ");
      break;
    case Kind::Bool:
      t = "true / false";
      break;
    case Kind::Str:
      if (n.choices.empty()) t = "string";
      for (size_t i = 0; i < n.choices.size(); ++i) t += (i ? " | `" : "`") + n.choices[i] + "`";
      break;
    case Kind::Betas:
      t = "[beta1, beta2], each in " + n.range.str();
      break;
    case Kind::Any:
    case Kind::Obj:
      t = n.accepts;
      break;
  }
  if (n.auto_ok) t += " or `\"auto\"`";
  return t;
}

std::string default_text(const Node& n) {
  if (n.def.is_null()) return n.derived;
  if (n.def.is_string())
    return n.def.get<std::string>().empty() ? "`\"\"`" : "`" + n.def.get<std::string>() + "`";
  if (n.def.is_number_float()) return "`" + num_str(n.def.get<double>()) + "`";  // 1, not 1.0
  if (n.def.is_array()) {  // betas
    std::string t = "`[";
    for (size_t i = 0; i < n.def.size(); ++i) t += (i ? ", " : "") + n.def[i].dump();
    return t + "]`";
  }
  return "`" + n.def.dump() + "`";
}

// Rows for the declared keys under `n` (compatibility-only ones gathered into `compat_keys`,
// one entry per parent object).
void table_rows(const Node& n, const std::string& path, std::string& out,
                std::vector<std::string>& compat_keys) {
  std::vector<std::string> here;
  for (const Node& k : n.kids) {
    const std::string p = join_path(path, k.name);
    if (k.compat) {
      here.push_back(k.name);
      continue;
    }
    if (k.kind != Kind::Obj)
      out += "| `" + p + "` | " + cell(type_text(k)) + " | " + cell(default_text(k)) + " | " +
             cell(k.doc) + " |\n";
    table_rows(k, p, out, compat_keys);
  }
  if (path.empty()) {
    for (const std::string& k : here) compat_keys.push_back("`" + k + "`");
  } else if (here.size() == 1) {
    compat_keys.push_back("`" + path + "." + here[0] + "`");
  } else if (!here.empty()) {
    std::string g = "`" + path + ".{";
    for (size_t i = 0; i < here.size(); ++i) g += (i ? ", " : "") + here[i];
    compat_keys.push_back(g + "}`");
  }
}

void declaration_rows(const Node& n, const std::string& path, json& out) {
  for (const Node& k : n.kids) {
    const std::string p = join_path(path, k.name);
    if (k.kind != Kind::Obj) {
      json row = {{"key", p},         {"kind", kind_name(k.kind)}, {"default", k.def},
                  {"derived", k.derived}, {"compat", k.compat},    {"alias", k.alias},
                  {"auto_ok", k.auto_ok}, {"doc", k.doc}};
      if (k.int_range)
        row["min"] = k.lo, row["max"] = k.hi;
      if (k.kind == Kind::Num || k.kind == Kind::Betas)
        row["range"] = {k.range.lo_open ? "(" : "[",
                        std::isinf(k.range.lo) ? json() : json(k.range.lo),
                        std::isinf(k.range.hi) ? json() : json(k.range.hi),
                        k.range.hi_open ? ")" : "]"};
      if (!k.choices.empty()) row["choices"] = k.choices;
      out.push_back(row);
    }
    declaration_rows(k, p, out);
  }
}

}  // namespace

}  // namespace config

using config::json;

std::string config_keys_markdown() {
  std::string out =
      "| key | type | default | meaning |\n"
      "| --- | --- | --- | --- |\n";
  std::vector<std::string> compat_keys;
  config::table_rows(config::schema(), "", out, compat_keys);
  out += "\nAccepted for DeepSpeed compatibility with no effect yet (type-checked, kept in the "
         "resolved config, listed in one note when a run starts):";
  for (size_t i = 0; i < compat_keys.size(); ++i) out += (i ? ", " : " ") + compat_keys[i];
  out += ".\n";
  return out;
}

std::string config_declaration_json() {
  json rows = json::array();
  config::declaration_rows(config::schema(), "", rows);
  return rows.dump(1) + "\n";
}

}  // namespace sw
