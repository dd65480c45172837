// Allocation entry points: cuMemAlloc family, managed and pinned host memory, stream-ordered
// allocation and memory pools.
//
// Every device-memory allocation call goes through CountAllocCallAndCheckFailure, which numbers the
// calls (fakecudaDriverAllocCount) and implements FAKECUDA_FAIL_ALLOC.
#include "driver.h"

namespace fakecuda {
namespace {

bool IsFreeableDeviceKind(RegionKind k) {
  return k == RegionKind::kDeviceMalloc || k == RegionKind::kDeviceAsync || k == RegionKind::kGraph;
}

// A live pool (a device's default pool, or one the program created); any other value is misuse.
MemPool* LookupPool(State& s, CUmemoryPool pool, const char* call) {
  for (auto& dev : s.devices) {
    if (reinterpret_cast<CUmemoryPool>(&dev->default_pool) == pool) return &dev->default_pool;
  }
  auto it = s.pools.find(pool);
  if (it == s.pools.end()) BadHandle(s, call, HandleKind::kMemPool, reinterpret_cast<std::uintptr_t>(pool));
  return it->second.get();
}

CUmemoryPool PoolHandle(MemPool* pool) {
  return pool->is_default ? reinterpret_cast<CUmemoryPool>(pool) : reinterpret_cast<CUmemoryPool>(pool->handle);
}

CUresult AllocAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, bool explicit_pool, CUstream hStream,
                    bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuMemAllocAsync"); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  MemPool* mp = nullptr;
  if (explicit_pool) {
    mp = LookupPool(s, pool, "cuMemAllocFromPoolAsync");
  } else {
    mp = DeviceOf(s, st->ctx).current_pool;
  }
  if (st->capture && st->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  // On a stream that is not capturing, a stream-ordered allocation is a "potentially unsafe" call
  // while a conflicting capture runs (an H200, 2026-11-27: refused and the capture invalidated,
  // from the capturing thread and, in global mode, from any other).
  if (!st->capture) {
    if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  }
  if (CountAllocCallAndCheckFailure(s)) return CUDA_ERROR_OUT_OF_MEMORY;
  // The fake allocates immediately; that is always a legal implementation of stream order.
  // Captured allocations become graph memory, owned by the graph if it also frees them.
  const RegionKind kind = st->capture ? RegionKind::kGraph : RegionKind::kDeviceAsync;
  std::uintptr_t base = 0;
  if (CUresult r = AllocateArenaRegion(s, st->ctx, bytesize, kind, mp, &base); r != CUDA_SUCCESS) return r;
  if (st->capture) {
    Region& region = s.regions[base];
    region.capture_id = st->capture->id;
    region.graph_unlaunched = true;
    region.graph = st->capture->graph;
    st->capture->graph->allocations.push_back(base);
    NoteCapturedNode(*st->capture, st);
  } else {
    // Graph memory comes from the graph's own pool, not this one. A pool counts the bytes asked
    // for, not their rounding (an H100 reports 1000 bytes used after cuMemAllocAsync(1000)).
    mp->OnAllocated(bytesize);
    Region& region = s.regions[base];
    region.alloc_stream = SharedStream(s, st);
    region.alloc_seq = st->submitted;  // reached once the stream has run what was queued before
  }
  *dptr = base;
  return CUDA_SUCCESS;
}

CUresult FreeAsync(CUdeviceptr dptr, CUstream hStream, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuMemFreeAsync"); r != CUDA_SUCCESS) return r;
  if (!st->capture) {  // as for cuMemAllocAsync
    if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  }
  auto it = s.regions.find(dptr);
  if (it == s.regions.end() || !IsFreeableDeviceKind(it->second.kind) || it->second.free_pending ||
      it->second.free_node_pending) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Region& region = it->second;
  // Graph memory that no launch has allocated yet cannot be freed outside a graph: an H200 and an
  // H100 answer CUDA_ERROR_INVALID_VALUE (2026-11-26), on any stream.
  if (region.graph_unlaunched && !(st->capture && region.capture_id == st->capture->id)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uintptr_t base = region.base;
  const std::uint64_t buffer_id = region.buffer_id;
  // Releases the allocation when the op runs, unless it is gone already (context reset).
  auto release = [base, buffer_id] {
    State& state = GetState();
    std::lock_guard inner(state.mu);
    auto r = state.regions.find(base);
    if (r != state.regions.end() && r->second.buffer_id == buffer_id &&
        (r->second.free_pending || r->second.free_node_pending)) {
      // "The allocation must not be accessed after stream execution reaches the free": work of
      // another stream, not ordered before the free, that still reads or writes it.
      RequireNoQueuedAccess(state, base, r->second.size, "cuMemFreeAsync reached on its stream");
      ReleaseFreedRegion(state, base);
    }
  };

  if (st->capture) {
    const std::shared_ptr<Capture> cap = st->capture;
    if (cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    // cuMemFreeAsync: "During stream capture, this function results in the creation of a free
    // node and must therefore be passed the address of a graph allocation"; cuGraphAddMemFreeNode
    // refuses "an address that was not returned by an allocation node" with invalid value. (PyTorch's
    // cudaMallocAsync backend defers such frees past the capture for that reason.) Graph memory of
    // another graph may be freed here: it is freed when this graph is launched.
    if (region.kind != RegionKind::kGraph) return CUDA_ERROR_INVALID_VALUE;
    ++s.device_free_calls;
    NoteCapturedNode(*cap, st);
    if (region.capture_id == cap->id) {
      // Allocated and freed inside the same graph: the graph owns it until destroyed.
      region.free_pending = true;
      cap->graph->owned_allocations.push_back(base);
    } else {
      // Another graph's memory is freed when this graph is launched; until then it is in use.
      region.free_node_pending = true;
      cap->graph->nodes.push_back(release);
      cap->graph->deferred_frees.emplace_back(base, buffer_id);
    }
    return CUDA_SUCCESS;
  }
  region.free_pending = true;
  region.stream_ordered_free = true;
  if (CUresult r = Submit(s, st, release); r != CUDA_SUCCESS) {
    region.free_pending = region.stream_ordered_free = false;
    return r;
  }
  ++s.device_free_calls;
  return CUDA_SUCCESS;
}

CUresult HostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  constexpr unsigned kValid = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (pp == nullptr || bytesize == 0 || (flags & ~kValid) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  std::uintptr_t base = 0;
  if (CUresult r = AllocateHostRegion(s, ctx, bytesize, RegionKind::kPinnedHost, &base); r != CUDA_SUCCESS) return r;
  *pp = reinterpret_cast<void*>(base);
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

std::uint64_t fakecuda::DeviceUsedBytes(const State& s, const Device& dev) {
  // What the device's memory pools reserve beyond what is allocated from them is device memory in
  // use too (a GPU's cuMemGetInfo counts a pool's whole chunks; the arena holds only the
  // allocations themselves).
  std::uint64_t slack = dev.default_pool.reserved - std::min(dev.default_pool.reserved, dev.default_pool.used);
  for (const auto& [key, pool] : s.pools)
    if (pool->device == dev.ordinal) slack += pool->reserved - std::min(pool->reserved, pool->used);
  return std::min<std::uint64_t>(dev.capacity, dev.used + slack);
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  const Device& dev = DeviceOf(s, ctx);
  const std::uint64_t used = DeviceUsedBytes(s, dev);
  // Null outputs are legal: real programs ask for only one of the two.
  if (free != nullptr) *free = dev.capacity - used;
  if (total != nullptr) *total = dev.capacity;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  if (CountAllocCallAndCheckFailure(s)) return CUDA_ERROR_OUT_OF_MEMORY;
  std::uintptr_t base = 0;
  if (CUresult r = AllocateArenaRegion(s, ctx, bytesize, RegionKind::kDeviceMalloc, nullptr, &base);
      r != CUDA_SUCCESS) {
    return r;
  }
  *dptr = base;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                                    unsigned int ElementSizeBytes) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  if (CountAllocCallAndCheckFailure(s)) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::size_t pitch = RoundUp(WidthInBytes, kAllocAlignment);
  if (pitch < WidthInBytes) return CUDA_ERROR_INVALID_VALUE;  // no pitch can hold such a row
  if (Height > DeviceOf(s, ctx).capacity / pitch) return CUDA_ERROR_OUT_OF_MEMORY;
  std::uintptr_t base = 0;
  if (CUresult r = AllocateArenaRegion(s, ctx, pitch * Height, RegionKind::kDeviceMalloc, nullptr, &base);
      r != CUDA_SUCCESS) {
    return r;
  }
  *dptr = base;
  *pPitch = pitch;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  State& s = GetState();
  std::unique_lock lk(s.mu);
  // The capture rules come first, even on a thread with no current context, and freeing 0 is then
  // a no-op, context or not: an H200's answers (2026-11-27, tests/gpu/capture_queries_h200.jsonl).
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  if (dptr == 0) return CUDA_SUCCESS;  // also with no current context
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  auto it = s.regions.find(dptr);
  if (it == s.regions.end() || it->second.free_pending || it->second.graph_unlaunched ||
      !(IsFreeableDeviceKind(it->second.kind) || it->second.kind == RegionKind::kManaged)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uint64_t buffer_id = it->second.buffer_id;
  const int device = it->second.device;
  ++s.device_free_calls;
  if (it->second.kind == RegionKind::kDeviceAsync) {
    // cuMemFree "will not perform any implicit synchronization when the pointer was allocated with
    // cuMemAllocAsync. Callers must ensure that all accesses to the pointer have completed": work
    // still queued on it is the program's error, and nothing is waited for (until 2026-11-30 the
    // simulated driver synchronized here, which hid such races).
    RequireNoQueuedAccess(s, dptr, it->second.size, "cuMemFree_v2");
    ReleaseRegion(s, dptr);
    return CUDA_SUCCESS;
  }
  it->second.free_pending = true;  // a concurrent free of the same pointer now fails
  // cuMemFree synchronizes the device: work issued earlier may still use the memory.
  ++s.device_syncs;
  SyncDevice(s, lk, device);
  it = s.regions.find(dptr);
  if (it != s.regions.end() && it->second.buffer_id == buffer_id) ReleaseFreedRegion(s, dptr);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  if (CountAllocCallAndCheckFailure(s)) return CUDA_ERROR_OUT_OF_MEMORY;
  // Managed memory is plain host memory here and does not count against device capacity.
  std::uintptr_t base = 0;
  if (CUresult r = AllocateHostRegion(s, ctx, bytesize, RegionKind::kManaged, &base); r != CUDA_SUCCESS) return r;
  *dptr = base;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) { return HostAlloc(pp, bytesize, 0); }

CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) { return HostAlloc(pp, bytesize, Flags); }

CUresult CUDAAPI cuMemFreeHost(void* p) {
  State& s = GetState();
  std::unique_lock lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  auto it = s.regions.find(base);
  if (it == s.regions.end() || it->second.kind != RegionKind::kPinnedHost || it->second.free_pending ||
      it->second.host_registered) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uint64_t buffer_id = it->second.buffer_id;
  it->second.free_pending = true;
  // Like cuMemFree, freeing pinned memory waits for the device; and since pinned memory is every
  // device's to copy from (portable), for every device: copies on any of them may still read it.
  ++s.device_syncs;
  SyncAllDevices(s, lk);
  it = s.regions.find(base);
  if (it != s.regions.end() && it->second.buffer_id == buffer_id) ReleaseRegion(s, base);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (pdptr == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  const Region* region = FindRegion(s, reinterpret_cast<std::uintptr_t>(p));
  if (region == nullptr || region->kind != RegionKind::kPinnedHost) return CUDA_ERROR_INVALID_VALUE;
  *pdptr = reinterpret_cast<CUdeviceptr>(p);  // unified addressing: same address on both sides
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return AllocAsync(dptr, bytesize, nullptr, false, hStream, false);
}
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return AllocAsync(dptr, bytesize, nullptr, false, hStream, true);
}
CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  return AllocAsync(dptr, bytesize, pool, true, hStream, false);
}
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream) {
  return AllocAsync(dptr, bytesize, pool, true, hStream, true);
}
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return FreeAsync(dptr, hStream, false); }
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return FreeAsync(dptr, hStream, true); }

