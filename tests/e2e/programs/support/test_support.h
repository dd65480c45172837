// Shared by the end-to-end programs. Everything here works on the simulated device and, unchanged,
// on a real GPU: test-only entry points are looked up at run time, never linked.
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "public/gpushim.h"

#define CHECK(x)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace testsupport {

// A kernel that waits `delay_us` in stream order, then fills `bytes` at `dst` with `value`: the
// simulated device exports it; on a GPU it comes from libgpushim_testkernels.so (tests/gpu). Null
// where neither has it.
using DelayedFillFn = int (*)(void*, int, size_t, unsigned, cudaStream_t);
inline DelayedFillFn find_delayed_fill() {
  static const DelayedFillFn fn = [] {
    void* f = dlsym(RTLD_DEFAULT, "fakecudaLaunchDelayedFill");
    if (f == nullptr) {
      if (void* lib = dlopen("libgpushim_testkernels.so", RTLD_NOW | RTLD_GLOBAL)) {
        f = dlsym(lib, "fakecudaLaunchDelayedFill");
        // CUDA loads a kernel at its first launch (lazy loading, the default since CUDA 12), and
        // loading may synchronize the context: a first launch behind a held stream waited forever
        // on an H200 (2026-11-29). So the library's kernels are loaded before anything is held.
        if (auto load = reinterpret_cast<int (*)()>(dlsym(lib, "gpushimTestKernelsLoad"))) load();
      }
    }
    return reinterpret_cast<DelayedFillFn>(f);
  }();
  return fn;
}

inline cudaError_t delayed_fill(void* dst, int value, size_t bytes, unsigned delay_us, cudaStream_t stream) {
  const DelayedFillFn fn = find_delayed_fill();
  if (fn == nullptr) {
    std::fprintf(stderr, "no delayed-fill kernel: run on the simulated device or build tests/gpu\n");
    std::exit(3);
  }
  return static_cast<cudaError_t>(fn(dst, value, bytes, delay_us, stream));
}

// Holds `stream` until `*released` is set: the work queued after this is pending, however long the
// program takes meanwhile (a kernel's delay alone can run out on a busy machine). The program must
// not wait for that stream before it sets the flag.
inline cudaError_t hold_stream_until(cudaStream_t stream, std::atomic<bool>* released) {
  (void)find_delayed_fill();  // loaded now, should the program launch it behind the hold
  return cudaLaunchHostFunc(
      stream,
      [](void* flag) {
        while (!static_cast<std::atomic<bool>*>(flag)->load(std::memory_order_acquire)) sched_yield();
      },
      released);
}

// Device memory holds `value` in every byte (read in 1 MiB windows); says where it does not.
inline bool holds(const void* p, size_t bytes, unsigned char value) {
  std::vector<unsigned char> buf(std::min<size_t>(bytes, 1 << 20));
  for (size_t off = 0; off < bytes; off += buf.size()) {
    const size_t n = std::min(buf.size(), bytes - off);
    CHECK(cudaMemcpy(buf.data(), static_cast<const char*>(p) + off, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i)
      if (buf[i] != value) {
        std::fprintf(stderr, "byte %zu of %p holds 0x%02x, expected 0x%02x\n", off + i, p, buf[i], value);
        return false;
      }
  }
  return true;
}

// `rounds` plain cudaMalloc + cudaMemset + cudaFree of `bytes` on the current device.
inline void plain_rounds(int rounds, size_t bytes) {
  for (int i = 0; i < rounds; ++i) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, bytes));
    CHECK(cudaMemset(p, i & 0xff, bytes));
    CHECK(cudaFree(p));
  }
}

// A stream-ordered memory pool of the program's own on `device` (device memory, default settings).
inline cudaMemPool_t new_device_pool(int device) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  CHECK(cudaMemPoolCreate(&pool, &props));
  return pool;
}

// One that keeps everything freed into it (release threshold max): what it reserves stays held
// from the driver, beyond what is allocated from it, until it is trimmed or destroyed.
inline cudaMemPool_t new_keeping_pool(int device) {
  cudaMemPool_t pool = new_device_pool(device);
  uint64_t keep = UINT64_MAX;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  return pool;
}

// The shim's figures for `device`, or false when the program runs without the shim.
inline bool shim_stats(int device, gpushim_device_stats* out) {
  using Fn = int (*)(int, gpushim_device_stats*);
  static Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gpushim_get_device_stats"));
  if (fn == nullptr) return false;
  out->struct_size = sizeof(*out);
  return fn(device, out) == 0;
}

// Whether a file whose path contains `name` is mapped into this process (/proc/self/maps).
inline bool mapped(const char* name) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return false;
  char line[4096];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f) != nullptr) found = std::strstr(line, name) != nullptr;
  std::fclose(f);
  return found;
}

}  // namespace testsupport
