#include "accounting/allocation_tracker.h"

namespace gpushim {

AllocationTracker::AllocationTracker() : shards_(new Shard[kShards]) {}

ModuleTotals& AllocationTracker::module_counters(const AllocationRecord& rec) {
  // Host and managed memory belong to no device: one row per module, whatever device was current.
  return modules_.at(rec.module, on_device(rec.kind) ? rec.device : -1, rec.kind);
}

bool AllocationTracker::insert(uintptr_t ptr, const AllocationRecord& rec) {
  Shard& s = shard_for(ptr);
  std::lock_guard<std::mutex> lock(s.mu);
  auto [it, inserted] = s.live.try_emplace(ptr, rec);
  if (!inserted) return false;
  // A record put back (a free that CUDA or the pool refused) is the same allocation: same serial.
  if (rec.serial == 0) it->second.serial = ++s.serial != 0 ? s.serial : ++s.serial;
  SiteTotals& t = s.sites[SiteKey{rec.stack, rec.device, rec.kind}];
  t.bytes += rec.size;
  t.count += 1;
  module_counters(rec).on_alloc(rec.size);
  return true;
}

bool AllocationTracker::erase(uintptr_t ptr, AllocationRecord* out) {
  Shard& s = shard_for(ptr);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.find(ptr);
  if (it == s.live.end()) return false;
  const AllocationRecord& rec = it->second;
  auto site = s.sites.find(SiteKey{rec.stack, rec.device, rec.kind});
  if (site != s.sites.end()) {
    site->second.count -= 1;
    site->second.bytes -= rec.size;
    // Sites with nothing live are dropped so that the per-shard site map stays proportional to
    // what is live, not to every stack ever seen; but in batches, not at once: a site emptied by
    // this free is most often refilled by the next allocation (a loop allocating and freeing),
    // and erasing it would cost that allocation a fresh insert.
    if (site->second.count == 0 && ++s.empty_sites > s.live.size() + kEmptySitesKept) sweep_empty_sites(s);
  }
  module_counters(rec).on_free(rec.size);
  if (out) *out = rec;
  s.live.erase(it);
  return true;
}

void AllocationTracker::sweep_empty_sites(Shard& s) {
  absl::erase_if(s.sites, [](const auto& kv) { return kv.second.count == 0; });
  s.empty_sites = 0;
}

bool AllocationTracker::find(uintptr_t ptr, AllocationRecord* out) const {
  Shard& s = shard_for(ptr);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.find(ptr);
  if (it == s.live.end()) return false;
  if (out) *out = it->second;
  return true;
}

std::vector<std::pair<SiteKey, SiteTotals>> AllocationTracker::sites() const {
  absl::flat_hash_map<SiteKey, SiteTotals> merged;
  for (unsigned i = 0; i < kShards; ++i) {
    std::lock_guard<std::mutex> lock(shards_[i].mu);
    for (const auto& [k, v] : shards_[i].sites) {
      if (v.count == 0) continue;
      SiteTotals& t = merged[k];
      t.bytes += v.bytes;
      t.count += v.count;
    }
  }
  return {merged.begin(), merged.end()};
}

std::vector<std::pair<uintptr_t, AllocationRecord>> AllocationTracker::live() const {
  std::vector<std::pair<uintptr_t, AllocationRecord>> out;
  for (unsigned i = 0; i < kShards; ++i) {
    std::lock_guard<std::mutex> lock(shards_[i].mu);
    out.insert(out.end(), shards_[i].live.begin(), shards_[i].live.end());
  }
  return out;
}

size_t AllocationTracker::live_count() const {
  size_t n = 0;
  for (unsigned i = 0; i < kShards; ++i) {
    std::lock_guard<std::mutex> lock(shards_[i].mu);
    n += shards_[i].live.size();
  }
  return n;
}

size_t AllocationTracker::memory_bytes() const {
  size_t n = 0;
  for (unsigned i = 0; i < kShards; ++i) {
    std::lock_guard<std::mutex> lock(shards_[i].mu);
    n += shards_[i].live.capacity() * (sizeof(uintptr_t) + sizeof(AllocationRecord) + 1) +
         shards_[i].sites.capacity() * (sizeof(SiteKey) + sizeof(SiteTotals) + 1);
  }
  return n + modules_.memory_bytes();
}

void AllocationTracker::lock_all_for_fork() {
  for (unsigned i = 0; i < kShards; ++i) shards_[i].mu.lock();
}

void AllocationTracker::unlock_all_after_fork() {
  for (unsigned i = kShards; i-- > 0;) shards_[i].mu.unlock();
}

}  // namespace gpushim
