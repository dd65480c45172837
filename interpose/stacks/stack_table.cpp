#include "stacks/stack_table.h"

#include <cstring>

namespace gpushim {
namespace {

uint64_t hash_words(const uint64_t* w, size_t n) {
  // FNV-1a over words in four independent lanes, finished with a murmur mix: cheap, and stacks
  // differ mostly in a few words. One lane would chain every word's multiply behind the last
  // (a 32-frame stack: 32 dependent multiplies on every allocation); four lanes run side by side.
  constexpr uint64_t kPrime = 1099511628211ull;
  uint64_t h0 = 1469598103934665603ull ^ n, h1 = h0 ^ 0x9E3779B97F4A7C15ull, h2 = h0 + 1, h3 = h0 + 2;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    h0 = (h0 ^ w[i]) * kPrime;
    h1 = (h1 ^ w[i + 1]) * kPrime;
    h2 = (h2 ^ w[i + 2]) * kPrime;
    h3 = (h3 ^ w[i + 3]) * kPrime;
  }
  for (; i < n; ++i) h0 = (h0 ^ w[i]) * kPrime;
  auto rotl = [](uint64_t v, int r) { return (v << r) | (v >> (64 - r)); };
  uint64_t h = ((h0 ^ rotl(h1, 16)) * kPrime ^ rotl(h2, 32)) * kPrime ^ rotl(h3, 48);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

// StackId layout: shard in the low bits, entry index above; id 0 is reserved for the empty stack.
constexpr unsigned kShardBits = 4;
inline StackId make_id(unsigned shard, uint32_t index) { return ((index + 1) << kShardBits) | shard; }
inline unsigned id_shard(StackId id) { return id & ((1u << kShardBits) - 1); }
inline uint32_t id_index(StackId id) { return (id >> kShardBits) - 1; }

}  // namespace

StackTable::StackTable() : shards_(new Shard[kShards]) {}

StackId StackTable::intern(const uint64_t* words, size_t depth) {
  if (depth == 0) return kEmptyStack;
  const uint64_t h = hash_words(words, depth);
  const unsigned s = static_cast<unsigned>(h >> 60) & (kShards - 1);
  Shard& shard = shards_[s];
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.by_hash.find(h);
  if (it != shard.by_hash.end()) {
    uint32_t idx = it->second;
    for (;;) {
      const Entry& e = shard.entries[idx];
      if (e.depth == depth && std::memcmp(&shard.arena[e.offset], words, depth * sizeof(uint64_t)) == 0)
        return make_id(s, idx);
      auto nx = shard.next_same_hash.find(idx);
      if (nx == shard.next_same_hash.end()) break;
      idx = nx->second;
    }
  }
  const uint32_t idx = static_cast<uint32_t>(shard.entries.size());
  shard.entries.push_back(Entry{static_cast<uint32_t>(shard.arena.size()), static_cast<uint32_t>(depth)});
  shard.arena.insert(shard.arena.end(), words, words + depth);
  if (it == shard.by_hash.end()) {
    shard.by_hash.emplace(h, idx);
  } else {
    // Keep the chain: the newest entry becomes the head, the old head follows it.
    shard.next_same_hash.emplace(idx, it->second);
    it->second = idx;
  }
  return make_id(s, idx);
}

void StackTable::frames(StackId id, std::vector<uint64_t>* out) const {
  out->clear();
  if (id == kEmptyStack) return;
  const Shard& shard = shards_[id_shard(id)];
  std::lock_guard<std::mutex> lock(shard.mu);
  const uint32_t idx = id_index(id);
  if (idx >= shard.entries.size()) return;
  const Entry& e = shard.entries[idx];
  out->assign(shard.arena.begin() + e.offset, shard.arena.begin() + e.offset + e.depth);
}

size_t StackTable::size() const {
  size_t n = 1;
  for (unsigned i = 0; i < kShards; ++i) {
    std::lock_guard<std::mutex> lock(shards_[i].mu);
    n += shards_[i].entries.size();
  }
  return n;
}

size_t StackTable::memory_bytes() const {
  size_t n = 0;
  for (unsigned i = 0; i < kShards; ++i) {
    const Shard& sh = shards_[i];
    std::lock_guard<std::mutex> lock(sh.mu);
    n += sh.arena.capacity() * sizeof(uint64_t) + sh.entries.capacity() * sizeof(Entry) +
         sh.by_hash.capacity() * (sizeof(uint64_t) + sizeof(uint32_t) + 1) +
         sh.next_same_hash.capacity() * (2 * sizeof(uint32_t) + 1);
  }
  return n;
}

void StackTable::lock_all_for_fork() {
  for (unsigned i = 0; i < kShards; ++i) shards_[i].mu.lock();
}

void StackTable::unlock_all_after_fork() {
  for (unsigned i = kShards; i-- > 0;) shards_[i].mu.unlock();
}

}  // namespace gpushim
