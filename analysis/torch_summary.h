// `gpushim-analyze summary --format torch`: torch.cuda.memory_summary()'s table (PyTorch 2.x,
// torch/cuda/memory.py), block for block and unit for unit, so that a PyTorch user reads it as the
// table they know; the shim's own rows follow in a block of their own.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "run_view.h"
#include "trace_reader.h"

namespace gpushim::analysis {

// One statistic of memory_stats(): current, peak, and the totals of its rises and falls. An
// unknown cell (a report does not keep it) is empty and prints "n/a".
struct TorchStat {
  std::optional<uint64_t> current, peak, allocated, freed;
};

// The statistics memory_summary() prints, in its order, as interpose/accounting/torch_stats.h
// defines them for the core and for this tally alike. Pools: PyTorch's, by block size (small: at
// most 1 MiB, its kSmallSize); segments by segment size (small: at most 2 MiB, kSmallBuffer).
//
// Under each policy:
//   caching      every row as PyTorch's native allocator means it: blocks carved from segments
//                (cudaMalloc'd, never grown), non-releasable = the free pieces of segments still
//                partly in use. A free block waiting for its fence (cudaFree's implicit sync) is
//                inactive here; PyTorch keeps a block active only while record_stream uses wait.
//   vmm          segments are runs of adjacent mappings, as PyTorch's expandable segments; all
//                in the large pool. Non-releasable from a trace only: the arena does not tell the
//                core where its blocks lie, so a report says n/a.
//   passthrough  every allocation is CUDA's own: a segment of its own, wholly in use, so reserved
//                equals allocated, segments equal allocations, non-releasable is zero.
// Any policy: allocations a pool forwards to CUDA count with a segment of their own; "Active"
// equals "Allocated"; oversize rows count blocks and segments of at least GPUSHIM_MAX_SPLIT
// under caching (PyTorch's max_split_size), zero otherwise. With GPUSHIM_OWN_SEGMENT_MIN a report has no non-releasable
// figures (the own-segment resource does not place its blocks).
// A report's table equals its run's trace's (a trace cut short has no "cudaMalloc retries": the
// pool's count is in its end chunk), except for cudaMallocPitch's "Requested memory" (the report
// counts width x height, the trace pitch x height: what the policy was asked, which a replay must
// ask again), and under passthrough with several threads allocating at once, peaks that may differ by
// a few blocks: the trace orders CUDA's own allocations by their times, the core's atomics by
// their own order (a pool's operations are numbered in its lock order, which both follow).
// Reports of shims before the figures existed show n/a where their counters hold nothing (no
// byte totals, no pool split, no peaks of counts, no non-releasable figures).
enum TorchMetric {
  kAllocatedBytes,      // "Allocated memory": blocks handed out, policy-rounded
  kActiveBytes,         // "Active memory": the same here (no block waits for a stream after its free)
  kRequestedBytes,      // "Requested memory": what callers asked for
  kReservedBytes,       // "GPU reserved memory": segments held from the driver
  kInactiveSplitBytes,  // "Non-releasable memory": free parts of segments still partly in use
  kAllocation,          // "Allocations"
  kActive,              // "Active allocs"
  kSegment,             // "GPU reserved segments"
  kInactiveSplit,       // "Non-releasable allocs": free pieces of segments still partly in use
  kTorchMetrics
};
enum TorchPool { kAllPools, kLargePool, kSmallPool, kTorchPools };

struct TorchDeviceStats {
  int device = 0;
  std::array<std::array<TorchStat, kTorchPools>, kTorchMetrics> stats;
  // Blocks and segments of at least max_split_size (GPUSHIM_MAX_SPLIT under caching); zero
  // without one, as in PyTorch's default.
  TorchStat oversize_allocations, oversize_segments;
  std::optional<uint64_t> num_ooms, num_alloc_retries;
};

// memory_summary()'s table for one device, exactly as PyTorch lays it out, titled "gpushim"
// where PyTorch's says "PyTorch" (same width).
std::string render_torch_table(const TorchDeviceStats& s);

// One of the shim's rows under the table: `name`, then `value` in the table's width, wrapped at
// spaces onto rows of its own (a GPU's "Unaccounted" sentence was cut off at the border).
std::string torch_table_extra_row(const std::string& name, const std::string& value);

// The statistics of every device: from a trace's events, or from a report (its "torch" figures;
// an older report's counters, the rest n/a). `trace` is null for a report.
std::vector<TorchDeviceStats> torch_stats(const RunView& run, const TraceData* trace);

// The whole view: per device, torch's table, then the shim's rows (policy, cached free memory,
// largest free block, syncs for reuse, peak time, duration, unaccounted memory).
std::string torch_summary(const RunView& run, const TraceData* trace);

}  // namespace gpushim::analysis
