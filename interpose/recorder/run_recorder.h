// The run's recorder: what a run keeps beyond dispatch, and the outputs made of it. The Shim
// (core/) sequences each CUDA call over the books and the pools, then tells the recorder what
// happened; the recorder keeps the run's history (OOMs, invalid and late frees, what resets freed,
// the timeline, growth checkpoints and the loop's period, what was live at interpreter teardown)
// and writes everything that leaves the process: the trace (GPUSHIM_TRACE, through its tap), the
// live outputs (metrics file, snapshots) and the exit report, with its stderr summary and verdict.
// It never writes a figure of the books (accounting/ does) and never calls CUDA.
//
// One instance, made with the Shim at the first CUDA call and, like it, never destroyed. Its
// per-event entry points (freed, after_event) are on the allocation path: inlined into the Shim's
// one call per event, they cost a few relaxed loads and, when one is due, the sample.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "accounting/allocation_tracker.h"
#include "accounting/checkpoint_schedule.h"
#include "accounting/device_ledger.h"
#include "accounting/driver_usage.h"
#include "accounting/period_detector.h"
#include "accounting/recent_frees.h"
#include "accounting/site_history.h"
#include "accounting/time_series.h"
#include "accounting/vmm_tracker.h"
#include "config/config.h"
#include "live/live_outputs.h"
#include "policy/backend.h"
#include "policy/device_memory_resource.h"
#include "report/report_builder.h"
#include "stacks/module_map.h"
#include "stacks/stack_capturer.h"
#include "stacks/stack_table.h"
#include "util/clock.h"
#include "util/iteration_counter.h"

namespace gpushim {

class TraceTap;

class RunRecorder {
 public:
  // One device of the core's device table, as the recorder reads it.
  struct DeviceView {
    int ordinal = 0;
    const DeviceLedger* ledger = nullptr;
    uint64_t capacity = 0;
  };
  // What the core lends the recorder for the process's life: read-only but for the driver-usage
  // samples (a timeline sample asks for one) and the stack capturer (an invalid free's stack).
  struct Lent {
    const Config* config = nullptr;
    std::string exe;
    int pid = 0;
    uint64_t start_ns = 0;  // the shim's start, on the now_ns clock
    const Ledgers* books = nullptr;
    const StackTable* stacks = nullptr;
    StackCapturer* capturer = nullptr;
    ModuleMap* modules = nullptr;  // not const: a report pins the loaded set first (ModuleMap::view)
    DriverUsage* usage = nullptr;
    const VmmTracker* vmm = nullptr;
    const IterationCounter* iterations = nullptr;
    // Calls its argument for every device the core has made, in ordinal order.
    std::function<void(absl::FunctionRef<void(const DeviceView&)>)> devices;
    // Host memory of the shim's bookkeeping (Shim::host_bytes, the recorder's own included).
    std::function<uint64_t()> host_bytes;
  };

  // Opens the trace when GPUSHIM_TRACE asks for one.
  explicit RunRecorder(Lent lent);
  ~RunRecorder();  // the shim's is never destroyed (like the Shim); a unit test's is
  RunRecorder(const RunRecorder&) = delete;
  RunRecorder& operator=(const RunRecorder&) = delete;

  // ---- the run's start and the device table ----
  // Starts the metrics file and the snapshot signal, as configured (at the first CUDA call).
  void start_live_outputs();
  uint64_t start_ns() const { return lent_.start_ns; }  // the shim's start, on the now_ns clock
  // True while a trace is recorded (its file opened).
  bool tracing() const { return trace_ != nullptr; }
  // A device's pool built to report its segments into the trace; only while tracing().
  std::unique_ptr<DeviceMemoryResource> traced_pool(int ordinal, Backend& capped);
  void device_added(int ordinal, uint64_t capacity, uint64_t limit);

