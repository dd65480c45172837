// Errors the shim returns on its own (a cap or pool out of memory, an injected failure, a refused
// free) must look like the real runtime's to the caller, including what cudaGetLastError and
// cudaPeekAtLastError say afterwards: code that checks the last error instead of the return value
// must see the failure too.
#pragma once

#include <cuda_runtime_api.h>

namespace gpushim {

// Makes the real runtime record `code` as the calling thread's last error, with a call that has
// no other effect. Handles cudaErrorMemoryAllocation and cudaErrorInvalidValue (the codes the shim
// produces itself), and the refusals of a destroyed context (cudaErrorContextIsDestroyed,
// cudaErrorDeviceUninitialized: the runtime says them itself there); does nothing for other
// codes, and nothing while a stream capture is active (a runtime allocation call there could
// invalidate the capture).
void set_runtime_last_error(cudaError_t code);

}  // namespace gpushim
