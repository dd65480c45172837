// Resets that free every allocation of the device: memory allocated after one must be fresh
// memory that works, whatever the policy cached before. Data is written and read back after the
// reset, and the program prints what it and the shim see as one JSON line.
//
// Usage: e2e_device_reset runtime|primary_reset[_v1]|release[_v1]|host_of_other_device|survivors|ctx_destroy|
//                         destroyed_elsewhere|own_context_only|free_after_other_device_reset|capped_after_reset
//   runtime:        cudaMalloc, cudaFree (the pool caches the segment), cudaDeviceReset
//   primary_reset:  the same with the driver's cuDevicePrimaryCtxReset (_v1: its CUDA 7-10 entry
//                   point, looked up by its plain name)
//   release:        a driver-API program that retains the primary context, allocates and
//                   releases it (the last reference: the context is destroyed with its memory);
//                   release_v1 with cuDevicePrimaryCtxRelease's CUDA 7-10 entry point
//   ctx_destroy [proc_address]:
//                   cuMemAlloc in a context made with cuCtxCreate, then cuCtxDestroy (looked up
//                   with dlsym, or with cuGetProcAddress), which frees that memory; then memory of
//                   the primary context, old and new, must hold data
//   destroyed_elsewhere:
//                   a thread makes a context of its own current (cuCtxCreate on another thread);
//                   runtime allocations there must be that context's, not the pool's; then
//                   another thread destroys it, and the thread's cudaMalloc and cudaMallocAsync
//                   must be refused as CUDA refuses them (context is destroyed), even with a pool
//                   that has room, and so must its cudaFree, cudaFreeAsync and cuMemFree of memory
//                   the primary context's thread allocated (which stays the program's, and holds
//                   its data); all work again once the thread binds the primary context. A
//                   thread whose first runtime calls come under that context and ask the default
//                   memory pool is refused too. `destroyed_elsewhere BYTES`: the two refused
//                   requests ask for BYTES (4096 by default)
//   capped_after_reset BYTES [async]:
//                   a program that once made a context resets the device, and its next cudaMalloc
//                   (cudaMallocAsync) asks for BYTES, which the cap or GPUSHIM_FAIL refuses: refused,
//                   and nothing is left allocated on the device
//   free_after_other_device_reset:
//                   device 0's block freed with device 1 current just after its reset, in a
//                   program that once made a context: freed, as CUDA's runtime frees it (two devices)
//   own_context_only:
//                   a program whose only context is one it made (cuCtxCreate before any runtime
//                   call) allocates with the runtime: the memory is that context's, and the
//                   device's primary context stays inactive, as CUDA's runtime leaves it
//   host_of_other_device:
//                   pinned host memory allocated while device 1 is current, then device 0 reset:
//                   the memory is device 1's primary context's and stays (needs two devices)
//   survivors reset|release:
//                   a driver-API program with memory of three owners when its primary context
//                   is reset (cuDevicePrimaryCtxReset) or destroyed by its last release: the
//                   primary context's (device, pinned host and managed memory: freed), a created
//                   context's and cuMemCreate's (no context: both survive, and hold their data)
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <string>
#include <vector>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {

constexpr size_t kMiB = 1 << 20;

// Survives the reset in the program's mind only: the reset frees it (a leak the report names).
__attribute__((noinline)) void* held_across_reset(size_t bytes) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  CHECK(cudaMemset(p, 0x11, bytes));
  return p;
}

