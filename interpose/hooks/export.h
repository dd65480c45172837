// What every hook file needs to define an entry point: the shim exports only the CUDA functions
// it intercepts and gpushim_* (exports.map enforces it; this makes each one visible to it).
#pragma once

#define GPUSHIM_EXPORT extern "C" __attribute__((visibility("default")))
