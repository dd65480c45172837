// What the calling thread is doing inside our hooks, kept in one thread-local frame:
//   - whether it is inside one of our runtime hooks: the real libcudart implements cudaMalloc &co
//     by calling the driver through the cuGetProcAddress answers we substituted, and those driver
//     calls must only be forwarded (the runtime hook accounts them; counting them again at the
//     driver level would count every byte twice);
//   - the return address of the outermost hook, i.e. the code that called into CUDA, which is how
//     an allocation is attributed to a module without unwinding the stack.
#pragma once

#include <cstdint>

#include "util/thread_block.h"

namespace gpushim {

enum class HookApi : uint8_t { kRuntime, kDriver };

struct CallFrame {
  uint32_t runtime_depth = 0;  // runtime hooks of ours on this thread's stack
  uint32_t depth = 0;          // hooks of ours (runtime or driver) on this thread's stack
  uintptr_t caller = 0;        // return address into the code that called the outermost hook
  bool in_real_call = false;   // inside CUDA's own function, called by the core with none of its locks held
};

inline CallFrame& this_thread_call_frame() {
  // Inline: two hooks per allocation-and-free pair each touch it, on the hot path. A slot of the
  // front's static TLS block: a fixed offset from the thread pointer (util/thread_block.h).
  return thread_slot<CallFrame, ThreadSlot::kCallFrame>();
}

// One per hook invocation, on the hook's stack. The outermost one records the caller.
class CallScope {
 public:
  CallScope(HookApi api, const void* return_address) : frame_(this_thread_call_frame()), api_(api) {
    if (frame_.depth++ == 0) frame_.caller = reinterpret_cast<uintptr_t>(return_address);
    if (api_ == HookApi::kRuntime) ++frame_.runtime_depth;
  }
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

  // True when a runtime hook of ours encloses this call (the caller is libcudart acting for it).
  bool nested_in_runtime_hook() const {
    return frame_.runtime_depth > (api_ == HookApi::kRuntime ? 1u : 0u);
  }

 private:
  CallFrame& frame_;
  const HookApi api_;
};

// True inside one of our runtime hooks (the call has a runtime last error to keep up to date).
inline bool in_runtime_hook() { return this_thread_call_frame().runtime_depth != 0; }

// Around a real CUDA call the core makes holding none of its locks (a forwarded allocation or
// free): there the thread is in CUDA, not in the shim's bookkeeping (may_hold_shim_locks).
class RealCallScope {
 public:
  RealCallScope() : frame_(this_thread_call_frame()), saved_(frame_.in_real_call) { frame_.in_real_call = true; }
  ~RealCallScope() { frame_.in_real_call = saved_; }
  RealCallScope(const RealCallScope&) = delete;
  RealCallScope& operator=(const RealCallScope&) = delete;

 private:
  CallFrame& frame_;
  const bool saved_;
};

// True while this thread is inside one of our hooks, where it may hold the shim's locks, and not
// in a real call made without them: exit() reached from here (a signal handler that interrupted
// the hook) must not wait for those locks (Shim::exit_inside_hook).
inline bool may_hold_shim_locks() {
  const CallFrame& f = this_thread_call_frame();
  return f.depth != 0 && !f.in_real_call;
}

// Return address of the outermost hook on this thread, 0 outside hooks.
inline uintptr_t current_hook_caller() { return this_thread_call_frame().caller; }

}  // namespace gpushim
