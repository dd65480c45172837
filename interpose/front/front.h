// What the pieces of the front share (front/README.md). Nothing here may need the C++ runtime:
// the front is linked as C (interpose/CMakeLists.txt).
#pragma once

#include "front/front_api.h"

namespace gpushim::front {

// glibc's own dlsym, taken with dlvsym so that the front's interposed dlsym cannot recurse.
void* real_dlsym(void* handle, const char* name);
// That function itself, for the tail jump of the interposed dlsym (front_dlsym.cpp).
void* real_dlsym_function();

// The path the dynamic loader gave this library (absolute or as LD_PRELOAD spelled it); null if
// unknown.
const char* own_file_name();

// Chooses PyTorch's allocator in the environment when this library was preloaded
// (torch_routing.cpp). Run at start-up by gpushim_front_init (front_loader.cpp).
void route_torch_allocator();

// Adds NAME=value to the environment, which must not hold NAME yet, as setenv would but without
// its malloc (environment.cpp) while the process has one thread, with setenv otherwise.
void add_to_environment(const char* name, const char* value);

// Loads libgpushim-core.so if no thread has yet, and fills the trampolines' slots. Never holds a
// lock of its own across dlopen (a thread inside dlopen holds the loader's lock while a library
// constructor may call CUDA on it; racing threads each dlopen, which counts references, and store
// the same values); waits only while a fork() is being prepared. Returns the core's substitution
// function, null when the core could not be loaded.
GpushimCoreSubstitute load_core();

// True when `p` lies in this library (one of its own trampolines, say).
bool is_own_address(const void* p);

// True for the names the front exports a trampoline for.
bool is_exported_function(const char* name);

}  // namespace gpushim::front
