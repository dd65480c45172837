// Streams of one device ordering memory of another, and a pooled block freed inside a capture:
// what CUDA does, the shim must too (found by a review helper, 2026-11-27; test_stream_devices.py).
// Usage: e2e_cross_device_streams CASE [STEPS: program_ctx_only*, 40]. Prints one JSON line; exit 2 when
// the memory is wrong.
// foreign_ctx_stream/control and destroy_*_device print the peak reserved of plain-free rounds (a
// non-blocking stream of a program-made context, or a destroyed stream of another device, made
// every fence of the device fail until 2026-11-27; test_stream_devices.py checks both);
// foreign_ctx_fence*, foreign_ctx_oom*, foreign_ctx_trim* and legacy_*_program_ctx whether a block
// such a stream still wrote was handed out again before that stream's work ended (the pools'
// synchronization covers the primary context only, and a context's legacy stream shares its handle
// with every other's: all but the fence cases corrupted memory until 2026-11-27).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {
constexpr size_t kMiB = 1 << 20;
// Rounds of cudaMalloc + cudaMemset + cudaFree of 64 MiB after a stream or context went: where
// every later fence failed, a pool held each round's block, 640 MiB, five times the tests' bound
// of 128 MiB (100 rounds until 2026-11-29: 6.4 GB of memsets a run, 41 CPU-seconds of the normal
// stage for nothing more).
constexpr int kRounds = 10;

int device_of(void* p) {
  cudaPointerAttributes a{};
  CHECK(cudaPointerGetAttributes(&a, p));
  return a.device;
}

// cudaMallocAsync on a stream of device 1 while device 0 is current: CUDA allocates on the
// stream's device.
int wrong_device() {
  cudaStream_t s1;
  CHECK(cudaSetDevice(1));
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaSetDevice(0));
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, kMiB, s1));
  const int on = device_of(p);
  std::printf("{\"case\": \"wrong_device\", \"device\": %d}\n", on);
  CHECK(cudaFreeAsync(p, s1));
  CHECK(cudaStreamSynchronize(s1));
  return on == 1 ? 0 : 2;
}

// The same through the driver API (forwarded to CUDA's pool under every policy): booked on the
// stream's device, where CUDA allocates it, not the current one.
int wrong_device_driver() {
  cudaStream_t s1;
  CHECK(cudaSetDevice(1));
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaSetDevice(0));
  const testsupport::Driver& D = testsupport::driver();
  CUdeviceptr p = 0;
  CHECK_CU(D.MemAllocAsync(&p, kMiB, reinterpret_cast<CUstream>(s1)));
  const int on = device_of(reinterpret_cast<void*>(p));
  std::printf("{\"case\": \"wrong_device_driver\", \"device\": %d}\n", on);
  CHECK_CU(D.MemFreeAsync(p, reinterpret_cast<CUstream>(s1)));
  CHECK(cudaStreamSynchronize(s1));
  return on == 1 ? 0 : 2;
}

// Device-0 memory freed in the order of device 1's default stream (legacy or per-thread), then
// allocated again on device 0.
int cross_device_default(cudaStream_t dflt, const char* name) {
  CHECK(cudaSetDevice(1));
  CHECK(cudaFree(nullptr));
  CHECK(cudaSetDevice(0));
  // Device 1's work below uses device 0's stream-ordered memory: CUDA's way to allow it (a GPU
  // faults without; under the vmm policy the shim's mappings must get it too).
  cudaMemPool_t pool0 = nullptr;
  CHECK(cudaDeviceGetDefaultMemPool(&pool0, 0));
  cudaMemAccessDesc from_1 = {};
  from_1.location.type = cudaMemLocationTypeDevice;
  from_1.location.id = 1;
  from_1.flags = cudaMemAccessFlagsProtReadWrite;
  CHECK(cudaMemPoolSetAccess(pool0, &from_1, 1));
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, 20 * kMiB, dflt));
  CHECK(cudaStreamSynchronize(dflt));
  CHECK(cudaSetDevice(1));
  CHECK(testsupport::delayed_fill(p, 0xAA, 20 * kMiB, 300000, dflt));  // device 1's stream
  CHECK(cudaFreeAsync(p, dflt));                                        // ordered after the fill
  CHECK(cudaSetDevice(0));
  void* q = nullptr;
  CHECK(cudaMallocAsync(&q, 20 * kMiB, dflt));  // device 0's stream
  CHECK(cudaMemsetAsync(q, 0x33, 20 * kMiB, dflt));
  CHECK(cudaStreamSynchronize(dflt));
  CHECK(cudaSetDevice(1));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaSetDevice(0));
  const bool intact = testsupport::holds(q, 20 * kMiB, 0x33);
  std::printf("{\"case\": \"%s\", \"same_block\": %s, \"intact\": %s}\n", name, q == p ? "true" : "false",
              intact ? "true" : "false");
  return intact ? 0 : 2;
}

