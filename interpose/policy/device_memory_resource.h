// The interface every pooling policy implements for one device (RMM's device_memory_resource,
// reduced to what a preload needs). Passthrough is the absence of a resource: the core forwards.
//
// Resources compose: a pool sits over a Backend (segments from the real driver, or a simulated
// one for replay), and caps or fault injection wrap the Backend, so a pool never knows about them.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "report/report_model.h"

namespace gpushim {

struct AllocRequest {
  size_t size = 0;
  CUstream stream = nullptr;
  bool stream_ordered = false;  // cudaMallocAsync: reuse follows stream order, not device syncs
};

class DeviceMemoryResource {
 public:
  virtual ~DeviceMemoryResource() = default;

  // On success sets *out and *allocated (the bytes the block occupies, rounding included).
  virtual CUresult allocate(const AllocRequest& req, void** out, uint64_t* allocated) = 0;
  // `p` must be a pointer this resource returned and that is live (the core checks that).
  virtual CUresult deallocate(void* p, CUstream stream, bool stream_ordered) = 0;
  // True if `p` lies inside memory this resource holds from the driver, live or cached; used to
  // refuse frees of interior or already-freed pointers instead of forwarding them to CUDA.
  virtual bool contains(const void* p) const = 0;
  // Reserved/cached/segment figures for the report.
  virtual void figures(PoolFigures* out) const = 0;
  // Gives cached free memory back to the driver (after the synchronization reuse requires).
  virtual void release_cached() = 0;

  // ---- what pointer queries and IPC need to stay truthful (the driver only sees segments) ----
  // True if `p` lies inside a block currently handed out; sets its start and size.
  virtual bool find_block(const void* p, uintptr_t* base, uint64_t* size) const {
    (void)p, (void)base, (void)size;
    return false;
  }
  // Null if legacy CUDA IPC (cuIpcGetMemHandle) on the live block at `block` gives an importing
  // process exactly that block's bytes at the address it maps; otherwise why not, in words that
  // complete "this block is ...". A resource that cannot tell must refuse.
  virtual const char* ipc_export_refusal(const void* block, uint64_t size) const {
    (void)block, (void)size;
    return "carved out of a larger driver allocation: CUDA's handle describes that allocation, so an importing "
           "process would map its start, i.e. other bytes";
  }
};

}  // namespace gpushim
