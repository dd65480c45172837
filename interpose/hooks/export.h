// What every hook file needs to define an entry point: the shim exports only the CUDA functions
// it intercepts and gpushim_* (the version script made from cuda/hooked_symbols.h enforces it;
// this makes each one visible to it). A new hook gets its line in that table too.
#pragma once

#define GPUSHIM_EXPORT extern "C" __attribute__((visibility("default")))
