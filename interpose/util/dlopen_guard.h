// Every dlopen and dl_iterate_phdr the shim makes goes through here. fork() while another thread is
// inside one gives the child the loader's lock held (glibc 2.36 resets dl_load_lock in the child,
// not the write lock dl_iterate_phdr and dlopen take) or its state half changed, and the child's
// own dlopen then hangs or crashes (a DataLoader worker importing a module, say). The shim's
// loader work happens at moments the program did not choose (the first CUDA call, a snapshot's
// symbolization), so the preload front makes fork wait for it (front/front_api.h); without a
// front these are the plain calls.
#pragma once

#include <dlfcn.h>

namespace gpushim {

namespace dlopen_guard_internal {
// Set once by attach_front, before any hook runs.
inline void (*g_enter)() = nullptr;
inline void (*g_leave)() = nullptr;
}  // namespace dlopen_guard_internal

inline void set_dlopen_guard(void (*enter)(), void (*leave)()) {
  dlopen_guard_internal::g_enter = enter;
  dlopen_guard_internal::g_leave = leave;
}

// Loader work in progress, for its scope: a fork() waits for it to end.
class LoaderScope {
 public:
  LoaderScope() {
    if (dlopen_guard_internal::g_enter != nullptr) dlopen_guard_internal::g_enter();
  }
  ~LoaderScope() {
    if (dlopen_guard_internal::g_leave != nullptr) dlopen_guard_internal::g_leave();
  }
  LoaderScope(const LoaderScope&) = delete;
  LoaderScope& operator=(const LoaderScope&) = delete;
};

inline void* guarded_dlopen(const char* file, int flags) {
  const LoaderScope scope;
  return dlopen(file, flags);
}

}  // namespace gpushim
