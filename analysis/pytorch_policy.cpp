#include "pytorch_policy.h"

#include <algorithm>

namespace gpushim::analysis {

bool PyTorchCachingAllocator::BySize::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

bool PyTorchCachingAllocator::ByAddress::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  return a->ptr < b->ptr;
}

PyTorchCachingAllocator::PyTorchCachingAllocator(Backend& backend, bool expandable_segments)
    : backend_(backend), expandable_(expandable_segments) {
  small_.small = true;
}

PyTorchCachingAllocator::~PyTorchCachingAllocator() {
  // Give everything back, as the process's exit would. Every block lies in a segment's chain,
  // reachable from a live block or a free or unmapped one.
  std::vector<Block*> all;
  for (auto& [p, b] : live_) all.push_back(b);
  live_.clear();
  for (Pool* pool : {&small_, &large_}) {
    all.insert(all.end(), pool->blocks.begin(), pool->blocks.end());
    all.insert(all.end(), pool->unmapped.begin(), pool->unmapped.end());
  }
  // Blocks that were live are in no set: walk every segment's chain from any block we know.
  std::set<Block*> seen;
  std::vector<Block*> chains;
  for (Block* b : all) {
    while (b->prev) b = b->prev;
    if (seen.insert(b).second) chains.push_back(b);
  }
  for (Block* head : chains)
    for (Block* b = head; b;) {
      Block* n = b->next;
      delete b;
      b = n;
    }
  for (auto& [base, size] : segments_) backend_.segment_free(reinterpret_cast<void*>(base), size);
  for (auto& e : expandables_) {
    for (auto& [page, handle] : e->handles) {
      backend_.unmap(e->va + page * e->page, e->page);
      backend_.physical_release(handle, e->page);
    }
    backend_.va_free(e->va, e->size);
  }
}