// Whether the whole block holds `value`.
bool reads_back(const void* p, size_t bytes, int value) {
  std::vector<unsigned char> host(bytes);
  if (cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  for (unsigned char c : host)
    if (c != static_cast<unsigned char>(value)) return false;
  return true;
}

// Writes `value` through the whole block and reads it back.
bool write_and_verify(void* p, size_t bytes, int value) {
  return cudaMemset(p, value, bytes) == cudaSuccess && reads_back(p, bytes, value);
}

size_t driver_used() {
  size_t free = 0, total = 0;
  CHECK_CU(testsupport::driver().MemGetInfo(&free, &total));
  return total - free;
}

// `reset_name`: the driver's entry point, the CUDA 11 form or the CUDA 7-10 one libcuda still exports.
int runtime_reset(bool through_driver, const char* reset_name = "cuDevicePrimaryCtxReset_v2") {
  CHECK(cudaSetDevice(0));
  held_across_reset(3 * kMiB);
  void* cached = nullptr;
  CHECK(cudaMalloc(&cached, 5 * kMiB));
  CHECK(cudaFree(cached));  // a pool keeps its segment
  const size_t used_before = driver_used();
  if (through_driver) {
    using Reset = CUresult (*)(CUdevice);
    using Retain = CUresult (*)(CUcontext*, CUdevice);
    auto reset = testsupport::driver_function<Reset>(reset_name);
    CHECK_CU(reset(0));
    // A driver-API program takes the context up again itself.
    CUcontext ctx = nullptr;
    CHECK_CU(testsupport::driver_function<Retain>("cuDevicePrimaryCtxRetain")(&ctx, 0));
  } else {
    CHECK(cudaDeviceReset());
  }
  CHECK(cudaSetDevice(0));
  const size_t used_after_reset = driver_used();
  // The same sizes again: a pool that kept its segments would hand out freed memory here.
  void* fresh = nullptr;
  CHECK(cudaMalloc(&fresh, 5 * kMiB));
  const bool ok = write_and_verify(fresh, 5 * kMiB, 0x5A);
  void* fresh2 = nullptr;
  CHECK(cudaMalloc(&fresh2, 3 * kMiB));
  const bool ok2 = write_and_verify(fresh2, 3 * kMiB, 0x3C) && write_and_verify(fresh, 5 * kMiB, 0x5A);
  gpushim_device_stats st{};
  const bool shim = testsupport::shim_stats(0, &st);
  const size_t used_now = driver_used();
  std::printf("{\"verified\": %s, \"used_before\": %zu, \"used_after_reset\": %zu, \"used_now\": %zu, "
              "\"shim\": %s, \"live_bytes\": %llu, \"live_count\": %llu, \"reserved_bytes\": %llu}\n",
              ok && ok2 ? "true" : "false", used_before, used_after_reset, used_now, shim ? "true" : "false",
              st.live_bytes, st.live_count, st.reserved_bytes);
  CHECK(cudaFree(fresh));
  CHECK(cudaFree(fresh2));
  return ok && ok2 ? 0 : 1;
}

__attribute__((noinline)) CUdeviceptr driver_alloc_in_context(size_t bytes) {
  CUdeviceptr p = 0;
  CHECK_CU(testsupport::driver().MemAlloc(&p, bytes));
  return p;
}

int release_last_reference(const char* release_name = "cuDevicePrimaryCtxRelease_v2") {
  using Init = CUresult (*)(unsigned);
  using Retain = CUresult (*)(CUcontext*, CUdevice);
  using Release = CUresult (*)(CUdevice);
  using SetCurrent = CUresult (*)(CUcontext);
  using MemsetD8 = CUresult (*)(CUdeviceptr, unsigned char, size_t);
  using CopyDtoH = CUresult (*)(void*, CUdeviceptr, size_t);
  CHECK_CU(testsupport::driver_function<Init>("cuInit")(0));
  auto retain = testsupport::driver_function<Retain>("cuDevicePrimaryCtxRetain");
  auto release = testsupport::driver_function<Release>(release_name);
  auto set_current = testsupport::driver_function<SetCurrent>("cuCtxSetCurrent");
  auto memset_d8 = testsupport::driver_function<MemsetD8>("cuMemsetD8_v2");
  auto copy = testsupport::driver_function<CopyDtoH>("cuMemcpyDtoH_v2");
  CUcontext ctx = nullptr;
  CHECK_CU(retain(&ctx, 0));
  CHECK_CU(set_current(ctx));
  driver_alloc_in_context(4 * kMiB);
  CHECK_CU(release(0));  // the last reference: the context goes, and its memory with it
  unsigned flags = 0;
  int active = 1;
  CHECK_CU(testsupport::driver().DevicePrimaryCtxGetState(0, &flags, &active));
  CHECK_CU(retain(&ctx, 0));
  CHECK_CU(set_current(ctx));
  const CUdeviceptr p = driver_alloc_in_context(4 * kMiB);
  std::vector<unsigned char> host(4 * kMiB);
  bool ok = memset_d8(p, 0x77, host.size()) == CUDA_SUCCESS && copy(host.data(), p, host.size()) == CUDA_SUCCESS;
  for (unsigned char c : host) ok = ok && c == 0x77;
  std::printf("{\"verified\": %s, \"destroyed\": %s}\n", ok ? "true" : "false", active == 0 ? "true" : "false");
  CHECK_CU(testsupport::driver().MemFree(p));
  CHECK_CU(release(0));
  return ok ? 0 : 1;
}

// Allocated in the created context: the destroy frees it (a leak the report names).
__attribute__((noinline)) CUdeviceptr driver_alloc_in_created_context(size_t bytes) {
  CUdeviceptr p = 0;
  CHECK_CU(testsupport::driver().MemAlloc(&p, bytes));
  return p;
}

__attribute__((noinline)) void* runtime_alloc_in_primary(size_t bytes, int value) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  CHECK(cudaMemset(p, value, bytes));
  return p;
}

