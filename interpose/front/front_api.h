// The contract between the preload front (libgpushim.so, front/) and the library it loads at the
// first CUDA call (libgpushim-core.so: hooks/ over the core). Plain C types: the front links no C++
// runtime. The core exports the two functions below under these names (gpushim_*, as every export).
#pragma once

#include <stdint.h>

extern "C" {

// What the front lends the core. The core is loaded RTLD_LOCAL, outside the global scope, where
// RTLD_NEXT means nothing useful (glibc searches the loading object's scope): every lookup that
// must find "the definition after the preload" goes through the front, which is in that scope.
struct GpushimFront {
  uint32_t size;  // sizeof(GpushimFront) as the front was built
  // glibc's own dlsym, never the front's interposed one.
  void* (*real_dlsym)(void* handle, const char* name);
  // dlvsym(RTLD_NEXT, name, version) (`version` null: dlsym) as seen from the preloaded front:
  // the libcudart the application bound to.
  void* (*next_symbol)(const char* name, const char* version);
  // A block of static TLS for the core's hot per-thread state (util/thread_block.h): its offset
  // from the thread pointer (the same in every thread) and its size. The front's, because the
  // front is in the initial static TLS and the dlopened core is not.
  intptr_t thread_block_offset;
  uint64_t thread_block_bytes;
  // pthread_atfork for the core: its handlers run from the front's own, registered at start-up.
  // The core must not call pthread_atfork while it is being loaded (glibc's fork holds its handler
  // lock while the front's prepare handler waits for that load to finish: a deadlock), and a fork
  // must never copy a half-done load.
  int (*atfork)(void (*prepare)(), void (*parent)(), void (*child)());
  // Around each dlopen the core makes (util/dlopen_guard.h): fork waits for it to end.
  void (*begin_dlopen)();
  void (*end_dlopen)();
};

// Called once per dlopen of the core, before the front hands out any of its functions; racing
// threads may call it again with the same table. Returns 0 when the core can serve.
using GpushimCoreAttach = int (*)(const GpushimFront* front);
// A handle-scoped dlsym(handle, name) of a name we hook found `found`: our hook in its place when
// `found` is libcuda's or libcudart's own definition, else `found` (hooks/substitution.h).
using GpushimCoreSubstitute = void* (*)(const char* name, void* found);

}  // extern "C"

inline constexpr uint64_t kGpushimFrontThreadBlockBytes = 256;
inline constexpr const char kGpushimCoreLibrary[] = "libgpushim-core.so";
inline constexpr const char kGpushimCoreAttach[] = "gpushim_core_attach";
inline constexpr const char kGpushimCoreSubstitute[] = "gpushim_core_substitute";