  // ---- per event (the allocation path) ----
  // Always inlined into the core's one call per event (Shim::recorded_*), so that recording costs
  // the hot path one call (two while tracing), as it did when the Shim held this state itself.
  // An allocation the books kept, into the trace (while tracing()). `request` is the size the
  // policy was asked for. The caller then calls after_event.
  void trace_alloc(uintptr_t ptr, const AllocationRecord& rec, uint64_t request, CUstream stream,
                   bool stream_ordered);
  // A free the books accounted (its trace event is the caller's: trace_free): into the window of
  // recent frees (`free_pc`: the return address of the hook that freed it), then a sample if due.
  // `late_check`: counted as late if the exit report was written already (a caller that checked
  // before its real free passes false, having called note_late_free).
  [[gnu::always_inline]] void freed(uint64_t t_ns, uintptr_t ptr, const AllocationRecord& rec, uintptr_t free_pc,
                                    bool late_check) {
    if (late_check) note_late_free();
    recent_frees_.record(ptr, rec.size, rec.stack, free_pc);
    after_event(t_ns);
  }
  void note_late_free() {
    if (reported()) late_frees_.fetch_add(1, std::memory_order_relaxed);
  }
  // A free into the trace (while tracing()).
  void trace_free(uint64_t t_ns, uintptr_t ptr, const AllocationRecord& rec, CUstream stream, bool stream_ordered);
  // Any allocation or free: the timeline's sample and a growth checkpoint when due. Cheap when
  // neither is: relaxed loads, one relaxed add and compares.
  [[gnu::always_inline]] void after_event(uint64_t t_ns) {
    timeline_.maybe_sample(t_ns, [this](auto&& append) { take_samples(append); });
    // Growth on logical time as well as on the clock (accounting/checkpoint_schedule.h).
    // Both asked: a point the iteration count is due for must say so even when the event count
    // wanted one too. Here that is an iteration GPUSHIM_ITERATION_SITE began, the allocation
    // that began it just made; marks take theirs at the mark (iteration_marked).
    const bool by_events = event_checkpoints_.on_event();
    const bool by_iterations = iteration_checkpoints_.due(iterations_.count());
    if (by_events || by_iterations)
      sample_sites(now_ns() - lent_.start_ns,  // `t_ns` may be the coarse clock: a point needs the precise one
                   by_iterations && (iterations_.sources() & IterationCounter::kSite) != 0 ? IterationPoint::kSite
                                                                                           : IterationPoint::kNone);
  }
  // A stack captured for an allocation: the loop's period is looked for in their sequence.
  void stack_captured(StackId id) { periods_.on_allocation(id); }
  // gpushim_mark_iteration() counted mark `n`: a checkpoint if due, and the trace's mark.
  void iteration_marked(uint64_t n);

  // ---- what went wrong ----
  // An allocation refused: one line (rate-limited), the trace's event, and the record the report
  // shows (the first kMaxOomRecords, with the largest sites of that moment). `limit`: the cap.
  void oom(OomRecord rec, uint64_t limit);
  // A free of memory that is not a live allocation: one line with the caller's stack (the first
  // ones only), and the count. `key`: what the books keep it under; `shown`: what the program passed.
  void invalid_free(uintptr_t key, const void* shown, const char* what, const char* returned);
  // A reset or a context's destruction freed `rec` (at `ptr`): per site for the report, and into
  // the trace.
  void freed_by_reset(uintptr_t ptr, const AllocationRecord& rec);
  void device_reset(int ordinal);
  void context_destroyed(int ordinal);
  // True once the exit report was written (teardown news is no longer news).
  bool reported() const { return reported_.load(std::memory_order_relaxed); }
  // The exit report's file exists, whole: what an exit() that interrupts the rest of the exit
  // work (the summary, the trace's end) can still say the run left.
  const char* report_published() const { return report_published_.load(std::memory_order_acquire); }