size_t free_as_seen() {
  size_t free = 0, total = 0;
  CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

int context_destroy(bool via_proc_address) {
  using Init = CUresult (*)(unsigned);
  using Create = CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
  using Destroy = CUresult (*)(CUcontext);
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  using GetCurrent = CUresult (*)(CUcontext*);
  using MemsetD8 = CUresult (*)(CUdeviceptr, unsigned char, size_t);
  using CopyDtoH = CUresult (*)(void*, CUdeviceptr, size_t);
  CHECK(cudaSetDevice(0));
  void* kept = runtime_alloc_in_primary(2 * kMiB, 0x22);  // the primary context's: the destroy leaves it
  const size_t free_before = free_as_seen();
  CHECK_CU(testsupport::driver_function<Init>("cuInit")(0));
  Destroy destroy = nullptr;
  if (via_proc_address) {
    CUdriverProcAddressQueryResult found{};
    void* f = nullptr;
    CHECK_CU(testsupport::driver_function<GetProc>("cuGetProcAddress_v2")("cuCtxDestroy", &f, 12000,
                                                                             CU_GET_PROC_ADDRESS_DEFAULT, &found));
    destroy = reinterpret_cast<Destroy>(f);
  } else {
    destroy = testsupport::driver_function<Destroy>("cuCtxDestroy_v2");
  }
  auto get_current = testsupport::driver_function<GetCurrent>("cuCtxGetCurrent");
  CUcontext primary = nullptr, created = nullptr, current = nullptr;
  CHECK_CU(get_current(&primary));
  CHECK_CU(testsupport::driver_function<Create>("cuCtxCreate_v4")(&created, nullptr, 0, 0));
  for (size_t mib : {6, 1}) driver_alloc_in_created_context(mib * kMiB);  // one site
  CHECK_CU(destroy(created));  // frees both
  CHECK_CU(get_current(&current));
  const size_t free_after = free_as_seen();
  // The primary context again: what it held before, and new memory of both APIs, holds data.
  std::vector<unsigned char> host(6 * kMiB);
  bool ok = current == primary && write_and_verify(kept, 2 * kMiB, 0x22);
  void* fresh = runtime_alloc_in_primary(6 * kMiB, 0);
  ok = ok && write_and_verify(fresh, 6 * kMiB, 0x5A);
  const CUdeviceptr d = driver_alloc_in_context(6 * kMiB);
  ok = ok && testsupport::driver_function<MemsetD8>("cuMemsetD8_v2")(d, 0x77, host.size()) == CUDA_SUCCESS &&
       testsupport::driver_function<CopyDtoH>("cuMemcpyDtoH_v2")(host.data(), d, host.size()) == CUDA_SUCCESS;
  for (unsigned char c : host) ok = ok && c == 0x77;
  gpushim_device_stats st{};
  const bool shim = testsupport::shim_stats(0, &st);
  std::printf("{\"verified\": %s, \"shim\": %s, \"live_bytes\": %llu, \"live_count\": %llu, "
              "\"free_before\": %zu, \"free_after\": %zu}\n",
              ok ? "true" : "false", shim ? "true" : "false", st.live_bytes, st.live_count, free_before, free_after);
  CHECK(cudaFree(kept));
  CHECK(cudaFree(fresh));
  CHECK_CU(testsupport::driver().MemFree(d));
  return ok ? 0 : 1;
}

__attribute__((noinline)) CUdeviceptr driver_alloc_in_other_context(size_t bytes) {
  CUdeviceptr p = 0;
  CHECK_CU(testsupport::driver().MemAlloc(&p, bytes));
  return p;
}

// Physical memory of no context (cuMemCreate), mapped at a reserved range of `bytes`.
struct Mapped {
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle handle = 0;
};
__attribute__((noinline)) Mapped map_physical(size_t bytes) {
  const auto& drv = testsupport::driver();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  Mapped m;
  CHECK_CU(drv.MemCreate(&m.handle, bytes, &prop, 0));
  CHECK_CU(drv.MemAddressReserve(&m.va, bytes, 0, 0, 0));
  CHECK_CU(drv.MemMap(m.va, bytes, 0, m.handle, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_CU(drv.MemSetAccess(m.va, bytes, &access, 1));
  return m;
}

// The primary context's memory of every kind its end frees.
__attribute__((noinline)) void primary_memory_of_every_kind(size_t bytes) {
  using AllocManaged = CUresult (*)(CUdeviceptr*, size_t, unsigned);
  CUdeviceptr device = 0, managed = 0;
  void* host = nullptr;
  CHECK_CU(testsupport::driver().MemAlloc(&device, bytes));
  CHECK_CU(testsupport::driver().MemAllocHost(&host, bytes));
  CHECK_CU(testsupport::driver_function<AllocManaged>("cuMemAllocManaged")(&managed, bytes, CU_MEM_ATTACH_GLOBAL));
}

__attribute__((noinline)) void* pinned_while_device_1_is_current(size_t bytes) {
  void* h = nullptr;
  CHECK(cudaSetDevice(1));
  CHECK(cudaMallocHost(&h, bytes));
  std::memset(h, 0x5C, bytes);
  return h;
}

int host_of_other_device() {
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    std::printf("{\"skipped\": true}\n");
    return 0;
  }
  void* h = pinned_while_device_1_is_current(1 * kMiB);
  CHECK(cudaSetDevice(0));
  void* d = nullptr;
  CHECK(cudaMalloc(&d, 2 * kMiB));  // device 0's: the reset frees it
  CHECK(cudaDeviceReset());
  CHECK(cudaSetDevice(1));
  const cudaError_t freed = cudaFreeHost(h);
  std::printf("{\"skipped\": false, \"free_host\": \"%s\"}\n", cudaGetErrorName(freed));
  return freed == cudaSuccess ? 0 : 1;
}

int survivors(bool release_last) {
  using Init = CUresult (*)(unsigned);
  using Retain = CUresult (*)(CUcontext*, CUdevice);
  using DeviceCall = CUresult (*)(CUdevice);
  using Create = CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
  using MemsetD8 = CUresult (*)(CUdeviceptr, unsigned char, size_t);
  using CopyDtoH = CUresult (*)(void*, CUdeviceptr, size_t);
  const auto& drv = testsupport::driver();
  CHECK_CU(testsupport::driver_function<Init>("cuInit")(0));
  auto retain = testsupport::driver_function<Retain>("cuDevicePrimaryCtxRetain");
  auto memset_d8 = testsupport::driver_function<MemsetD8>("cuMemsetD8_v2");
  auto copy = testsupport::driver_function<CopyDtoH>("cuMemcpyDtoH_v2");
  auto holds = [&](CUdeviceptr p, size_t bytes, unsigned char value) {
    std::vector<unsigned char> host(bytes);
    if (copy(host.data(), p, bytes) != CUDA_SUCCESS) return false;
    for (unsigned char c : host)
      if (c != value) return false;
    return true;
  };
  CUcontext primary = nullptr, created = nullptr;
  CHECK_CU(testsupport::driver_function<Create>("cuCtxCreate_v4")(&created, nullptr, 0, 0));
  const CUdeviceptr other = driver_alloc_in_other_context(6 * kMiB);
  CHECK_CU(memset_d8(other, 0x66, 6 * kMiB));
  CHECK_CU(retain(&primary, 0));
  testsupport::make_current(primary);
  const Mapped mapped = map_physical(2 * kMiB);
  CHECK_CU(memset_d8(mapped.va, 0x44, 2 * kMiB));
  primary_memory_of_every_kind(1 * kMiB);
  if (release_last) {
    CHECK_CU(testsupport::driver_function<DeviceCall>("cuDevicePrimaryCtxRelease_v2")(0));
    unsigned flags = 0;
    int active = 1;
    CHECK_CU(drv.DevicePrimaryCtxGetState(0, &flags, &active));
    if (active != 0) {
      std::fprintf(stderr, "the last release left the primary context active\n");
      return 1;
    }
  } else {
    CHECK_CU(testsupport::driver_function<DeviceCall>("cuDevicePrimaryCtxReset_v2")(0));
    // "Resetting the primary context does not release it": the retain is given back all the
    // same, and that release ends nothing more.
    CHECK_CU(testsupport::driver_function<DeviceCall>("cuDevicePrimaryCtxRelease_v2")(0));
  }
  CHECK_CU(retain(&primary, 0));
  bool ok = holds(mapped.va, 2 * kMiB, 0x44);
  testsupport::make_current(created);
  ok = ok && holds(other, 6 * kMiB, 0x66);
  gpushim_device_stats st{};
  const bool shim = testsupport::shim_stats(0, &st);
  std::printf("{\"verified\": %s, \"shim\": %s, \"live_bytes\": %llu, \"live_count\": %llu}\n",
              ok ? "true" : "false", shim ? "true" : "false", st.live_bytes, st.live_count);
  CHECK_CU(drv.MemFree(other));
  testsupport::destroy_context(created);
  testsupport::make_current(primary);
  CHECK_CU(drv.MemUnmap(mapped.va, 2 * kMiB));
  CHECK_CU(drv.MemRelease(mapped.handle));
  CHECK_CU(drv.MemAddressFree(mapped.va, 2 * kMiB));
  CHECK_CU(testsupport::driver_function<DeviceCall>("cuDevicePrimaryCtxRelease_v2")(0));
  return ok ? 0 : 1;
}

// CUDA's runtime uses the driver context current to the thread; a context destroyed by another
// thread stays current on its thread, where every call then answers "context is destroyed". The
// pool, whose memory is its primary context's, must serve neither.
int destroyed_elsewhere(size_t request) {
  using Create = CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
  using PointerAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  void* warm = nullptr;  // the pool holds a segment with room before the context is made
  CHECK(cudaMalloc(&warm, 1 * kMiB));
  CHECK(cudaFree(warm));
  void* kept = nullptr;  // the primary context's, freed under the destroyed context, then here
  CHECK(cudaMalloc(&kept, 4096));
  CHECK(cudaMemset(kept, 0x5A, 4096));
  CUcontext created = nullptr;
  std::thread([&] { CHECK_CU(testsupport::driver_function<Create>("cuCtxCreate_v4")(&created, nullptr, 0, 0)); })
      .join();
  bool owned_by_created = false;
  int plain = -1, async = -1, after = -1, free_plain = -1, free_async = -1, free_driver = -1;
  // A thread whose first runtime calls, under the destroyed context, ask the device's default
  // pool, which the shim's pool answers for.
  cudaMemPool_t pool = nullptr;
  CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  std::atomic<int> stage{0};
  int pool_get = -1, pool_set = -1, pool_trim = -1;
  std::thread first_calls([&] {
    testsupport::make_current(created);
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
    cuuint64_t value = 0;
    pool_get = static_cast<int>(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &value));
    cudaGetLastError();
    pool_set = static_cast<int>(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &value));
    cudaGetLastError();
    pool_trim = static_cast<int>(cudaMemPoolTrimTo(pool, 0));
    cudaGetLastError();
  });
  while (stage.load() != 1) std::this_thread::yield();
  std::thread([&] {
    testsupport::make_current(created);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 4096));
    CUcontext owner = nullptr;
    CHECK_CU(testsupport::driver_function<PointerAttribute>("cuPointerGetAttribute")(
        &owner, CU_POINTER_ATTRIBUTE_CONTEXT, reinterpret_cast<CUdeviceptr>(p)));
    owned_by_created = owner == created && write_and_verify(p, 4096, 0x2D);
    CHECK(cudaFree(p));
    std::thread([&] { testsupport::destroy_context(created); }).join();
    p = nullptr;
    plain = static_cast<int>(cudaMalloc(&p, request));
    cudaGetLastError();
    async = static_cast<int>(cudaMallocAsync(&p, request, nullptr));
    cudaGetLastError();
    free_plain = static_cast<int>(cudaFree(kept));
    if (cudaGetLastError() != static_cast<cudaError_t>(free_plain)) free_plain = -2;
    free_async = static_cast<int>(cudaFreeAsync(kept, nullptr));
    cudaGetLastError();
    free_driver = static_cast<int>(testsupport::driver().MemFree(reinterpret_cast<CUdeviceptr>(kept)));
    CHECK(cudaSetDevice(0));
    void* q = nullptr;
    after = static_cast<int>(cudaMalloc(&q, 4096));
    if (after == 0) after = write_and_verify(q, 4096, 0x3C) ? 0 : -2;
    if (q) CHECK(cudaFree(q));
  }).join();
  stage = 2;
  first_calls.join();
  gpushim_device_stats st{};
  const bool shim = testsupport::shim_stats(0, &st);
  const bool kept_holds = reads_back(kept, 4096, 0x5A);
  const int free_later = static_cast<int>(cudaFree(kept));
  std::printf("{\"owned_by_created\": %s, \"plain\": %d, \"async\": %d, \"after\": %d, \"free_plain\": %d, "
              "\"free_async\": %d, \"free_driver\": %d, \"kept_live\": %s, \"kept_holds\": %s, \"free_later\": %d, "
              "\"pool_get\": %d, \"pool_set\": %d, \"pool_trim\": %d}\n",
              owned_by_created ? "true" : "false", plain, async, after, free_plain, free_async, free_driver,
              !shim || st.live_count == 1 ? "true" : "false", kept_holds ? "true" : "false", free_later, pool_get,
              pool_set, pool_trim);
  return 0;
}

