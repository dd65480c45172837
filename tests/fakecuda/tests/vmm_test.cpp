// Virtual memory management: reservations, physical allocations, mappings, access, deferred
// release, argument validation, and sharing through POSIX file descriptors.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "test_util.h"

namespace fakecuda_test {
namespace {

constexpr size_t kGran = size_t{2} << 20;

size_t RoundUpGran(size_t v) { return (v + kGran - 1) / kGran * kGran; }

CUmemAllocationProp DeviceProp(bool exportable = false) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

CUmemAccessDesc ReadWrite() {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return d;
}

using Vmm = DriverTest;

TEST_F(Vmm, Granularity) {
  CUmemAllocationProp prop = DeviceProp();
  size_t g = 0;
  ASSERT_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(g, kGran);
  ASSERT_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT_EQ(g, kGran);
}

TEST_F(Vmm, ReserveCreateMapAccessUnmapRelease) {
  const size_t used = fakecudaDeviceUsedBytes(0);
  const auto allocs = fakecudaDriverAllocCount();
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 4 * kGran, 0, 0, 0));
  EXPECT_EQ(va % kGran, 0u);
  CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemCreate(&h, 2 * kGran, &prop, 0));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used + 2 * kGran);
  EXPECT_EQ(fakecudaDriverAllocCount(), allocs + 1);
  ASSERT_CU(cuMemMap(va + kGran, 2 * kGran, 0, h, 0));
  CUmemAccessDesc rw = ReadWrite();
  ASSERT_CU(cuMemSetAccess(va + kGran, 2 * kGran, &rw, 1));
  unsigned long long flags = 0;
  ASSERT_CU(cuMemGetAccess(&flags, &rw.location, va + kGran));
  EXPECT_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  auto* bytes = reinterpret_cast<unsigned char*>(va + kGran);
  bytes[0] = 1;
  bytes[2 * kGran - 1] = 2;
  ASSERT_CU(cuMemsetD8(va + kGran + 4096, 7, 4096));
  EXPECT_EQ(bytes[4096 + 100], 7);

  // Pointer queries: RANGE_* describe the reservation, the address range the mapping.
  CUdeviceptr start = 0, base = 0;
  size_t range = 0, size = 0;
  unsigned int type = 0, ipc = 1;
  ASSERT_CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + kGran + 10));
  ASSERT_CU(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, va + kGran + 10));
  ASSERT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + kGran + 10));
  ASSERT_CU(cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, va + kGran));
  ASSERT_CU(cuMemGetAddressRange(&base, &size, va + kGran + 10));
  EXPECT_EQ(start, va);
  EXPECT_EQ(range, 4 * kGran);
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  EXPECT_EQ(ipc, 0u);
  EXPECT_EQ(base, va + kGran);
  EXPECT_EQ(size, 2 * kGran);
  // Legacy IPC does not work on VMM memory.
  CUipcMemHandle ipc_handle;
  EXPECT_EQ(cuIpcGetMemHandle(&ipc_handle, va + kGran), CUDA_ERROR_INVALID_VALUE);

  // Release while mapped: the memory stays until unmapped.
  ASSERT_CU(cuMemRelease(h));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used + 2 * kGran);
  EXPECT_EQ(bytes[0], 1);
  const auto syncs = fakecudaDeviceSyncCount();
  ASSERT_CU(cuMemUnmap(va + kGran, 2 * kGran));
  EXPECT_EQ(fakecudaDeviceSyncCount(), syncs + 1);  // unmapping synchronizes
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);
  EXPECT_EQ(cuMemGetAddressRange(&base, &size, va + kGran), CUDA_ERROR_NOT_FOUND);
  ASSERT_CU(cuMemAddressFree(va, 4 * kGran));
}

TEST_F(Vmm, TwoMappingsShareTheBytes) {
  CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemCreate(&h, kGran, &prop, 0));
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAddressReserve(&a, kGran, 0, 0, 0));
  ASSERT_CU(cuMemAddressReserve(&b, kGran, 0, 0, 0));
  ASSERT_CU(cuMemMap(a, kGran, 0, h, 0));
  ASSERT_CU(cuMemMap(b, kGran, 0, h, 0));
  CUmemAccessDesc rw = ReadWrite();
  ASSERT_CU(cuMemSetAccess(a, kGran, &rw, 1));
  ASSERT_CU(cuMemSetAccess(b, kGran, &rw, 1));
  reinterpret_cast<int*>(a)[1000] = 42;
  EXPECT_EQ(reinterpret_cast<int*>(b)[1000], 42);
  ASSERT_CU(cuMemsetD32(b, 0x5a5a5a5a, 16));
  EXPECT_EQ(reinterpret_cast<unsigned*>(a)[3], 0x5a5a5a5au);
  // cuMemRetainAllocationHandle finds the allocation behind an address; pair it with a release.
  CUmemGenericAllocationHandle again = 0;
  ASSERT_CU(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(b + 64)));
  EXPECT_EQ(again, h);
  ASSERT_CU(cuMemRelease(again));
  CUmemAllocationProp got{};
  ASSERT_CU(cuMemGetAllocationPropertiesFromHandle(&got, h));
  EXPECT_EQ(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  ASSERT_CU(cuMemUnmap(a, kGran));
  ASSERT_CU(cuMemUnmap(b, kGran));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(a, kGran));
  ASSERT_CU(cuMemAddressFree(b, kGran));
}

