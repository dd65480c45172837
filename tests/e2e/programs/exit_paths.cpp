// Ways a CUDA process ends. Each mode leaks something first, so a report has content to show.
//
// Usage: e2e_exit_paths MODE [THREADS]
//   return          return from main
//   thread-exit     THREADS threads allocate and free without pause; one of them calls exit(0)
//                   while the others keep going
//   runtime-first   an atexit handler registered after the first CUDA call (so it runs before the
//                   shim's) tears the device down with cudaDeviceReset
//   static-dtor     a static object's destructor frees its block after the report was written
//   both            runtime-first and static-dtor together: the late free reaches a reset device
//   _exit           _exit(0) after allocating
//   sigkill         SIGKILL after allocating
//   busy THREADS    THREADS threads allocate and free without pause; main prints "busy" once they
//                   have run a while and waits for a signal (SIGTERM, SIGINT) to end the process
//   own-sigterm     like busy with one thread, but the program handles SIGTERM itself (_exit(9))
//   quick-exit      quick_exit(0) after allocating
//   signal-exit     main allocates and frees without pause until a SIGALRM handler calls exit(0)
//                   (a common way to stop on a timer or on Ctrl-C), usually inside cudaMalloc or
//                   cudaFree
//   signal-exit-in-free  the same handler, while main waits inside cudaFree, which synchronizes
//                   the device while a slow kernel (2 s) still writes the block
//   snapshot-exit   asks for a snapshot (raise(SIGUSR2)) and exits at once
//   exit-at-load    leaks 300 blocks (sites to symbolize), asks for 5 snapshots (SIGUSR2), then
//                   dlopens a plugin (e2e-libs/libe2e_exit_at_load.so) whose constructor calls exit(3)
//   exit-during-slow-load  leaks, then a thread dlopens a plugin (libe2e_slow_load.so) whose
//                   constructor takes 11 s; main asks for a snapshot and returns meanwhile
//   cleanup-after-driver-start  the first CUDA call is the driver's (cuMemAlloc, cuMemFree), then
//                   the runtime starts (cudaGetDeviceCount, which the shim does not hook), then the
//                   program registers an atexit handler that frees a block, then its first runtime
//                   hook allocates that block: the handler runs before the report, which must find
//                   nothing live
//   teardown-probe  no leak: an atexit handler registered before the first CUDA call (so it runs
//                   after the runtime's teardown, which the runtime registers at its first call)
//                   prints whether the primary context of device 0 is still active and, if it is,
//                   what a pool the program made (release threshold max, 100 MiB freed into it)
//                   still reserves: what the teardown ended, for the shim's report to know
//   pthread-exit    main ends with pthread_exit() while a worker allocates and frees, then returns:
//                   the process ends when the worker does (glibc's exit(0) at the last thread)
//   segv / abort    a fatal signal in the host after allocating; with a second argument `wait`,
//                   only once a line arrives on stdin (so a test can first see the allocation in
//                   the trace being written, and then crash the program)
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {

// Constructed before main, so its destructor runs after every atexit handler registered later,
// the shim's report included.
struct LateFreer {
  void* p = nullptr;
  ~LateFreer() {
    if (p == nullptr) return;
    const cudaError_t e = cudaFree(p);
    std::fprintf(stderr, "static destructor: cudaFree returned %s\n", cudaGetErrorName(e));
  }
} g_late;

// A static object whose destructor allocates: it runs after every exit handler, the runtime's
// teardown and the shim's report included, where CUDA's runtime answers cudaErrorCudartUnloading.
struct LateAllocator {
  bool armed = false;
  ~LateAllocator() {
    if (!armed) return;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, 1 << 20);
    std::fprintf(stderr, "static destructor: cudaMalloc returned %s\n", cudaGetErrorName(e));
  }
} g_late_allocator;

__attribute__((noinline)) void* leak_at_exit(size_t bytes) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  CHECK(cudaMemset(p, 1, bytes));
  return p;
}

void teardown_device() {
  const cudaError_t e = cudaDeviceReset();
  std::fprintf(stderr, "atexit: cudaDeviceReset returned %s\n", cudaGetErrorName(e));
}

