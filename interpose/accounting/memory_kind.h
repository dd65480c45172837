// What kind of memory an allocation is: the report keeps each kind apart.
#pragma once

#include <cstdint>

namespace gpushim {

enum class MemoryKind : uint8_t {
  kDevice = 0,    // device memory of this process (cudaMalloc, cuMemAlloc, device cuMemCreate, ...)
  kManaged = 1,   // cudaMallocManaged / cuMemAllocManaged
  kHost = 2,      // pinned host memory (cudaMallocHost, cuMemHostAlloc, host-located cuMemCreate)
  kGraph = 3,     // graph memory (cuGraphAddMemAllocNode, stream-ordered allocation during capture)
  kImported = 4,  // memory another process exported to us (cuMemImportFromShareableHandle)
};
constexpr int kMemoryKinds = 5;

const char* memory_kind_name(MemoryKind k);

// Kinds that occupy memory of one of this process's devices, i.e. that the driver charges to it and
// GPUSHIM_LIMIT counts. Imported memory is charged to its exporter.
inline bool on_device(MemoryKind k) { return k == MemoryKind::kDevice || k == MemoryKind::kGraph; }

}  // namespace gpushim