// Peer access set up first, as PyTorch and NCCL do at start: device 1 may use device 0's memory
// (cudaDeviceEnablePeerAccess), before anything was allocated on device 0; then device 1's work
// writes device 0's cudaMalloc and cudaMallocAsync memory. Under vmm the pool's first mappings
// must carry the access (a review helper found them without it, the grant dropped for want of
// the device's state).
int peer_access_first() {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  CHECK(cudaSetDevice(1));
  CHECK(cudaFree(nullptr));
  CHECK(cudaDeviceEnablePeerAccess(0, 0));
  CHECK(cudaSetDevice(0));
  void* p = nullptr;
  void* q = nullptr;
  CHECK(cudaMalloc(&p, 4 * kMiB));
  CHECK(cudaMallocAsync(&q, 4 * kMiB, 0));
  CHECK(cudaStreamSynchronize(0));
  CHECK(cudaSetDevice(1));
  CHECK(cudaMemset(p, 0x5A, 4 * kMiB));  // device 1's legacy stream
  CHECK(cudaMemset(q, 0x5A, 4 * kMiB));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaSetDevice(0));
  const bool intact = testsupport::holds(p, 4 * kMiB, 0x5A) && testsupport::holds(q, 4 * kMiB, 0x5A);
  // Device 1's access to the memory, as the driver has it for a mapping (the vmm pool's; -1 where
  // the memory is no mapping), with peer access and after it is disabled again.
  auto access_of_1 = [](void* ptr) {
    using GetAccess = CUresult (*)(unsigned long long*, const CUmemLocation*, CUdeviceptr);
    static auto get = testsupport::driver_function<GetAccess>("cuMemGetAccess");
    CUmemLocation loc = {};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = 1;
    unsigned long long flags = 0;
    return get(&flags, &loc, reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS ? static_cast<long long>(flags) : -1;
  };
  const long long with_peer = access_of_1(q);
  CHECK(cudaSetDevice(1));
  CHECK(cudaDeviceDisablePeerAccess(0));
  CHECK(cudaSetDevice(0));
  const long long without_peer = access_of_1(q);
  CHECK(cudaFree(p));
  CHECK(cudaFree(q));
  std::printf("{\"case\": \"peer_access_first\", \"intact\": %s, \"access_with_peer\": %lld, "
              "\"access_without_peer\": %lld}\n",
              intact ? "true" : "false", with_peer, without_peer);
  return intact ? 0 : 2;
}

void report(const char* name, int dev) {
  gpushim_device_stats st{};
  testsupport::shim_stats(dev, &st);
  std::printf("{\"case\": \"%s\", \"peak_reserved_mib\": %llu, \"reuse_syncs\": %llu}\n", name,
              st.peak_reserved_bytes >> 20, st.reuse_syncs);
}

// A live non-blocking stream in a context the program created on device 0, while the runtime
// (primary context) allocates and frees.
int foreign_ctx_stream(bool with_stream) {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  testsupport::ProgramContext c;
  if (with_stream) {
    c = testsupport::make_program_context();
    testsupport::make_current(c.primary);
  }
  testsupport::plain_rounds(kRounds, 64 * kMiB);
  // The context goes, with its stream, while fences may still hold events made there: they must
  // count as finished, never be asked of the driver again (the strict device would stop here).
  if (with_stream) {
    testsupport::destroy_context(c.context);
    testsupport::make_current(c.primary);
    testsupport::plain_rounds(kRounds, 64 * kMiB);
  }
  report(with_stream ? "foreign_ctx_stream" : "foreign_ctx_control", 0);
  return 0;
}

