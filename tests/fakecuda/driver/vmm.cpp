// Virtual memory management: address reservations, physical allocations, mappings, access, and
// POSIX file descriptor export/import.
//
// A reservation is a PROT_NONE MAP_NORESERVE range. A physical allocation (cuMemCreate) is a memfd
// of its own; cuMemMap maps it MAP_SHARED|MAP_FIXED into a reservation with no access, and
// cuMemSetAccess mprotect()s it. Two mappings of one allocation therefore share their bytes, within
// a process and, through an exported fd, across processes. As in CUDA, releasing a handle that is
// still mapped only drops the reference: the memory lives until the last mapping goes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "driver.h"

namespace fakecuda {
namespace {

constexpr int kMapFixedNoReplace = 0x100000;  // MAP_FIXED_NOREPLACE (Linux 4.17+)

std::size_t PageSize() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

bool Aligned(std::uintptr_t v) { return v % kGranularity == 0; }

void* MapReservation(std::uintptr_t addr, std::size_t size, int extra_flags) {
  return mmap(reinterpret_cast<void*>(addr), size, PROT_NONE,
              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra_flags, -1, 0);
}


// Collects the mappings that exactly tile [ptr, ptr+size); false if the range is not made of
// whole mappings.
bool WholeMappings(State& s, std::uintptr_t ptr, std::size_t size, std::vector<Region*>* out) {
  std::uintptr_t cursor = ptr;
  const std::uintptr_t end = ptr + size;
  while (cursor < end) {
    auto it = s.regions.find(cursor);
    if (it == s.regions.end() || it->second.kind != RegionKind::kVmmMapping) return false;
    out->push_back(&it->second);
    cursor += it->second.size;
  }
  return cursor == end && !out->empty();
}

void DestroyPhysical(State& s, PhysicalAllocation& phys) {
  if (phys.fd >= 0) close(phys.fd);
  phys.fd = -1;
  if (phys.device >= 0 && phys.charged != 0) UnchargeDevice(*s.devices[static_cast<std::size_t>(phys.device)], phys.charged);
  phys.charged = 0;
}

void DropReference(State& s, const std::shared_ptr<PhysicalAllocation>& phys) {
  if (--phys->refs == 0) {
    s.physical.erase(phys->handle);
    BuryHandle(s, HandleKind::kPhysical, phys->handle, "cuMemRelease");
  }
  if (phys->refs == 0 && phys->mappings == 0) DestroyPhysical(s, *phys);
}

// The live allocation of a handle; any other value is misuse by `call`.
std::shared_ptr<PhysicalAllocation> LookupPhysical(State& s, CUmemGenericAllocationHandle handle, const char* call) {
  auto it = s.physical.find(handle);
  if (it == s.physical.end()) BadHandle(s, call, HandleKind::kPhysical, handle);
  return it->second;
}

// cuMemUnmap and cuMemSetAccess act on mappings: a range that starts where nothing is mapped (never
// mapped, or unmapped already) is the VMM form of a destroyed handle.
void RequireMapping(State& s, std::uintptr_t ptr, const char* call) {
  const Region* m = FindRegion(s, ptr);
  if (m == nullptr || m->kind != RegionKind::kVmmMapping) {
    Misuse("%s: nothing is mapped at %#lx (never mapped, or unmapped already)", call, static_cast<unsigned long>(ptr));
  }
}

std::shared_ptr<PhysicalAllocation> RegisterPhysical(State& s, int fd, std::size_t size, const CUmemAllocationProp& prop,
                                                     int device, std::size_t charged) {
  auto phys = std::make_shared<PhysicalAllocation>();
  phys->id = NextId(s);
  phys->handle = MintHandle(s, HandleKind::kPhysical);
  phys->fd = fd;
  phys->size = size;
  phys->prop = prop;
  phys->device = device;
  phys->charged = charged;
  s.physical[phys->handle] = phys;
  return phys;
}

int CreateMemfd(int device, std::size_t size) {
  const std::string name = device >= 0 ? "fakecuda-vmm-dev" + std::to_string(device) : "fakecuda-vmm-host";
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Recovers the location of an imported allocation from the memfd's name.
bool ParseMemfdName(int fd, int* device) {
  char link[128];
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
  if (n <= 0) return false;
  link[n] = '\0';
  if (std::strstr(link, "memfd:fakecuda-vmm-host") != nullptr) {
    *device = -1;
    return true;
  }
  const char* dev = std::strstr(link, "memfd:fakecuda-vmm-dev");
  if (dev == nullptr) return false;
  *device = std::atoi(dev + std::strlen("memfd:fakecuda-vmm-dev"));
  return true;
}

CUresult ValidateLocation(State& s, const CUmemLocation& loc) {
  if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    Device* d = nullptr;
    return GetDevice(s, loc.id, &d);
  }
  if (loc.type == CU_MEM_LOCATION_TYPE_HOST || loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) return CUDA_SUCCESS;
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

Reservation* FindReservation(State& s, std::uintptr_t p, std::size_t size) {
  auto it = s.reservations.upper_bound(p);
  if (it == s.reservations.begin()) return nullptr;
  --it;
  Reservation& r = it->second;
  if (p < r.base || p + size > r.base + r.size || p + size < p) return nullptr;
  return &r;
}

}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = ValidateLocation(s, prop->location); r != CUDA_SUCCESS) return r;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (ptr == nullptr || size == 0 || size % PageSize() != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (addr % PageSize() != 0) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t align = std::max(alignment, kGranularity);

  std::uintptr_t base = 0;
  // The address is a hint: honour it when that range is free.
  if (addr != 0 && addr % align == 0) {
    void* p = MapReservation(addr, size, kMapFixedNoReplace);
    if (p != MAP_FAILED && reinterpret_cast<std::uintptr_t>(p) == addr) {
      base = addr;
    } else if (p != MAP_FAILED) {
      munmap(p, size);  // old kernel treating the flag as a plain hint
    }
  }
  if (base == 0) {
    void* p = MapReservation(0, size + align, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    const auto start = reinterpret_cast<std::uintptr_t>(p);
    base = RoundUp(start, align);
    if (base > start) munmap(p, base - start);
    const std::uintptr_t end = base + size;
    if (start + size + align > end) munmap(reinterpret_cast<void*>(end), start + size + align - end);
  }
  s.reservations[base] = Reservation{base, size};
  *ptr = base;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end()) {
    Misuse("cuMemAddressFree: no reservation starts at %#lx (never reserved, or freed already)",
           static_cast<unsigned long>(ptr));
  }
  if (it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  // Mappings must be unmapped first (cuMemUnmap), otherwise their memory would leak.
  auto m = s.regions.lower_bound(ptr);
  if (m != s.regions.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || prop == nullptr || flags != 0 || size == 0 || size % kGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if ((prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) return CUDA_ERROR_NOT_SUPPORTED;

  int device = -1;
  std::size_t charged = 0;
  switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE: {
      Device* d = nullptr;
      if (CUresult r = GetDevice(s, prop->location.id, &d); r != CUDA_SUCCESS) return r;
      // The device comes from the properties; no current context is needed (NVIDIA's memMapIPCDrv
      // sample creates its allocations after destroying its context).
      if (CountAllocCallAndCheckFailure(s)) return CUDA_ERROR_OUT_OF_MEMORY;
      if (CUresult r = ChargeDevice(*d, size); r != CUDA_SUCCESS) return r;
      device = d->ordinal;
      charged = size;
      break;
    }
    case CU_MEM_LOCATION_TYPE_HOST:
      // Host memory is not IPC capable; it needs no context (NCCL creates it without one).
      if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_INVALID_VALUE;
      break;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  int fd = CreateMemfd(device, size);
  if (fd < 0) {
    if (device >= 0) UnchargeDevice(*s.devices[static_cast<std::size_t>(device)], charged);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *handle = RegisterPhysical(s, fd, size, *prop, device, charged)->handle;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  std::shared_ptr<PhysicalAllocation> phys = LookupPhysical(s, handle, "cuMemRelease");
  if (phys->device >= 0) ++s.device_free_calls;
  DropReference(s, phys);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  std::shared_ptr<PhysicalAllocation> phys = LookupPhysical(s, handle, "cuMemMap");
  if (flags != 0 || size == 0 || !Aligned(ptr) || !Aligned(size)) return CUDA_ERROR_INVALID_VALUE;
  // cuda.h: "offset ... currently must be zero".
  if (offset != 0 || size > phys->size) return CUDA_ERROR_INVALID_VALUE;
  Reservation* res = FindReservation(s, ptr, size);
  if (res == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Only unmapped parts of a reservation can be mapped.
  auto next = s.regions.lower_bound(ptr);
  if (next != s.regions.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (FindRegion(s, ptr) != nullptr) return CUDA_ERROR_INVALID_VALUE;

  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, phys->fd,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Region r;
  r.base = ptr;
  r.size = size;
  r.kind = RegionKind::kVmmMapping;
  r.device = phys->device;
  r.buffer_id = NextId(s);
  r.phys = phys;
  r.phys_offset = offset;
  r.reservation_base = res->base;
  r.reservation_size = res->size;
  s.regions[ptr] = std::move(r);
  ++phys->mappings;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  State& s = GetState();
  std::unique_lock lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  RequireMapping(s, ptr, "cuMemUnmap");
  std::vector<Region*> mappings;
  if (!Aligned(ptr) || !Aligned(size) || !WholeMappings(s, ptr, size, &mappings)) return CUDA_ERROR_INVALID_VALUE;
  // Work still queued that accesses the range is the program's error (CUDA does not promise to
  // wait for it); the rest is modelled as a GPU costs it, a synchronization.
  RequireNoQueuedAccess(s, ptr, size, "cuMemUnmap");
  ++s.device_syncs;
  SyncPrimaryContexts(s, lk);
  mappings.clear();
  if (!WholeMappings(s, ptr, size, &mappings)) return CUDA_ERROR_INVALID_VALUE;  // raced with another unmap
  // Turn the range back into a plain reservation.
  MapReservation(ptr, size, MAP_FIXED);
  for (Region* m : mappings) {
    std::shared_ptr<PhysicalAllocation> phys = m->phys;
    s.regions.erase(m->base);
    if (--phys->mappings == 0 && phys->refs == 0) DestroyPhysical(s, *phys);
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  RequireMapping(s, ptr, "cuMemSetAccess");
  std::vector<Region*> mappings;
  if (!WholeMappings(s, ptr, size, &mappings)) return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < count; ++i) {
    if (CUresult r = ValidateLocation(s, desc[i].location); r != CUDA_SUCCESS) return r;
    // "Users cannot specify CU_MEM_LOCATION_TYPE_HOST_NUMA accessibility for allocations created on
    // with CU_MEM_LOCATION_TYPE_DEVICE" (cuMemSetAccess).
    if (desc[i].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
      for (Region* m : mappings)
        if (m->phys->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    const CUmemAccess_flags f = desc[i].flags;
    if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (Region* m : mappings) {
    for (std::size_t i = 0; i < count; ++i) {
      m->access_by_location[{desc[i].location.type, desc[i].location.id}] = desc[i].flags;
    }
    CUmemAccess_flags strongest = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    for (const auto& [loc, f] : m->access_by_location) strongest = std::max(strongest, f);
    m->access = strongest;
    const int prot = strongest == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? (PROT_READ | PROT_WRITE)
                     : strongest == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                                     : PROT_NONE;
    if (mprotect(reinterpret_cast<void*>(m->base), m->size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Region* m = FindRegion(s, ptr);
  if (m == nullptr || m->kind != RegionKind::kVmmMapping) return CUDA_ERROR_INVALID_VALUE;
  auto it = m->access_by_location.find({location->type, location->id});
  *flags = it == m->access_by_location.end() ? CU_MEM_ACCESS_FLAGS_PROT_NONE : it->second;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  std::shared_ptr<PhysicalAllocation> phys = LookupPhysical(s, handle, "cuMemGetAllocationPropertiesFromHandle");
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *prop = phys->prop;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  const Region* m = FindRegion(s, reinterpret_cast<std::uintptr_t>(addr));
  if (handle == nullptr || m == nullptr || m->kind != RegionKind::kVmmMapping) return CUDA_ERROR_INVALID_VALUE;
  // Each retain must be paired with cuMemRelease, exactly like the handle from cuMemCreate.
  if (m->phys->refs++ == 0) {
    s.physical[m->phys->handle] = m->phys;
    ReviveHandle(s, HandleKind::kPhysical, m->phys->handle);
  }
  *handle = m->phys->handle;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType, unsigned long long flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  std::shared_ptr<PhysicalAllocation> phys = LookupPhysical(s, handle, "cuMemExportToShareableHandle");
  if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  // Only allocations created with this handle type requested may be exported.
  if ((phys->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = dup(phys->fd);  // the caller owns (and closes) the new descriptor
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareableHandle) = fd;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                                CUmemAllocationHandleType shHandleType) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  // For POSIX fds the "pointer" carries the descriptor value itself.
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(osHandle));
  struct stat st {};
  int device = -1;
  if (fd < 0 || fstat(fd, &st) != 0 || !ParseMemfdName(fd, &device) || st.st_size <= 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = device >= 0 ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
  prop.location.id = device >= 0 ? device : 0;
  // The exporting process pays for the memory; an importer charges nothing.
  const int local_device = (device >= 0 && device < static_cast<int>(s.devices.size())) ? device : -1;
  *handle = RegisterPhysical(s, own, static_cast<std::size_t>(st.st_size), prop, local_device, 0)->handle;
  return CUDA_SUCCESS;
}