std::atomic<long> g_ops{0};

void exit_nine(int) { _exit(9); }

void exit_zero(int) { std::exit(0); }

[[noreturn]] void allocate_until_exit(int id, bool exits) {
  std::vector<void*> held;
  unsigned x = 12345u + static_cast<unsigned>(id);
  for (long i = 0;; ++i) {
    x = x * 1103515245u + 12345u;
    if (held.size() < 16 && (x >> 16) % 3 != 0) {
      void* p = nullptr;
      if (cudaMalloc(&p, 1 + (x >> 8) % (1 << 20)) == cudaSuccess) held.push_back(p);
    } else if (!held.empty()) {
      cudaFree(held.back());
      held.pop_back();
    }
    if (exits && ++g_ops > 3000) {
      std::printf("{\"exiting_thread\":%d,\"ops\":%ld}\n", id, g_ops.load());
      std::fflush(stdout);
      std::exit(0);
    }
    if (!exits) g_ops++;
  }
}

void* g_cleaned = nullptr;
void free_at_exit() { std::fprintf(stderr, "atexit: cudaFree returned %s\n", cudaGetErrorName(cudaFree(g_cleaned))); }

int cleanup_after_driver_start() {
  using Init = CUresult (*)(unsigned);
  using Retain = CUresult (*)(CUcontext*, CUdevice);
  CHECK_CU(testsupport::driver_function<Init>("cuInit")(0));
  CUcontext primary = nullptr;
  CHECK_CU(testsupport::driver_function<Retain>("cuDevicePrimaryCtxRetain")(&primary, 0));
  testsupport::make_current(primary);
  const testsupport::Driver& drv = testsupport::driver();
  CUdeviceptr d = 0;
  CHECK_CU(drv.MemAlloc(&d, 1 << 20));  // the shim starts here
  CHECK_CU(drv.MemFree(d));
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));  // the runtime starts (its teardown registered): no call the shim hooks
  std::atexit(free_at_exit);            // runs before the runtime's teardown
  CHECK(cudaMalloc(&g_cleaned, 64 << 20));  // the first runtime hook
  return 0;
}

