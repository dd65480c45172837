// Interleaving of a thread's Python frames into its native stack: each native frame of the
// interpreter's eval loop is replaced by the Python frames it runs, and the interpreter's other
// native frames (call plumbing, Py_RunMain, ...) are dropped. A pure function over frame words,
// so the rule is unit-tested apart from any interpreter.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpushim {

enum class NativeFrameRole : uint8_t {
  kOther,        // kept
  kEvalLoop,     // one native call of the eval loop: replaced by the Python frames it runs
  kInterpreter,  // other interpreter code: dropped
};

struct PythonStackWord {
  uint64_t word;        // make_python_frame(id)
  bool ends_eval_call;  // the outermost Python frame of one native eval call
};

// `native` and `python` are innermost first. Each kEvalLoop frame takes the next group of Python
// frames (up to and including one with ends_eval_call). Python frames left over (a native stack
// cut short, or eval frames the unwinder could not see) go at the outer end, so no Python frame is
// ever lost or reordered. At most `max_native` native and `max_python` Python frames are written
// (innermost kept); native frames past the budget are skipped but still place the Python frames.
// `out` needs room for max_native + max_python words. Returns the number written.
template <typename Role>
size_t interleave_python_frames(const uint64_t* native, size_t n_native, const PythonStackWord* python, size_t n_python,
                                Role&& role, size_t max_native, size_t max_python, uint64_t* out) {
  size_t o = 0, p = 0, kept_native = 0, kept_python = 0;
  auto emit_group = [&] {
    while (p < n_python) {
      const bool last = python[p].ends_eval_call;
      if (kept_python < max_python) out[o++] = python[p].word, ++kept_python;
      ++p;
      if (last) break;
    }
  };
  for (size_t i = 0; i < n_native; ++i) {
    switch (role(native[i])) {
      case NativeFrameRole::kEvalLoop: emit_group(); break;
      case NativeFrameRole::kInterpreter: break;
      case NativeFrameRole::kOther:
        if (kept_native < max_native) out[o++] = native[i], ++kept_native;
        break;
    }
  }
  while (p < n_python) emit_group();
  return o;
}

}  // namespace gpushim
