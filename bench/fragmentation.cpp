// Utilization on fragmentation workloads (bench/workloads.h), replayed through cudaMalloc/cudaFree.
// Prints one JSON line per workload with:
//   peak_requested      the most bytes the program held at once (its own count)
//   peak_device_used    the most device memory in use after any call, as the device counts it
//                       (simulated device only: fakecudaDeviceUsedBytes; 0 elsewhere)
//   shim_peak_allocated / shim_peak_reserved   the shim's peaks (gpushim_get_device_stats), when
//                       run under the preload
//   driver_allocs / driver_frees / device_syncs   calls the workload caused at the simulated
//                       driver: allocations (cuMemAlloc, cuMemCreate), releases (cuMemFree,
//                       cuMemRelease) and device-wide synchronizations, explicit or implied by
//                       cuMemFree and cuMemUnmap (0 on a GPU: the counters are the simulator's)
// so that utilization can be compared across policies and against no shim at all:
//   device utilization = peak_requested / peak_device_used
//   shim utilization   = shim_peak_allocated / shim_peak_reserved (what the report calls it)
//
// Each workload runs in a process of its own (peaks are per process).
// Usage: fragmentation <workload> [scale] [seed]   (workloads: see workload_names())
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "simulated_device.h"
#include "support/test_support.h"
#include "workloads.h"

namespace {

size_t device_used() { return gpushim_bench::simulated_device_used(0); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <workload> [scale] [seed]; workloads:", argv[0]);
    for (const auto& n : gpushim_bench::workload_names()) std::fprintf(stderr, " %s", n.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }
  const std::string name = argv[1];
  const int scale = argc > 2 ? std::atoi(argv[2]) : 40;
  const uint32_t seed = argc > 3 ? static_cast<uint32_t>(std::atoi(argv[3])) : 7;
  const gpushim_bench::EventSequence seq = gpushim_bench::make_workload(name, scale, seed);
  if (seq.events().empty()) {
    std::fprintf(stderr, "unknown workload %s\n", name.c_str());
    return 2;
  }
  CHECK(cudaFree(nullptr));
  const size_t base_used = device_used();  // the context's own memory, if the device charges any
  const unsigned long long base_allocs = gpushim_bench::simulated_driver_allocs(),
                           base_frees = gpushim_bench::simulated_driver_frees(),
                           base_syncs = gpushim_bench::simulated_device_syncs();
  std::vector<void*> slots(seq.slots(), nullptr);
  std::vector<uint64_t> sizes(seq.slots(), 0);
  uint64_t held = 0, peak_held = 0, peak_used = 0;
  for (const auto& ev : seq.events()) {
    if (ev.alloc) {
      CHECK(cudaMalloc(&slots[ev.slot], ev.size));
      sizes[ev.slot] = ev.size;
      held += ev.size;
      peak_held = std::max(peak_held, held);
      peak_used = std::max<uint64_t>(peak_used, device_used() - base_used);
    } else {
      CHECK(cudaFree(slots[ev.slot]));
      held -= sizes[ev.slot];
    }
  }
  const unsigned long long allocs = gpushim_bench::simulated_driver_allocs() - base_allocs,
                           frees = gpushim_bench::simulated_driver_frees() - base_frees,
                           syncs = gpushim_bench::simulated_device_syncs() - base_syncs;
  gpushim_device_stats st{};
  const bool shim = testsupport::shim_stats(0, &st);
  std::printf("{\"workload\":\"%s\",\"events\":%zu,\"peak_requested\":%llu,\"peak_device_used\":%llu,"
              "\"shim\":%s,\"shim_peak_allocated\":%llu,\"shim_peak_reserved\":%llu,\"reuse_syncs\":%llu,"
              "\"driver_allocs\":%llu,\"driver_frees\":%llu,\"device_syncs\":%llu}\n",
              name.c_str(), seq.events().size(), static_cast<unsigned long long>(peak_held),
              static_cast<unsigned long long>(peak_used), shim ? "true" : "false",
              shim ? st.peak_allocated_bytes : 0ull, shim ? st.peak_reserved_bytes : 0ull,
              shim ? st.reuse_syncs : 0ull, allocs, frees, syncs);
  return 0;
}
