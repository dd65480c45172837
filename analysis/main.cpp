// gpushim-analyze: offline analysis of gpushim reports and traces.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli.h"
#include "util/version.h"

namespace {

using gpushim::analysis::CommandSpec;

const std::vector<const CommandSpec*> kCommands = {
    &gpushim::analysis::kSummaryCommand, &gpushim::analysis::kReplayCommand, &gpushim::analysis::kDiffCommand,
    &gpushim::analysis::kMergeCommand,   &gpushim::analysis::kExportCommand, &gpushim::analysis::kConfigCommand,
};

std::string usage() {
  return "usage: gpushim-analyze COMMAND [ARGS] (COMMAND --help for details)\n\ncommands:\n" +
         gpushim::analysis::commands_text(kCommands) +
         R"(
--version prints the gpushim release.
REPORT is a JSON report written by libgpushim.so (GPUSHIM_REPORT, at exit or on a snapshot);
TRACE a binary trace (GPUSHIM_TRACE). Inputs are recognized by content, gzip-compressed or not;
- reads one from standard input.
)";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(usage().c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("gpushim-analyze %s\n", gpushim::kVersion);
    return 0;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  std::vector<std::string> names;
  for (const CommandSpec* c : kCommands) {
    names.push_back(c->name);
    if (std::strcmp(argv[1], c->name) != 0) continue;
    // Whatever an input does to the readers, the user gets one line, never an abort.
    try {
      return gpushim::analysis::run_command(*c, args);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "gpushim-analyze %s: out of memory (an input too large for this machine?)\n", c->name);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpushim-analyze %s: %s\n", c->name, e.what());
    }
    return 1;
  }
  const std::string guess = gpushim::analysis::nearest_name(argv[1], names);
  std::fprintf(stderr, "gpushim-analyze: unknown command '%s'%s (gpushim-analyze --help)\n", argv[1],
               guess.empty() ? "" : (": did you mean " + guess + "?").c_str());
  return 2;
}
