// Contexts the program destroyed that other threads may still have current.
//
// cuCtxDestroy leaves a context current to every other thread it was current to, and each later
// call there is to be refused (CUDA: "attempting to access ctx from those threads will result in
// the error CUDA_ERROR_CONTEXT_IS_DESTROYED"). The driver itself does not say so to every question:
// on an H200 (driver 580, 2026-11-29, docs/gpu-validation.md run 8) cuCtxGetDevice still answered
// there, so the pools served cudaMallocAsync and took back frees that CUDA's runtime refused (201).
// So the shim keeps its own list, from the hooks that destroy and make contexts (the driver may
// give a new context a destroyed one's handle: making it takes it off the list).
#pragma once

#include <cuda.h>

namespace gpushim {

// cuCtxDestroy of `context` (a context the program made) succeeded.
void note_context_destroyed(CUcontext context);
// A context was made (cuCtxCreate*, cuCtxFromGreenCtx) with this handle.
void note_context_made(CUcontext context);
// Was `context` destroyed, and no context made with its handle since? Lock-free while the program
// has destroyed none. A context destroyed long ago may be forgotten (the list keeps the latest
// few hundred): then only the driver's own refusal tells.
bool context_destroyed(CUcontext context);

}  // namespace gpushim
