// One allocation's call stack, as the hot path records it: native return addresses from the
// unwinder, the calling thread's Python frames interleaved where the interpreter runs them, the
// shim's own frames dropped, interned into the StackTable. Also watches the stacks for new
// activations of GPUSHIM_ITERATION_SITE.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "util/iteration_counter.h"
#include "python/python_call_counter.h"
#include "python/python_code_table.h"
#include "python/python_runtime.h"
#include "stacks/stack_table.h"
#include "stacks/symbolizer.h"

namespace gpushim {

struct StackCaptureOptions {
  unsigned native_depth = 32;   // native frames kept; 0 turns capture off (Python frames too)
  bool python = true;           // GPUSHIM_PYTHON_STACKS
  std::string iteration_site;   // GPUSHIM_ITERATION_SITE, "" for none
  // Code of the shim itself: frames inside it at the top of a stack are not the caller's.
  uintptr_t skip_begin = 0, skip_end = 0;
  // Per-thread cache of repeated stacks (stack_cache.h). Off only to compare against (tests, bench).
  bool cache = true;
};

class StackCapturer {
 public:
  static constexpr size_t kMaxPythonFrames = 128;
  // With Python frames the native stack is unwound this deep, past the native budget, so that
  // the Python frames land in their place under deep native stacks (PyTorch's dispatcher).
  static constexpr size_t kMaxNativeUnwind = 256;

  // Looks the interpreter up (dlsym) when options.python is set. `iterations` may be null.
  StackCapturer(StackCaptureOptions options, StackTable* table, IterationCounter* iterations);
  StackCapturer(const StackCapturer&) = delete;
  StackCapturer& operator=(const StackCapturer&) = delete;

  // Captures and interns the calling thread's stack. `allocation`: whether this is an allocation
  // (only those feed the iteration-site detection).
  StackId capture(bool allocation = true);

  // For Symbolizer::set_python_resolver.
  bool resolve_python(uint32_t id, FrameInfo* out) const;

  // For the report: the interpreter version when Python frames are captured ("3.11.7"), "" when
  // the process has no interpreter, "off" when disabled, or "unsupported: <why>".
  const std::string& python_status() const { return python_status_; }
  bool python_active() const { return code_table_ != nullptr; }
  size_t memory_bytes() const;

  void lock_for_fork() {
    if (code_table_) code_table_->lock_for_fork();
  }
  void unlock_after_fork() {
    if (code_table_) code_table_->unlock_after_fork();
  }

 private:
  size_t skip_own_frames(const uint64_t* buf, size_t n) const;
  void observe_native_site(const uint64_t* native, size_t n);
  void observe(const struct SiteActivation& cur);

  const StackCaptureOptions options_;
  StackTable* const table_;
  IterationCounter* const iterations_;
  PythonRuntime python_;
  std::unique_ptr<PythonCodeTable> code_table_;  // null: no Python frames captured
  PythonCallCounter* calls_ = nullptr;  // exact counting of a Python iteration site; never freed (see there)
  std::string python_status_;
  uintptr_t native_site_begin_ = 0, native_site_end_ = 0;  // GPUSHIM_ITERATION_SITE as a native symbol
  const bool cache_;             // the per-thread stack cache is used (options, and libunwind's cursor found)
  const uint64_t cache_owner_;   // this capturer in those caches
};

}  // namespace gpushim