// A capture begun on a stream of a program-made context while the primary is current, and the
// stream destroyed mid-capture: what it queued before the capture is its tail. The event marking
// it was recorded in the caller's context and failed until 2026-11-27, so the tail was unknown and
// every fence of the device failed until a synchronization (a review helper's reproducer).
// `context_goes`: the context is destroyed instead, its stream still capturing. The capture was
// kept under the caller's context, so it outlived its own: every pool held its memory for good
// (every round of 64 MiB), and the reset at the end destroyed its event, dead with the
// context (the strict device stops there). A review helper's reproducers, 2026-11-27.
int foreign_ctx_capture(bool context_goes) {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  testsupport::ProgramContext c = testsupport::make_program_context();
  testsupport::make_current(c.primary);
  using Begin = CUresult (*)(CUstream, CUstreamCaptureMode);
  CHECK_CU(testsupport::driver_function<Begin>("cuStreamBeginCapture_v2")(c.stream, CU_STREAM_CAPTURE_MODE_RELAXED));
  if (context_goes) {
    testsupport::destroy_context(c.context);
    testsupport::make_current(c.primary);
  } else {
    CHECK_CU(testsupport::driver_function<CUresult (*)(CUstream)>("cuStreamDestroy_v2")(c.stream));
  }
  testsupport::plain_rounds(kRounds, 64 * kMiB);
  report(context_goes ? "foreign_ctx_capture_ctx_gone" : "foreign_ctx_capture", 0);
  if (!context_goes) {
    testsupport::destroy_context(c.context);
    testsupport::make_current(c.primary);
  }
  CHECK(cudaDeviceReset());
  return 0;
}

// Two 8 MiB blocks of device 0 that share one 20 MiB segment, the first freed: returns the second.
void* block_beside_a_freed_one() {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  void *a = nullptr, *p = nullptr;
  CHECK(cudaMalloc(&a, 8 * kMiB));
  CHECK(cudaMalloc(&p, 8 * kMiB));
  CHECK(cudaMemset(p, 0x11, 8 * kMiB));
  CHECK(cudaFree(a));
  return p;
}

// 20 MiB asked after 8 MiB at `p`, which a stream of `c`'s context may still write, was freed: short
// of memory (the pool may not hand `p` out yet) the program synchronizes that context and asks
// again. Then the block is written and read back once both contexts have finished.
struct Reallocated {
  void* q = nullptr;
  bool oom = false, intact = false, overlaps = false;
};
Reallocated reallocate_over(void* p, const testsupport::ProgramContext& c) {
  Reallocated r;
  const cudaError_t got = cudaMalloc(&r.q, 20 * kMiB);
  r.oom = got == cudaErrorMemoryAllocation;
  if (r.oom) {
    (void)cudaGetLastError();
    testsupport::make_current(c.context);
    CHECK_CU(testsupport::driver_function<CUresult (*)()>("cuCtxSynchronize")());
    testsupport::make_current(c.primary);
    CHECK(cudaMalloc(&r.q, 20 * kMiB));
  } else {
    CHECK(got);
  }
  CHECK(cudaMemset(r.q, 0x33, 20 * kMiB));
  CHECK(cudaDeviceSynchronize());
  testsupport::make_current(c.context);
  CHECK_CU(testsupport::driver_function<CUresult (*)()>("cuCtxSynchronize")());
  testsupport::make_current(c.primary);
  r.intact = testsupport::holds(r.q, 20 * kMiB, 0x33);
  r.overlaps = static_cast<char*>(r.q) < static_cast<char*>(p) + 8 * kMiB &&
               static_cast<char*>(p) < static_cast<char*>(r.q) + 20 * kMiB;
  return r;
}