// CUDA's runtime allocates in the current context and never makes the primary one for it; the
// shim, asking whether the current context is the primary one, must not make it either (a real
// device gives every primary context memory of its own).
int own_context_only() {
  using Create = CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
  using PointerAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  using State = CUresult (*)(CUdevice, unsigned*, int*);
  CHECK_CU(testsupport::driver_function<CUresult (*)(unsigned)>("cuInit")(0));
  CUcontext created = nullptr;
  CHECK_CU(testsupport::driver_function<Create>("cuCtxCreate_v4")(&created, nullptr, 0, 0));
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 4096));
  CUcontext owner = nullptr;
  CHECK_CU(testsupport::driver_function<PointerAttribute>("cuPointerGetAttribute")(
      &owner, CU_POINTER_ATTRIBUTE_CONTEXT, reinterpret_cast<CUdeviceptr>(p)));
  const bool owned_by_created = owner == created && write_and_verify(p, 4096, 0x4B);
  unsigned flags = 0;
  int active = -1;
  CHECK_CU(testsupport::driver_function<State>("cuDevicePrimaryCtxGetState")(0, &flags, &active));
  CHECK(cudaFree(p));
  testsupport::destroy_context(created);
  std::printf("{\"owned_by_created\": %s, \"primary_active\": %d}\n", owned_by_created ? "true" : "false", active);
  return 0;
}

