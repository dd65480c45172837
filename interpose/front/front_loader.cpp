// The front's one job: find libgpushim-core.so next to itself and load it at the first CUDA call,
// so that a process that never calls CUDA maps nothing but this small library (issue 30: the C++
// runtime, Abseil and the core's constructors doubled the start-up of /bin/true).
//
// Should the core fail to load (a copied libgpushim.so without its core, say), every call goes to
// the real CUDA function unobserved, after one line on stderr: never a crash, never a wrong answer.
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "front/front.h"
#include "public/gpushim.h"
#include "util/version.h"  // the tag `gpushim --version` reads from the preloaded file

namespace {

#define GPUSHIM_FRONT_SYMBOL(index, name) #name,
const char* const kNames[] = {
#include "front_symbols.inc"
};
#undef GPUSHIM_FRONT_SYMBOL

using DlsymFn = void* (*)(void*, const char*);

DlsymFn g_real_dlsym = nullptr;
GpushimCoreSubstitute g_substitute = nullptr;
int g_loaded = 0;  // 1: the slots hold their final values
int g_warned = 0;
// Where the core is, fixed at load time: LD_PRELOAD may name this library by a relative path, and
// the program may change directory before its first CUDA call.
char g_core_path[PATH_MAX];

void* no_dlsym(void*, const char*) { return nullptr; }

// glibc 2.34 moved dlsym into libc and gave it a new version; older ones only have the base
// version of their architecture (2.2.5 on x86-64, 2.17 on aarch64).
DlsymFn find_real_dlsym() {
  static const char* const kVersions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
  for (const char* version : kVersions)
    if (void* f = dlvsym(RTLD_NEXT, "dlsym", version)) return reinterpret_cast<DlsymFn>(f);
  return &no_dlsym;
}

// Called by the core for the symbols after the preload: RTLD_NEXT from here, as the front is what
// LD_PRELOAD placed in the global scope.
void* next_symbol(const char* name, const char* version) {
  if (version != nullptr) return dlvsym(RTLD_NEXT, name, version);
  return gpushim::front::real_dlsym(RTLD_NEXT, name);
}

// The core's hot per-thread state (front_api.h): initial-exec in the preloaded front, so it is part
// of every thread's static TLS from the start.
__attribute__((tls_model("initial-exec"), aligned(16))) thread_local unsigned char
    t_core_block[kGpushimFrontThreadBlockBytes];

// What the core is lent, filled by the constructor (before any call can reach the front) and only
// read after.
GpushimFront g_table;

// What a function answers when neither the core nor CUDA has it: CUDA's "unknown error" (999 in
// both the runtime's and the driver's numbering), or the public API's "shim not active".
int unavailable() { return 999; }
int no_device_stats(int, gpushim_device_stats*) { return -1; }
unsigned long long no_count() { return 0; }

void* inactive_answer(const char* name) {
  if (strcmp(name, "gpushim_get_device_stats") == 0) return reinterpret_cast<void*>(&no_device_stats);
  return reinterpret_cast<void*>(&no_count);
}
bool is_public_api(const char* name) { return strncmp(name, "gpushim_", 8) == 0; }

void warn_once(const char* why) {
  if (__atomic_exchange_n(&g_warned, 1, __ATOMIC_ACQ_REL) != 0) return;
  char line[PATH_MAX + 256];
  const int n = snprintf(line, sizeof line, "gpushim: cannot load %s (%s): CUDA calls go to CUDA unobserved\n",
                         g_core_path[0] ? g_core_path : kGpushimCoreLibrary, why ? why : "unknown error");
  if (n > 0) (void)!write(2, line, static_cast<size_t>(n) < sizeof line ? n : sizeof line - 1);
}

// Appends `n` bytes of `s` to g_core_path at *at; false when the path would not fit.
bool append(size_t* at, const char* s, size_t n) {
  if (*at + n >= sizeof g_core_path) return false;
  memcpy(g_core_path + *at, s, n);
  *at += n;
  g_core_path[*at] = '\0';
  return true;
}

__attribute__((constructor)) void find_core() {
  // The block's offset from the thread pointer is fixed at load time, the same for every thread.
  g_table = GpushimFront{sizeof(GpushimFront), &gpushim::front::real_dlsym, &next_symbol,
                         reinterpret_cast<char*>(t_core_block) - static_cast<char*>(__builtin_thread_pointer()),
                         kGpushimFrontThreadBlockBytes};
  const char* self = gpushim::front::own_file_name();
  const char* slash = self ? strrchr(self, '/') : nullptr;
  // Found by the loader's search without a folder in its name: the core lies where the loader
  // searches (LD_LIBRARY_PATH, the runpath), so its bare name finds it the same way (empty path).
  if (slash == nullptr) return;
  size_t at = 0;
  bool ok = true;
  if (self[0] != '/') {
    char cwd[PATH_MAX];
    ok = getcwd(cwd, sizeof cwd) != nullptr && append(&at, cwd, strlen(cwd)) && append(&at, "/", 1);
  }
  ok = ok && append(&at, self, static_cast<size_t>(slash - self) + 1) &&
       append(&at, kGpushimCoreLibrary, sizeof kGpushimCoreLibrary - 1);
  if (!ok) g_core_path[0] = '\0';  // too long: the bare name, found by the loader's search if at all
}

}  // namespace

