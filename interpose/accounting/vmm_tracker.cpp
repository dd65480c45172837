#include "accounting/vmm_tracker.h"

namespace gpushim {

void VmmTracker::created(const Physical& p) {
  std::lock_guard<std::mutex> lock(mu_);
  handles_[p.handle] = Entry{p};
}

void VmmTracker::imported(uint64_t handle, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry e;
  e.p = Physical{handle, 0, device, MemoryKind::kImported};
  e.sized = false;
  handles_[handle] = e;
}

void VmmTracker::retained(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = handles_.find(handle); it != handles_.end()) ++it->second.refs;
}

void VmmTracker::maybe_gone(absl::flat_hash_map<uint64_t, Entry>::iterator it, std::vector<Physical>* gone) {
  if (it->second.refs > 0 || it->second.mappings > 0) return;
  if (it->second.sized) gone->push_back(it->second.p);
  handles_.erase(it);
}

bool VmmTracker::released(uint64_t handle, Physical* gone) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end() || it->second.refs == 0) return false;
  --it->second.refs;
  std::vector<Physical> out;
  maybe_gone(it, &out);
  if (out.empty()) return false;
  *gone = out.front();
  return true;
}

bool VmmTracker::mapped(uintptr_t va, uint64_t size, uint64_t handle, Physical* sized) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) return false;  // not one we saw created (e.g. a pool of the shim's own)
  ++it->second.mappings;
  mappings_[va] = Mapping{size, handle};
  if (it->second.sized) return false;
  it->second.sized = true;
  it->second.p.size = size;
  *sized = it->second.p;
  return true;
}

void VmmTracker::unmap_locked(uintptr_t va, uint64_t size, std::vector<Physical>* gone) {
  // cuMemUnmap takes a range that may cover several whole mappings.
  for (auto m = mappings_.lower_bound(va); m != mappings_.end() && m->first < va + size;) {
    const uint64_t handle = m->second.handle;
    m = mappings_.erase(m);
    auto it = handles_.find(handle);
    if (it == handles_.end() || it->second.mappings == 0) continue;
    --it->second.mappings;
    maybe_gone(it, gone);
  }
}

void VmmTracker::unmapped(uintptr_t va, uint64_t size, std::vector<Physical>* gone) {
  std::lock_guard<std::mutex> lock(mu_);
  unmap_locked(va, size, gone);
}

void VmmTracker::address_reserved(uintptr_t va, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reservations_.emplace(va, size).second) reserved_va_bytes_ += size;
}

void VmmTracker::address_freed(uintptr_t va, std::vector<Physical>* gone) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(va);
  if (it == reservations_.end()) return;
  // Freeing a range takes its mappings with it, as far as anyone can still reach them.
  unmap_locked(va, it->second, gone);
  reserved_va_bytes_ -= it->second;
  reservations_.erase(it);
}

uint64_t VmmTracker::reserved_va_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_va_bytes_;
}

}  // namespace gpushim