TEST_F(Vmm, CopiesSpanAdjacentMappings) {
  // An expandable-segment style range: one reservation backed by several physical chunks.
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 3 * kGran, 0, 0, 0));
  CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h[3];
  CUmemAccessDesc rw = ReadWrite();
  for (int i = 0; i < 3; ++i) {
    ASSERT_CU(cuMemCreate(&h[i], kGran, &prop, 0));
    ASSERT_CU(cuMemMap(va + i * kGran, kGran, 0, h[i], 0));
    ASSERT_CU(cuMemRelease(h[i]));
  }
  ASSERT_CU(cuMemSetAccess(va, 3 * kGran, &rw, 1));
  std::vector<unsigned char> in(2 * kGran, 0x3c), out(2 * kGran);
  ASSERT_CU(cuMemcpyHtoD(va + kGran / 2, in.data(), in.size()));
  ASSERT_CU(cuMemcpyDtoH(out.data(), va + kGran / 2, out.size()));
  EXPECT_EQ(in, out);
  ASSERT_CU(cuMemUnmap(va, 3 * kGran));  // several whole mappings at once
  ASSERT_CU(cuMemAddressFree(va, 3 * kGran));
}

TEST_F(Vmm, ArgumentValidation) {
  CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h = 0;
  EXPECT_EQ(cuMemCreate(&h, kGran + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);  // not a granule multiple
  EXPECT_EQ(cuMemCreate(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp bad_dev = prop;
  bad_dev.location.id = 5;
  EXPECT_EQ(cuMemCreate(&h, kGran, &bad_dev, 0), CUDA_ERROR_INVALID_DEVICE);
  ASSERT_CU(cuMemCreate(&h, 2 * kGran, &prop, 0));
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 4 * kGran, 0, 0, 0));
  EXPECT_EQ(cuMemMap(va + 4096, kGran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);      // unaligned address
  EXPECT_EQ(cuMemMap(va, kGran + 4096, 0, h, 0), CUDA_ERROR_INVALID_VALUE);      // unaligned size
  EXPECT_EQ(cuMemMap(va, 4 * kGran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);         // larger than the allocation
  EXPECT_EQ(cuMemMap(va + 3 * kGran, 2 * kGran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  // past the reservation
  EXPECT_EQ(cuMemMap(va, kGran, kGran, h, 0), CUDA_ERROR_INVALID_VALUE);         // offset must be 0
  CUdeviceptr unreserved = 0;
  CUdeviceptr elsewhere = 0;
  ASSERT_CU(cuMemAlloc(&elsewhere, 4096));
  unreserved = elsewhere & ~(kGran - 1);
  EXPECT_EQ(cuMemMap(unreserved, kGran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);    // not a reservation
  ASSERT_CU(cuMemFree(elsewhere));
  ASSERT_CU(cuMemMap(va, 2 * kGran, 0, h, 0));
  EXPECT_EQ(cuMemMap(va + kGran, kGran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);    // already mapped
  CUmemAccessDesc rw = ReadWrite();
  EXPECT_EQ(cuMemSetAccess(va, 3 * kGran, &rw, 1), CUDA_ERROR_INVALID_VALUE);   // partly unmapped
  EXPECT_EQ(cuMemUnmap(va, kGran), CUDA_ERROR_INVALID_VALUE);                   // part of a mapping
  EXPECT_EQ(cuMemAddressFree(va, 4 * kGran), CUDA_ERROR_INVALID_VALUE);         // still mapped
  EXPECT_EQ(cuMemAddressFree(va, 2 * kGran), CUDA_ERROR_INVALID_VALUE);         // wrong size
  // Mapped but no access granted yet: the device cannot use it.
  EXPECT_EQ(cuMemsetD8(va, 1, 16), CUDA_ERROR_INVALID_VALUE);
  // "Users cannot specify CU_MEM_LOCATION_TYPE_HOST_NUMA accessibility for allocations created on
  // with CU_MEM_LOCATION_TYPE_DEVICE" (cuMemSetAccess): it was granted (a review helper's find).
  CUmemAccessDesc numa = rw;
  numa.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  numa.location.id = 0;
  EXPECT_EQ(cuMemSetAccess(va, 2 * kGran, &numa, 1), CUDA_ERROR_INVALID_VALUE);
  unsigned long long flags = 7;
  ASSERT_CU(cuMemGetAccess(&flags, &numa.location, va));
  EXPECT_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_NONE));
  ASSERT_CU(cuMemUnmap(va, 2 * kGran));
  ASSERT_CU(cuMemRelease(h));
  EXPECT_DEATH(cuMemRelease(h), "fakecuda: misuse: cuMemRelease: physical memory handle 0x[0-9a-f]+ was destroyed \\(cuMemRelease\\)");
  EXPECT_DEATH(cuMemMap(va, 2 * kGran, 0, h, 0), "fakecuda: misuse: cuMemMap: physical memory handle 0x[0-9a-f]+ was destroyed");
  ASSERT_CU(cuMemAddressFree(va, 4 * kGran));
  EXPECT_EQ(cuMemAddressReserve(&va, 1000, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
}

// CUDA does not promise that cuMemUnmap waits for work still queued on the range (PyTorch
// synchronizes before it unmaps for that reason): the fake stops the process there. Work done
// first, the unmap is fine, and counted as the synchronization a GPU costs.
TEST_F(Vmm, UnmappingUnderQueuedWorkStopsTheProcess) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * kGran, 0, 0, 0));
  CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemCreate(&h, 2 * kGran, &prop, 0));
  ASSERT_CU(cuMemMap(va, 2 * kGran, 0, h, 0));
  CUmemAccessDesc rw = ReadWrite();
  ASSERT_CU(cuMemSetAccess(va, 2 * kGran, &rw, 1));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  static std::atomic<bool> open{false};
  open = false;
  ASSERT_CU(cuLaunchHostFunc(s, [](void*) {
    while (!open) std::this_thread::yield();
  }, nullptr));
  ASSERT_CU(cuMemsetD8Async(va + kGran + 512, 3, 4096, s));  // waits behind the gate
  const char* kMisuse = "fakecuda: misuse: cuMemUnmap of \\[0x[0-9a-f]+, 0x[0-9a-f]+\\) while work queued on stream "
                        "0x[0-9a-f]+ still accesses \\[0x[0-9a-f]+, 0x[0-9a-f]+\\)";
  EXPECT_DEATH(cuMemUnmap(va, 2 * kGran), kMisuse);
  // The same memset captured into a graph, whose launch waits behind the gate.
  CUstream c = nullptr;
  ASSERT_CU(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuStreamBeginCapture_v2(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD8Async(va, 4, 4096, c));
  ASSERT_CU(cuStreamEndCapture(c, &graph));
  ASSERT_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, s));
  EXPECT_DEATH(cuMemUnmap(va, kGran * 2), kMisuse);
  open = true;
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(va)[kGran + 512], 3);
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(va)[0], 4);  // the graph ran
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(graph));
  ASSERT_CU(cuStreamDestroy(c));
  const auto syncs = fakecudaDeviceSyncCount();
  ASSERT_CU(cuMemUnmap(va, 2 * kGran));
  EXPECT_EQ(fakecudaDeviceSyncCount(), syncs + 1);
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, 2 * kGran));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(Vmm, ReserveHonoursAFreeHint) {
  CUdeviceptr first = 0;
  ASSERT_CU(cuMemAddressReserve(&first, 2 * kGran, 0, 0, 0));
  ASSERT_CU(cuMemAddressFree(first, 2 * kGran));
  CUdeviceptr again = 0;
  ASSERT_CU(cuMemAddressReserve(&again, 2 * kGran, 0, first, 0));
  EXPECT_EQ(again, first);
  // A hint inside an existing reservation cannot be honoured: some other range is returned.
  CUdeviceptr other = 0;
  ASSERT_CU(cuMemAddressReserve(&other, kGran, 0, first, 0));
  EXPECT_NE(other, first);
  ASSERT_CU(cuMemAddressFree(other, kGran));
  ASSERT_CU(cuMemAddressFree(again, 2 * kGran));
}

