// The CPython interpreter of this process, found at run time: the shim never links libpython, so
// a process without Python pays nothing and any supported version works with one libgpushim.so.
#pragma once

#include <cstdint>
#include <string>

#include "python/python_layout.h"

namespace gpushim {

struct PythonRuntime {
  const PythonLayout* layout = nullptr;
  std::string version;  // "3.11.7"
  // PyGILState_GetThisThreadState: the calling thread's thread state from thread-specific storage.
  // Needs no GIL and takes no lock, so it is callable from an allocation hook in any thread.
  void* (*this_thread_state)() = nullptr;
  // _Py_IsFinalizing / Py_IsFinalizing: during finalization other threads' states are freed.
  int (*is_finalizing)() = nullptr;
  uintptr_t code_type = 0;  // &PyCode_Type: every frame's code object is checked against it
  uintptr_t str_type = 0;   // &PyUnicode_Type, &PyBytes_Type: checked before a name or table is copied
  uintptr_t bytes_type = 0;
  // &PyLong_Type, &PyFloat_Type (0 if absent): arguments of these types are compared by value too.
  uintptr_t long_type = 0, float_type = 0;
  // _PyEval_EvalFrameDefault: a native frame in this range runs Python frames. end == begin when
  // the symbol's size is unknown.
  uintptr_t eval_begin = 0, eval_end = 0;
  // The module (libpython or the python executable) holding the eval loop: its native frames
  // collapse into the Python frames they run.
  uintptr_t interpreter_begin = 0, interpreter_end = 0;

  bool is_eval_frame(uint64_t pc) const { return pc > eval_begin && pc <= eval_end; }
  bool is_interpreter_frame(uint64_t pc) const { return pc > interpreter_begin && pc <= interpreter_end; }
};

enum class PythonSupport {
  kAbsent,       // no interpreter in this process (or Python stacks are off)
  kSupported,
  kUnsupported,  // an interpreter the shim cannot read safely; `reason` says why
};

struct PythonDetection {
  PythonSupport support = PythonSupport::kAbsent;
  PythonRuntime runtime;
  std::string reason;
};

// Looks the interpreter up in the process's global symbol scope (dlsym(RTLD_DEFAULT)). Takes no
// Python lock and calls nothing that needs the GIL.
PythonDetection detect_python();

}  // namespace gpushim
