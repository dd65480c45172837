// Shared by the driver-API hook files (driver_api, vmm_api, pointer_api).
#pragma once

#include <cuda.h>

#include "core/call_context.h"
#include "core/shim.h"
#include "hooks/export.h"

// Opens the call's scope: marks the thread as inside a driver hook (so calls the real driver makes
// back into hooked entry points are not counted twice) and remembers who called.
#define GPUSHIM_SCOPE gpushim::CallScope scope(gpushim::HookApi::kDriver, __builtin_return_address(0))

namespace gpushim::driver_hook {

// The shim, when this call is ours to account: not when a runtime hook of ours made it, not when
// the shim is off.
inline Shim* accounting(const CallScope& scope) { return scope.nested_in_runtime_hook() ? nullptr : Shim::get(); }

// A driver function the process's libcuda lacks answers as CUDA does before cuInit.
template <typename F, typename... Args>
CUresult call(F* real, Args... args) {
  return real ? real(args...) : CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace gpushim::driver_hook
