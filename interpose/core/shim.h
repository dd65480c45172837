// The shim's core: the one object that owns configuration, accounting, stacks and the per-device
// policies. Hooks (hooks/) only translate CUDA calls into calls on this class.
//
// Lifetime: created on the first CUDA call (so processes that never touch CUDA pay nothing: no
// threads, files or output), never destroyed (frees that arrive during teardown stay safe).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "accounting/allocation_tracker.h"
#include "accounting/memory_counters.h"
#include "accounting/time_series.h"
#include "config/config.h"
#include "policy/backend.h"
#include "policy/device_budget.h"
#include "policy/device_memory_resource.h"
#include "policy/fault_injector.h"
#include "report/report_model.h"
#include "stacks/stack_table.h"

namespace gpushim {

constexpr int kMaxDevices = 64;

// Per-device state. Created on first use of the device and never freed.
// The pool's chain is pool -> LimitedBackend (the cap) -> DriverBackend (libcuda).
struct DeviceState {
  int ordinal = 0;
  uint64_t capacity = 0;                        // total device memory, learned at creation
  MemoryCounters counters;                      // device memory handed to callers
  DeviceBudget budget;                          // bytes held from the driver, and the cap
  std::unique_ptr<Backend> driver;
  std::unique_ptr<Backend> limited;
  std::unique_ptr<DeviceMemoryResource> pool;   // null under passthrough
  std::atomic<uint64_t> ooms{0};                // out-of-memory errors returned to callers
  std::atomic<uint64_t> injected_failures{0};   // of those, failed on purpose by GPUSHIM_FAIL
};

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
};

// What a runtime hook hands the core: how to call the real function when forwarding.
enum class DeviceApi : uint8_t { kMalloc, kMallocAsync, kMallocPitch };
// Which free a hook implements: cudaFree-like calls free device and managed memory, cudaFreeHost
// pinned host memory; CUDA refuses the other kind, and so must the core.
enum class FreeApi : uint8_t { kDevice, kHost };

class Shim {
 public:
  // The initialized shim, or null when it is disabled (bad configuration) or being initialized by
  // this very thread (a re-entrant call must simply forward).
  static Shim* get();
  // The shim if it was ever initialized in this process; never initializes.
  static Shim* existing();

  const Config& config() const { return config_; }

  // ---- device memory (runtime API) ----
  // `forward` performs the real call and returns its cudaError_t; used when no pool serves.
  template <typename Forward>
  cudaError_t device_alloc(void** out, size_t size, size_t requested, CUstream stream, bool stream_ordered,
                           Forward&& forward);
  template <typename Forward>
  cudaError_t deallocate(void* ptr, CUstream stream, bool stream_ordered, Forward&& forward,
                         FreeApi api = FreeApi::kDevice);
  cudaError_t mem_get_info(size_t* free, size_t* total);
  // GPUSHIM_FAIL for allocations that reach CUDA without device_alloc (passthrough's pitched
  // allocations): cudaSuccess to proceed, or the injected failure, already accounted.
  cudaError_t inject_if_chosen(uint64_t requested);

  // ---- memory the shim only accounts (managed, pinned host, driver-level) ----
  void record_alloc(MemoryKind kind, int device, void* ptr, uint64_t size, uint64_t requested);
  void record_failure(MemoryKind kind, int device);

  // ---- reports ----
  // Builds the report of the current state (exit or on-demand snapshot).
  ReportData build_report(const char* reason);
  // Writes the report file and the stderr summary once; later calls do nothing.
  void write_exit_report();
  // Figures of `d` as the report shows them (reserved from the pool, or = allocated).
  PoolFigures pool_figures(const DeviceState* d) const;
  // Host memory of the shim's own bookkeeping: stack table, live-allocation index, pool metadata.
  uint64_t host_bytes() const;
  // Called from the library destructor, after everything else.
  void on_unload();

  StackTable& stacks() { return stacks_; }
  AllocationTracker& tracker() { return tracker_; }
  DeviceState* device(int ordinal);  // null for an invalid ordinal; creates it on first use
  const DeviceState* existing_device(int ordinal) const {
    return ordinal >= 0 && ordinal < kMaxDevices ? devices_[ordinal].load(std::memory_order_acquire) : nullptr;
  }

 private:
  Shim(Config config, std::string exe);
  static Shim* slow_init();

  StackId capture_stack();
  DeviceState* current_device_state();
  MemoryCounters& counters_for(MemoryKind kind, int device);
  static bool stream_capturing(CUstream stream);
  void on_oom(DeviceState* d, uint64_t requested, StackId stack, bool injected = false);
  // GPUSHIM_FAIL selected this allocation: account and report it like an OOM (core/shim_faults.cpp).
  cudaError_t injected_failure(DeviceState* d, uint64_t requested, uint64_t number);
  void maybe_sample(uint64_t now) {
    timeline_.maybe_sample(now, [&](auto&& append) { take_samples(append); });
  }
  template <typename Append>
  void take_samples(Append&& append);
  bool pool_contains(const void* ptr) const;
  template <typename Forward>
  cudaError_t unknown_free(void* ptr, Forward&& forward);
  template <typename Forward>
  cudaError_t mismatched_free(void* ptr, const AllocationRecord& rec, Forward&& forward);
  // One line with the caller's stack; counts the invalid free.
  void warn_invalid_free(const void* ptr, const char* what);

  static void fork_prepare();
  static void fork_parent();
  static void fork_child();

  const Config config_;
  const std::string exe_;
  const uint64_t start_ns_;
  int pid_;
  StackTable stacks_;
  AllocationTracker tracker_;
  MemoryCounters managed_;
  MemoryCounters host_;
  std::atomic<DeviceState*> devices_[kMaxDevices] = {};
  std::mutex devices_mu_;  // only for creating DeviceState
  std::atomic<uint64_t> invalid_frees_{0};
  std::atomic<uint64_t> late_frees_{0};
  std::atomic<bool> reported_{false};
  TimeSeries timeline_;
  std::mutex ooms_mu_;
  std::vector<OomRecord> ooms_;
  bool forked_child_ = false;
  FaultInjector faults_;
};

}  // namespace gpushim

#include "core/shim_inl.h"
