// Command-line plumbing shared by the gpushim-analyze subcommands.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace gpushim::analysis {

struct Cli {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> options;  // "--name" -> values (repeatable)
  bool has(const std::string& name) const { return options.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const {
    auto it = options.find(name);
    return it == options.end() || it->second.empty() ? fallback : it->second.back();
  }
  const std::vector<std::string>& all(const std::string& name) const;
};

// Options in `with_value` take the next argument (or "--name=value"); those in `flags` take none.
// "-o" is accepted as "--output", "-h" as "--help". Anything else starting with '-' is an error.
bool parse_cli(const std::vector<std::string>& args, const std::set<std::string>& with_value,
               const std::set<std::string>& flags, Cli* out, std::string* error);

// Writes `data` to `path`, or to stdout for "-". False with a message on failure.
bool write_output(const std::string& path, const std::string& data, std::string* error);

// Bytes with units as GPUSHIM_LIMIT takes them ("8GiB", "512MiB", "80GB", plain bytes).
bool parse_size(const std::string& text, uint64_t* out);

// The subcommands: each returns the process exit status (0 ok, 1 failure, 2 usage error).
int cmd_summary(const std::vector<std::string>& args);
int cmd_replay(const std::vector<std::string>& args);
int cmd_diff(const std::vector<std::string>& args);
int cmd_merge(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_config(const std::vector<std::string>& args);

// Prints "gpushim-analyze <cmd>: <message>" and the usage hint; returns 2.
int usage_error(const char* cmd, const std::string& message);

}  // namespace gpushim::analysis
