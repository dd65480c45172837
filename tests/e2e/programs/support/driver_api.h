// The driver API for the test programs, looked up at run time in libcuda.so.1 with dlsym on its
// handle, as libraries carrying their own runtime do (one of the three paths the shim intercepts;
// the exported-symbol path is covered by libe2e_direct_driver). The programs then link only the
// runtime and run unchanged against NVIDIA's libraries, where libcuda comes with the driver, not
// with the toolkit the programs are built against.
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

// A driver call that must succeed; otherwise the program ends with its CUresult.
#define CHECK_CU(x)                                                                                \
  do {                                                                                             \
    const CUresult r_ = (x);                                                                       \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s failed: CUresult %d\n", __FILE__, __LINE__, #x, static_cast<int>(r_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

namespace testsupport {

inline void* libcuda() {
  static void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return lib;
}

// A function the simulated driver has and NVIDIA's does not (fakecuda.h): null on a real GPU.
template <typename F>
F driver_test_hook(const char* name) {
  return libcuda() ? reinterpret_cast<F>(dlsym(libcuda(), name)) : nullptr;
}

template <typename F>
F driver_function(const char* name) {
  void* f = libcuda() ? dlsym(libcuda(), name) : nullptr;
  if (f == nullptr) {
    std::fprintf(stderr, "libcuda.so.1 lacks %s\n", name);
    std::exit(3);
  }
  return reinterpret_cast<F>(f);
}

// A context the program makes itself on device 0 (cuCtxCreate) with one non-blocking stream of its
// own, which device fences cover. The new context is current on return; `primary`, the one that
// was current before (the runtime's), is what make_current takes back.
struct ProgramContext {
  CUcontext primary = nullptr;
  CUcontext context = nullptr;
  CUstream stream = nullptr;
};
inline ProgramContext make_program_context() {
  ProgramContext c;
  CHECK_CU(driver_function<CUresult (*)(CUcontext*)>("cuCtxGetCurrent")(&c.primary));
  using CtxCreate = CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
  CHECK_CU(driver_function<CtxCreate>("cuCtxCreate_v4")(&c.context, nullptr, 0, 0));
  CHECK_CU(driver_function<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate")(&c.stream, CU_STREAM_NON_BLOCKING));
  return c;
}
inline void make_current(CUcontext c) { CHECK_CU(driver_function<CUresult (*)(CUcontext)>("cuCtxSetCurrent")(c)); }
inline void destroy_context(CUcontext c) { CHECK_CU(driver_function<CUresult (*)(CUcontext)>("cuCtxDestroy_v2")(c)); }

#define TESTSUPPORT_DRIVER(member, symbol) decltype(&::symbol) member = driver_function<decltype(&::symbol)>(#symbol);

struct Driver {
  TESTSUPPORT_DRIVER(MemAlloc, cuMemAlloc_v2)
  TESTSUPPORT_DRIVER(MemAllocPitch, cuMemAllocPitch_v2)
  TESTSUPPORT_DRIVER(MemFree, cuMemFree_v2)
  TESTSUPPORT_DRIVER(MemAllocHost, cuMemAllocHost_v2)
  TESTSUPPORT_DRIVER(MemFreeHost, cuMemFreeHost)
  TESTSUPPORT_DRIVER(MemAllocAsync, cuMemAllocAsync)
  TESTSUPPORT_DRIVER(MemFreeAsync, cuMemFreeAsync)
  TESTSUPPORT_DRIVER(MemGetInfo, cuMemGetInfo_v2)
  TESTSUPPORT_DRIVER(MemGetAddressRange, cuMemGetAddressRange_v2)
  TESTSUPPORT_DRIVER(PointerGetAttribute, cuPointerGetAttribute)
  TESTSUPPORT_DRIVER(PointerGetAttributes, cuPointerGetAttributes)
  TESTSUPPORT_DRIVER(MemAddressReserve, cuMemAddressReserve)
  TESTSUPPORT_DRIVER(MemAddressFree, cuMemAddressFree)
  TESTSUPPORT_DRIVER(MemCreate, cuMemCreate)
  TESTSUPPORT_DRIVER(MemRelease, cuMemRelease)
  TESTSUPPORT_DRIVER(MemMap, cuMemMap)
  TESTSUPPORT_DRIVER(MemUnmap, cuMemUnmap)
  TESTSUPPORT_DRIVER(MemSetAccess, cuMemSetAccess)
  TESTSUPPORT_DRIVER(MemRetainAllocationHandle, cuMemRetainAllocationHandle)
  TESTSUPPORT_DRIVER(MemExportToShareableHandle, cuMemExportToShareableHandle)
  TESTSUPPORT_DRIVER(MemImportFromShareableHandle, cuMemImportFromShareableHandle)
  TESTSUPPORT_DRIVER(DeviceGetCount, cuDeviceGetCount)
  TESTSUPPORT_DRIVER(DevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState)
  TESTSUPPORT_DRIVER(GraphCreate, cuGraphCreate)
  TESTSUPPORT_DRIVER(GraphDestroy, cuGraphDestroy)
  TESTSUPPORT_DRIVER(GraphAddMemAllocNode, cuGraphAddMemAllocNode)
  TESTSUPPORT_DRIVER(StreamSynchronize, cuStreamSynchronize)
  TESTSUPPORT_DRIVER(ArrayCreate, cuArrayCreate_v2)
  TESTSUPPORT_DRIVER(Array3DCreate, cuArray3DCreate_v2)
  TESTSUPPORT_DRIVER(ArrayDestroy, cuArrayDestroy)
  TESTSUPPORT_DRIVER(MipmappedArrayCreate, cuMipmappedArrayCreate)
  TESTSUPPORT_DRIVER(MipmappedArrayDestroy, cuMipmappedArrayDestroy)
};

#undef TESTSUPPORT_DRIVER

inline const Driver& driver() {
  static const Driver d;
  return d;
}

}  // namespace testsupport