// A block that a stream of a program-made context still writes, freed and handed out again: the
// pool must wait for that stream (live, or destroyed after the free: `destroyed`, its work a tail).
// Two 8 MiB blocks share one 20 MiB segment and are freed, then 20 MiB asked: the new block can
// only lie over the written one. `plain`: the block is freed with cudaFree from the primary
// context, and under GPUSHIM_LIMIT=24M the pools wait for the fence that covers the stream (more
// than CUDA promises: its cudaFree synchronizes the caller's context only). Otherwise it is freed
// in that stream's order (cuMemFreeAsync), as CUDA allows; then memory short (GPUSHIM_LIMIT=24M)
// or `trim` (cudaMemPoolTrimTo, PyTorch's empty_cache) makes the pool synchronize, which covers
// the primary context only. Before 2026-11-27 the pools then released everything waiting and the
// late write landed in the new block. Now the block waits for its own event: short of memory, the
// allocation fails (`oom`), and succeeds, over the block, once that context has synchronized.
int foreign_ctx_reuse(bool plain, bool destroyed, bool trim, const char* name) {
  void* p = block_beside_a_freed_one();
  testsupport::ProgramContext c = testsupport::make_program_context();
  // The program's stream writes the block late (a slow kernel); nobody may have it before that.
  CHECK(testsupport::delayed_fill(p, 0xAA, 8 * kMiB, 300000, reinterpret_cast<cudaStream_t>(c.stream)));
  if (!plain) CHECK_CU(testsupport::driver().MemFreeAsync(reinterpret_cast<CUdeviceptr>(p), c.stream));
  if (destroyed) CHECK_CU(testsupport::driver_function<CUresult (*)(CUstream)>("cuStreamDestroy_v2")(c.stream));
  testsupport::make_current(c.primary);
  if (plain) CHECK(cudaFree(p));
  if (trim) {
    cudaMemPool_t pool = nullptr;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    CHECK(cudaMemPoolTrimTo(pool, 20 * kMiB));  // keeps the segment
  }
  const Reallocated r = reallocate_over(p, c);
  gpushim_device_stats st{};
  testsupport::shim_stats(0, &st);
  std::printf("{\"case\": \"%s\", \"overlaps\": %s, \"intact\": %s, \"oom\": %s, \"reuse_syncs\": %llu}\n", name,
              r.overlaps ? "true" : "false", r.intact ? "true" : "false", r.oom ? "true" : "false", st.reuse_syncs);
  CHECK(cudaFree(r.q));
  testsupport::destroy_context(c.context);
  testsupport::make_current(c.primary);
  return r.intact ? 0 : 2;
}

// A block freed in the order of a program-made context's legacy stream, which shares its handle
// with the primary context's (`from_program`), or the other way round, then asked for in the order
// of the other context's legacy stream: the two streams are not one, and the late write must not
// land in the new block. Until 2026-11-27 vmm and caching handed it out at once (the same handle).
// `via_proc_address`: the context is made with the cuCtxCreate that cuGetProcAddress hands out (as
// runtimes and bindings find driver functions), not the one dlsym finds: the shim must hear of it
// either way, or it takes every stream for the primary context's.
int legacy_of_two_contexts(bool from_program, bool via_proc_address) {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  testsupport::ProgramContext c;
  if (via_proc_address) {
    using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
    using CtxCreate = CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
    CUdriverProcAddressQueryResult found{};
    void* f = nullptr;
    CHECK_CU(testsupport::driver_function<GetProc>("cuGetProcAddress_v2")("cuCtxCreate", &f, 12050,
                                                                             CU_GET_PROC_ADDRESS_DEFAULT, &found));
    CHECK_CU(testsupport::driver_function<CUresult (*)(CUcontext*)>("cuCtxGetCurrent")(&c.primary));
    CHECK_CU(reinterpret_cast<CtxCreate>(f)(&c.context, nullptr, 0, 0));
    CHECK_CU(testsupport::driver_function<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate")(&c.stream,
                                                                                                CU_STREAM_NON_BLOCKING));
  } else {
    c = testsupport::make_program_context();
  }
  testsupport::make_current(c.primary);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 8 * kMiB));
  CHECK(cudaMemset(p, 0x11, 8 * kMiB));
  CHECK(cudaDeviceSynchronize());
  testsupport::make_current(from_program ? c.context : c.primary);
  CHECK(testsupport::delayed_fill(p, 0xAA, 8 * kMiB, 300000, nullptr));  // the current context's legacy stream
  CHECK_CU(testsupport::driver().MemFreeAsync(reinterpret_cast<CUdeviceptr>(p), nullptr));
  testsupport::make_current(from_program ? c.primary : c.context);
  void* q = nullptr;
  CHECK(cudaMallocAsync(&q, 8 * kMiB, nullptr));
  CHECK(cudaMemsetAsync(q, 0x33, 8 * kMiB, nullptr));
  CHECK(cudaStreamSynchronize(nullptr));
  testsupport::make_current(c.context);
  CHECK_CU(testsupport::driver_function<CUresult (*)()>("cuCtxSynchronize")());
  testsupport::make_current(c.primary);
  CHECK(cudaDeviceSynchronize());
  const bool intact = testsupport::holds(q, 8 * kMiB, 0x33);
  std::printf("{\"same_block\": %s, \"intact\": %s}\n", q == p ? "true" : "false", intact ? "true" : "false");
  CHECK(cudaFree(q));
  testsupport::destroy_context(c.context);
  testsupport::make_current(c.primary);
  return intact ? 0 : 2;
}

