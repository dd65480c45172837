#include "cuda/runtime_last_error.h"

#include <cstdint>

#include "cuda/capture_state.h"
#include "cuda/real_symbols.h"

namespace gpushim {

void set_runtime_last_error(cudaError_t code) {
  const RealRuntime& rt = real_runtime();
  if (rt.cudaMalloc == nullptr || active_captures().load(std::memory_order_acquire) != 0) return;
  if (code == cudaErrorMemoryAllocation) {
    // No device has 2^64 - 1 bytes: the runtime answers with the out-of-memory error and records it.
    void* p = nullptr;
    if (rt.cudaMalloc(&p, SIZE_MAX) == cudaSuccess && p != nullptr && rt.cudaFree) rt.cudaFree(p);
  } else if (code == cudaErrorInvalidValue) {
    // A null out-pointer is refused before anything else happens.
    rt.cudaMalloc(nullptr, 0);
  }
}

}  // namespace gpushim
