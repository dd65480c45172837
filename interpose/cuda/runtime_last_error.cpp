#include "cuda/runtime_last_error.h"

#include <cstdint>

#include "cuda/capture_state.h"
#include "cuda/real_symbols.h"

namespace gpushim {

void set_runtime_last_error(cudaError_t code) {
  const RealRuntime& rt = real_runtime();
  if (code == cudaErrorStreamCaptureUnsupported) {
    // Said only while a capture forbids unsafe calls on this thread: the runtime refuses a free for
    // that reason before it looks at the pointer, and records the error (the capture is already
    // invalidated by then).
    if (rt.cudaFree != nullptr) rt.cudaFree(reinterpret_cast<void*>(uintptr_t{1}));
    return;
  }
  if (rt.cudaMalloc == nullptr || active_captures().load(std::memory_order_acquire) != 0) return;
  if (code == cudaErrorMemoryAllocation) {
    // No device has 2^64 - 1 bytes: the runtime answers with the out-of-memory error and records it.
    void* p = nullptr;
    if (rt.cudaMalloc(&p, SIZE_MAX) == cudaSuccess && p != nullptr && rt.cudaFree) rt.cudaFree(p);
  } else if (code == cudaErrorInvalidValue) {
    // A null out-pointer is refused before anything else happens.
    rt.cudaMalloc(nullptr, 0);
  } else if ((code == cudaErrorContextIsDestroyed || code == cudaErrorDeviceUninitialized) && rt.cudaMemGetInfo) {
    // Said for a context that refuses every call (destroyed while current here): a query that
    // changes nothing gets the same refusal, and the runtime records it.
    size_t free = 0, total = 0;
    rt.cudaMemGetInfo(&free, &total);
  }
}

}  // namespace gpushim