// A program that works in a context it made (cuCtxCreate) and allocates with the runtime there, as
// CUDA allows (the runtime uses the current context): each step allocates on its own stream, a
// slow kernel writes the block, and it is freed on the same stream (`legacy`: that context's
// legacy stream). CUDA reuses such memory in that stream's order at once, so the program needs one
// block however far the device lags: under GPUSHIM_LIMIT the pools must neither fail nor grow.
// (The runtime's first call comes first, in the primary context, as the other cases' do.) A review
// helper's reproducer, 2026-11-27.
int program_ctx_only(bool legacy, const char* name, bool per_thread, int steps) {
  CHECK(cudaFree(nullptr));
  CUcontext ctx = nullptr;
  CUstream s = nullptr;
  using CtxCreate = CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
  CHECK_CU(testsupport::driver_function<CtxCreate>("cuCtxCreate_v4")(&ctx, nullptr, 0, 0));
  if (!legacy)
    CHECK_CU(testsupport::driver_function<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate")(&s, CU_STREAM_NON_BLOCKING));
  const auto stream = per_thread ? cudaStreamPerThread : reinterpret_cast<cudaStream_t>(s);
  int failed_at = -1;
  for (int i = 0; i < steps; ++i) {
    void* p = nullptr;
    const cudaError_t r = cudaMallocAsync(&p, 64 * kMiB, stream);
    if (r != cudaSuccess) {
      failed_at = i;
      std::fprintf(stderr, "step %d: cudaMallocAsync: %s\n", i, cudaGetErrorName(r));
      break;
    }
    CHECK(testsupport::delayed_fill(p, i, 64 * kMiB, 20000, stream));
    CHECK(cudaFreeAsync(p, stream));
  }
  CHECK_CU(testsupport::driver_function<CUresult (*)()>("cuCtxSynchronize")());
  gpushim_device_stats st{};
  testsupport::shim_stats(0, &st);
  std::printf("{\"case\": \"%s\", \"failed_at\": %d, \"peak_reserved_mib\": %llu}\n", name, failed_at,
              st.peak_reserved_bytes >> 20);
  testsupport::destroy_context(ctx);
  return failed_at < 0 ? 0 : 2;
}

// foreign_ctx_oom, with the free made while a stream of the primary context captures a graph
// (relaxed mode: other streams work as usual). The free is on the program-made context's stream,
// which is not capturing: it is stream-ordered there, and the pool's synchronization (memory short,
// GPUSHIM_LIMIT=24M) covers the primary context only. `trim`: cudaMemPoolTrimTo instead, with room.
int foreign_ctx_capture_free(bool trim, bool destroy, const char* name) {
  void* p = block_beside_a_freed_one();
  cudaStream_t cs;
  CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  testsupport::ProgramContext c = testsupport::make_program_context();
  CHECK(testsupport::delayed_fill(p, 0xAA, 8 * kMiB, 300000, reinterpret_cast<cudaStream_t>(c.stream)));
  if (destroy) CHECK_CU(testsupport::driver().MemFreeAsync(reinterpret_cast<CUdeviceptr>(p), c.stream));
  testsupport::make_current(c.primary);
  CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
  testsupport::make_current(c.context);
  if (destroy) CHECK_CU(testsupport::driver_function<CUresult (*)(CUstream)>("cuStreamDestroy_v2")(c.stream));
  else CHECK_CU(testsupport::driver().MemFreeAsync(reinterpret_cast<CUdeviceptr>(p), c.stream));
  testsupport::make_current(c.primary);
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(cs, &g));
  if (g != nullptr) CHECK(cudaGraphDestroy(g));
  if (trim) {
    cudaMemPool_t pool = nullptr;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    CHECK(cudaMemPoolTrimTo(pool, 0));
  }
  const Reallocated r = reallocate_over(p, c);
  std::printf("{\"case\": \"%s\", \"overlaps\": %s, \"intact\": %s, \"oom\": %s}\n", name,
              r.overlaps ? "true" : "false", r.intact ? "true" : "false", r.oom ? "true" : "false");
  CHECK(cudaFree(r.q));
  CHECK(cudaStreamDestroy(cs));
  testsupport::destroy_context(c.context);
  testsupport::make_current(c.primary);
  return r.intact ? 0 : 2;
}

