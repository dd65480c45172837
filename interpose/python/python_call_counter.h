// GPUSHIM_ITERATION_SITE naming a Python function, counted exactly: the interpreter reports every
// start of the function's code object, so frames and arguments that reuse freed addresses cannot
// merge two calls, as they can when calls are recognised in allocation stacks (iteration_site.h).
//
// The mechanism, by version (costs measured by bench/iteration_site_bench.py, docs/python.md):
//   - 3.12+: sys.monitoring, a PY_START event set with set_local_events on the function's code
//     object alone. Other code runs exactly as before; each call of the function costs one C call.
//   - 3.9-3.11 (no sys.monitoring): a PEP 523 frame-evaluation function that compares each frame's
//     code object with the function's and hands every frame to the evaluator it replaced. Free on
//     3.9/3.10, where every Python call goes through that function anyway; on 3.11 it turns off the
//     inlining of Python-to-Python calls, for the whole interpreter. A profile function
//     (PyEval_SetProfile) would be exact too, but costs far more on every version and displaces
//     the program's own profilers.
//
// The code object is learned from the allocation stacks: at the first allocation made inside the
// function, which the allocation-stack observation counts. From then on the interpreter counts.
// Calls before the first allocation inside the function are not counted: the shim starts when
// the process first uses CUDA. Nothing is installed in a process that never allocates inside the
// function, in a subinterpreter (counted from allocation stacks), or when the hook is replaced by
// another user of PEP 523 (then counting falls back to allocation stacks, with one stderr line).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "util/iteration_counter.h"
#include "python/python_runtime.h"

namespace gpushim {

class PythonCallCounter {
 public:
  // Null when the interpreter lacks what the counting needs (then allocation stacks count). The
  // object is never freed: the interpreter may call into it until the process ends. At most one
  // per process installs its hook; others only ever answer false.
  static PythonCallCounter* create(const PythonRuntime& rt, std::string site, IterationCounter* iterations);

  // From an allocation whose stack runs `code`, a code object of the site, in the calling thread
  // (any thread; the GIL is not needed). True when the interpreter counts the calls of `code`: the
  // allocation must then not count one. The first time, installs the hook (3.9-3.11) or asks the
  // main thread to (3.12+, a pending call); until it counts, false.
  bool counts_calls_of(uintptr_t code);

  struct Api;  // the C API functions used, found with dlsym

 private:
  enum Phase : int { kIdle, kArming, kArmed, kOff };
  static constexpr int kMaxTargets = 8;

  PythonCallCounter(const PythonRuntime& rt, std::string site, IterationCounter* iterations, const Api* api);
  void arm(uintptr_t interp);
  void request_registration();
  bool is_target(uintptr_t code) const {
    const int n = n_targets_.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i)
      if (targets_[i].load(std::memory_order_relaxed) == code) return true;
    return false;
  }
  // Under the GIL: `code` (alive: some frame runs it) is the site's; keep it alive and count it.
  bool register_target(uintptr_t code);
  // Under the GIL, at the start of a call of a target: counts it unless the thread already runs
  // the function further out (recursion: the outermost call is the iteration). `own_frames`: the
  // frames of this call already on the thread's chain.
  void count_call(uintptr_t tstate, uintptr_t code, size_t own_frames);
  bool setup_monitoring();  // under the GIL
  int take_tool(void* monitoring, int except);
  void release_tool(void* monitoring, int tool);
  static void* use_tool_id_wrapper(void* module, void* const* args, intptr_t nargs, void* kwnames);
  // 3.12+: whether a frame running `code` has not gone past its RESUME instruction.
  bool at_start(uintptr_t frame, uintptr_t code) const;
  void turn_off(const std::string& why);

  static void* eval_hook(void* tstate, void* frame, int throwflag);
  static void* monitoring_callback(void* self, void* const* args, intptr_t nargs);
  static int register_pending(void*);

  const PythonRuntime rt_;
  const std::string site_;
  IterationCounter* const iterations_;
  const Api& api_;
  std::atomic<int> phase_{kIdle};
  std::atomic<uintptr_t> interp_{0};  // the interpreter whose calls are counted
  std::atomic<bool> pending_{false};  // a registration is queued (3.12+)
  // The latest code object of the site seen in an allocation stack and not yet a target. Only
  // compared as an address until a frame proves it alive.
  std::atomic<uintptr_t> candidate_{0};
  std::atomic<uintptr_t> targets_[kMaxTargets] = {};  // written under the GIL, referenced forever
  std::atomic<int> n_targets_{0};
  // 3.9-3.11: the evaluator ours replaced, set before ours is installed.
  std::atomic<void* (*)(void*, void*, int)> previous_eval_{nullptr};
  void* monitoring_ = nullptr;                           // 3.12+: sys.monitoring, referenced forever
  int tool_ = -1;
  void* use_tool_id_ = nullptr;  // 3.12+: sys.monitoring.use_tool_id as it was, referenced forever
  long py_start_ = -1;  // sys.monitoring.events.PY_START
};

}  // namespace gpushim