extern "C" {
// The trampolines' targets (front_trampolines.cpp), null until the core is loaded.
__attribute__((visibility("hidden"))) void* gpushim_front_slots[GPUSHIM_FRONT_SYMBOLS];

// The first call of a trampoline whose slot is empty: the target to jump to, all arguments intact.
__attribute__((visibility("hidden"))) void* gpushim_front_resolve(unsigned index) {
  const char* name = kNames[index];
  // The public API answers "not active" until the first CUDA call loaded the core: a program
  // marking iterations on a machine without a GPU loads nothing.
  if (is_public_api(name) && __atomic_load_n(&g_loaded, __ATOMIC_ACQUIRE) == 0) return inactive_answer(name);
  gpushim::front::load_core();
  return __atomic_load_n(&gpushim_front_slots[index], __ATOMIC_ACQUIRE);
}
}

namespace gpushim::front {

void* real_dlsym_function() {
  DlsymFn fn = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
  if (fn == nullptr) {
    fn = find_real_dlsym();
    __atomic_store_n(&g_real_dlsym, fn, __ATOMIC_RELEASE);
  }
  return reinterpret_cast<void*>(fn);
}

void* real_dlsym(void* handle, const char* name) {
  return reinterpret_cast<DlsymFn>(real_dlsym_function())(handle, name);
}

const char* own_file_name() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&own_file_name), &info) == 0) return nullptr;
  return info.dli_fname;
}

bool is_exported_function(const char* name) {
  for (const char* n : kNames)
    if (strcmp(n, name) == 0) return true;
  return false;
}

GpushimCoreSubstitute load_core() {
  if (__atomic_load_n(&g_loaded, __ATOMIC_ACQUIRE) != 0) return __atomic_load_n(&g_substitute, __ATOMIC_ACQUIRE);
  void* core = dlopen(g_core_path[0] ? g_core_path : kGpushimCoreLibrary, RTLD_NOW | RTLD_LOCAL);
  if (core == nullptr) {
    warn_once(dlerror());
  } else {
    auto attach = reinterpret_cast<GpushimCoreAttach>(real_dlsym(core, kGpushimCoreAttach));
    if (attach == nullptr || attach(&g_table) != 0) {
      warn_once("not a gpushim core of this version");
      core = nullptr;
    }
  }
  for (size_t i = 0; i < sizeof kNames / sizeof kNames[0]; ++i) {
    void* f = core != nullptr ? real_dlsym(core, kNames[i]) : nullptr;
    if (f == nullptr) f = is_public_api(kNames[i]) ? inactive_answer(kNames[i]) : next_symbol(kNames[i], nullptr);
    if (f == nullptr) f = reinterpret_cast<void*>(&unavailable);
    __atomic_store_n(&gpushim_front_slots[i], f, __ATOMIC_RELEASE);
  }
  GpushimCoreSubstitute sub =
      core != nullptr ? reinterpret_cast<GpushimCoreSubstitute>(real_dlsym(core, kGpushimCoreSubstitute)) : nullptr;
  __atomic_store_n(&g_substitute, sub, __ATOMIC_RELEASE);
  __atomic_store_n(&g_loaded, 1, __ATOMIC_RELEASE);
  return sub;
}

}  // namespace gpushim::front
