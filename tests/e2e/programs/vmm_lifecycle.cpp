// The virtual-memory API's lifetimes: physical memory exists from cuMemCreate until it is both
// released (once per create or retain) and unmapped, in either order. After each step prints what
// the shim counts live on device 0 and what the driver has charged the device beyond the context,
// for the test to check they agree at every step. Also host-located memory made with no context.
#include <cuda.h>

#include <unistd.h>

#include <thread>

#include "support/driver_api.h"
#include "support/test_support.h"

#define DRV(x)                                                                                     \
  do {                                                                                             \
    CUresult r_ = (x);                                                                             \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, static_cast<int>(r_)); \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

namespace {

constexpr size_t kChunk = 2 << 20;
size_t (*g_used)(int) = nullptr;
size_t g_context = 0;
bool g_first = true;

void step(const char* name) {
  gpushim_device_stats st = {};
  const bool have = testsupport::shim_stats(0, &st);
  std::printf("%s\"%s\":[%llu,%zu]", g_first ? "" : ",", name, have ? static_cast<unsigned long long>(st.live_bytes) : 0ull,
              g_used ? g_used(0) - g_context : 0);
  g_first = false;
}

CUmemAllocationProp device_prop() {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  return prop;
}

}  // namespace

int main() {
  const testsupport::Driver& D = testsupport::driver();
  CHECK(cudaFree(nullptr));  // the runtime's context, current on this thread
  g_used = testsupport::driver_test_hook<size_t (*)(int)>("fakecudaDeviceUsedBytes");
  g_context = g_used ? g_used(0) : 0;
  const CUmemAllocationProp prop = device_prop();
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUdeviceptr va = 0;
  DRV(D.MemAddressReserve(&va, 4 * kChunk, 0, 0, 0));
  std::printf("{");
  step("start");

  // NCCL's order: release right after mapping; the mapping keeps the memory.
  CUmemGenericAllocationHandle h = 0;
  DRV(D.MemCreate(&h, kChunk, &prop, 0));
  step("created");
  DRV(D.MemMap(va, kChunk, 0, h, 0));
  DRV(D.MemSetAccess(va, kChunk, &access, 1));
  step("mapped");
  DRV(D.MemRelease(h));
  step("released_while_mapped");
  DRV(D.MemUnmap(va, kChunk));
  step("unmapped_after_release");

  // Expandable segments' order: unmap first, release last.
  DRV(D.MemCreate(&h, 2 * kChunk, &prop, 0));
  DRV(D.MemMap(va, 2 * kChunk, 0, h, 0));
  DRV(D.MemUnmap(va, 2 * kChunk));
  step("unmapped_before_release");
  DRV(D.MemRelease(h));
  step("released_after_unmap");

  // A retain is one more reference: the memory outlives the first release.
  DRV(D.MemCreate(&h, kChunk, &prop, 0));
  DRV(D.MemMap(va, kChunk, 0, h, 0));
  CUmemGenericAllocationHandle again = 0;
  DRV(D.MemRetainAllocationHandle(&again, reinterpret_cast<void*>(va)));
  DRV(D.MemRelease(h));
  DRV(D.MemUnmap(va, kChunk));
  step("retained_unmapped_released_once");
  DRV(D.MemRelease(again));
  step("released_twice");

  // Two mappings of one allocation in one unmap call.
  DRV(D.MemCreate(&h, kChunk, &prop, 0));
  DRV(D.MemMap(va, kChunk, 0, h, 0));
  DRV(D.MemMap(va + kChunk, kChunk, 0, h, 0));
  DRV(D.MemRelease(h));
  step("two_mappings");
  DRV(D.MemUnmap(va, 2 * kChunk));
  step("both_unmapped");

  // Shared through a POSIX file descriptor and imported (here by the same process, which the driver
  // allows): the importer's mapping is the exporter's memory, counted once as device memory and
  // shown apart as imported memory while mapped.
  {
    CUmemAllocationProp shareable = prop;
    shareable.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    DRV(D.MemCreate(&h, kChunk, &shareable, 0));
    int fd = -1;
    DRV(D.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CUmemGenericAllocationHandle imported = 0;
    DRV(D.MemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    DRV(D.MemMap(va, kChunk, 0, imported, 0));
    step("imported_mapped");
    DRV(D.MemRelease(imported));
    DRV(D.MemUnmap(va, kChunk));
    DRV(D.MemRelease(h));
    step("import_done");
  }

  // Host memory, made on a thread with no current context (NCCL does this).
  CUresult host_result = CUDA_ERROR_UNKNOWN;
  std::thread([&] {
    CUmemAllocationProp host = {};
    host.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    host.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CUmemGenericAllocationHandle hh = 0;
    host_result = D.MemCreate(&hh, kChunk, &host, 0);
  }).join();
  std::printf(",\"host_create\":%d", static_cast<int>(host_result));

  // Memory on another device, made from this device's context: the shim must not create a context
  // on that device to account it (that would cost the program a context's worth of memory).
  int devices = 0;
  DRV(D.DeviceGetCount(&devices));
  if (devices > 1) {
    CUmemAllocationProp other = prop;
    other.location.id = 1;
    CUmemGenericAllocationHandle oh = 0;
    DRV(D.MemCreate(&oh, kChunk, &other, 0));
    unsigned int flags = 0;
    int active = -1;
    DRV(D.DevicePrimaryCtxGetState(1, &flags, &active));
    std::printf(",\"other_device_primary_active\":%d,\"other_device_used\":%zu", active, g_used ? g_used(1) : 0);
  }

  // A live one for the report.
  DRV(D.MemCreate(&h, 3 * kChunk, &prop, 0));
  step("live_at_exit");
  DRV(D.MemAddressFree(va, 4 * kChunk));
  std::printf("}\n");
  return 0;
}
