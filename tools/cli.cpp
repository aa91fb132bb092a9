// The command line's shared parts (tools/cli.h), the one file that includes CLI11: the help
// layout, option kinds with one message style, and the parse -> help | usage mistake | run
// decision.
#include "tools/cli.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>

#include "core/launch.h"

namespace sw::cli {

namespace {

// --help: the usage line first, then the description, the positionals, the options, the
// subcommands (each with the first line of its description) and the footer.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() {
    column_width(24);
    label("SUBCOMMAND", "COMMAND");
  }

  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode mode) const override {
    std::ostringstream out;
    out << make_usage(app, name);
    if (!app->get_description().empty()) out << "\n" << app->get_description() << "\n";
    out << make_positionals(app) << make_groups(app, mode) << make_subcommands(app, mode);
    if (!app->get_footer().empty()) out << "\n" << app->get_footer() << "\n";
    return out.str();
  }

  std::string make_subcommand(const CLI::App* sub) const override {
    const std::string& d = sub->get_description();
    std::ostringstream out;
    CLI::detail::format_help(out, sub->get_name(), d.substr(0, d.find('\n')), column_width_);
    return out.str();
  }
};

std::string quote(const std::string& s) { return "'" + s + "'"; }

// "shardwise", "shardwise data prepare": the names from the top app down to `app`.
std::string command_path(const CLI::App* app) {
  std::string path;
  for (; app; app = app->get_parent()) path = app->get_name() + (path.empty() ? "" : " ") + path;
  return path;
}

[[noreturn]] void usage_fail(const CLI::App* app, const std::string& message) {
  throw UsageError{message, command_path(app)};
}

// Strict decimal integer (no sign for unsigned, no base prefixes, nothing after the digits).
template <class T>
bool parse_decimal(const std::string& s, T& v) {
  const char* b = s.data();
  const char* e = b + s.size();
  const auto r = std::from_chars(b, e, v);
  return !s.empty() && r.ec == std::errc() && r.ptr == e;
}

// The names of the subcommands `app` offers ("train, profile, ... or ckpt").
std::string offered(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::App* s : app->get_subcommands({}))
    if (!s->get_name().empty() && s->get_name() != "help") names.push_back(s->get_name());
  std::string r;
  for (size_t i = 0; i < names.size(); ++i)
    r += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return r;
}

// The deepest subcommand the parse selected (the app itself when none).
const CLI::App* selected_leaf(const CLI::App* app) {
  for (;;) {
    const std::vector<CLI::App*> subs = app->get_subcommands();
    if (subs.empty()) return app;
    app = subs.front();
  }
}

// CLI11's parse error as one line naming the option (CLI11 2.1's own wording otherwise).
std::string describe(const CLI::ParseError& e, const CLI::App* where) {
  const std::string what = e.what();
  if (dynamic_cast<const CLI::RequiredError*>(&e)) {
    for (const CLI::Option* o : where->get_options())
      if (o->get_required() && o->count() == 0)
        return "missing " +
               (o->get_positional() ? o->get_name(true) : o->get_name() + " " + o->get_type_name());
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) {
    // "--set: 1 required KEY=VALUE missing": the option was last on the line, without value.
    const size_t colon = what.find(": ");
    if (colon != std::string::npos && what.find(" required ") != std::string::npos &&
        what.size() > 8 && what.compare(what.size() - 8, 8, " missing") == 0)
      return what.substr(0, colon) + " needs a value";
  }
  return what;
}

// Checks what CLI11 left over in `app` (unknown options, extra positionals) as a usage error.
void check_leftovers(const CLI::App* app) {
  const std::vector<std::string> rest = app->remaining(false);
  if (rest.empty()) return;
  const std::string& a = rest.front();
  if (a.size() > 1 && a[0] == '-') usage_fail(app, "unknown option " + quote(a));
  if (!app->get_subcommands({}).empty()) {
    const bool top = app->get_parent() == nullptr;
    usage_fail(app, std::string("unknown ") + (top ? "" : app->get_name() + " ") +
                        (top ? "command " : "subcommand ") + quote(a) + " (expected " +
                        offered(app) + ")");
  }
  usage_fail(app, "unexpected argument " + quote(a));
}

}  // namespace

