// Interned, deduplicated call stacks.
//
// The hot path only captures return addresses and interns them here; symbolization happens when
// a report is written (heaptrack's split). A stack is a sequence of 64-bit frame words, innermost
// first. A word is either a native return address or, with kPythonFrameTag set, the id of an
// interned Python source location (see python frames), so native and Python frames share one table
// and one id space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace gpushim {

using StackId = uint32_t;
// Id of the empty stack (capture off, or nothing captured). Always valid.
constexpr StackId kEmptyStack = 0;

constexpr uint64_t kPythonFrameTag = 1ull << 63;
inline bool is_python_frame(uint64_t word) { return (word & kPythonFrameTag) != 0; }
inline uint32_t python_frame_id(uint64_t word) { return static_cast<uint32_t>(word); }
inline uint64_t make_python_frame(uint32_t id) { return kPythonFrameTag | id; }

class StackTable {
 public:
  StackTable();
  StackTable(const StackTable&) = delete;
  StackTable& operator=(const StackTable&) = delete;

  // Thread-safe. Returns the same id for the same sequence of words, kEmptyStack for depth 0.
  StackId intern(const uint64_t* words, size_t depth);

  // Thread-safe. Copies the words of `id` into `out` (cleared first). Unknown ids give an empty stack.
  void frames(StackId id, std::vector<uint64_t>* out) const;

  // Number of distinct stacks, the empty one included.
  size_t size() const;
  // Host bytes held by the table (arena plus index), for the self-cost figures in the report.
  size_t memory_bytes() const;

  // fork(): taken in the prepare handler and dropped in parent and child, so the child never
  // inherits a lock held by a thread that does not exist there.
  void lock_all_for_fork();
  void unlock_all_after_fork();

 private:
  // Sharded by hash so that threads capturing different stacks do not contend on one lock.
  static constexpr unsigned kShardBits = 4;
  static constexpr unsigned kShards = 1u << kShardBits;
  struct Entry {
    uint32_t offset;  // into the shard's arena
    uint32_t depth;
  };
  struct Shard {
    mutable std::mutex mu;
    std::vector<uint64_t> arena;
    std::vector<Entry> entries;
    absl::flat_hash_map<uint64_t, uint32_t> by_hash;  // hash -> entry index (collisions chained below)
    absl::flat_hash_map<uint32_t, uint32_t> next_same_hash;  // entry index -> next with equal hash
  };
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace gpushim
