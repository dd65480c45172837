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

constexpr char kUsage[] = R"(usage: gpushim-analyze COMMAND [ARGS] (COMMAND --help for details)

commands:
  summary REPORT|TRACE          the human report: peaks, fragmentation, OOMs, growth suspects,
                                top sites, per-module table
  replay TRACE [--policy P]...  the trace's allocations through each policy on a simulated
         [--limit BYTES]        device: peak reserved, utilization, OOMs, driver calls
  diff A B                      per-site change in live and peak bytes between two runs
  merge DIR|FILES               one table across ranks or processes, outliers flagged
  export --format memory-viz|folded|speedscope|perfetto|perfetto-json|timeline
         TRACE|REPORT -o FILE
  config --check [NAME=VALUE]...  GPUSHIM_* settings through the library's own parser

--version prints the gpushim release.
REPORT is a JSON report written by libgpushim.so (GPUSHIM_REPORT, at exit or on a snapshot);
TRACE a binary trace (GPUSHIM_TRACE). Inputs are recognized by content.
)";

struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>&);
};

constexpr Command kCommands[] = {
    {"summary", gpushim::analysis::cmd_summary}, {"replay", gpushim::analysis::cmd_replay},
    {"diff", gpushim::analysis::cmd_diff},       {"merge", gpushim::analysis::cmd_merge},
    {"export", gpushim::analysis::cmd_export},     {"config", gpushim::analysis::cmd_config},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("gpushim-analyze %s\n", gpushim::kVersion);
    return 0;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    // Whatever an input does to the readers, the user gets one line, never an abort.
    try {
      return c.run(args);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "gpushim-analyze %s: out of memory (an input too large for this machine?)\n", c.name);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpushim-analyze %s: %s\n", c.name, e.what());
    }
    return 1;
  }
  std::fprintf(stderr, "gpushim-analyze: unknown command '%s'\n%s", argv[1], kUsage);
  return 2;
}
