// Backing store and bookkeeping of simulated device memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "driver.h"

namespace fakecuda {
namespace {

std::size_t PageSize() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

bool IsArenaKind(RegionKind k) {
  return k == RegionKind::kDeviceMalloc || k == RegionKind::kDeviceAsync || k == RegionKind::kGraph ||
         k == RegionKind::kArray;
}

}  // namespace

void PopulateForWrite(std::uintptr_t p, std::size_t n) {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14; older kernels answer EINVAL
#endif
  if (n < (std::size_t{256} << 10)) return;  // a few faults cost less than the call
  const std::uintptr_t begin = p / PageSize() * PageSize();
  const std::uintptr_t end = RoundUp(p + n, PageSize());
  (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
}

// ---------------------------------------------------------------------------------------------
// Arena
// ---------------------------------------------------------------------------------------------

bool Arena::Init(int device, std::size_t capacity) {
  const std::string name = "fakecuda-device" + std::to_string(device);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return false;
  // Sparse: no RAM is used until a page is written.
  if (ftruncate(fd, static_cast<off_t>(capacity)) != 0) {
    close(fd);
    return false;
  }
  // Reserve capacity + one granule so the mapping can start on a 2 MiB boundary, like real device
  // addresses, then map the memfd over the aligned part and give back the slack.
  const std::size_t span = capacity + kGranularity;
  void* reserve = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserve == MAP_FAILED) {
    close(fd);
    return false;
  }
  const auto start = reinterpret_cast<std::uintptr_t>(reserve);
  const std::uintptr_t aligned = RoundUp(start, kGranularity);
  void* mapped = mmap(reinterpret_cast<void*>(aligned), capacity, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0);
  if (mapped == MAP_FAILED) {
    munmap(reserve, span);
    close(fd);
    return false;
  }
  if (aligned > start) munmap(reserve, aligned - start);
  const std::uintptr_t end = aligned + capacity;
  if (start + span > end) munmap(reinterpret_cast<void*>(end), start + span - end);

  fd_ = fd;
  base_ = aligned;
  size_ = capacity;
  free_.clear();
  free_[0] = capacity;
  kept_budget_ = std::min(capacity / 4, std::size_t{2} << 30);
  return true;
}

std::optional<std::size_t> Arena::Carve(std::size_t size) {
  const std::optional<std::size_t> at = Fit(size);
  if (at) {
    carved_ += size;
    const bool none = touched_begin_ == touched_end_;
    touched_begin_ = none ? *at : std::min(touched_begin_, *at);
    touched_end_ = none ? *at + size : std::max(touched_end_, *at + size);
  }
  return at;
}

std::optional<std::size_t> Arena::Fit(std::size_t size) {
  if (GetConfig().alloc_top_down) {
    // Last fit: the end of the highest range that holds it, kept on the alignment every carve has.
    for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
      if (it->second < size) continue;
      const std::size_t start = it->first, end = it->first + it->second;
      const std::size_t offset = (end - size) / kAllocAlignment * kAllocAlignment;
      if (offset < start) continue;
      free_.erase(std::next(it).base());
      if (offset > start) free_[start] = offset - start;
      if (end > offset + size) free_[offset + size] = end - offset - size;
      return offset;
    }
    return std::nullopt;
  }
  // First fit in address order: simple, and it reuses freed addresses quickly, which is what makes
  // use-after-free by a pool visible in tests.
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const std::size_t offset = it->first;
    const std::size_t rest = it->second - size;
    free_.erase(it);
    if (rest > 0) free_[offset + size] = rest;
    return offset;
  }
  return std::nullopt;
}

void Arena::Release(std::size_t offset, std::size_t size) {
  auto next = free_.lower_bound(offset);
  std::size_t start = offset;
  std::size_t length = size;
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == offset + size) {
    length += next->second;
    free_.erase(next);
  }
  free_[start] = length;

  carved_ -= size;

  // Freed pages stay resident while the free bytes within the span carved since the last punch stay
  // under a budget; past it, every free range goes back to the system at once. Punching each range
  // at its free made the next allocation there fault every page in again: a test that frees and
  // refills hundreds of MiB spent most of its time in the kernel (~15 us a fault on a virtual
  // machine). First fit keeps that span near the program's peak, so RAM stays bounded by the peak
  // plus the budget. A range carved again may hold an earlier owner's bytes, as on a GPU, where
  // cudaMalloc's memory is never cleared.
  if (touched_end_ - touched_begin_ - carved_ > kept_budget_) {
    // Partial pages at a range's ends are zeroed, not freed, which leaves neighbours untouched.
    for (const auto& [at, bytes] : free_) {
      const std::size_t from = std::max(at, touched_begin_), to = std::min(at + bytes, touched_end_);
      if (from < to)
        fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from), static_cast<off_t>(to - from));
    }
    // What is still carved is the span now.
    touched_begin_ = free_.empty() || free_.begin()->first != 0 ? 0 : free_.begin()->second;
    touched_end_ = free_.empty() || free_.rbegin()->first + free_.rbegin()->second != size_ ? size_ : free_.rbegin()->first;
    if (carved_ == 0) touched_begin_ = touched_end_ = 0;
  }
}