// A program that once made a context of its own (cuCtxCreate, destroyed at once): from then on the
// shim asks which context is current at each allocation and free.
void make_a_context_once() {
  using Create = CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
  CUcontext created = nullptr;
  CHECK_CU(testsupport::driver_function<Create>("cuCtxCreate_v4")(&created, nullptr, 0, 0));
  testsupport::destroy_context(created);
}

// Device 0's block freed while device 1 is current and was just reset, in a program that once made
// a context of its own (so that the shim asks which context is current at each free). The runtime
// makes device 1's primary context anew at the free, as at any call after a reset, and frees the
// block: a block of another device is freed by any live context (unified addressing).
int free_after_other_device_reset() {
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    std::printf("{\"skipped\": true}\n");
    return 0;
  }
  CHECK(cudaSetDevice(0));
  void* on0 = nullptr;
  CHECK(cudaMalloc(&on0, 4096));
  const bool written = write_and_verify(on0, 4096, 0x5A);
  make_a_context_once();
  CHECK(cudaSetDevice(1));
  void* on1 = nullptr;
  CHECK(cudaMalloc(&on1, 4096));
  CHECK(cudaFree(on1));
  CHECK(cudaDeviceReset());
  const cudaError_t freed = cudaFree(on0);
  std::printf("{\"skipped\": false, \"written\": %s, \"free\": \"%s\"}\n", written ? "true" : "false",
              cudaGetErrorName(freed));
  return 0;
}