// A block freed on one thread's per-thread default stream in a program-made context, asked for on
// another thread's per-thread default stream in that context: two streams, so not at once (the
// late write must not land in the new block). The control for program_ctx_only_per_thread.
int ptds_of_two_threads() {
  CHECK(cudaFree(nullptr));
  CUcontext ctx = nullptr;
  using CtxCreate = CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
  CHECK_CU(testsupport::driver_function<CtxCreate>("cuCtxCreate_v4")(&ctx, nullptr, 0, 0));
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, 8 * kMiB, cudaStreamPerThread));
  CHECK(cudaMemsetAsync(p, 0x11, 8 * kMiB, cudaStreamPerThread));
  CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  CHECK(testsupport::delayed_fill(p, 0xAA, 8 * kMiB, 300000, cudaStreamPerThread));
  CHECK(cudaFreeAsync(p, cudaStreamPerThread));
  void* q = nullptr;
  std::thread t([&] {
    CHECK(cudaFree(nullptr));
    testsupport::make_current(ctx);
    CHECK(cudaMallocAsync(&q, 8 * kMiB, cudaStreamPerThread));
    CHECK(cudaMemsetAsync(q, 0x33, 8 * kMiB, cudaStreamPerThread));
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  });
  t.join();
  CHECK_CU(testsupport::driver_function<CUresult (*)()>("cuCtxSynchronize")());
  const bool intact = testsupport::holds(q, 8 * kMiB, 0x33);
  std::printf("{\"case\": \"ptds_of_two_threads\", \"same_block\": %s, \"intact\": %s}\n", q == p ? "true" : "false",
              intact ? "true" : "false");
  testsupport::destroy_context(ctx);
  return intact ? 0 : 2;
}

