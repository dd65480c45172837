// gpushim-analyze config --check: the library's own parser (interpose/config) run on GPUSHIM_*
// settings before a program starts, so that the launcher refuses a bad value with the very
// message the library would print, instead of a run with the shim disabled.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "config/config.h"
#include "util/text.h"

extern char** environ;

namespace gpushim::analysis {

std::string setting_name_problem(const std::string& name) {
  const std::vector<ConfigVariableDoc> docs = config_variable_docs();
  std::string known;
  for (const ConfigVariableDoc& d : docs) {
    if (d.name == name) return "";
    known += (known.empty() ? "" : ", ") + d.name;
  }
  if (name.rfind("GPUSHIM_", 0) == 0) return ConfigError{name, "", known, /*unknown_name=*/true}.message();
  // The prefix left off (ROUND), or spelt in lower case (gpushim_round, round): the setting meant.
  std::string upper = name;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::string meant = upper.rfind("GPUSHIM_", 0) == 0 ? upper : "GPUSHIM_" + upper;
  const bool guess = std::any_of(docs.begin(), docs.end(), [&](const ConfigVariableDoc& d) { return d.name == meant; });
  return "'" + excerpt(name, 64) + "' is not a GPUSHIM_* variable" + (guess ? " (did you mean " + meant + "?)" : "");
}

namespace {

int run_config(const Cli& cli) {
  std::vector<std::pair<std::string, std::string>> vars;
  auto set = [&vars](std::string name, std::string value) {
    for (auto& [n, v] : vars)
      if (n == name) return void(v = std::move(value));
    vars.emplace_back(std::move(name), std::move(value));
  };
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos && entry.rfind("GPUSHIM_", 0) == 0) set(entry.substr(0, eq), entry.substr(eq + 1));
  }
  for (const std::string& a : cli.operands) {
    const size_t eq = a.find('=');
    if (eq == std::string::npos || eq == 0) return usage_error("config", "'" + a + "' is not NAME=VALUE");
    if (a.rfind("GPUSHIM_", 0) != 0) return usage_error("config", setting_name_problem(a.substr(0, eq)));
    set(a.substr(0, eq), a.substr(eq + 1));
  }
  const ConfigResult result = parse_config(vars);
  for (const ConfigError& e : result.errors) std::fprintf(stderr, "gpushim-analyze config: %s\n", e.message().c_str());
  if (result.ok())
    for (const std::string& line : result.inert) std::fprintf(stderr, "gpushim-analyze config: %s\n", line.c_str());
  return result.ok() ? 0 : 1;
}

}  // namespace

const CommandSpec kConfigCommand{
    .name = "config",
    .operands = "[NAME=VALUE]...",
    .min_operands = 0,
    .max_operands = SIZE_MAX,
    .summary = "GPUSHIM_* settings through the library's own parser",
    .description = R"(Checks the GPUSHIM_* variables of this process's environment, with each NAME=VALUE argument
added (or replacing the environment's value), exactly as libgpushim.so parses them when a
program starts. Prints one line per error on stderr and exits 1 if any; exits 0 if the shim
would accept them all, silently unless some setting has no effect under the chosen policy
(GPUSHIM_MAX_SPLIT under vmm), which gets a line of its own, as the shim gives it.
)",
    .options = {{.name = "--check", .help = "check the settings (the only action)", .required = true}},
    .run = run_config,
};

}  // namespace gpushim::analysis
