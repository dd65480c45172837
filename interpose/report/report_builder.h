// The report of one moment (the exit report, or an on-demand snapshot), built from read-only
// views of what the shim keeps: the books (accounting/device_ledger.h), the growth history, the
// OOMs and resets it recorded, and the means to name stacks. The recorder gathers these (taking
// the locks they need: recorder/run_recorder.h) and calls build_report; nothing here changes any
// of them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "accounting/device_ledger.h"
#include "accounting/driver_usage.h"
#include "accounting/site_history.h"
#include "accounting/time_series.h"
#include "report/growth_verdict.h"
#include "report/report_model.h"
#include "stacks/module_map.h"
#include "stacks/stack_table.h"
#include "stacks/symbolizer.h"

namespace gpushim {

// An OOM as recorded on the failing path; symbolized only when a report is written.
struct OomRecord {
  uint64_t t_ns;
  int device;
  uint64_t requested;
  uint64_t device_free;
  uint64_t allocated;
  PoolFigures pool;
  StackId stack;
  std::vector<std::pair<StackId, SiteTotals>> top_sites;
  bool injected = false;  // GPUSHIM_FAIL, not a real shortage
  // The error the caller got, in its API's words (a driver-API caller gets no cudaError_t).
  const char* returned = "cudaErrorMemoryAllocation";
};

// The books at one moment: what a report's tables are read from (build_report takes one as it
// starts, before the slow part, symbolizing), and what was live as the Python interpreter began
// its teardown. A device whose pool keeps the records is read whole under that pool's lock (the
// lock rule, accounting/device_ledger.h), so its counters, sites and module rows agree even while
// other threads allocate; the other figures are atomics and the tracker's shards, read one after
// the other within the microseconds this takes.
struct LiveSnapshot {
  uint64_t t_ns = 0;  // since start
  std::vector<std::pair<SiteKey, SiteTotals>> sites;
  std::vector<CounterSnapshot> devices;  // indexed by ordinal; live_count 0 for absent devices
  // The pools' state then (requested, reserved, cached, mapped), so that what the report derives
  // from live and pool figures together (rounding waste) is of one moment. Indexed by ordinal.
  std::vector<PoolFigures> pools;
  // The module rows then, so that "live by module" adds up to the devices' live.
  struct ModuleLive {
    ModuleId id;
    int device;
    MemoryKind kind;
    ModuleSnapshot figures;
  };
  std::vector<ModuleLive> modules;
};

// Reads `books` and `devices` (the devices in use, each at most once) as one moment.
LiveSnapshot read_live_moment(const Ledgers& books, const std::vector<const DeviceLedger*>& devices, uint64_t t_ns);

// One device as the report sees it.
struct DeviceSource {
  const DeviceLedger* ledger;
  uint64_t capacity;
  uint64_t resets;
  uint64_t context_destroys;
};

struct ReportSources {
  // The run.
  int pid = 0;
  std::string exe;
  std::string policy;
  const char* reason = "";
  uint64_t start_ns = 0;  // the shim's start, on the now_ns clock
  int stack_depth = 0;
  std::string fail_spec;  // GPUSHIM_FAIL's text
  // The books, read-only.
  const Ledgers* books = nullptr;
  std::vector<DeviceSource> devices;   // in ordinal order
  const LiveSnapshot* teardown = nullptr;  // set: the program's figures are those of that moment
  const DriverUsage* usage = nullptr;
  // Growth: the history, and what says where the iterations are (report/growth_verdict.h).
  const SiteHistory* history = nullptr;
  GrowthEvidence evidence;
  // Recorded events, copied under their locks.
  std::vector<std::pair<SiteKey, SiteTotals>> freed_by_reset;
  std::vector<Sample> timeline;
  std::vector<OomRecord> ooms;
  uint64_t invalid_frees = 0;
  uint64_t host_bytes = 0;
  uint64_t reserved_va_bytes = 0;
  // Naming stacks and modules.
  const StackTable* stacks = nullptr;
  const ModuleMap* modules = nullptr;
  Symbolizer* symbolizer = nullptr;
  std::string python_status;
  // Why PyTorch's caching allocator stays in charge ("" when it does not: config/torch_alloc.h).
  std::string torch_cache_reason;
};

ReportData build_report(const ReportSources& in);

}  // namespace gpushim
