// fork() while another thread's first hooked CUDA call is loading the preload's core
// (interpose/front/). CUDA is started through driver calls the shim does not hook (looked up on a
// libcuda handle: only hooked names load the core), so the core is not loaded yet; a thread then makes the first hooked call while main forks after a delay that
// sweeps the load. The child either makes a hooked call (any answer will do: it must return) or
// dlopens a library it had not loaded (a DataLoader worker importing a module): a fork copying a
// half-done load, or the loader's lock held, crashes or hangs it. Each round runs in a process of its
// own, so that every round's first call loads the core afresh. Prints one JSON line.
//
// Usage: e2e_fork_during_load [rounds] [seconds before a child counts as hung (20)]
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "support/test_support.h"

namespace {

enum Outcome { kOk, kHung, kSetupFailed, kCoreAlreadyLoaded, kCrashed, kOther, kOutcomes };

struct Driver {
  decltype(&cuInit) init;
  decltype(&cuDeviceGet) device_get;
  decltype(&cuDevicePrimaryCtxRetain) retain;
  decltype(&cuCtxSetCurrent) set_current;
  decltype(&cuMemAlloc_v2) alloc;  // the global scope's: the preload's trampoline when preloaded
  decltype(&cuMemFree_v2) free;
};

bool load_driver(Driver* d) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) return false;
  d->init = reinterpret_cast<decltype(d->init)>(dlsym(h, "cuInit"));
  d->device_get = reinterpret_cast<decltype(d->device_get)>(dlsym(h, "cuDeviceGet"));
  d->retain = reinterpret_cast<decltype(d->retain)>(dlsym(h, "cuDevicePrimaryCtxRetain"));
  d->set_current = reinterpret_cast<decltype(d->set_current)>(dlsym(h, "cuCtxSetCurrent"));
  d->alloc = reinterpret_cast<decltype(d->alloc)>(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
  d->free = reinterpret_cast<decltype(d->free)>(dlsym(RTLD_DEFAULT, "cuMemFree_v2"));
  return d->init && d->device_get && d->retain && d->set_current && d->alloc && d->free;
}

int one_round(unsigned delay_us, bool child_dlopens, unsigned hang_s) {
  Driver drv;
  CUdevice dev;
  CUcontext ctx;
  if (!load_driver(&drv) || drv.init(0) || drv.device_get(&dev, 0) || drv.retain(&ctx, dev) || drv.set_current(ctx))
    return kSetupFailed;
  if (testsupport::mapped("libgpushim-core.so")) return kCoreAlreadyLoaded;
  std::thread first([&drv, ctx] {
    drv.set_current(ctx);
    CUdeviceptr d = 0;
    if (drv.alloc(&d, 4096) == CUDA_SUCCESS) drv.free(d);
  });
  if (delay_us != 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
  const pid_t child = fork();
  if (child == 0) {
    alarm(hang_s);  // a hang ends as SIGALRM
    if (child_dlopens) _exit(dlopen("libz.so.1", RTLD_NOW) != nullptr ? 0 : 7);
    CUdeviceptr d = 0;
    (void)drv.alloc(&d, 4096);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  first.join();
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) return kHung;
  if (WIFSIGNALED(status)) return kCrashed;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? kOk : kOther;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 100;
  const unsigned hang_s = argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 20;
  int counts[kOutcomes] = {};
  for (int i = 0; i < rounds; ++i) {
    const pid_t r = fork();
    if (r == 0) _exit(one_round(static_cast<unsigned>(i % 25) * 40, i % 2 == 1, hang_s));
    int status = 0;
    waitpid(r, &status, 0);
    counts[WIFEXITED(status) && WEXITSTATUS(status) < kOutcomes ? WEXITSTATUS(status) : kOther]++;
  }
  std::printf(
      "{\"rounds\": %d, \"ok\": %d, \"hung\": %d, \"setup_failed\": %d, \"core_already_loaded\": %d, "
      "\"crashed\": %d, \"other\": %d}\n",
      rounds, counts[kOk], counts[kHung], counts[kSetupFailed], counts[kCoreAlreadyLoaded], counts[kCrashed],
      counts[kOther]);
  return 0;
}
