// The recorder's tap into GPUSHIM_TRACE: turns what the run records (allocations, frees, OOMs,
// devices, iteration marks, growth checkpoints, the pools' segments) into trace events for the
// writer (trace/trace_recorder.h). The RunRecorder holds one while a trace is recorded and calls in
// after one null check; nothing here touches the books.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "accounting/allocation_tracker.h"
#include "config/config.h"
#include "policy/backend.h"
#include "policy/device_memory_resource.h"
#include "policy/observed_backend.h"
#include "report/report_builder.h"
#include "stacks/stack_table.h"
#include "stacks/symbolizer.h"
#include "trace/trace_recorder.h"

namespace gpushim {

class TraceTap {
 public:
  // Opens the trace file the configuration names and starts its writer. Null, with one line, if
  // the file cannot be made. `start_ns`: the shim's start on the now_ns clock.
  static std::unique_ptr<TraceTap> start(const Config& config, const std::string& exe, int pid, uint64_t start_ns,
                                         const StackTable* stacks, Symbolizer::PythonResolver python);

  // `request` is the size the policy was asked for (differs from rec.requested for pitched memory).
  void alloc(uintptr_t ptr, const AllocationRecord& rec, uint64_t request, CUstream stream, bool stream_ordered);
  void free(uint64_t t_ns, uintptr_t ptr, const AllocationRecord& rec, CUstream stream, bool stream_ordered);
  void oom(const OomRecord& oom);
  void device(int ordinal, uint64_t capacity, uint64_t limit);
  // A device's pool built to report its segments, and to order the trace as the pool orders its
  // work: pool -> observed `capped` backend, inside the ordering wrapper.
  std::unique_ptr<DeviceMemoryResource> traced_pool(const Config& config, int ordinal, Backend& capped);
  void iteration(uint64_t n);
  // A growth checkpoint the history kept, at `t_ns` since start.
  void checkpoint(uint64_t t_ns, uint64_t iteration, unsigned sources);
  // `end_ns` (now_ns clock): the moment the run's exit report describes, so that the report and
  // the trace of one run give the same duration.
  // `teardown_ns`: when the interpreter's teardown began, since the shim's start (0: not seen).
  void finish(std::vector<trace::DeviceTotals> devices, uint64_t end_ns, uint64_t teardown_ns);
  // In a fork child: the parent's trace is the parent's to write.
  void disable_in_child() { recorder_->disable_in_child(); }

 private:
  TraceTap(std::unique_ptr<trace::TraceRecorder> recorder, uint64_t start_ns)
      : recorder_(std::move(recorder)), start_ns_(start_ns) {}
  std::unique_ptr<trace::TraceRecorder> recorder_;
  const uint64_t start_ns_;
  // What traced_pool built around each pool; kept for the process's life, like the pools.
  std::mutex pools_mu_;
  std::vector<std::unique_ptr<SegmentObserver>> tracers_;
  std::vector<std::unique_ptr<Backend>> observed_;
};

}  // namespace gpushim