// The first cudaMalloc after a reset, in a program that once made a context of its own: until the
// runtime makes the reset primary context anew, it refuses the questions a destroyed one refuses,
// so the shim lets CUDA answer first and asks the cap after. Over the cap, what CUDA made must be
// freed again: the device's used memory is the same after the refusal as before it.
int capped_after_reset(size_t request, bool stream_ordered) {
  const auto used = testsupport::driver_test_hook<size_t (*)(int)>("fakecudaDeviceUsedBytes");
  if (used == nullptr) {
    std::fprintf(stderr, "the simulated driver's fakecudaDeviceUsedBytes is missing\n");
    return 1;
  }
  CHECK_CU(testsupport::driver_function<CUresult (*)(unsigned)>("cuInit")(0));
  make_a_context_once();
  CHECK(cudaSetDevice(0));
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 4096));
  CHECK(cudaFree(p));
  CHECK(cudaDeviceReset());
  const size_t before = used(0);
  p = nullptr;
  const int refused = static_cast<int>(stream_ordered ? cudaMallocAsync(&p, request, nullptr) : cudaMalloc(&p, request));
  cudaGetLastError();
  CHECK(cudaDeviceSynchronize());  // a stream-ordered undo frees in stream order
  const size_t after = used(0);
  void* q = nullptr;
  const int small = static_cast<int>(cudaMalloc(&q, 4096));
  const bool holds = small == 0 && write_and_verify(q, 4096, 0x6E);
  if (q != nullptr) CHECK(cudaFree(q));
  std::printf("{\"refused\": %d, \"used_before\": %zu, \"used_after\": %zu, \"small\": %d, \"holds\": %s}\n",
              refused, before, after, small, holds ? "true" : "false");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "runtime";
  if (mode == "runtime") return runtime_reset(false);
  if (mode == "primary_reset") return runtime_reset(true);
  if (mode == "primary_reset_v1") return runtime_reset(true, "cuDevicePrimaryCtxReset");
  if (mode == "release") return release_last_reference();
  if (mode == "release_v1") return release_last_reference("cuDevicePrimaryCtxRelease");
  if (mode == "destroyed_elsewhere") return destroyed_elsewhere(argc > 2 ? std::stoul(argv[2]) : 4096);
  if (mode == "own_context_only") return own_context_only();
  if (mode == "free_after_other_device_reset") return free_after_other_device_reset();
  if (mode == "host_of_other_device") return host_of_other_device();
  if (mode == "survivors") return survivors(argc > 2 && std::string(argv[2]) == "release");
  if (mode == "capped_after_reset")
    return capped_after_reset(argc > 2 ? std::stoul(argv[2]) : 4096, argc > 3 && std::string(argv[3]) == "async");
  if (mode == "ctx_destroy") return context_destroy(argc > 2 && std::string(argv[2]) == "proc_address");
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
