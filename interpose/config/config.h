// GPUSHIM_* configuration: one table of variables (config.cpp) is the single source of truth for
// parsing, error messages and the README table (tests check the README against it).
#pragma once

#include <csignal>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/fault_spec.h"
#include "config/torch_alloc.h"

namespace gpushim {

enum class PolicyKind { kPassthrough, kCaching, kVmm };
const char* policy_name(PolicyKind p);

// A per-device cap: absolute bytes or a fraction of the device's capacity.
struct LimitSpec {
  uint64_t bytes = 0;    // 0 and percent == 0: no limit
  double percent = 0;    // (0, 100]
  bool active() const { return bytes != 0 || percent != 0; }
  uint64_t resolve(uint64_t capacity) const {
    if (bytes) return bytes;
    if (percent) return static_cast<uint64_t>(static_cast<double>(capacity) * percent / 100.0);
    return 0;
  }
};

struct Config {
  PolicyKind policy = PolicyKind::kCaching;
  unsigned stack_depth = 32;        // 0 turns capture off
  std::string report_template;      // "" -> gpushim.<exe>.<pid>.json
  bool report_enabled = true;       // GPUSHIM_REPORT=off
  unsigned summary_sites = 5;       // 0 turns the stderr summary off
  LimitSpec limit;                  // GPUSHIM_LIMIT
  unsigned sample_ms = 100;         // time-series sampling interval
  // Caching pool knobs (defaults measured in bench/, reasons in docs/policies.md).
  uint64_t round_bytes = 512;
  uint64_t small_segment = 2ull << 20;
  uint64_t large_segment = 20ull << 20;
  uint64_t max_split = UINT64_MAX;  // none
  uint64_t quarantine_bytes = 256ull << 10;  // cudaFree'd bytes per reuse epoch (policy/reuse_rules.h)
  // GPUSHIM_VMM_REUSE: vmm builds from free memory its stream may reuse (true), or from idle memory
  // only (false: the pool before 2026-11-27, which traces recorded earlier replay with).
  bool vmm_stream_order_builds = true;
  // Live outputs (docs/metrics-and-snapshots.md).
  std::string metrics_template;     // GPUSHIM_METRICS; "" = off
  int snapshot_signal = SIGUSR2;    // GPUSHIM_SNAPSHOT_SIGNAL; 0 = off
  // Python frames and growth (docs/python.md).
  bool python_stacks = true;        // GPUSHIM_PYTHON_STACKS
  std::string iteration_site;       // GPUSHIM_ITERATION_SITE, "" for none
  TorchAlloc torch_alloc = TorchAlloc::kAsync;  // GPUSHIM_TORCH_ALLOC (config/torch_alloc.h)
  FaultSpec fail;                   // GPUSHIM_FAIL: allocations failed on purpose
  // Allocations at least this large get a driver segment of their own (exact legacy IPC); 0: off.
  uint64_t own_segment_min = 0;
  // GPUSHIM_TRACE: record every allocation event to a binary trace (docs/trace-format.md).
  bool trace_enabled = false;
  std::string trace_template;       // "" -> gpushim.<exe>.<pid>.trace
  // A CI verdict (GPUSHIM_EXIT_CODE): the status a run that exits 0 gets instead when it ends with
  // growth suspects, invalid frees, or more than exit_leak_bytes of device memory live (UINT64_MAX: no
  // such check). 0 = off.
  int exit_code = 0;
  uint64_t exit_leak_bytes = UINT64_MAX;
};

struct ConfigError {
  std::string variable;
  std::string value;
  std::string accepted;  // what the variable takes; for an unknown name, the known names
  bool unknown_name = false;
  std::string message() const;  // one line, ready for log_line
};

struct ConfigResult {
  Config config;
  std::vector<ConfigError> errors;
  // Accepted settings that the chosen pool does not have (GPUSHIM_MAX_SPLIT under vmm): one line
  // each, ready for log_line. They do not turn the shim off, since a job that sweeps policies keeps
  // one environment, but the user must not believe they act.
  std::vector<std::string> inert;
  bool ok() const { return errors.empty(); }
};

// Parses every GPUSHIM_* entry of `env` ("NAME=value" strings, like environ). Unknown GPUSHIM_*
// names are errors too, so typos never silently do nothing.
ConfigResult parse_config(const char* const* env);
ConfigResult parse_config(const std::vector<std::pair<std::string, std::string>>& vars);

struct ConfigVariableDoc {
  std::string name;
  std::string accepted;
  std::string default_value;
  std::string description;
};
// The table behind the README's variable list, in documentation order.
std::vector<ConfigVariableDoc> config_variable_docs();

}  // namespace gpushim
