// Behaves like NCCL: a static runtime reaching the driver through cuGetProcAddress_v2, buffers
// from cuMemAlloc and from the virtual-memory API (cuMemCreate + cuMemMap, with the handle
// released right after mapping, as NCCL does), and host memory from a host-located cuMemCreate
// made on a thread with no current context.
#include <thread>

#include "static_runtime_support.h"

using namespace staticrt;

namespace {

struct Api {
  decltype(&cuMemAlloc_v2) mem_alloc = resolve<decltype(&cuMemAlloc_v2)>("cuMemAlloc", 3020);
  decltype(&cuMemCreate) create = resolve<decltype(&cuMemCreate)>("cuMemCreate", 10020);
  decltype(&cuMemRelease) release = resolve<decltype(&cuMemRelease)>("cuMemRelease", 10020);
  decltype(&cuMemAddressReserve) reserve = resolve<decltype(&cuMemAddressReserve)>("cuMemAddressReserve", 10020);
  decltype(&cuMemMap) map = resolve<decltype(&cuMemMap)>("cuMemMap", 10020);
  decltype(&cuMemSetAccess) set_access = resolve<decltype(&cuMemSetAccess)>("cuMemSetAccess", 10020);
  decltype(&cuCtxGetDevice) ctx_device = resolve<decltype(&cuCtxGetDevice)>("cuCtxGetDevice", 2000);
};

const Api& api() {
  static const Api a;
  return a;
}

}  // namespace

// Allocates `plain` bytes with cuMemAlloc and `vmm` bytes (a multiple of 2 MiB) of mapped
// physical memory on the current context's device. Everything stays allocated.
extern "C" int nccl_like_allocate(size_t plain, size_t vmm) {
  const Api& a = api();
  CUdeviceptr p = 0;
  STATICRT_CHECK(a.mem_alloc(&p, plain));
  CUdevice dev = 0;
  STATICRT_CHECK(a.ctx_device(&dev));
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  CUmemGenericAllocationHandle h = 0;
  STATICRT_CHECK(a.create(&h, vmm, &prop, 0));
  CUdeviceptr va = 0;
  STATICRT_CHECK(a.reserve(&va, vmm, 0, 0, 0));
  STATICRT_CHECK(a.map(va, vmm, 0, h, 0));
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  STATICRT_CHECK(a.set_access(va, vmm, &access, 1));
  // The mapping keeps the memory alive; NCCL drops its handle at once.
  STATICRT_CHECK(a.release(h));
  return 0;
}

// Host memory from the VMM API, created on a fresh thread that has no current context.
extern "C" int nccl_like_host_memory(size_t bytes) {
  CUresult result = CUDA_ERROR_UNKNOWN;
  std::thread([&] {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CUmemGenericAllocationHandle h = 0;
    result = api().create(&h, bytes, &prop, 0);
  }).join();
  return static_cast<int>(result);
}
