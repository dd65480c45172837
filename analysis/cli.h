// Command-line plumbing shared by the gpushim-analyze subcommands.
//
// Each subcommand declares its options once, in a CommandSpec (name, value or flag, help line,
// accepted values, range, default); the parser, the validation and both help texts (the
// command's --help and its line in the top-level usage) are made from that one table, so the
// help cannot drift from what is parsed. Our own code rather than CLI11 or cxxopts (both Debian
// packages): measured, either header costs ~9 s of CPU per translation unit at -O2 -g (cli.cpp:
// ~2.7 s), neither suggests the nearest name for a misspelt option, and their messages were not
// ours to word (analysis/README.md has the numbers).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace gpushim::analysis {

// What an option takes. Values are checked while parsing, so a command reads them already valid.
enum class ValueKind : uint8_t {
  kFlag,    // no value
  kText,    // any string
  kChoice,  // one of `choices` (matched ignoring case, read back as spelt in the table)
  kCount,   // a whole number in [min, max]
  kNumber,  // a decimal number in [min, max]
  kBytes,   // bytes above 0 with units, as GPUSHIM_LIMIT takes them (8GiB, 512MiB, plain bytes)
};

struct Choice {
  const char* name;
  const char* help = nullptr;  // shown under the option when set
};

struct OptionSpec {
  const char* name;  // "--top"
  ValueKind kind = ValueKind::kFlag;
  const char* value_name = nullptr;  // "N" in "--top N"; a choice option without one shows its choices
  // One paragraph, wrapped to the terminal width by the help; '\n' breaks a line (and the spaces
  // after it indent the next one).
  const char* help = "";
  const char* fallback = nullptr;  // the value when absent; the help says "(default X)"
  std::vector<Choice> choices = {};
  double min = 0, max = 0;  // kCount, kNumber
  bool repeatable = false;  // otherwise given twice is an error
  bool required = false;
  const char* short_name = nullptr;  // "-o"
};

class Cli;

struct CommandSpec {
  const char* name;      // "summary"
  const char* operands;  // "REPORT|TRACE", as the usage line shows them
  size_t min_operands = 0, max_operands = 0;
  const char* summary = "";      // the command's line in the top-level usage
  const char* description = "";  // prose between the usage line and the options, as written
  std::vector<OptionSpec> options = {};
  int (*run)(const Cli&) = nullptr;
};

// What one command line said, checked against its CommandSpec.
class Cli {
 public:
  std::vector<std::string> operands;

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  // The value given, else the table's fallback, else "". Asking for a name the table lacks throws
  // std::logic_error (a programming error; main turns it into one line).
  std::string text(const std::string& name) const;
  uint64_t count(const std::string& name) const;  // kCount (0 when absent without a fallback)
  double number(const std::string& name) const;   // kNumber
  uint64_t bytes(const std::string& name) const;  // kBytes
  const std::vector<std::string>& all(const std::string& name) const;  // every value of a repeatable option

 private:
  friend bool parse_cli(const CommandSpec&, const std::vector<std::string>&, Cli*, std::string*);
  const OptionSpec& spec(const std::string& name) const;
  const CommandSpec* command_ = nullptr;
  std::map<std::string, std::vector<std::string>> values_;  // "--name" -> values
};

// Parses `args` (what follows the command's name) by `spec`: "--name value", "--name=value", the
// short names, "--" before operands that begin with '-'. False with a one-line message (without
// the command's name) on an unknown option (with the nearest known name when one is close), a
// missing or invalid value (naming what is accepted), an option given twice, a flag given a value,
// a missing required option or the wrong number of operands. "-h"/"--help" set out->has("--help")
// and skip the checks of what is required.
bool parse_cli(const CommandSpec& spec, const std::vector<std::string>& args, Cli* out, std::string* error);

// The command's --help: usage line, description, options (with their choices and defaults).
std::string help_text(const CommandSpec& spec);
// One line (or two) per command for the top-level usage: name, required options, operands, summary.
std::string commands_text(const std::vector<const CommandSpec*>& specs);

// Parses, prints the help or the one-line error (exit status 2), or runs the command.
int run_command(const CommandSpec& spec, const std::vector<std::string>& args);

// The candidate closest to `word` by edit distance (insertions, deletions, substitutions, swaps of
// neighbours) when it is near enough to be a typo (at most a third of the word, at least 2 edits,
// the launcher's rule in scripts/gpushim), else "". Words under 3 characters get no guess.
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);

// Writes `data` to `path`, or to stdout for "-". False with a message on failure.
bool write_output(const std::string& path, const std::string& data, std::string* error);
// A command's result on stdout: 0, or 1 after one line "gpushim-analyze <cmd>: cannot write to
// stdout: <why>" (a full disk, a closed descriptor), so a lost result never looks like success.
int print_output(const char* cmd, const std::string& data);

// Bytes with units as GPUSHIM_LIMIT takes them ("8GiB", "512MiB", "80GB", plain bytes).
bool parse_size(const std::string& text, uint64_t* out);

// The subcommands, each declared in its cmd_*.cpp.
extern const CommandSpec kSummaryCommand, kReplayCommand, kDiffCommand, kMergeCommand, kExportCommand,
    kConfigCommand;

// Empty when `name` is one of the shim's settings (config_variable_docs(), the table the library
// parses); else why not, in one line: a name without the GPUSHIM_ prefix, with the prefixed name
// suggested when that is a setting ("'ROUND' is not a GPUSHIM_* variable (did you mean
// GPUSHIM_ROUND?)"), or the library's own line for an unknown GPUSHIM_* name. config --check and
// replay --set both ask it (cmd_config.cpp).
std::string setting_name_problem(const std::string& name);

// Prints "gpushim-analyze <cmd>: <message> (gpushim-analyze <cmd> --help)", one line; returns 2.
int usage_error(const char* cmd, const std::string& message);

}  // namespace gpushim::analysis
