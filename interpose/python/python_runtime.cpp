#include "python/python_runtime.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace gpushim {
namespace {

template <typename T>
T symbol(const char* name) {
  return reinterpret_cast<T>(dlsym(RTLD_DEFAULT, name));
}

// [begin, end) of the loaded object containing `addr`, over all its PT_LOAD segments.
bool module_range(uintptr_t addr, uintptr_t* begin, uintptr_t* end) {
  struct Ctx {
    uintptr_t probe, begin, end;
  } ctx{addr, 0, 0};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* c = static_cast<Ctx*>(data);
        uintptr_t lo = UINTPTR_MAX, hi = 0;
        bool inside = false;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          const uintptr_t s = info->dlpi_addr + ph.p_vaddr, e = s + ph.p_memsz;
          lo = std::min(lo, s);
          hi = std::max(hi, e);
          inside |= c->probe >= s && c->probe < e;
        }
        if (!inside) return 0;
        c->begin = lo;
        c->end = hi;
        return 1;
      },
      &ctx);
  *begin = ctx.begin;
  *end = ctx.end;
  return ctx.end > ctx.begin;
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
  if (!module_range(d.runtime.eval_begin, &d.runtime.interpreter_begin, &d.runtime.interpreter_end)) {
    d.reason = "cannot find the module of the Python interpreter";
    return d;
  }
  d.support = PythonSupport::kSupported;
  return d;
}

}  // namespace gpushim