TEST_F(Vmm, DeviceAllocationsCountAgainstCapacity) {
  size_t free_b = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free_b, &total));
  CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h = 0;
  EXPECT_EQ(cuMemCreate(&h, RoundUpGran(free_b + 1), &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_CU(cuMemCreate(&h, 4 * kGran, &prop, 0));
  size_t after = 0;
  ASSERT_CU(cuMemGetInfo(&after, &total));
  EXPECT_EQ(free_b - after, 4 * kGran);
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemGetInfo(&after, &total));
  EXPECT_EQ(after, free_b);
}

TEST_F(Vmm, HostLocatedAllocationsNeedNoContextAndCostNoDeviceMemory) {
  const size_t used = fakecudaDeviceUsedBytes(0);
  const auto allocs = fakecudaDriverAllocCount();
  std::thread([&] {
    // NCCL does this on a thread without a current context.
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CUmemGenericAllocationHandle h = 0;
    ASSERT_CU(cuMemCreate(&h, kGran, &prop, 0));
    EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);
    EXPECT_EQ(fakecudaDriverAllocCount(), allocs);
    CUdeviceptr va = 0;
    ASSERT_CU(cuMemAddressReserve(&va, kGran, 0, 0, 0));
    ASSERT_CU(cuMemMap(va, kGran, 0, h, 0));
    CUmemAccessDesc host{};
    host.location.type = CU_MEM_LOCATION_TYPE_HOST;
    host.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ASSERT_CU(cuMemSetAccess(va, kGran, &host, 1));
    reinterpret_cast<int*>(va)[0] = 9;
    unsigned int type = 0;
    ASSERT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va));
    EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_HOST));
    ASSERT_CU(cuMemUnmap(va, kGran));
    ASSERT_CU(cuMemRelease(h));
    ASSERT_CU(cuMemAddressFree(va, kGran));
    // Host allocations cannot ask for shareable handles.
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    EXPECT_EQ(cuMemCreate(&h, kGran, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  }).join();
  // A device-located allocation takes its device from the properties, not from a current context.
  std::thread([] {
    CUcontext none = nullptr;
    ASSERT_CU(cuCtxGetCurrent(&none));
    ASSERT_EQ(none, nullptr);
    CUmemAllocationProp prop = DeviceProp();
    CUmemGenericAllocationHandle h = 0;
    const size_t used = fakecudaDeviceUsedBytes(0);
    ASSERT_CU(cuMemCreate(&h, kGran, &prop, 0));
    EXPECT_EQ(fakecudaDeviceUsedBytes(0), used + kGran);
    ASSERT_CU(cuMemRelease(h));
    EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);
    prop.location.id = 99;
    EXPECT_EQ(cuMemCreate(&h, kGran, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
  }).join();
}