  // ---- outputs ----
  // The report of the current state (exit or on-demand snapshot).
  ReportData build_report(const char* reason);
  // The exit report file, the stderr summary and the exit verdict, once; later calls do nothing.
  void write_exit_report();
  // The run ends now (a termination signal): the exit report, and the end of the trace.
  void finish_run();
  // The library is unloaded: the report if not written, the trace's end, the late frees' line.
  void on_unload();
  // GPUSHIM_EXIT_CODE: the status that replaces `status` at exit (the program's own if it is not
  // 0, or no verdict failed). Decided when the exit report was written.
  int exit_status(int status) const;
  // The Python interpreter begins its teardown: the exit report's live set, sites and growth are
  // those of this moment.
  void on_interpreter_shutdown();
  // In a fork child: no live thread, no trace, no report; the parent's run is the parent's.
  void abandon_in_fork_child();
  // The figures of every device as the metrics file shows them; cheap (no symbolization).
  std::vector<DeviceMetrics> live_device_metrics() const;
  // Host memory the recorder's own history holds.
  uint64_t host_bytes() const { return site_history_.memory_bytes(); }

 private:
  // Device memory the process uses that no hook saw (context, module images): the driver's used
  // memory at the last usage sample less what we held then; unknown before the first sample.
  // Called from the gpushim-live thread: cheap, and no CUDA call.
  std::optional<uint64_t> unaccounted_bytes(int ordinal) const;
  // At exit: stops the live thread, then writes the metrics file one last time from the exit
  // report's figures (null: no report was built; the live figures then).
  void finish_live_outputs(const ReportData* exit_report);
  // One timeline instant: a sample per device, through `append`.
  void take_samples(absl::FunctionRef<void(const Sample&)> append);
  // Growth tracking: per-site totals at each sampling instant (the report judges them).
  // `at_iteration`: what in the iteration count this point was due for (SitePoint::at_iteration).
  void sample_sites(uint64_t t_ns, IterationPoint at_iteration = IterationPoint::kNone);
  // GPUSHIM_TRACE's end chunk: the figures of every device.
  void finish_trace();

  const Lent lent_;
  const Config& config_;
  const IterationCounter& iterations_;
  TimeSeries timeline_;
  PeriodDetector periods_;                    // the loop structure of unmarked programs
  CheckpointSchedule event_checkpoints_;      // allocation calls and frees
  CheckpointSchedule iteration_checkpoints_;  // iteration marks and GPUSHIM_ITERATION_SITE calls
  SiteHistory site_history_;
  RecentFrees recent_frees_;  // so that a double free can name the allocation and the first free
  std::atomic<uint64_t> invalid_frees_{0};
  std::atomic<uint64_t> late_frees_{0};
  std::atomic<uint64_t> oom_lines_{0};  // real (not injected) out-of-memory errors, for the rate limit
  std::mutex ooms_mu_;
  std::vector<OomRecord> ooms_;
  std::mutex resets_mu_;
  absl::flat_hash_map<SiteKey, SiteTotals> freed_by_reset_;  // under resets_mu_
  std::atomic<uint64_t> resets_[Ledgers::kMaxDevices] = {};  // of each device's primary context
  // Destroyed created contexts that owned memory we tracked, per device.
  std::atomic<uint64_t> context_destroys_[Ledgers::kMaxDevices] = {};
  // What was live when the Python interpreter began its teardown; set once, never freed.
  std::atomic<const LiveSnapshot*> teardown_{nullptr};
  std::string torch_cache_reason_;  // set at start-up: why PyTorch's cache stays in charge
  const std::string start_dir_;     // the working directory at start-up (anchored_at)
  bool abandoned_ = false;          // a fork child's copy
  std::atomic<bool> reported_{false};
  std::string report_path_;                              // written once, before report_published_
  std::atomic<const char*> report_published_{nullptr};  // report_path_, once its file is whole
  std::mutex report_mu_;  // a second exit path waits for the report the first is writing
  std::atomic<uint64_t> exit_report_ns_{0};  // when the exit report's figures were taken (now_ns clock)
  std::atomic<bool> verdict_failed_{false};  // GPUSHIM_EXIT_CODE's conditions held at exit
  std::atomic<bool> trace_finished_{false};
  LiveOutputs live_;
  std::unique_ptr<TraceTap> trace_owner_;
  TraceTap* trace_ = nullptr;  // null unless GPUSHIM_TRACE is on and the file opened
};

}  // namespace gpushim