CUmemoryPool g_probed_pool = nullptr;
void probe_after_teardown() {
  using State = CUresult (*)(CUdevice, unsigned*, int*);
  using PoolAttribute = CUresult (*)(CUmemoryPool, CUmemPool_attribute, void*);
  unsigned flags = 0;
  int active = -1;
  const CUresult state = testsupport::driver_function<State>("cuDevicePrimaryCtxGetState")(0, &flags, &active);
  int pool_status = -1;
  cuuint64_t reserved = 0;
  // A pool its context's end destroyed must not be asked (a real driver may crash).
  if (state == CUDA_SUCCESS && active == 1)
    pool_status = static_cast<int>(testsupport::driver_function<PoolAttribute>("cuMemPoolGetAttribute")(
        g_probed_pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
  std::printf("{\"state\": %d, \"active\": %d, \"pool_status\": %d, \"reserved\": %llu}\n", static_cast<int>(state),
              active, pool_status, static_cast<unsigned long long>(reserved));
  std::fflush(stdout);
}

int teardown_probe() {
  std::atexit(probe_after_teardown);  // before the runtime's first call: runs after its teardown
  cudaMemPool_t pool = testsupport::new_keeping_pool(0);
  g_probed_pool = reinterpret_cast<CUmemoryPool>(pool);
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p = nullptr;
  CHECK(cudaMallocFromPoolAsync(&p, 100 << 20, pool, s));
  CHECK(cudaFreeAsync(p, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamDestroy(s));
  return 0;
}

}  // namespace


int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  if (mode == "cleanup-after-driver-start") return cleanup_after_driver_start();
  if (mode == "teardown-probe") return teardown_probe();
  if (mode == "own-sigterm") signal(SIGTERM, exit_nine);  // before the first CUDA call
  void* kept = leak_at_exit(2 << 20);
  std::printf("{\"leaked\":\"%p\"}\n", kept);
  std::fflush(stdout);
  if (mode == "return") return 0;
  if (mode == "thread-exit") {
    const int threads = argc > 2 ? std::atoi(argv[2]) : 4;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(allocate_until_exit, t, t == threads - 1);
    for (auto& th : pool) th.join();  // never returns: a worker calls exit()
    return 1;
  }
  if (mode == "busy" || mode == "own-sigterm") {
    const int threads = mode == "busy" && argc > 2 ? std::atoi(argv[2]) : 1;
    for (int t = 0; t < threads; ++t) std::thread(allocate_until_exit, t, false).detach();
    while (g_ops.load() < 2000) usleep(1000);
    std::printf("busy\n");
    std::fflush(stdout);
    for (;;) pause();
  }
  if (mode == "quick-exit") std::quick_exit(0);
  if (mode == "signal-exit") {
    signal(SIGALRM, exit_zero);
    itimerval in_50_ms{};
    in_50_ms.it_value.tv_usec = 50 * 1000;
    setitimer(ITIMER_REAL, &in_50_ms, nullptr);
    allocate_until_exit(0, false);
  }
  if (mode == "signal-exit-in-free") {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 1 << 20));
    CHECK(testsupport::delayed_fill(p, 0x5a, 1 << 20, 2000 * 1000, nullptr));
    signal(SIGALRM, exit_zero);
    itimerval in_50_ms{};
    in_50_ms.it_value.tv_usec = 50 * 1000;
    setitimer(ITIMER_REAL, &in_50_ms, nullptr);
    cudaFree(p);
    return 1;  // the handler ended the process first
  }
  if (mode == "exit-at-load") {
    for (int i = 0; i < 300; ++i) leak_at_exit(1000 + i);
    struct sigaction usr2 {};
    sigaction(SIGUSR2, nullptr, &usr2);  // the shim's snapshot handler; without it, its default kills
    if (usr2.sa_handler != SIG_DFL)
      for (int i = 0; i < 5; ++i) raise(SIGUSR2);  // a snapshot is being written when exit() comes
    usleep(1000);
    const std::string plugin = std::string(argc > 2 ? argv[2] : ".") + "/libe2e_exit_at_load.so";
    dlopen(plugin.c_str(), RTLD_NOW);
    return 4;  // the plugin could not be loaded
  }
  if (mode == "exit-during-slow-load") {
    const std::string plugin = std::string(argc > 2 ? argv[2] : ".") + "/libe2e_slow_load.so";
    std::thread([plugin] { dlopen(plugin.c_str(), RTLD_NOW); }).detach();
    usleep(300 * 1000);  // the dlopen holds the loader's lock now
    raise(SIGUSR2);      // the snapshot's symbolization waits for it
    usleep(200 * 1000);
    return 0;
  }
  if (mode == "pthread-exit") {
    std::thread([] {
      usleep(200 * 1000);  // main has ended by now
      void* p = nullptr;
      CHECK(cudaMalloc(&p, 1 << 20));
      CHECK(cudaFree(p));
      std::printf("{\"worker\":\"done\"}\n");
      std::fflush(stdout);
    }).detach();
    pthread_exit(nullptr);
  }
  if (mode == "snapshot-exit") {
    raise(SIGUSR2);
    return 0;
  }
  if (mode == "runtime-first" || mode == "both") std::atexit(teardown_device);
  if (mode == "static-dtor-alloc") {
    g_late_allocator.armed = true;
    CHECK(cudaFree(leak_at_exit(1 << 20)));
    return 0;
  }
  if (mode == "static-dtor" || mode == "both") {
    g_late.p = leak_at_exit(3 << 20);
    return 0;
  }
  if (mode == "runtime-first") return 0;
  if ((mode == "segv" || mode == "abort") && argc > 2 && std::string(argv[2]) == "wait") {
    char line[16];
    if (std::fgets(line, sizeof line, stdin) == nullptr) return 3;
  }
  if (mode == "_exit") _exit(0);
  if (mode == "sigkill") raise(SIGKILL);
  if (mode == "segv") raise(SIGSEGV);
  if (mode == "abort") std::abort();
  return 2;
}