struct Registry {
  CLI::App app;
  std::map<const CLI::App*, std::function<int()>> runs;
  CLI::App* help = nullptr;
  std::vector<std::string> help_of;  // help's COMMAND...
  bool show_version = false;
  std::string version;
};

bool prints_usage() { return launch_env().rank == 0; }

// ---- Opt -----------------------------------------------------------------------------------

Opt& Opt::required() {
  o_->required();
  return *this;
}

Opt& Opt::needs(const Opt& other) {
  o_->needs(other.o_);
  return *this;
}

Opt& Opt::excludes(const Opt& other) {
  o_->excludes(other.o_);
  return *this;
}

// ---- Command -------------------------------------------------------------------------------

Command Command::sub(const std::string& name, const std::string& description) {
  CLI::App* app = app_->add_subcommand(name, description);
  app->allow_extras();  // leftovers are reported by check_leftovers, naming the command
  app->require_subcommand(0, 1);
  app->footer("");  // CLI11 copies the parent's
  app->set_help_flag("-h,--help", "show this help");
  app->group("Commands");
  return Command(app, reg_);
}

Opt Command::config(std::string& path, bool required) {
  Opt o(app_->add_option("CONFIG.json", path,
                         "the run's JSON config (DeepSpeed-style keys; see configs/)")
            ->type_name(""));
  if (required) o.required();
  return o;
}

Opt Command::positional(const std::string& name, std::string& dest, const std::string& help) {
  return Opt(app_->add_option(name, dest, help)->type_name("")->required());
}

Opt Command::positionals(const std::string& name, std::vector<std::string>& dest,
                         const std::string& help) {
  return Opt(app_->add_option(name, dest, help)->type_name("")->required());
}

Opt Command::overrides(std::vector<std::string>& dest) {
  CLI::Validator kv(
      [](std::string& v) -> std::string {
        if (v.find('=') == std::string::npos || v.front() == '=')
          return "expects KEY=VALUE, got " + quote(v);
        return {};
      },
      "");
  return Opt(
      app_->add_option("--set", dest,
                       "override a config key by its dotted path, e.g. --set train_steps=50\n"
                       "--set optimizer.params.lr=1e-3 (VALUE is parsed as JSON, otherwise\n"
                       "taken as a string); repeatable, applied in order")
          ->type_name("KEY=VALUE")
          ->expected(1)
          ->allow_extra_args(false)  // one value per --set; the next word is not its
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
          ->check(kv));
}

Opt Command::flag(const std::string& name, bool& dest, const std::string& help) {
  return Opt(app_->add_flag(name, dest, help));
}

Opt Command::text(const std::string& name, std::string& dest, const std::string& type,
                  const std::string& help) {
  CLI::Validator non_empty(
      [](std::string& v) -> std::string { return v.empty() ? "expects a value, got ''" : ""; }, "");
  return Opt(app_->add_option(name, dest, help)->type_name(type)->check(non_empty));
}

Opt Command::any_text(const std::string& name, std::string& dest, const std::string& type,
                      const std::string& help) {
  return Opt(app_->add_option(name, dest, help)->type_name(type));
}

Opt Command::checked(const std::string& name, std::string& dest, const std::string& type,
                     const std::string& help,
                     std::function<std::string(const std::string&)> check) {
  CLI::Validator v([check](std::string& s) { return check(s); }, "");
  return Opt(app_->add_option(name, dest, help)->type_name(type)->check(v));
}

Opt Command::integer(const std::string& name, int& dest, int lo, int hi, const std::string& type,
                     const std::string& help) {
  return Opt(app_->add_option_function<std::string>(
                     name,
                     [name, &dest, lo, hi](const std::string& s) {
                       long long v = 0;
                       if (!parse_decimal(s, v))
                         throw CLI::ValidationError(name, "expects an integer, got " + quote(s));
                       if (v < lo || v > hi)
                         throw CLI::ValidationError(name, "must be between " + std::to_string(lo) +
                                                              " and " + std::to_string(hi) +
                                                              ", got " + s);
                       dest = static_cast<int>(v);
                     },
                     help)
                 ->type_name(type));
}

Opt Command::unsigned_integer(const std::string& name, uint64_t& dest, const std::string& type,
                              const std::string& help) {
  return Opt(app_->add_option_function<std::string>(
                     name,
                     [name, &dest](const std::string& s) {
                       if (!parse_decimal(s, dest))
                         throw CLI::ValidationError(
                             name, "expects a non-negative integer, got " + quote(s));
                     },
                     help)
                 ->type_name(type));
}