// A block a stream of a program-made context still writes, freed in that stream's order, and
// then the device reset (cudaDeviceReset) from the primary context, which frees every allocation
// of that context: the pool must keep no segment of it across the reset. The pool's
// synchronization before the reset covers the primary context only, and the block waits for its
// own event: the segment stayed, and after the reset the pool handed its addresses out beside
// fresh memory the driver had placed there (`overlap`). A review helper's reproducer, 2026-11-27.
int foreign_ctx_reset() {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 8 * kMiB));
  CHECK(cudaMemset(p, 0x11, 8 * kMiB));
  CHECK(cudaDeviceSynchronize());
  testsupport::ProgramContext c = testsupport::make_program_context();
  CHECK(testsupport::delayed_fill(p, 0xAA, 8 * kMiB, 300000, reinterpret_cast<cudaStream_t>(c.stream)));
  CHECK_CU(testsupport::driver().MemFreeAsync(reinterpret_cast<CUdeviceptr>(p), c.stream));
  testsupport::make_current(c.primary);
  CHECK(cudaDeviceReset());
  // The program's context finishes its work; then the program allocates twice.
  testsupport::make_current(c.context);
  CHECK_CU(testsupport::driver_function<CUresult (*)()>("cuCtxSynchronize")());
  testsupport::make_current(c.primary);
  void *x = nullptr, *y = nullptr;
  CHECK(cudaMalloc(&x, 20 * kMiB));
  CHECK(cudaMalloc(&y, 8 * kMiB));
  const bool overlap = static_cast<char*>(x) < static_cast<char*>(y) + 8 * kMiB &&
                       static_cast<char*>(y) < static_cast<char*>(x) + 20 * kMiB;
  CHECK(cudaMemset(x, 0x33, 20 * kMiB));
  CHECK(cudaMemset(y, 0x44, 8 * kMiB));
  CHECK(cudaDeviceSynchronize());
  const bool intact = testsupport::holds(x, 20 * kMiB, 0x33) && testsupport::holds(y, 8 * kMiB, 0x44);
  std::printf("{\"case\": \"foreign_ctx_reset\", \"overlap\": %s, \"intact\": %s}\n", overlap ? "true" : "false",
              intact ? "true" : "false");
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  testsupport::destroy_context(c.context);
  testsupport::make_current(c.primary);
  return intact && !overlap ? 0 : 2;
}

// A non-blocking stream of device 1 destroyed while device 0 is current (legal in CUDA).
int destroy_other_device(bool other) {
  CHECK(cudaSetDevice(1));
  cudaStream_t s1;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  testsupport::plain_rounds(2, 64 * kMiB);
  if (other) CHECK(cudaSetDevice(0));
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaSetDevice(1));
  testsupport::plain_rounds(kRounds, 64 * kMiB);
  report(other ? "destroy_other_device" : "destroy_same_device", 1);
  return 0;
}

// A pool block freed on the capturing stream: CUDA frees memory from outside the graph when the
// graph is launched, not at capture. Before the launch the block must not serve anyone else.
int captured_free() {
  CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, 20 * kMiB, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  CHECK(testsupport::delayed_fill(p, 0xAA, 20 * kMiB, 0, s));  // a node of the graph
  // A free node takes graph memory only: CUDA refuses this one, and p stays allocated.
  const cudaError_t refused = cudaFreeAsync(p, s);
  (void)cudaGetLastError();
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  void* q = nullptr;
  bool same = false;
  for (int i = 0; i < 4 && !same; ++i) {  // plain allocations before the launch
    CHECK(cudaMalloc(&q, 20 * kMiB));
    same = q == p;
  }
  CHECK(cudaMemset(q, 0x33, 20 * kMiB));
  CHECK(cudaGraphLaunch(exec, s));  // the captured fill writes p
  CHECK(cudaStreamSynchronize(s));
  const bool intact = testsupport::holds(q, 20 * kMiB, 0x33);
  CHECK(cudaFreeAsync(p, s));  // after the capture: the program's to free
  CHECK(cudaStreamSynchronize(s));
  std::printf("{\"case\": \"captured_free\", \"refused\": \"%s\", \"same_block\": %s, \"intact\": %s}\n",
              cudaGetErrorName(refused), same ? "true" : "false", intact ? "true" : "false");
  return intact && refused == cudaErrorInvalidValue ? 0 : 2;
}

