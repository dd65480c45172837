#include "python/python_runtime.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "util/loaded_modules.h"

namespace gpushim {
namespace {

template <typename T>
T symbol(const char* name) {
  return reinterpret_cast<T>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

PythonDetection detect_python() {
  PythonDetection d;
  auto get_version = symbol<const char* (*)()>("Py_GetVersion");
  auto this_thread_state = symbol<void* (*)()>("PyGILState_GetThisThreadState");
  if (get_version == nullptr || this_thread_state == nullptr) return d;  // no interpreter here

  d.support = PythonSupport::kUnsupported;
  const char* full = get_version();
  int major = 0, minor = 0;
  if (full == nullptr || std::sscanf(full, "%d.%d", &major, &minor) != 2) {
    d.reason = "cannot read the interpreter version";
    return d;
  }
  const size_t len = std::strcspn(full, " ");
  d.runtime.version.assign(full, len);
  d.runtime.layout = python_layout_for(major, minor);
  if (d.runtime.layout == nullptr || sizeof(void*) != 8) {
    d.reason = "Python " + d.runtime.version + " is not supported (3.9 to 3.13, 64-bit)";
    return d;
  }
  d.runtime.this_thread_state = this_thread_state;
  d.runtime.is_finalizing = symbol<int (*)()>(minor >= 13 ? "Py_IsFinalizing" : "_Py_IsFinalizing");
  d.runtime.code_type = symbol<uintptr_t>("PyCode_Type");
  d.runtime.str_type = symbol<uintptr_t>("PyUnicode_Type");
  d.runtime.bytes_type = symbol<uintptr_t>("PyBytes_Type");
  d.runtime.long_type = symbol<uintptr_t>("PyLong_Type");
  d.runtime.float_type = symbol<uintptr_t>("PyFloat_Type");
  const uintptr_t type_type = symbol<uintptr_t>("PyType_Type");
  void* eval = dlsym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
  if (d.runtime.is_finalizing == nullptr || d.runtime.code_type == 0 || d.runtime.str_type == 0 ||
      d.runtime.bytes_type == 0 || type_type == 0 || eval == nullptr) {
    d.reason = "Python " + d.runtime.version + " lacks a symbol the frame walker needs";
    return d;
  }
  // Debug builds with Py_TRACE_REFS (before 3.13) and free-threaded builds put other fields
  // before ob_type, which moves every offset we use: PyCode_Type's own type says which we have.
  if (*reinterpret_cast<const uintptr_t*>(d.runtime.code_type + kPyObjectType) != type_type) {
    d.reason = "Python " + d.runtime.version + " is a debug or free-threaded build, whose objects the frame walker cannot read";
    return d;
  }
  Dl_info info{};
  ElfW(Sym)* sym = nullptr;
  d.runtime.eval_begin = d.runtime.eval_end = reinterpret_cast<uintptr_t>(eval);
  if (dladdr1(eval, &info, reinterpret_cast<void**>(&sym), RTLD_DL_SYMENT) != 0 && sym != nullptr)
    d.runtime.eval_end = d.runtime.eval_begin + sym->st_size;
  if (!loaded_module_range(d.runtime.eval_begin, &d.runtime.interpreter_begin, &d.runtime.interpreter_end)) {
    d.reason = "cannot find the module of the Python interpreter";
    return d;
  }
  d.support = PythonSupport::kSupported;
  return d;
}

}  // namespace gpushim
