// Every dlopen, dlclose and dl_iterate_phdr the shim makes goes through here, and so does every
// stack unwind that may walk the loaded objects (stacks/native_stack.cpp). fork() while another thread is
// inside one gives the child the loader's lock held (glibc 2.36 resets dl_load_lock in the child,
// not the write lock dl_iterate_phdr and dlopen take) or its state half changed, and the child's
// own dlopen then hangs or crashes (a DataLoader worker importing a module, say). The shim's
// loader work happens at moments the program did not choose (the first CUDA call, a snapshot's
// symbolization), so the preload front makes fork wait for it (front/front_api.h); without a
// front these are the plain calls.
#pragma once

#include <dlfcn.h>

#include <atomic>

namespace gpushim {

namespace dlopen_guard_internal {
// Set by attach_front, before any hook runs (racing attachers store the same values).
inline std::atomic<void (*)()> g_enter{nullptr};
inline std::atomic<void (*)()> g_leave{nullptr};
}  // namespace dlopen_guard_internal

inline void set_dlopen_guard(void (*enter)(), void (*leave)()) {
  // `leave` first: whoever sees `enter` sees `leave` too (a scope never enters without leaving).
  dlopen_guard_internal::g_leave.store(leave, std::memory_order_relaxed);
  dlopen_guard_internal::g_enter.store(enter, std::memory_order_release);
}

// Loader work in progress, for its scope: a fork() waits for it to end.
class LoaderScope {
 public:
  LoaderScope() {
    if (void (*enter)() = dlopen_guard_internal::g_enter.load(std::memory_order_acquire)) {
      leave_ = dlopen_guard_internal::g_leave.load(std::memory_order_relaxed);
      enter();
    }
  }
  ~LoaderScope() {
    if (leave_ != nullptr) leave_();
  }
  LoaderScope(const LoaderScope&) = delete;
  LoaderScope& operator=(const LoaderScope&) = delete;

 private:
  void (*leave_)() = nullptr;
};

inline void* guarded_dlopen(const char* file, int flags) {
  const LoaderScope scope;
  return dlopen(file, flags);
}

// dlclose too: even one that only drops a RTLD_NOLOAD reference takes the loader's lock, and under
// ThreadSanitizer its interceptor's module-list lock, which a fork child then inherits held (its
// first dlopen hung: e2e.python_stacks, about 1 run in 5 under load).
inline int guarded_dlclose(void* handle) {
  const LoaderScope scope;
  return dlclose(handle);
}

}  // namespace gpushim