TEST_F(Vmm, ExportAndImportInProcess) {
  CUmemAllocationProp prop = DeviceProp(/*exportable=*/true);
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemCreate(&h, kGran, &prop, 0));
  int fd = -1;
  ASSERT_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  ASSERT_GE(fd, 0);
  CUmemGenericAllocationHandle imported = 0;
  ASSERT_CU(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAddressReserve(&a, kGran, 0, 0, 0));
  ASSERT_CU(cuMemAddressReserve(&b, kGran, 0, 0, 0));
  ASSERT_CU(cuMemMap(a, kGran, 0, h, 0));
  ASSERT_CU(cuMemMap(b, kGran, 0, imported, 0));
  CUmemAccessDesc rw = ReadWrite();
  ASSERT_CU(cuMemSetAccess(a, kGran, &rw, 1));
  ASSERT_CU(cuMemSetAccess(b, kGran, &rw, 1));
  reinterpret_cast<int*>(a)[7] = 77;
  EXPECT_EQ(reinterpret_cast<int*>(b)[7], 77);
  for (CUdeviceptr p : {a, b}) ASSERT_CU(cuMemUnmap(p, kGran));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemRelease(imported));
  for (CUdeviceptr p : {a, b}) ASSERT_CU(cuMemAddressFree(p, kGran));
  // Not exportable unless requested at creation.
  CUmemAllocationProp plain = DeviceProp();
  ASSERT_CU(cuMemCreate(&h, kGran, &plain, 0));
  EXPECT_EQ(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemRelease(h));
  // Random descriptors are not CUDA allocations.
  int devnull = open("/dev/null", O_RDONLY);
  EXPECT_EQ(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(devnull)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_ERROR_INVALID_VALUE);
  close(devnull);
}

TEST_F(Vmm, ExportToAnotherProcess) {
  CUmemAllocationProp prop = DeviceProp(/*exportable=*/true);
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemCreate(&h, kGran, &prop, 0));
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, kGran, 0, 0, 0));
  ASSERT_CU(cuMemMap(va, kGran, 0, h, 0));
  CUmemAccessDesc rw = ReadWrite();
  ASSERT_CU(cuMemSetAccess(va, kGran, &rw, 1));
  ASSERT_CU(cuMemsetD8(va, 0x11, kGran));
  int fd = -1;
  ASSERT_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  // The exported descriptor is inherited by the child (real programs pass it over a socket).
  ChildResult r = RunChild({"--child=vmm-import", std::to_string(fd), std::to_string(kGran), "17", "34"});
  close(fd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(reinterpret_cast<unsigned char*>(va)[0], 34);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(va)[kGran - 1], 34);
  ASSERT_CU(cuMemUnmap(va, kGran));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, kGran));
}

}  // namespace
}  // namespace fakecuda_test