// ---------------------------------------------------------------------------------------------
// Memory pools: handles only. Freed memory goes straight back to the device (release threshold 0).
// ---------------------------------------------------------------------------------------------

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pool_out = reinterpret_cast<CUmemoryPool>(&d->default_pool);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pool = PoolHandle(d->current_pool);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  MemPool* mp = LookupPool(s, pool, "cuDeviceSetMemPool");
  if (mp->device != dev) return CUDA_ERROR_INVALID_VALUE;
  d->current_pool = mp;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (pool == nullptr || poolProps == nullptr || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Device* d = nullptr;
  if (GetDevice(s, poolProps->location.id, &d) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
  auto mp = std::make_unique<MemPool>();
  mp->device = d->ordinal;
  mp->handle = MintHandle(s, HandleKind::kMemPool);
  *pool = reinterpret_cast<CUmemoryPool>(mp->handle);
  s.pools[reinterpret_cast<const void*>(mp->handle)] = std::move(mp);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  for (auto& dev : s.devices) {
    // "Destroying the current mempool of a device sets the default mempool of that device as the
    // current mempool" -- but a default pool itself cannot be destroyed.
    if (reinterpret_cast<CUmemoryPool>(&dev->default_pool) == pool) return CUDA_ERROR_INVALID_VALUE;
  }
  auto it = s.pools.find(pool);
  if (it == s.pools.end()) BadHandle(s, "cuMemPoolDestroy", HandleKind::kMemPool, reinterpret_cast<std::uintptr_t>(pool));
  for (auto& dev : s.devices) {
    if (dev->current_pool == it->second.get()) dev->current_pool = &dev->default_pool;
  }
  // Allocations keep a dangling pool pointer only for CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE; clear it.
  for (auto& [base, region] : s.regions) {
    if (region.pool == it->second.get()) region.pool = nullptr;
  }
  s.pools.erase(it);
  BuryHandle(s, HandleKind::kMemPool, reinterpret_cast<std::uintptr_t>(pool), "cuMemPoolDestroy");
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  MemPool* mp = LookupPool(s, pool, "cuMemPoolTrimTo");
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;  // as cuMemPoolGetAttribute
  mp->TrimTo(minBytesToKeep);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  MemPool* mp = LookupPool(s, pool, "cuMemPoolSetAccess");
  if (map == nullptr && count != 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    Device* d = nullptr;
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || GetDevice(s, map[i].location.id, &d) != CUDA_SUCCESS)
      return CUDA_ERROR_INVALID_VALUE;
    const CUmemAccess_flags f = map[i].flags;
    if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ && f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
    // The pool's own device keeps read-write access: it cannot be taken away.
    if (map[i].location.id == mp->device && f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_DEVICE;
  }
  for (size_t i = 0; i < count; ++i)
    if (map[i].location.id != mp->device) mp->access[map[i].location.id] = map[i].flags;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool pool, CUmemLocation* location) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  MemPool* mp = LookupPool(s, pool, "cuMemPoolGetAccess");
  Device* d = nullptr;
  if (flags == nullptr || location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE ||
      GetDevice(s, location->id, &d) != CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_VALUE;
  if (location->id == mp->device) {
    *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return CUDA_SUCCESS;
  }
  auto it = mp->access.find(location->id);
  *flags = it == mp->access.end() ? CU_MEM_ACCESS_FLAGS_PROT_NONE : it->second;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  MemPool* mp = LookupPool(s, pool, "cuMemPoolGetAttribute");
  // Any attribute, even a setting: a "potentially unsafe" call during a conflicting capture (an
  // H200, 2026-11-27, docs/gpu-validation.md run 5). The shim's passthrough once read the pool's
  // figures after a captured cudaMallocAsync and so invalidated the program's capture.
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto as_int = [&](int v) { *static_cast<int*>(value) = v; };
  auto as_u64 = [&](std::uint64_t v) { *static_cast<cuuint64_t*>(value) = v; };
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: as_int(mp->reuse_follow_event_dependencies); break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: as_int(mp->reuse_allow_opportunistic); break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: as_int(mp->reuse_allow_internal_dependencies); break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: as_u64(mp->release_threshold); break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: as_u64(mp->reserved); break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: as_u64(mp->reserved_high); break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: as_u64(mp->used); break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: as_u64(mp->used_high); break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  MemPool* mp = LookupPool(s, pool, "cuMemPoolSetAttribute");
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;  // as cuMemPoolGetAttribute (an H200)
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const int i = *static_cast<const int*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: mp->reuse_follow_event_dependencies = i != 0; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: mp->reuse_allow_opportunistic = i != 0; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: mp->reuse_allow_internal_dependencies = i != 0; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      mp->release_threshold = *static_cast<const cuuint64_t*>(value);
      break;
    // The high-water marks can only be reset, by writing 0: they restart from the current value.
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (*static_cast<const cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      mp->reserved_high = mp->reserved;
      break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (*static_cast<const cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      mp->used_high = mp->used;
      break;
    default: return CUDA_ERROR_INVALID_VALUE;  // the current figures are read-only
  }
  return CUDA_SUCCESS;
}
