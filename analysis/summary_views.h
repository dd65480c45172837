// The views of `gpushim-analyze summary` for users of other tools (PyTorch's memory_summary()
// table is torch_summary.h): heaptrack's "most allocations" and "temporary allocations" rankings,
// and a caller/callee tree around one site (--site N).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "run_view.h"
#include "trace_reader.h"

namespace gpushim::analysis {

// One site ranked by how it allocates rather than by what it holds.
struct AllocationRank {
  int device = 0;
  std::string kind = "device";
  uint64_t allocs = 0;
  uint64_t bytes = 0;           // allocated over the run
  uint64_t temporary = 0;       // of allocs, freed within the window or the same iteration
  uint64_t temporary_bytes = 0;
  std::vector<FrameInfo> frames;  // innermost first
};

struct AllocationRankings {
  double temporary_ms = 0;
  bool by_iteration = false;  // the trace has iteration marks: same-iteration frees count too
  std::vector<AllocationRank> sites;  // one per symbolized site, unsorted
};

// A site's allocations count as temporary when freed within `temporary_ms`, or (with iteration
// marks) before the next mark.
AllocationRankings rank_allocations(const TraceData& trace, double temporary_ms);

// The callers and callees of the function that site `site` (innermost frame outside the shim and
// the CUDA runtime) allocates from, over every site of the run: the bytes and allocations of each
// path through that function. `weight_of` gives a site's bytes (live, or at peak for traces).
std::string site_tree(const RunView& run, const SiteView& site, bool at_peak, size_t max_depth);

}  // namespace gpushim::analysis