// A pool waits for a fence whose event sits on a live stream of a program-made context, and that
// stream's work (a host function) waits for another thread of the program, which creates a stream
// meanwhile (a review helper's reproducer): the wait held the stream registry's lock, the stream's
// creation needed it, and both waited forever. The control's thread creates no stream.
std::atomic<bool> g_flag{false};
void CUDA_CB wait_flag(void*) {
  while (!g_flag.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
void on_alarm(int) {
  const char m[] = "{\"case\": \"foreign_stream_wait\", \"deadlock\": true}\n";
  (void)!write(1, m, sizeof m - 1);
  _exit(3);
}
int foreign_stream_wait(bool create_in_helper) {
  signal(SIGALRM, on_alarm);
  alarm(15);
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  const testsupport::ProgramContext c = testsupport::make_program_context();
  using LaunchHostFunc = CUresult (*)(CUstream, CUhostFn, void*);
  CHECK_CU(testsupport::driver_function<LaunchHostFunc>("cuLaunchHostFunc")(c.stream, wait_flag, nullptr));
  testsupport::make_current(c.primary);
  std::thread helper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (create_in_helper) {
      testsupport::make_current(c.primary);
      CUstream s2 = nullptr;
      testsupport::driver_function<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate")(&s2, CU_STREAM_NON_BLOCKING);
    }
    g_flag.store(true);
  });
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 64 * kMiB));
  CHECK(cudaFree(p));
  CHECK(cudaMalloc(&p, 64 * kMiB));  // the pool waits for the fence of the free above
  CHECK(cudaFree(p));
  helper.join();
  std::printf("{\"case\": \"foreign_stream_wait\", \"deadlock\": false}\n");
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string c = argc > 1 ? argv[1] : "";
  if (c == "wrong_device") return wrong_device();
  if (c == "wrong_device_driver") return wrong_device_driver();
  if (c == "legacy_cross_device") return cross_device_default(0, "legacy_cross_device");
  if (c == "peer_access_first") return peer_access_first();
  if (c == "ptds_cross_device") return cross_device_default(cudaStreamPerThread, "ptds_cross_device");
  if (c == "foreign_ctx_stream") return foreign_ctx_stream(true);
  if (c == "foreign_ctx_control") return foreign_ctx_stream(false);
  if (c == "foreign_ctx_capture") return foreign_ctx_capture(false);
  if (c == "foreign_ctx_capture_ctx_gone") return foreign_ctx_capture(true);
  if (c == "foreign_ctx_fence") return foreign_ctx_reuse(true, false, false, "foreign_ctx_fence");
  if (c == "foreign_ctx_fence_tail") return foreign_ctx_reuse(true, true, false, "foreign_ctx_fence_tail");
  if (c == "foreign_ctx_oom") return foreign_ctx_reuse(false, false, false, "foreign_ctx_oom");
  if (c == "foreign_ctx_oom_tail") return foreign_ctx_reuse(false, true, false, "foreign_ctx_oom_tail");
  if (c == "foreign_ctx_trim") return foreign_ctx_reuse(false, false, true, "foreign_ctx_trim");
  if (c == "foreign_ctx_trim_tail") return foreign_ctx_reuse(false, true, true, "foreign_ctx_trim_tail");
  if (c == "legacy_from_program_ctx") return legacy_of_two_contexts(true, false);
  if (c == "legacy_to_program_ctx") return legacy_of_two_contexts(false, false);
  if (c == "legacy_from_program_ctx_procaddr") return legacy_of_two_contexts(true, true);
  const int steps = argc > 2 ? std::atoi(argv[2]) : 40;  // program_ctx_only*
  if (c == "program_ctx_only") return program_ctx_only(false, "program_ctx_only", false, steps);
  if (c == "program_ctx_only_legacy") return program_ctx_only(true, "program_ctx_only_legacy", false, steps);
  if (c == "ptds_of_two_threads") return ptds_of_two_threads();
  if (c == "program_ctx_only_per_thread") return program_ctx_only(true, "program_ctx_only_per_thread", true, steps);
  if (c == "foreign_ctx_reset") return foreign_ctx_reset();
  if (c == "foreign_ctx_capture_free") return foreign_ctx_capture_free(false, false, "foreign_ctx_capture_free");
  if (c == "foreign_ctx_capture_free_trim") return foreign_ctx_capture_free(true, false, "foreign_ctx_capture_free_trim");
  if (c == "foreign_ctx_capture_destroy") return foreign_ctx_capture_free(false, true, "foreign_ctx_capture_destroy");
  if (c == "foreign_ctx_capture_destroy_trim") return foreign_ctx_capture_free(true, true, "foreign_ctx_capture_destroy_trim");
  if (c == "destroy_other_device") return destroy_other_device(true);
  if (c == "destroy_same_device") return destroy_other_device(false);
  if (c == "captured_free") return captured_free();
  if (c == "foreign_stream_wait") return foreign_stream_wait(true);
  if (c == "foreign_stream_wait_control") return foreign_stream_wait(false);
  return 64;
}