Opt Command::number(const std::string& name, double& dest, double lo, double hi, bool open,
                    const std::string& type, const std::string& help) {
  return Opt(app_->add_option_function<std::string>(
                     name,
                     [=, &dest](const std::string& s) {
                       errno = 0;
                       char* end = nullptr;
                       const double v = std::strtod(s.c_str(), &end);
                       if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE ||
                           !std::isfinite(v))
                         throw CLI::ValidationError(name, "expects a number, got " + quote(s));
                       if (open ? !(v > lo && v < hi) : !(v >= lo && v <= hi)) {
                         char range[96];
                         if (std::isinf(hi))
                           std::snprintf(range, sizeof range,
                                         open ? "must be > %g" : "must be >= %g", lo);
                         else
                           std::snprintf(range, sizeof range,
                                         open ? "must be between %g and %g (exclusive)"
                                              : "must be between %g and %g",
                                         lo, hi);
                         throw CLI::ValidationError(name, std::string(range) + ", got " + s);
                       }
                       dest = v;
                     },
                     help)
                 ->type_name(type));
}

void Command::footer(const std::string& text) { app_->footer(text); }

void Command::on_run(std::function<int()> run) { reg_->runs[app_] = std::move(run); }

void Command::usage_fail(const std::string& message) const { cli::usage_fail(app_, message); }

// ---- Program -------------------------------------------------------------------------------

Program::Program(const std::string& name, const std::string& description,
                 const std::string& version)
    : reg_(std::make_unique<Registry>()) {
  CLI::App& app = reg_->app;
  app.name(name);
  app.description(description);
  app.formatter(std::make_shared<HelpFormatter>());
  app.allow_extras();
  app.require_subcommand(0, 1);
  // A repeated option keeps its last value (the hand-written parser did); --set keeps all.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_help_flag("-h,--help", "show this help (also `" + name + " <command> --help`)");
  app.add_flag("--version", reg_->show_version, "print the version");
  reg_->version = version;
}

Program::~Program() = default;

Command Program::top() { return Command(&reg_->app, reg_.get()); }

void Program::add_help_command() {
  top().sub("help", "show a command's help: help [COMMAND [SUBCOMMAND]]");
  reg_->help = reg_->app.get_subcommand("help");
  reg_->help->add_option("COMMAND", reg_->help_of, "the command (and subcommand) to describe")
      ->type_name("");
}

int Program::run(const std::vector<std::string>& args) {
  CLI::App& app = reg_->app;
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 pops from the back
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    if (prints_usage()) std::cout << app.help() << std::flush;
    return 0;
  } catch (const CLI::ParseError& e) {
    const CLI::App* where = selected_leaf(&app);
    throw UsageError{describe(e, where), command_path(where)};
  }
  if (reg_->show_version) {
    if (prints_usage()) std::cout << reg_->version << "\n" << std::flush;
    return 0;
  }
  // Leftovers from the top down, so `shardwise --frob train` names --frob.
  const CLI::App* leaf = &app;
  check_leftovers(leaf);
  while (!leaf->get_subcommands().empty()) {
    leaf = leaf->get_subcommands().front();
    check_leftovers(leaf);
  }
  if (leaf == reg_->help) {  // `help data prepare` = `data prepare --help`
    const CLI::App* at = &app;
    for (const std::string& name : reg_->help_of) {
      const std::vector<const CLI::App*> subs =
          at->get_subcommands([&](const CLI::App* s) { return s->get_name() == name; });
      if (subs.empty())
        usage_fail(reg_->help, "no " + (at == &app ? "command" : at->get_name() + " subcommand") +
                                   " " + quote(name) + " (expected " + offered(at) + ")");
      at = subs.front();
    }
    std::vector<std::string> again = reg_->help_of;
    again.push_back("--help");
    return run(again);
  }
  const auto it = reg_->runs.find(leaf);
  if (it == reg_->runs.end()) {  // a command that groups subcommands, given none
    const bool top = leaf->get_parent() == nullptr;
    usage_fail(leaf, std::string("missing ") +
                         (top ? "command" : leaf->get_name() + " subcommand") + " (expected " +
                         offered(leaf) + ")");
  }
  return it->second();
}

}  // namespace sw::cli
