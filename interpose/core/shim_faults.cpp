// The core's side of GPUSHIM_FAIL: an allocation the FaultInjector selected fails here, before any
// pool or the real runtime sees it, and is accounted and reported like a real out-of-memory error.
#include "core/shim.h"
#include "cuda/runtime_last_error.h"
#include "util/log.h"
#include "util/units.h"

namespace gpushim {
namespace {
// Enough lines to see what is failing; a random:0.5 run over millions of calls must not flood stderr.
constexpr uint64_t kLoggedInjections = 16;
}  // namespace

cudaError_t Shim::inject_if_chosen(uint64_t requested) {
  if (!faults_.active() || requested == 0) return cudaSuccess;
  DeviceState* d = current_device_state();
  if (d == nullptr) return cudaSuccess;
  const uint64_t number = faults_.select(requested);
  return number != 0 ? injected_failure(d, requested, number) : cudaSuccess;
}

CUresult Shim::driver_inject_if_chosen(int device, uint64_t requested) {
  // Size 0 is CUDA's own CUDA_ERROR_INVALID_VALUE: never turned into an out-of-memory error.
  if (!faults_.active() || requested == 0) return CUDA_SUCCESS;
  DeviceState* d = this->device(device);
  if (d == nullptr) return CUDA_SUCCESS;
  const uint64_t number = faults_.select(requested);
  if (number == 0) return CUDA_SUCCESS;
  // The driver keeps no last error: the code returned is all the caller gets.
  note_injected_failure(d, requested, number, "CUDA_ERROR_OUT_OF_MEMORY");
  return CUDA_ERROR_OUT_OF_MEMORY;
}

cudaError_t Shim::injected_failure(DeviceState* d, uint64_t requested, uint64_t number) {
  note_injected_failure(d, requested, number, "cudaErrorMemoryAllocation");
  set_runtime_last_error(cudaErrorMemoryAllocation);
  return cudaErrorMemoryAllocation;
}

void Shim::note_injected_failure(DeviceState* d, uint64_t requested, uint64_t number, const char* returned) {
  const StackId stack = capture_stack();
  d->counters.on_failed();
  d->injected_failures.fetch_add(1, std::memory_order_relaxed);
  const uint64_t nth_injection = faults_.injected();
  if (nth_injection <= kLoggedInjections)
    log_line("injected allocation failure (GPUSHIM_FAIL=%s): allocation %llu, %s on device %d; returned %s%s",
             faults_.spec().text.c_str(), static_cast<unsigned long long>(number), format_bytes(requested).c_str(),
             d->ordinal, returned,
             nth_injection == kLoggedInjections ? " (further injections are counted in the report only)" : "");
  on_oom(d, requested, stack, /*injected=*/true);
}

}  // namespace gpushim
