// The report as plain data: the recorder fills it (recorder/run_recorder.h), the JSON writer and
// the stderr summary render it, and gpushim-analyze reads the JSON back. docs/report-format.md documents every field.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accounting/memory_figures.h"
#include "accounting/torch_stats.h"
#include "policy/pool_figures.h"
#include "stacks/symbolizer.h"
#include "util/version.h"

namespace gpushim {

// A device's figures: the five of every view (accounting/memory_figures.h; peak_bytes is the JSON's
// peak_allocated_bytes), and what only a device has.
struct DeviceReport : MemoryFigures {
  int device = 0;
  double peak_allocated_at_s = 0;       // seconds since the shim started
  uint64_t peak_reserved_bytes = 0;
  uint64_t failed_allocs = 0;
  uint64_t injected_failures = 0;       // of failed_allocs, failed on purpose by GPUSHIM_FAIL
  uint64_t resets = 0;                  // resets or destructions of its primary context
  uint64_t context_destroys = 0;        // destroyed created contexts that owned tracked memory
  uint64_t capacity_bytes = 0;          // device total as the driver reports it (0 if unknown)
  uint64_t limit_bytes = 0;             // GPUSHIM_LIMIT in bytes (0 = none)
  PoolFigures pool;
  // The driver's view (issue: see every device allocation), from the last sample of cuMemGetInfo.
  bool usage_sampled = false;
  double usage_at_s = 0;                // when sampled, seconds since the shim started
  uint64_t driver_used_bytes = 0;       // total - free as the driver reported it
  uint64_t held_bytes = 0;              // what we saw the process hold from the driver then
  uint64_t unaccounted_bytes = 0;       // driver_used - held (context, module images, rounding, ...)
  // PyTorch's memory_stats() figures (torch_stats.h), at exit; absent from reports of older shims.
  std::optional<torch_stats::Figures> torch;
};

// When the driver's sample was taken, next to the peak the same line invites comparing it with
// ("at the peak", "0.40 s before the peak"): a driver figure from another moment says nothing about
// the memory at the peak. Close in time is not enough: in a quick program every moment is "0.00 s",
// and a sample taken with a quarter of the peak held was called "at the peak". The one wording of
// the report's summary and of gpushim-analyze's.
std::string sample_vs_peak(const DeviceReport& d);

// Memory per module: the library (or executable) whose code called into CUDA; its figures are
// the module row's (accounting/memory_figures.h).
struct ModuleReport : MemoryFigures {
  std::string module;                   // path; "(unknown)" when no loaded module holds the caller
  int device = 0;                       // -1 for kinds not tied to a device (host, managed)
  std::string kind = "device";          // as in sites[].kind
};

// Figures computed from a DeviceReport, so every renderer derives them the same way.
struct DerivedFigures {
  double utilization = 0;             // peak allocated / peak reserved (1 when nothing was reserved)
  // 1 - largest free block / free memory ready for reuse (cached, less what waits for the work
  // before its free): how split up it is; 0 when none is ready. Memory still waiting is not split,
  // and counted in, a pool whose whole cache waited read as 100% fragmented.
  double external_fragmentation = 0;
  uint64_t internal_waste_bytes = 0;  // allocated (rounded) - requested, live now
};
inline DerivedFigures derive(const DeviceReport& d) {
  DerivedFigures f;
  f.utilization = d.peak_reserved_bytes
                      ? static_cast<double>(d.peak_bytes) / static_cast<double>(d.peak_reserved_bytes)
                      : 1.0;
  const uint64_t ready = d.pool.cached_free_bytes > d.pool.quarantined_bytes
                             ? d.pool.cached_free_bytes - d.pool.quarantined_bytes
                             : 0;
  if (ready != 0)
    f.external_fragmentation = 1.0 - static_cast<double>(std::min(d.pool.largest_free_block, ready)) /
                                         static_cast<double>(ready);
  f.internal_waste_bytes = d.live_bytes > d.pool.requested_bytes ? d.live_bytes - d.pool.requested_bytes : 0;
  return f;
}

// Memory that is not device memory proper but passes through the shim: managed and pinned host.
struct OtherMemoryReport : MemoryFigures {
  std::string kind;                     // "managed" or "host"
};

struct SiteReport {
  int device = 0;
  std::string kind = "device";          // "device", "managed" or "host"
  uint64_t live_bytes = 0;
  uint64_t live_count = 0;
  uint32_t stack_id = 0;
  std::vector<FrameInfo> frames;        // innermost first
  // Of the live memory above, what Python's interpreter teardown freed (finalizers run by atexit
  // callbacks and module teardown): still counted live, the program had not let go of it.
  uint64_t shutdown_freed_bytes = 0;
  uint64_t shutdown_freed_count = 0;
  std::string owner;                    // "PyTorch cache": a segment of PyTorch's caching allocator
};

// When the process's Python interpreter began its teardown (interpose/python/interpreter_shutdown.h).
// The exit report's live figures, sites and growth describe that moment.
struct TeardownReport {
  bool observed = false;                // false: no interpreter, or its teardown was not seen
  double began_s = 0;                   // seconds since the shim started
  uint64_t freed_bytes = 0;             // freed by the teardown, of what was live when it began
  uint64_t freed_count = 0;
};

// One point of the allocated/reserved time series (GPUSHIM_SAMPLE_MS).
struct TimelineSample {
  double t_s = 0;  // seconds since the shim started
  int device = 0;
  uint64_t allocated = 0;
  uint64_t reserved = 0;
};

// An allocation the device (or the cap) refused, with what a person needs to act on it.
struct OomReport {
  double t_s = 0;
  int device = 0;
  uint64_t requested = 0;
  uint64_t capacity = 0;        // device total
  uint64_t limit = 0;           // GPUSHIM_LIMIT in bytes, 0 = none
  uint64_t device_free = 0;     // free on the device as the driver saw it
  uint64_t allocated = 0;       // live, handed to callers
  uint64_t reserved = 0;        // held from the driver
  uint64_t cached_free = 0;     // reserved but not allocated
  uint64_t largest_free_block = 0;
  uint64_t cuda_pools_kept = 0;  // of reserved: CUDA's own pools' beyond their allocations (0 from a trace)
  std::string advice;
  bool injected = false;              // failed on purpose by GPUSHIM_FAIL
  std::vector<FrameInfo> frames;      // the failing call
  std::vector<SiteReport> top_sites;  // largest live sites at that moment
};

// A site whose live memory grew steadily through the run (accounting/growth_detector.h): the
// likely leaks, ranked above what is merely live at exit.
struct GrowthSuspectReport {
  int device = 0;
  std::string kind = "device";
  uint64_t growth_bytes = 0;            // live bytes gained since the site's baseline
  double bytes_per_s = 0;               // least-squares growth rate
  double bytes_per_iteration = 0;       // NaN (null in JSON) without iteration counts
  uint64_t iterations = 0;              // iterations counted while the site grew
  uint64_t live_bytes = 0;
  uint64_t live_count = 0;
  uint64_t samples = 0;                 // points the verdict rests on
  double first_s = 0;                   // first and last of those points, seconds since start
  double last_s = 0;
  double trend = 0;                     // Kendall's tau of bytes over time, 0..1
  uint32_t stack_id = 0;
  std::vector<FrameInfo> frames;
  std::string owner;                    // as SiteReport::owner
};

struct GrowthReport {
  uint64_t samples = 0;                 // instants at which every site's totals were sampled
  uint64_t iterations = 0;              // gpushim_mark_iteration() + GPUSHIM_ITERATION_SITE activations
  std::string iteration_source = "none";  // "none", "marks", "site", "marks+site", "detected"
  uint64_t detected_period = 0;         // without marks: allocations per period of the repeating loop, 0 = none
  // Without marks, when the program's step was found inside that period (report/step_finder.h):
  // `iterations` are steps, and the period spans this many of them; 0 = the period is the unit.
  uint64_t steps_per_pattern = 0;
  std::string step_function;            // the function whose calls are the steps
  std::vector<GrowthSuspectReport> suspects;  // largest growth first
  // "suspects", "none" (judged: nothing grew), or "not judged" (too little evidence: `evidence`
  // says how much there was, e.g. "3 iterations seen, 8 needed"). Never "none" on thin evidence.
  std::string verdict = "not judged";
  std::string evidence;
};

struct ReportData {
  std::string schema = "gpushim-report/1";
  std::string version = kVersion;       // the gpushim release that wrote it
  int pid = 0;
  std::string exe;
  std::string host;
  std::string rank;                     // the RANK variable, "" when unset
  std::string policy;
  std::string reason = "exit";          // "exit" or "snapshot"
  double wall_time_s = 0;               // wall clock at report time, seconds since the epoch
  double duration_s = 0;                // since the shim started
  int stack_depth = 0;
  // One line when PyTorch's caching allocator was in charge (the user's setting kept it): its
  // segments, not the program's tensors, are what the shim saw. "" otherwise.
  std::string torch_cache;
  std::string python;                   // interpreter version whose frames are captured, "" none, "off", "unsupported: ..."
  std::vector<DeviceReport> devices;
  std::vector<OtherMemoryReport> other_memory;
  GrowthReport growth;
  TeardownReport teardown;
  std::vector<SiteReport> sites;        // largest live bytes first
  // Allocations still live when a reset (cudaDeviceReset, cuDevicePrimaryCtxReset) or the
  // context's destruction freed them, per site; live_* are the bytes and count it freed.
  std::vector<SiteReport> freed_by_reset;
  std::vector<TimelineSample> timeline; // oldest first
  std::vector<OomReport> ooms;          // oldest first (at most the first 16)
  uint64_t invalid_frees = 0;
  uint64_t distinct_stacks = 0;
  uint64_t shim_host_bytes = 0;         // the shim's own bookkeeping memory
  std::vector<ModuleReport> modules;    // device memory first, largest live bytes first
  uint64_t reserved_va_bytes = 0;       // address space held with cuMemAddressReserve (not memory)
};

}  // namespace gpushim