// ---------------------------------------------------------------------------------------------
// Capacity and call accounting
// ---------------------------------------------------------------------------------------------

bool CountAllocCallAndCheckFailure(State& s) {
  ++s.device_alloc_calls;
  return GetConfig().fail_alloc.count(s.device_alloc_calls) != 0;
}

CUresult ChargeDevice(Device& dev, std::size_t bytes) {
  if (bytes > dev.capacity - dev.used) return CUDA_ERROR_OUT_OF_MEMORY;
  dev.used += bytes;
  return CUDA_SUCCESS;
}

void UnchargeDevice(Device& dev, std::size_t bytes) { dev.used -= std::min(bytes, dev.used); }

CUresult EnsureArena(Device& dev) {
  if (dev.arena.ready()) return CUDA_SUCCESS;
  if (!dev.arena.Init(dev.ordinal, dev.capacity)) {
    std::fprintf(stderr, "fakecuda: cannot create the memory of device %d: errno %d\n", dev.ordinal, errno);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Regions
// ---------------------------------------------------------------------------------------------

CUresult AllocateArenaRegion(State& s, Context* ctx, std::size_t size, RegionKind kind, MemPool* pool,
                             std::uintptr_t* out) {
  Device& dev = DeviceOf(s, ctx);
  if (CUresult r = EnsureArena(dev); r != CUDA_SUCCESS) return r;
  if (size > dev.capacity) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::size_t charged = RoundUp(size, kAllocAlignment);
  if (CUresult r = ChargeDevice(dev, charged); r != CUDA_SUCCESS) return r;
  std::optional<std::size_t> offset = dev.arena.Carve(charged);
  if (!offset) {  // fragmented: capacity is there but no contiguous range
    UnchargeDevice(dev, charged);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Region r;
  r.base = dev.arena.base() + *offset;
  r.size = size;
  r.kind = kind;
  r.device = ctx->device;
  r.ctx = ctx;
  r.buffer_id = NextId(s);
  r.arena_offset = *offset;
  r.charged = charged;
  r.pool = pool;
  s.regions[r.base] = r;
  // The addresses are an allocation's again: asking about them is defined once more.
  auto freed = s.async_freed.upper_bound(r.base);
  if (freed != s.async_freed.begin() && std::prev(freed)->second > r.base) --freed;
  while (freed != s.async_freed.end() && freed->first < r.base + charged) freed = s.async_freed.erase(freed);
  *out = r.base;
  return CUDA_SUCCESS;
}

CUresult AllocateHostRegion(State& s, Context* ctx, std::size_t size, RegionKind kind, std::uintptr_t* out) {
  const std::size_t length = RoundUp(size, PageSize());
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Region r;
  r.base = reinterpret_cast<std::uintptr_t>(p);
  r.size = size;
  r.kind = kind;
  r.device = ctx->device;
  r.ctx = ctx;
  r.buffer_id = NextId(s);
  r.map_base = r.base;
  r.map_length = length;
  s.regions[r.base] = r;
  *out = r.base;
  return CUDA_SUCCESS;
}

void ReleaseRegion(State& s, std::uintptr_t base) {
  auto it = s.regions.find(base);
  if (it == s.regions.end()) return;
  Region& r = it->second;
  if (r.stream_ordered_free) s.async_freed[r.base] = r.base + r.size;
  if (r.pool != nullptr && r.kind == RegionKind::kDeviceAsync) r.pool->OnReleased(r.size);
  if (IsArenaKind(r.kind)) {
    Device& dev = *s.devices[static_cast<std::size_t>(r.device)];
    dev.arena.Release(r.arena_offset, r.charged);
    UnchargeDevice(dev, r.charged);
  } else if (r.map_length != 0) {
    munmap(reinterpret_cast<void*>(r.map_base), r.map_length);
  }
  s.regions.erase(it);
}

void ReleaseFreedRegion(State& s, std::uintptr_t base) {
  auto it = s.regions.find(base);
  if (it == s.regions.end()) return;
  Region& r = it->second;
  if (r.kind != RegionKind::kGraph || r.graph.expired()) {
    ReleaseRegion(s, base);
    return;
  }
  r.graph_unlaunched = r.graph_parked = true;
  r.free_pending = r.stream_ordered_free = r.free_node_pending = false;
}

std::uintptr_t AsyncFreedAt(const State& s, std::uintptr_t p) {
  auto it = s.async_freed.upper_bound(p);
  if (it == s.async_freed.begin()) return 0;
  --it;
  return p < it->second ? it->first : 0;
}

Region* FindRegion(State& s, std::uintptr_t p) {
  auto it = s.regions.upper_bound(p);
  if (it == s.regions.begin()) return nullptr;
  --it;
  Region& r = it->second;
  return (p - r.base < r.size) ? &r : nullptr;
}

namespace {

// Addresses the device hands out: its memory (every device's arena) and the program's reserved
// virtual ranges. One of them with no live region is memory nobody may touch.
bool InDeviceAddressSpace(State& s, std::uintptr_t p) {
  for (const auto& dev : s.devices)
    if (dev->arena.contains(p)) return true;
  return FindReservation(s, p, 1) != nullptr;
}

[[noreturn]] void StopForUnheldMemory(std::uintptr_t p, std::size_t n, const Access& access) {
  Misuse("%s: [%#lx, %#lx) is device memory no allocation holds (freed, or never allocated): a use after free is "
         "undefined on a GPU",
         access.call, static_cast<unsigned long>(p), static_cast<unsigned long>(p + n));
}

// A live region CUDA still forbids touching, from `access`.
void RequireUsable(const Region& r, std::uintptr_t p, std::size_t n, const Access& access) {
  if (r.free_pending)
    Misuse("%s: [%#lx, %#lx) is in the allocation at %#lx, which was freed (cuMemFreeAsync, or a free in progress): "
           "CUDA leaves work issued after the free undefined",
           access.call, static_cast<unsigned long>(p), static_cast<unsigned long>(p + n),
           static_cast<unsigned long>(r.base));
  // Captured work runs at its graph's launch, which the program may order after the allocating
  // graph's: only work outside any graph is checked here.
  if (r.graph_unlaunched && !access.graph_node && access.capture_id == 0)
    Misuse("%s: [%#lx, %#lx) is graph memory no launch of its graph has made yet: CUDA allows it only to work "
           "ordered after the graph's execution",
           access.call, static_cast<unsigned long>(p), static_cast<unsigned long>(p + n));
}

bool IsDeviceKind(RegionKind k) {
  return k != RegionKind::kManaged && k != RegionKind::kPinnedHost;
}

}  // namespace

CUresult CheckDeviceRange(State& s, std::uintptr_t p, std::size_t n, const Access& access) {
  Region* r = FindRegion(s, p);
  if (r == nullptr) {
    if (InDeviceAddressSpace(s, p)) StopForUnheldMemory(p, n, access);
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uintptr_t end = p + n;
  if (end < p) return CUDA_ERROR_INVALID_VALUE;
  // A range may run across adjacent VMM mappings (one virtual range backed by several physical
  // chunks, e.g. PyTorch's expandable segments); anything else must stay inside its allocation.
  while (true) {
    RequireUsable(*r, p, n, access);
    if (r->kind == RegionKind::kVmmMapping && r->access == CU_MEM_ACCESS_FLAGS_PROT_NONE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // Access is granted per device (cuMemSetAccess): "mapping ... does not make the address
    // accessible". Another device's work there faults on a GPU, the context lost. (A pool's memory
    // and cuMemAlloc's, which CUDA gives other devices by cuMemPoolSetAccess and peer access, are
    // not checked.)
    if (r->kind == RegionKind::kVmmMapping && access.device >= 0) {
      auto granted = r->access_by_location.find({CU_MEM_LOCATION_TYPE_DEVICE, access.device});
      if (granted == r->access_by_location.end() || granted->second == CU_MEM_ACCESS_FLAGS_PROT_NONE)
        Misuse("%s: device %d accesses [%#lx, %#lx), mapped at %#lx, to which cuMemSetAccess gave it no access (only "
               "other devices): a GPU faults there",
               access.call, access.device, static_cast<unsigned long>(p), static_cast<unsigned long>(end),
               static_cast<unsigned long>(r->base));
    }
    const std::uintptr_t r_end = r->base + r->size;
    if (end <= r_end) return CUDA_SUCCESS;
    if (r->kind != RegionKind::kVmmMapping) return CUDA_ERROR_INVALID_VALUE;
    auto next = s.regions.find(r_end);
    if (next == s.regions.end() || next->second.kind != RegionKind::kVmmMapping) return CUDA_ERROR_INVALID_VALUE;
    r = &next->second;
  }
}

CUresult CheckAnyRange(State& s, std::uintptr_t p, std::size_t n, const Access& access) {
  if (FindRegion(s, p) == nullptr && !InDeviceAddressSpace(s, p)) return CUDA_SUCCESS;  // pageable host memory
  return CheckDeviceRange(s, p, n, access);
}

CUresult CheckHostRange(State& s, std::uintptr_t p, std::size_t n, const Access& access) {
  const Region* r = FindRegion(s, p);
  if (r != nullptr && IsDeviceKind(r->kind))
    Misuse("%s: the host side [%#lx, %#lx) is device memory: a copy whose pointers do not match its direction is "
           "undefined in CUDA",
           access.call, static_cast<unsigned long>(p), static_cast<unsigned long>(p + n));
  return CheckAnyRange(s, p, n, access);
}

}  // namespace fakecuda
