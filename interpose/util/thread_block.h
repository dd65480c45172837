// The hot path's per-thread state, in a block of static TLS that the preloaded front owns
// (front/front_api.h). The core is dlopened at the first CUDA call; initial-exec TLS of its own
// would have to come out of glibc's static TLS surplus (1,664 bytes on Debian 12, shared with every
// library the program dlopened before: PyTorch's, NVIDIA's), and its dlopen fails once that is gone.
// The front's block is part of the initial static TLS, so it is always there; the core reaches it
// at a fixed offset from the thread pointer, as fast as its own initial-exec variable would be.
// Without a front (unit tests, gpushim-analyze, a core loaded some other way) each thread uses a
// block of ordinary dynamic TLS instead.
//
// Each slot holds one trivially copyable value that is valid as all-zero bytes (a thread's block
// starts zeroed). Adding one: a name below; kThreadBlockBytes must stay within the front's block.
#pragma once

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <type_traits>

namespace gpushim {

enum class ThreadSlot : uint8_t {
  kCallFrame,     // core/call_context.h: hooks on this thread's stack, and their caller
  kLastCaller,    // core/shim_driver.cpp: the last return address mapped to a module
  kModuleRow,     // accounting/module_counters.h: the last per-module row used
  kTraceBuffer,   // trace/trace_recorder.cpp: this thread's event buffer
  kTraceOpSeq,    // recorder/trace_ordered_resource.h: the sequence number of its last operation
  kKnownStream,   // cuda/stream_registry.cpp: the last stream it told the registry of
  kContextChecked,  // core/shim_driver.cpp: whether it was checked for a current context
  kCount
};
inline constexpr size_t kThreadSlotBytes = 32;
inline constexpr size_t kThreadBlockBytes = kThreadSlotBytes * static_cast<size_t>(ThreadSlot::kCount);

namespace thread_block_internal {
inline constexpr intptr_t kNoFrontBlock = INTPTR_MIN;
// Offset of the front's block from the thread pointer; kNoFrontBlock until a front lends one.
// Set before any hook runs (attach_front; threads racing to load the core store the same value).
// Relaxed: a plain load on x86-64 and aarch64.
inline std::atomic<intptr_t> g_offset{kNoFrontBlock};
char* own_block();  // this thread's block of dynamic TLS (thread_block.cpp)

inline char* thread_pointer() {
#if defined(__x86_64__) || defined(__aarch64__)
  return static_cast<char*>(__builtin_thread_pointer());
#else
#error "thread_block.h: the thread pointer of this architecture"
#endif
}
}  // namespace thread_block_internal

// Lends the core the front's block: `offset` from the thread pointer, `bytes` long. Ignored when
// too small (a front of another version).
inline void use_front_thread_block(intptr_t offset, size_t bytes) {
  if (bytes >= kThreadBlockBytes) thread_block_internal::g_offset.store(offset, std::memory_order_relaxed);
}

template <typename T, ThreadSlot S>
inline T& thread_slot() {
  static_assert(sizeof(T) <= kThreadSlotBytes && alignof(T) <= 16, "a slot is 32 bytes, 16-aligned");
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "a slot starts as zero bytes and is never destroyed");
  using namespace thread_block_internal;
  const intptr_t off = g_offset.load(std::memory_order_relaxed);
  char* base = off != kNoFrontBlock ? thread_pointer() + off : own_block();
  return *reinterpret_cast<T*>(base + static_cast<size_t>(S) * kThreadSlotBytes);
}

}  // namespace gpushim
