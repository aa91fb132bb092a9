// The command line's shared parts, on CLI11 (Debian's libcli11-dev, header-only). Only the
// tools' .cpp files include this header, so CLI11's compile cost stays out of the libraries.
//
// Every subcommand declares its options on a CLI::App with help text; run() parses argv and
// turns the outcome into one of three exit codes, the same for every subcommand:
//   0  done, or --help / --version printed (stdout)
//   1  an error in what was asked (sw::Error: a bad config, a missing file, ...): main()
//      prints one line "shardwise: error: <message>"
//   2  a usage mistake (unknown subcommand or option, missing or malformed argument): two
//      lines on stderr, "shardwise <cmd>: <problem naming the option>" and
//      "Try 'shardwise <cmd> --help'."
// Under mpirun/srun every rank parses the same argv and returns the same code; only rank 0
// (the launcher's rank, core/launch.h) prints help, the version and usage mistakes.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace sw::cli {

// A usage mistake found after parsing (a combination of options CLI11 cannot express, or an
// unknown argument): exit 2, the message prefixed by the subcommand's path.
struct UsageError {
  std::string message;
  std::string cmd;  // "shardwise data prepare"; its --help is the hint
};

// "shardwise", "shardwise data prepare": the names from the top app down to `app`.
std::string command_path(const CLI::App* app);

[[noreturn]] void usage_fail(const CLI::App* app, const std::string& message);

// What runs when a subcommand was given, after its options parsed and passed every check.
using Run = std::function<int()>;
using Runs = std::map<const CLI::App*, Run>;

// Adds subcommand `name` under `parent`. `description`'s first line is the summary listed by
// the parent's --help; the whole text follows the usage line of the subcommand's own --help.
CLI::App* add_command(CLI::App& parent, const std::string& name, const std::string& description);

// The positional CONFIG.json (the run's JSON config), required unless `required` is false.
CLI::Option* add_config(CLI::App* app, std::string& path, bool required = true);

// --set KEY=VALUE, repeatable: a config override by dotted key path (engine/config.h).
CLI::Option* add_overrides(CLI::App* app, std::vector<std::string>& overrides);

// --name VALUE where VALUE must not be empty; `type` is how --help names it (FILE, DIR).
CLI::Option* add_text(CLI::App* app, const std::string& name, std::string& dest,
                      const std::string& type, const std::string& help);

// Numbers, parsed strictly as written in decimal ("12x", "0x10", "" are errors) into dest.
CLI::Option* add_integer(CLI::App* app, const std::string& name, int& dest, int lo, int hi,
                         const std::string& type, const std::string& help);
CLI::Option* add_unsigned(CLI::App* app, const std::string& name, uint64_t& dest,
                          const std::string& type, const std::string& help);
// A finite number in [lo, hi] (or (lo, hi) with `open`); hi may be infinity.
CLI::Option* add_number(CLI::App* app, const std::string& name, double& dest, double lo,
                        double hi, bool open, const std::string& type, const std::string& help);

// The top-level app with Shardwise's help layout and parse settings (a repeated option keeps
// its last value, except --set which keeps all).
void configure_top(CLI::App& app, const std::string& description);

// Parses `args` (argv without the program name) against `app` and runs what the selected
// subcommand registered in `runs`. `help_cmd` is the `help [COMMAND...]` subcommand (its
// positionals in `help_of`), `version` the --version flag. Throws UsageError for usage
// mistakes; prints help and returns 0 for --help.
int parse_and_run(CLI::App& app, const std::vector<std::string>& args, const Runs& runs,
                  const CLI::App* help_cmd, const std::vector<std::string>& help_of,
                  const CLI::Option* version, const std::string& version_text);

// Whether this process prints help, the version and usage mistakes (rank 0 of a launch).
bool prints_usage();

}  // namespace sw::cli
