// The command line's shared parts. Options are declared and parsed with CLI11 (Debian's
// libcli11-dev, header-only), which only tools/cli.cpp includes: its templates add about 12 s
// of compile time (-O3) to every file that includes it (ckpt_cmd.cpp: 2 s without, 14 s
// with), so the command files declare their options through this small interface instead,
// one call per option with its help text.
//
// The outcome of a parse is one of three exit codes, the same for every subcommand:
//   0  done, or --help / --version printed (stdout)
//   1  an error in what was asked (sw::Error: a bad config, a missing file, ...): main()
//      prints one line "shardwise: error: <message>"
//   2  a usage mistake (unknown subcommand or option, missing or malformed argument): two
//      lines on stderr, "shardwise <cmd>: <problem naming the option>" and
//      "Try 'shardwise <cmd> --help'."
// Under mpirun/srun every rank parses the same argv and returns the same code; only rank 0
// (the launcher's rank, core/launch.h) prints help, the version and usage mistakes.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace sw::cli {

// A usage mistake: exit 2, the message prefixed by the subcommand's path.
struct UsageError {
  std::string message;
  std::string cmd;  // "shardwise data prepare"; its --help is the hint
};

// An option just declared, to mark required or related to another.
class Opt {
 public:
  explicit Opt(CLI::Option* o) : o_(o) {}
  Opt& required();
  Opt& needs(const Opt& other);     // given only together with `other`
  Opt& excludes(const Opt& other);  // never together with `other`

 private:
  CLI::Option* o_;
};

struct Registry;

// One command or subcommand: declares its arguments (bound to the caller's variables, which
// must outlive Program::run) and what runs when it was given.
class Command {
 public:
  Command(CLI::App* app, Registry* reg) : app_(app), reg_(reg) {}

  // A subcommand. `description`'s first line is the summary this command's --help lists;
  // the whole text follows the usage line of the subcommand's own --help.
  Command sub(const std::string& name, const std::string& description);

  // The positional CONFIG.json (the run's JSON config).
  Opt config(std::string& path, bool required = true);
  // A required positional, and one taking one or more values.
  Opt positional(const std::string& name, std::string& dest, const std::string& help);
  Opt positionals(const std::string& name, std::vector<std::string>& dest, const std::string& help);
  // --set KEY=VALUE, repeatable, kept in order: a config override by dotted key path.
  Opt overrides(std::vector<std::string>& dest);
  Opt flag(const std::string& name, bool& dest, const std::string& help);
  // --name VALUE; `type` is how --help names VALUE (FILE, DIR). text() refuses an empty value.
  Opt text(const std::string& name, std::string& dest, const std::string& type,
           const std::string& help);
  Opt any_text(const std::string& name, std::string& dest, const std::string& type,
               const std::string& help);
  // A value `check` accepts: it returns "" or what is wrong ("cannot parse 'x' as bytes").
  Opt checked(const std::string& name, std::string& dest, const std::string& type,
              const std::string& help, std::function<std::string(const std::string&)> check);
  // Numbers, parsed strictly in decimal ("12x", "0x10", "" are mistakes) and range-checked.
  Opt integer(const std::string& name, int& dest, int lo, int hi, const std::string& type,
              const std::string& help);
  Opt unsigned_integer(const std::string& name, uint64_t& dest, const std::string& type,
                       const std::string& help);
  // A finite number in [lo, hi], or (lo, hi) when `open`; hi may be infinity.
  Opt number(const std::string& name, double& dest, double lo, double hi, bool open,
             const std::string& type, const std::string& help);

  // Text after the options in --help.
  void footer(const std::string& text);
  // What runs when this command was given and every argument parsed and passed its checks.
  void on_run(std::function<int()> run);
  // A usage mistake in this command found after parsing (a combination of values).
  [[noreturn]] void usage_fail(const std::string& message) const;

 private:
  CLI::App* app_;
  Registry* reg_;
};

// The program: its top-level command, then run() parses argv and dispatches.
class Program {
 public:
  Program(const std::string& name, const std::string& description, const std::string& version);
  ~Program();
  Command top();
  // The `help [COMMAND...]` command (declare it last, so `shardwise --help` lists it last).
  void add_help_command();
  // Parses `args` (argv without the program name) and runs what the selected command
  // registered; prints help or the version and returns 0; throws UsageError.
  int run(const std::vector<std::string>& args);

 private:
  std::unique_ptr<Registry> reg_;
};

// Whether this process prints help, the version and usage mistakes (rank 0 of a launch).
bool prints_usage();

}  // namespace sw::cli
