// Native code that Python test scripts load with ctypes: allocations from C called by Python, C
// calling back into Python, and a thread that never runs Python. Linked to libcudart like any CUDA
// extension module, so its cudaMalloc calls reach the preloaded shim.
#include <cuda_runtime_api.h>
#include <pthread.h>

#include <cstddef>

#define EXPORT extern "C" __attribute__((visibility("default"), noinline))

// Allocates `bytes` from C; returns the pointer, or null on failure.
EXPORT void* native_alloc_in_c(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
  return p;
}

// Calls back into Python (a ctypes CFUNCTYPE), which allocates; returns what the callback returned.
EXPORT int native_call_back(int (*callback)(void)) {
  const int rc = callback();
  return rc + 0;  // keeps the call a call (no tail call), so this frame is on the callback's stack
}

namespace {
struct ThreadJob {
  size_t bytes;
  void* result;
};
}  // namespace

EXPORT void* native_thread_body(void* arg) {
  auto* job = static_cast<ThreadJob*>(arg);
  job->result = native_alloc_in_c(job->bytes);
  return nullptr;
}

// Allocates `bytes` on a new native thread (one that never runs Python) and waits for it.
EXPORT void* native_thread_alloc(size_t bytes) {
  ThreadJob job{bytes, nullptr};
  pthread_t t;
  if (pthread_create(&t, nullptr, native_thread_body, &job) != 0) return nullptr;
  pthread_join(t, nullptr);
  return job.result;
}
