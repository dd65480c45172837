// The names our hooks stand in for, so that the two other paths to the real functions hand out
// our hooks instead: a handle-scoped dlsym (which never sees LD_PRELOAD) and cuGetProcAddress
// (how libcudart, and libraries carrying their own static copy of it, reach every driver
// function). Exactly these names: matching "everything starting with cu" would catch cudnn*,
// cublas* and cuda* functions that are not the driver's.
#pragma once

namespace gpushim {

// `real` is what the real cuGetProcAddress returned for some name, version and flags: the exact
// variant it chose (cuMemAlloc_v2, cuMemAllocAsync_ptsz, the 4-argument cuGetProcAddress, ...).
// Returns our hook for exactly that variant, or `real` itself when we do not hook it.
void* substitute_driver_function(void* real);

// A handle-scoped dlsym(handle, name) found `found`. If `found` is libcuda's or libcudart's own
// definition of a name we hook, returns our hook; otherwise `found`. Never calls dlsym itself
// (the caller is our dlsym), never loads a library.
void* substitute_by_name(const char* name, void* found);

}  // namespace gpushim
