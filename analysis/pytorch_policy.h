// PyTorch's CUDA caching allocator as a replay policy (`gpushim-analyze replay --policy pytorch`
// and `--policy pytorch-expandable`), so that a replay answers "would this job fit under PyTorch's
// allocator, and under ours?" in one run. Our own implementation of the rules PyTorch documents and
// its c10/cuda/CUDACachingAllocator.cpp follows, with default settings (no max_split_size, no
// roundup_power2_divisions, no garbage collection threshold, no memory fraction):
//
// - sizes round up to 512 B; requests up to 1 MiB use the small pool, larger the large pool;
// - a free block is found by best fit on (stream, size, address) among the pool's free blocks of
//   the request's stream; a small-pool block is split when at least 512 B remain, a large-pool
//   block when more than 1 MiB remains (with expandable segments: at least 512 B in both pools);
//   a freed block merges with free neighbours of its segment;
// - without a fit, a new segment: 2 MiB for the small pool, 20 MiB for requests of 1-10 MiB,
//   larger requests rounded up to 2 MiB; when the device refuses, every entirely free segment is
//   released (cudaFree, which synchronizes the device) and the request tried once more, then OOM;
// - expandable_segments:True: one virtual range per stream and pool (9/8 of the device), grown by
//   mapping 2 MiB (small pool) or 20 MiB (large pool) pages behind its lowest free tail that has
//   room; on OOM (and release_cached, i.e. empty_cache) every whole free page is unmapped, each
//   unmapping after a stream synchronization.
//
// Freed memory is reusable on its stream at once (PyTorch relies on stream order; cross-stream use
// needs record_stream, which no trace records). It runs over a Backend like the shim's pools, so
// the replay counts its driver calls and synchronizations the same way. Replay only: not
// thread-safe, and not offered to the shim.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "policy/backend.h"
#include "policy/device_memory_resource.h"

namespace gpushim::analysis {

class PyTorchCachingAllocator final : public DeviceMemoryResource {
 public:
  // PyTorch's constants (CUDACachingAllocator.cpp), the defaults of PYTORCH_CUDA_ALLOC_CONF.
  static constexpr uint64_t kMinBlockSize = 512;         // every size rounds up to a multiple
  static constexpr uint64_t kSmallSize = 1ull << 20;     // largest request of the small pool
  static constexpr uint64_t kSmallBuffer = 2ull << 20;   // small pool's segments / pages
  static constexpr uint64_t kLargeBuffer = 20ull << 20;  // segment for 1-10 MiB; large pool's pages
  static constexpr uint64_t kMinLargeAlloc = 10ull << 20;
  static constexpr uint64_t kRoundLarge = 2ull << 20;    // larger segments round up to this

  PyTorchCachingAllocator(Backend& backend, bool expandable_segments);
  ~PyTorchCachingAllocator() override;

  static uint64_t round_size(uint64_t size);
  static uint64_t segment_size(uint64_t rounded);  // cudaMalloc size for a request (not expandable)

  CUresult allocate(const AllocRequest& req, void** out, uint64_t* allocated) override;
  CUresult deallocate(void* p, CUstream stream, bool stream_ordered) override;
  bool contains(const void* p) const override;
  void figures(PoolFigures* out) const override;
  // empty_cache(): every entirely free segment released; with expandable segments every whole
  // free page unmapped.
  void release_cached() override;
  // Replays never destroy a stream, and this allocator never names one to its backend.
  void forget_streams(absl::FunctionRef<bool(CUstream)>) override {}
  bool find_block(const void* p, uintptr_t* base, uint64_t* size) const override;
  const char* ipc_export_refusal(const void*, uint64_t) const override {
    return "a block of the PyTorch-allocator simulation (replay only)";
  }

  // ---- for tests ----
  size_t segment_count() const;  // cudaMalloc segments held, or expandable ranges reserved
  uint64_t reserved_bytes() const { return reserved_; }
  uint64_t synchronizations() const { return syncs_; }

 private:
  struct Pool;
  struct Expandable;
  struct Block {
    uintptr_t ptr = 0;
    uint64_t size = 0;
    uintptr_t stream = 0;
    Pool* pool = nullptr;
    Expandable* segment = nullptr;  // the virtual range of an expandable block, else null
    bool allocated = false;
    bool mapped = true;
    Block* prev = nullptr;  // neighbours in the same segment, in address order
    Block* next = nullptr;
    uint64_t requested = 0;
  };
  struct BySize {  // PyTorch's BlockComparatorSize
    bool operator()(const Block* a, const Block* b) const;
  };
  struct ByAddress {  // PyTorch's BlockComparatorAddress
    bool operator()(const Block* a, const Block* b) const;
  };
  struct Pool {
    bool small = false;
    std::set<Block*, BySize> blocks;        // free, mapped
    std::set<Block*, ByAddress> unmapped;   // expandable address space without memory
  };
  struct Expandable {
    uintptr_t va = 0;
    uint64_t size = 0;  // reserved bytes of address space
    uint64_t page = 0;
    uintptr_t stream = 0;
    std::map<uint64_t, uint64_t> handles;  // page index -> physical handle, for mapped pages
  };

  Pool& pool_for(uint64_t rounded) { return rounded <= kSmallSize ? small_ : large_; }
  bool should_split(const Block* b, uint64_t size) const;
  // Cuts `b` at `size` bytes: the rest becomes its next neighbour (same stream, pool, segment and
  // mapping), returned for the caller to file in the right set.
  static Block* split_block(Block* b, uint64_t size);
  Block* get_free_block(Pool& pool, uintptr_t stream, uint64_t size);
  Block* alloc_block(Pool& pool, uintptr_t stream, uint64_t size);
  Block* alloc_expandable(Pool& pool, uintptr_t stream, uint64_t size);
  Block* find_expandable(Pool& pool, uintptr_t stream, uint64_t size);
  bool map_block(Block* b, uint64_t size);
  void unmap_block(Block* b);
  void free_block(Block* b);
  uint64_t try_merge(Block* dst, Block* src);
  bool release_cached_blocks();
  void release_pool(Pool& pool);

  Backend& backend_;
  const bool expandable_;
  Pool small_, large_;
  std::vector<std::unique_ptr<Expandable>> expandables_;
  std::map<uintptr_t, uint64_t> segments_;         // cudaMalloc'd segments: base -> size
  absl::flat_hash_map<uintptr_t, Block*> live_;  // allocated blocks by address
  uint64_t reserved_ = 0, peak_reserved_ = 0, requested_ = 0, peak_requested_ = 0;
  uint64_t segment_allocs_ = 0, segment_frees_ = 0, maps_ = 0, unmaps_ = 0, retries_ = 0, ooms_ = 0, syncs_ = 0;
};

}  // namespace gpushim::analysis
