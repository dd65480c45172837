// What a pool needs from a device: segments, physical chunks and mappings, and the means to know
// when freed memory is no longer in use. Implemented over the real driver (driver_backend.cpp) and
// by a simulation (sim_backend.cpp) that gpushim-analyze's replay and the unit tests use, so both
// run the very same pool code.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace gpushim {

class Backend {
 public:
  static constexpr std::atomic<bool> kNever{false};
  virtual ~Backend() = default;

  // ---- plain segments (caching policy) ----
  virtual CUresult segment_alloc(size_t bytes, void** out) = 0;
  virtual CUresult segment_free(void* p, size_t bytes) = 0;
  // Grows the segment at `p` (`bytes` long) in place by `more` bytes, so that it ends `more` later;
  // CUDA_ERROR_NOT_SUPPORTED when the memory after it cannot be had (or never: cudaMalloc).
  virtual CUresult segment_extend(void* p, size_t bytes, size_t more) {
    (void)p;
    (void)bytes;
    (void)more;
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  // Gives back the end of the segment at `p` (`bytes` long) past its first `keep` bytes, which
  // nothing uses any more. CUDA_ERROR_NOT_SUPPORTED where segments cannot shrink.
  virtual CUresult segment_shrink(void* p, size_t bytes, size_t keep) {
    (void)p;
    (void)bytes;
    (void)keep;
    return CUDA_ERROR_NOT_SUPPORTED;
  }

  // ---- reuse safety ----
  // Waits until all work issued so far on the device, on every stream, has completed.
  virtual CUresult synchronize() = 0;
  // An event recorded now at the tail of `stream`; 0 if it cannot be recorded.
  virtual uint64_t record_event(CUstream stream) = 0;
  // True once the work before the event has completed. Never called during stream capture.
  virtual bool event_done(uint64_t event) = 0;
  virtual void release_event(uint64_t event) = 0;
  // A device fence: completes once all work issued so far, on every stream of the device, has
  // completed, which is what a plain cudaFree's implicit synchronization waits for, observed
  // without waiting (events recorded on every stream in use). 0 if none can be recorded: then
  // only synchronize() proves it. Never recorded or queried during stream capture.
  virtual uint64_t record_device_fence() { return 0; }
  virtual bool fence_done(uint64_t fence) {
    (void)fence;
    return false;
  }
  virtual void release_fence(uint64_t fence) { (void)fence; }
  // Blocks until the fence has completed (the work before it, not the whole device). False if
  // the backend cannot.
  virtual bool wait_fence(uint64_t fence) {
    (void)fence;
    return false;
  }
  // ---- streams of other contexts ----
  // A stream-ordered call names `stream` as the calling thread sees it. False when the pool's own
  // context orders that stream: the pool's events name the same stream later, and its
  // synchronize() covers the stream's work. True for a stream of another context on the device (one
  // the program made, cuCtxCreate) or for a default stream while such a context is current; then,
  // with `event`, an event recorded now in that context, which alone can order a block freed
  // there (0 if none could be recorded; released with release_event; synchronize() does not
  // finish it, see synchronize_covers).
  virtual bool foreign_stream(CUstream stream, uint64_t* event) {
    (void)stream;
    (void)event;
    return false;
  }
  // Read by the pools before each foreign_stream call, without a call: while it is false no
  // stream can belong to another context, and foreign_stream would say false. Never null.
  virtual const std::atomic<bool>* foreign_streams_possible() { return &kNever; }
  // Was `event` (foreign_stream's) recorded on the default stream that `stream`, a default stream
  // handle, names for the calling thread now? Then a request there comes after that free in
  // that stream's order, as a request on the stream a block was freed on does.
  virtual bool event_on_callers_stream(uint64_t event, CUstream stream) {
    (void)event;
    (void)stream;
    return false;
  }
  // Has the work before `event` finished once synchronize() returns? Not for one recorded in
  // another context (foreign_stream): the pool synchronizes its own context only.
  virtual bool synchronize_covers(uint64_t event) {
    (void)event;
    return true;
  }
  // True while any stream is capturing a graph: then no synchronize and no event query is legal,
  // so pools grow instead of waiting.
  virtual bool capture_active() { return false; }

  // ---- capacity ----
  virtual CUresult mem_info(size_t* free, size_t* total) = 0;
  // At most this many bytes could physical_create() give now: a bound, not a promise (the device's
  // free memory; an adaptor narrows it, e.g. to the cap's room). A pool that makes a block of many
  // pieces asks first, so that a request the device cannot hold is refused before any piece is
  // made: made one by one, they took every free byte of the device before the last one failed.
  virtual uint64_t creatable_bytes() {
    size_t free = 0, total = 0;
    return mem_info(&free, &total) == CUDA_SUCCESS ? free : UINT64_MAX;
  }

  // ---- virtual memory (vmm policy); granularity 0 means unsupported ----
  virtual size_t granularity() { return 0; }
  virtual CUresult va_reserve(size_t, uintptr_t /*hint*/, uintptr_t*) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult va_free(uintptr_t, size_t) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult physical_create(size_t, uint64_t*) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult physical_release(uint64_t, size_t) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult map(uintptr_t, size_t, uint64_t /*handle*/, size_t /*offset*/) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult unmap(uintptr_t, size_t) { return CUDA_ERROR_NOT_SUPPORTED; }
};

}  // namespace gpushim