uint64_t PyTorchCachingAllocator::round_size(uint64_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

uint64_t PyTorchCachingAllocator::segment_size(uint64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

bool PyTorchCachingAllocator::should_split(const Block* b, uint64_t size) const {
  const uint64_t remaining = b->size - size;
  if (b->pool->small || expandable_) return remaining >= kMinBlockSize;
  return remaining > kSmallSize;  // no max_split_size by default
}

PyTorchCachingAllocator::Block* PyTorchCachingAllocator::split_block(Block* b, uint64_t size) {
  Block* rest = new Block;
  rest->ptr = b->ptr + size;
  rest->size = b->size - size;
  rest->stream = b->stream;
  rest->pool = b->pool;
  rest->segment = b->segment;
  rest->mapped = b->mapped;
  rest->prev = b;
  rest->next = b->next;
  if (b->next) b->next->prev = rest;
  b->next = rest;
  b->size = size;
  return rest;
}

PyTorchCachingAllocator::Block* PyTorchCachingAllocator::get_free_block(Pool& pool, uintptr_t stream, uint64_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
  if ((*it)->segment != nullptr) {
    // A block that borders unmapped space counts as the size it can grow to, so the best fit
    // prefers a block that cannot grow when one is near enough in size.
    auto expandable_size = [](const Block* b) { return b->size + (b->next && !b->next->mapped ? b->next->size : 0); };
    for (auto next = std::next(it); (*it)->segment != nullptr && next != pool.blocks.end() && (*next)->stream == stream &&
                                    expandable_size(*next) < expandable_size(*it);
         ++next)
      it = next;
  }
  Block* b = *it;
  pool.blocks.erase(it);
  return b;
}

PyTorchCachingAllocator::Block* PyTorchCachingAllocator::alloc_block(Pool& pool, uintptr_t stream, uint64_t size) {
  if (expandable_) return alloc_expandable(pool, stream, size);
  const uint64_t bytes = segment_size(size);
  void* p = nullptr;
  if (backend_.segment_alloc(bytes, &p) != CUDA_SUCCESS) return nullptr;
  ++segment_allocs_;
  segments_.emplace(reinterpret_cast<uintptr_t>(p), bytes);
  reserved_ += bytes;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  Block* b = new Block;
  b->ptr = reinterpret_cast<uintptr_t>(p);
  b->size = bytes;
  b->stream = stream;
  b->pool = &pool;
  return b;
}

// The lowest-addressed run of free and unmapped blocks of this stream's segments that holds
// `size`, starting at an unmapped block or the free block just before it; else a new range.
PyTorchCachingAllocator::Block* PyTorchCachingAllocator::find_expandable(Pool& pool, uintptr_t stream, uint64_t size) {
  auto allocatable = [](const Block* b) { return b != nullptr && !b->allocated; };
  auto has_room = [&](const Block* b) {
    uint64_t bytes = 0;
    for (; bytes < size && allocatable(b); b = b->next) bytes += b->size;
    return bytes >= size;
  };
  Block key;
  key.stream = stream;
  for (auto it = pool.unmapped.lower_bound(&key); it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
    Block* c = *it;
    if (allocatable(c->prev)) c = c->prev;
    if (has_room(c)) return c;
  }
  size_t free = 0, total = 0;
  backend_.mem_info(&free, &total);
  auto e = std::make_unique<Expandable>();
  e->page = pool.small ? kSmallBuffer : kLargeBuffer;
  const uint64_t pages = std::max<uint64_t>(1, (total + total / 8 + e->page - 1) / e->page);
  e->size = pages * e->page;
  e->stream = stream;
  if (backend_.va_reserve(e->size, 0, &e->va) != CUDA_SUCCESS) return nullptr;
  Block* b = new Block;
  b->ptr = e->va;
  b->size = e->size;
  b->stream = stream;
  b->pool = &pool;
  b->segment = e.get();
  b->mapped = false;
  pool.unmapped.insert(b);
  expandables_.push_back(std::move(e));
  return b;
}

// Maps the pages under the first `size` bytes of the unmapped block `b` (all of them or none),
// then merges it with free neighbours into the pool's free blocks.
bool PyTorchCachingAllocator::map_block(Block* b, uint64_t size) {
  Expandable& e = *b->segment;
  const uint64_t first = (b->ptr - e.va) / e.page;
  const uint64_t last = (b->ptr + size - e.va + e.page - 1) / e.page;  // exclusive
  // Pages the device cannot hold fail the same way one by one, after creating all the others: a
  // request of exabytes in a trace (a corrupt size) ran for minutes. Asked once, up front.
  size_t free = 0, total = 0;
  if (backend_.mem_info(&free, &total) == CUDA_SUCCESS && (last - first) > free / e.page) return false;
  std::vector<uint64_t> handles;
  for (uint64_t i = first; i < last; ++i) {
    uint64_t h = 0;
    if (backend_.physical_create(e.page, &h) != CUDA_SUCCESS) {
      for (uint64_t made : handles) backend_.physical_release(made, e.page);
      return false;
    }
    handles.push_back(h);
  }
  for (uint64_t i = first; i < last; ++i) {
    backend_.map(e.va + i * e.page, e.page, handles[i - first], 0);
    e.handles[i] = handles[i - first];
    ++maps_;
  }
  const uint64_t mapped = (last - first) * e.page;
  reserved_ += mapped;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  Pool& pool = *b->pool;
  pool.unmapped.erase(b);
  b->mapped = true;
  if (mapped < b->size) {
    Block* rest = split_block(b, mapped);
    rest->mapped = false;
    pool.unmapped.insert(rest);
  }
  try_merge(b, b->prev);
  try_merge(b, b->next);
  pool.blocks.insert(b);
  return true;
}

PyTorchCachingAllocator::Block* PyTorchCachingAllocator::alloc_expandable(Pool& pool, uintptr_t stream, uint64_t size) {
  Block* c = find_expandable(pool, stream, size);
  if (c == nullptr) return nullptr;
  if (!c->mapped && !map_block(c, std::min(c->size, size))) return nullptr;
  // c is now free and mapped; map the unmapped space after it until it holds `size`.
  while (c->size < size) {
    Block* n = c->next;
    if (n == nullptr || n->allocated || n->mapped) return nullptr;  // cannot happen: find_expandable checked
    if (!map_block(n, std::min(size - c->size, n->size))) return nullptr;
    c = n;  // map_block merged c into n
  }
  pool.blocks.erase(c);
  return c;
}

uint64_t PyTorchCachingAllocator::try_merge(Block* dst, Block* src) {
  if (src == nullptr || src->allocated || src->mapped != dst->mapped) return 0;
  Pool& pool = *src->pool;
  if (src->mapped) pool.blocks.erase(src);
  else pool.unmapped.erase(src);
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  const uint64_t n = src->size;
  dst->size += n;
  delete src;
  return n;
}

void PyTorchCachingAllocator::free_block(Block* b) {
  b->allocated = false;
  try_merge(b, b->prev);
  try_merge(b, b->next);
  b->pool->blocks.insert(b);
}

// Unmaps the whole pages inside the free block `b` (PyTorch synchronizes the stream first); the
// parts before and after stay free and mapped.
void PyTorchCachingAllocator::unmap_block(Block* b) {
  Expandable& e = *b->segment;
  const uint64_t first = (b->ptr - e.va + e.page - 1) / e.page;
  const uint64_t last = (b->ptr + b->size - e.va) / e.page;
  if (first >= last) return;
  backend_.synchronize();
  ++syncs_;
  for (uint64_t i = first; i < last; ++i) {
    auto h = e.handles.find(i);
    backend_.unmap(e.va + i * e.page, e.page);
    backend_.physical_release(h->second, e.page);
    e.handles.erase(h);
    ++unmaps_;
  }
  Pool& pool = *b->pool;
  pool.blocks.erase(b);
  const uintptr_t begin = e.va + first * e.page, end = e.va + last * e.page;
  auto split_off = [&](uintptr_t at, uint64_t size, bool before) {
    Block* f = new Block;
    f->ptr = at;
    f->size = size;
    f->stream = b->stream;
    f->pool = b->pool;
    f->segment = b->segment;
    if (before) {
      f->prev = b->prev;
      f->next = b;
      if (b->prev) b->prev->next = f;
      b->prev = f;
    } else {
      f->prev = b;
      f->next = b->next;
      if (b->next) b->next->prev = f;
      b->next = f;
    }
    pool.blocks.insert(f);
  };
  if (begin > b->ptr) split_off(b->ptr, begin - b->ptr, true);
  if (b->ptr + b->size > end) split_off(end, b->ptr + b->size - end, false);
  reserved_ -= end - begin;
  b->ptr = begin;
  b->size = end - begin;
  b->mapped = false;
  try_merge(b, b->prev);
  try_merge(b, b->next);
  pool.unmapped.insert(b);
}

void PyTorchCachingAllocator::release_pool(Pool& pool) {
  if (expandable_) {
    // Unmapping changes the free set: collect first.
    std::vector<Block*> free(pool.blocks.begin(), pool.blocks.end());
    for (Block* b : free) unmap_block(b);
    // A range left with nothing mapped is given back whole.
    for (auto it = expandables_.begin(); it != expandables_.end();) {
      Expandable& e = **it;
      Block key;
      key.stream = e.stream;
      key.ptr = e.va;
      auto u = pool.unmapped.find(&key);
      if (u == pool.unmapped.end() || (*u)->segment != &e || (*u)->size != e.size) {
        ++it;
        continue;
      }
      delete *u;
      pool.unmapped.erase(u);
      backend_.va_free(e.va, e.size);
      it = expandables_.erase(it);
    }
    return;
  }
  std::vector<Block*> whole;
  for (Block* b : pool.blocks)
    if (b->prev == nullptr && b->next == nullptr) whole.push_back(b);
  for (Block* b : whole) {
    pool.blocks.erase(b);
    backend_.segment_free(reinterpret_cast<void*>(b->ptr), b->size);
    segments_.erase(b->ptr);
    reserved_ -= b->size;
    ++segment_frees_;
    delete b;
  }
}

// PyTorch's release_cached_blocks: true (as PyTorch's) when it ran; the retry follows either way.
bool PyTorchCachingAllocator::release_cached_blocks() {
  if (!expandable_) {
    // cudaFree synchronizes the device; after the first, the others find it idle: one paid.
    bool any = false;
    for (Pool* pool : {&large_, &small_})
      for (Block* b : pool->blocks) any = any || (b->prev == nullptr && b->next == nullptr);
    if (any) {
      backend_.synchronize();
      ++syncs_;
    }
  }
  release_pool(large_);
  release_pool(small_);
  return true;
}

CUresult PyTorchCachingAllocator::allocate(const AllocRequest& req, void** out, uint64_t* allocated) {
  const uint64_t size = round_size(req.size);
  Pool& pool = pool_for(size);
  const uintptr_t stream = reinterpret_cast<uintptr_t>(req.stream);
  Block* b = get_free_block(pool, stream, size);
  if (b == nullptr) b = alloc_block(pool, stream, size);
  if (b == nullptr) {
    // release_available_cached_blocks frees nothing without max_split_size: straight to all.
    ++retries_;
    release_cached_blocks();
    b = alloc_block(pool, stream, size);
  }
  if (b == nullptr) {
    ++ooms_;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (should_split(b, size)) pool.blocks.insert(split_block(b, size));
  b->allocated = true;
  b->requested = req.size;
  live_[b->ptr] = b;
  requested_ += req.size;
  peak_requested_ = std::max(peak_requested_, requested_);
  *out = reinterpret_cast<void*>(b->ptr);
  *allocated = b->size;
  return CUDA_SUCCESS;
}

CUresult PyTorchCachingAllocator::deallocate(void* p, CUstream, bool) {
  auto it = live_.find(reinterpret_cast<uintptr_t>(p));
  if (it == live_.end()) return CUDA_ERROR_INVALID_VALUE;
  Block* b = it->second;
  live_.erase(it);
  requested_ -= b->requested;
  free_block(b);
  return CUDA_SUCCESS;
}

bool PyTorchCachingAllocator::contains(const void* p) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto s = segments_.upper_bound(a);
  if (s != segments_.begin() && a < std::prev(s)->first + std::prev(s)->second) return true;
  for (const auto& e : expandables_)
    if (a >= e->va && a < e->va + e->size && e->handles.count((a - e->va) / e->page)) return true;
  return false;
}

bool PyTorchCachingAllocator::find_block(const void* p, uintptr_t* base, uint64_t* size) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [ptr, b] : live_)
    if (a >= ptr && a < ptr + b->size) {
      *base = ptr;
      *size = b->size;
      return true;
    }
  return false;
}

void PyTorchCachingAllocator::figures(PoolFigures* out) const {
  out->requested_bytes = requested_;
  out->peak_requested_bytes = peak_requested_;
  out->reserved_bytes = reserved_;
  out->peak_reserved_bytes = peak_reserved_;
  uint64_t cached = 0, largest = 0;
  for (const Pool* pool : {&small_, &large_})
    for (const Block* b : pool->blocks) {
      cached += b->size;
      largest = std::max(largest, b->size);
    }
  out->cached_free_bytes = cached;
  out->largest_free_block = largest;
  out->segment_allocs = segment_allocs_;
  out->segment_frees = segment_frees_;
  out->alloc_retries = retries_;
  out->ooms = ooms_;
  out->reuse_syncs = syncs_;
  out->map_calls = maps_;
  out->unmap_calls = unmaps_;
  out->mapped_bytes = expandable_ ? reserved_ : 0;
}

void PyTorchCachingAllocator::release_cached() { release_cached_blocks(); }

size_t PyTorchCachingAllocator::segment_count() const { return expandable_ ? expandables_.size() : segments_.size(); }

}  // namespace gpushim::analysis
