// libFuzzer target: the GPUSHIM_* configuration parser, fed whatever an environment can hold.
//
// Input: records separated by '\n'. A record whose first byte is below the number of known
// variables sets that variable to the rest of the record (so every variable is reached at once);
// any other record is taken as "NAME=value" as written (unknown names, names without '=', other
// prefixes). Values may hold any byte, NUL included.
//
// Checked on every input (a violation traps, which libFuzzer reports as a crash):
//   - each GPUSHIM_* record is either applied or yields exactly one error;
//   - every error message names its variable, says what is accepted (or lists the known names),
//     and is one line of printable ASCII of bounded length;
//   - the environ form of the same input gives the same verdicts;
//   - an accepted configuration is within the documented ranges, and what consumes it (the report
//     path template, the fault injector) runs on it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "policy/fault_injector.h"
#include "report/output_file.h"

namespace {

using gpushim::ConfigError;
using gpushim::ConfigResult;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

bool readable(const std::string& msg) {
  if (msg.empty() || msg.size() >= 900) return false;
  for (char c : msg)
    if (c < 0x20 || c >= 0x7f) return false;
  return true;
}

void check_error(const ConfigError& e) {
  const std::string msg = e.message();
  require(readable(msg));
  if (e.unknown_name) {
    require(msg.find(" is not a gpushim variable (known: GPUSHIM_") != std::string::npos);
  } else {
    require(msg.rfind(e.variable + "='", 0) == 0);
    require(msg.find("' is invalid: expected " + e.accepted) != std::string::npos);
  }
}

void check_config(const gpushim::Config& c) {
  require(c.stack_depth <= 256);
  require(c.sample_ms >= 1 && c.sample_ms <= 60000);
  require(c.summary_sites <= 1000);
  require(c.round_bytes >= 256 && c.round_bytes <= (2u << 20) && (c.round_bytes & (c.round_bytes - 1)) == 0);
  require(c.small_segment >= (1u << 20) && c.small_segment <= (64u << 20));
  require(c.large_segment >= (10u << 20) && c.large_segment <= (1ull << 30) && c.large_segment % (2u << 20) == 0);
  require(c.max_split >= (2u << 20));
  require(c.quarantine_bytes <= (1ull << 40));
  require(c.limit.percent >= 0 && c.limit.percent <= 100);
  if (!c.report_template.empty()) {
    const std::string path = gpushim::expand_path_template(c.report_template, "/usr/bin/prog", 4242);
    require(!path.empty());
  }
  gpushim::FaultInjector faults(c.fail);
  uint64_t injected = 0;
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 20, UINT64_MAX})
    if (faults.select(size) != 0) ++injected;
  require(faults.injected() == injected);
  require(faults.counted() == (c.fail.active() ? 4u : 0u));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<gpushim::ConfigVariableDoc> docs = gpushim::config_variable_docs();
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::pair<std::string, std::string>> vars;
  size_t start = 0;
  while (start <= input.size() && vars.size() < 64) {
    size_t end = input.find('\n', start);
    if (end == std::string::npos) end = input.size();
    const std::string record = input.substr(start, end - start);
    start = end + 1;
    if (record.empty()) continue;
    const auto pick = static_cast<unsigned char>(record[0]);
    if (pick < docs.size()) {
      vars.emplace_back(docs[pick].name, record.substr(1));
    } else {
      const size_t eq = record.find('=');
      vars.emplace_back(record.substr(0, eq), eq == std::string::npos ? "" : record.substr(eq + 1));
    }
  }

  const ConfigResult r = gpushim::parse_config(vars);
  size_t ours = 0;
  for (const auto& [name, value] : vars) ours += name.rfind("GPUSHIM_", 0) == 0;
  require(r.errors.size() <= ours);
  for (const ConfigError& e : r.errors) check_error(e);
  if (r.ok()) check_config(r.config);

  // The environ form: what a process really gets. NAME=value strings cannot hold NUL, and a name
  // cannot hold '='; skip inputs that have either (the vector form covered them).
  std::vector<std::string> strings;
  for (const auto& [name, value] : vars) {
    if (name.find('\0') != std::string::npos || value.find('\0') != std::string::npos ||
        name.find('=') != std::string::npos)
      return 0;
    strings.push_back(name + "=" + value);
  }
  std::vector<const char*> env;
  for (const std::string& s : strings) env.push_back(s.c_str());
  env.push_back(nullptr);
  const ConfigResult viaenv = gpushim::parse_config(env.data());
  require(viaenv.errors.size() == r.errors.size());
  for (size_t i = 0; i < r.errors.size(); ++i) require(viaenv.errors[i].message() == r.errors[i].message());
  return 0;
}
