// The interface every pooling policy implements for one device (RMM's device_memory_resource,
// reduced to what a preload needs). Passthrough is the absence of a resource: the core forwards.
//
// Resources compose: a pool sits over a Backend (segments from the real driver, or a simulated
// one for replay), and the cap wraps the Backend (LimitedBackend), so a pool never knows about it.
// Fault injection is not a wrapper: the core asks the FaultInjector (fault_injector.h) before it
// asks the pool, so an injected failure never reaches a resource either.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "policy/block_place.h"
#include "policy/pool_figures.h"

namespace gpushim {

struct AllocRequest {
  size_t size = 0;
  CUstream stream = nullptr;
  bool stream_ordered = false;  // cudaMallocAsync: reuse follows stream order, not device syncs
};

// What a caller keeps with each block of a resource that holds it (holds_payloads()): opaque to
// the resource, stored in the block, so that the block and the caller's record of it are found by
// one lookup and move together under the resource's one lock.
struct BlockPayload {
  static constexpr size_t kBytes = 40;
  alignas(8) unsigned char bytes[kBytes];
};

// Called by allocate_with/deallocate_with under the resource's lock: what the caller does here is
// atomic with the block changing hands. Must not call back into the resource.
class PayloadHooks {
 public:
  // The block of `bytes` at `p` was just handed out: fill `payload`. `place`: where the block lies
  // in its segment, from a resource that places_blocks() (null from others).
  virtual void on_allocated(uintptr_t p, uint64_t bytes, BlockPayload& payload,
                            const BlockPlace* place = nullptr) = 0;
  // The live block at `p` is about to be freed (`place`: as on_allocated, the block still in its
  // segment). False refuses the free: the block stays live.
  virtual bool on_freeing(uintptr_t p, uint64_t bytes, const BlockPayload& payload,
                          const BlockPlace* place = nullptr) = 0;

 protected:
  ~PayloadHooks() = default;
};

class DeviceMemoryResource {
 public:
  virtual ~DeviceMemoryResource() = default;

  // On success sets *out and *allocated (the bytes the block occupies, rounding included).
  virtual CUresult allocate(const AllocRequest& req, void** out, uint64_t* allocated) = 0;
  // `p` must be a pointer this resource returned and that is live (the core checks that).
  virtual CUresult deallocate(void* p, CUstream stream, bool stream_ordered) = 0;
  // True if `p` lies inside memory this resource holds from the driver, live or cached; used to
  // refuse frees of interior or already-freed pointers instead of forwarding them to CUDA.
  virtual bool contains(const void* p) const = 0;
  // Reserved/cached/segment figures for the report.
  virtual void figures(PoolFigures* out) const = 0;
  // Gives cached free memory back to the driver (after the synchronization reuse requires).
  virtual void release_cached() = 0;
  // The device's primary context is about to be reset (cudaDeviceReset), which frees every
  // segment of it: those go back now, blocks still waiting for another context's stream included
  // (the reset frees their memory whatever that stream still does, as it would without a pool).
  // This default suits memory a reset leaves alone (vmm's chunks): what release_cached releases.
  virtual void release_before_reset() { release_cached(); }
  // cudaMemPoolTrimTo: gives cached free memory back until the resource holds less than `keep`
  // bytes from the driver, or nothing more can be released safely. This default can only release
  // everything, so it does that for `keep` 0 and keeps everything otherwise.
  virtual void trim_to(uint64_t keep) {
    if (keep == 0) release_cached();
  }
  // Streams for which `doomed` is true are about to be destroyed, or their context is: no block may
  // name them afterwards (ReuseRules::forget_streams). Pure: a wrapper that forgot to forward it
  // would leave blocks naming a destroyed stream, and a real driver crashes on such a handle.
  virtual void forget_streams(absl::FunctionRef<bool(CUstream)> doomed) = 0;

  // ---- what pointer queries and IPC need to stay truthful (the driver only sees segments) ----
  // Pure, not defaulted: a wrapper that forgot to forward them would answer "not ours" for every
  // pooled block (the trace's wrapper once did: interior-pointer queries failed while tracing).
  // True if `p` lies inside a block currently handed out; sets its start and size.
  virtual bool find_block(const void* p, uintptr_t* base, uint64_t* size) const = 0;
  // Null if legacy CUDA IPC (cuIpcGetMemHandle) on the live block at `block` gives an importing
  // process exactly that block's bytes at the address it maps; otherwise why not, in words that
  // complete "this block is ...". A resource that cannot tell must refuse.
  virtual const char* ipc_export_refusal(const void* block, uint64_t size) const = 0;

  // ---- blocks that carry the caller's payload (only where holds_payloads()) ----
  virtual bool holds_payloads() const { return false; }
  // True if allocate_with and deallocate_with give the hooks every block's place in its segment,
  // the segments being those the resource takes from its Backend with segment_alloc: what the
  // "non-releasable" figures of torch_stats.h are kept from.
  virtual bool places_blocks() const { return false; }
  // Free blocks at least this large are never split for smaller requests (GPUSHIM_MAX_SPLIT, as
  // PyTorch's max_split_size): what its "oversize" figures count. UINT64_MAX: none.
  virtual uint64_t max_split() const { return UINT64_MAX; }
  // allocate() that also calls hooks.on_allocated under the lock. CUDA_ERROR_NOT_SUPPORTED (nothing
  // happened): this request's block could carry no payload; allocate() serves it, and the caller
  // keeps its record itself.
  virtual CUresult allocate_with(const AllocRequest& req, void** out, uint64_t* allocated, PayloadHooks& hooks) {
    (void)req, (void)out, (void)allocated, (void)hooks;
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  // deallocate() of a block that allocate_with handed out, after hooks.on_freeing agreed.
  // CUDA_ERROR_NOT_FOUND: `p` is not the start of a live block (nothing happened);
  // CUDA_ERROR_NOT_PERMITTED: on_freeing refused (nothing happened).
  virtual CUresult deallocate_with(void* p, CUstream stream, bool stream_ordered, PayloadHooks& hooks) {
    (void)p, (void)stream, (void)stream_ordered, (void)hooks;
    return CUDA_ERROR_NOT_FOUND;
  }
  // The payload of the live block starting at `p`.
  virtual bool find_payload(const void* p, BlockPayload* out) const {
    (void)p, (void)out;
    return false;
  }
  // The start of every live block whose payload this resource keeps (handed out by allocate_with).
  // A device reset frees all memory of the device: the core frees each of these blocks (and those
  // whose records it keeps), then gives every segment back with release_cached(), before the
  // real reset, so that no address the driver freed is ever handed out again.
  virtual void live_payload_blocks(std::vector<uintptr_t>* out) const { (void)out; }
  // Runs `fn` under the lock the hooks run under: for state the caller moves in its hooks and
  // must also change, or read consistently, from elsewhere. `fn` must not call the resource.
  virtual void with_lock(absl::FunctionRef<void()> fn) const { fn(); }
};

}  // namespace gpushim
