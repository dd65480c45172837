// Contexts the program destroyed that other threads may still have current.
//
// cuCtxDestroy leaves a context current to every other thread it was current to, and each later
// call there is to be refused (CUDA: "attempting to access ctx from those threads will result in
// the error CUDA_ERROR_CONTEXT_IS_DESTROYED"). The driver itself does not say so to every question:
// on an H200 (driver 580, 2026-11-29, docs/gpu-validation.md run 8) cuCtxGetDevice still answered
// there, so the pools served cudaMallocAsync and took back frees that CUDA's runtime refused (201).
// So the shim keeps its own list, from the hooks that destroy and make contexts. The driver may
// give a new context a destroyed one's handle: making it takes it off the list (a primary context,
// which no hook sees made, is told apart by the caller: device_of_primary_context).
#pragma once

#include <cuda.h>

namespace gpushim {

// Just before cuCtxDestroy of `context` (a context the program made) is forwarded, so that no
// context made meanwhile with the same handle can be listed after it: true if this call listed it.
bool note_context_destroying(CUcontext context);
// A context exists with this handle: made (cuCtxCreate*, cuCtxFromGreenCtx), or its destroy
// failed after note_context_destroying listed it, or found to be a primary context.
void note_context_alive(CUcontext context);
// Was `context` destroyed, and no context made with its handle since? One atomic load while the
// list is empty (a program that destroys no context, or whose destroyed handles were reused), a
// lock-free scan of a few dozen slots otherwise. When more contexts are destroyed than the list
// keeps, the oldest is forgotten: then only the driver's own refusal tells.
bool context_destroyed(CUcontext context);
// context_destroyed, and not a primary context the driver has made since with the handle (no
// hook sees one made: found so, it is taken off the list). What the allocation paths ask.
bool context_known_destroyed(CUcontext context);

}  // namespace gpushim
