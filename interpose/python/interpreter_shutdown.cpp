#include "python/interpreter_shutdown.h"

#include <dlfcn.h>

#include <atomic>

namespace gpushim {
namespace {

using PyObj = void;  // PyObject*: only ever passed back to the C API

// PyMethodDef's layout is part of CPython's stable ABI (unchanged from 3.9 to 3.13).
struct MethodDef {
  const char* name;
  PyObj* (*meth)(PyObj*, PyObj*);
  int flags;
  const char* doc;
};
constexpr int kMethNoArgs = 0x0004;

struct Api {
  int (*is_initialized)();
  int (*add_pending_call)(int (*)(void*), void*);
  PyObj* (*import_module)(const char*);
  PyObj* (*get_attr)(PyObj*, const char*);
  int (*set_attr)(PyObj*, const char*, PyObj*);
  PyObj* (*new_cfunction)(MethodDef*, PyObj*, PyObj*);  // PyCFunction_NewEx: self is the original
  PyObj* (*call)(PyObj*, PyObj*);                       // PyObject_CallObject
  void (*dec_ref)(PyObj*);                              // Py_DecRef: the function, not the macro
  void (*err_clear)();
  PyObj* (*sys_get_object)(const char*);                // PySys_GetObject: borrowed, null if unset
  PyObj** keyboard_interrupt;                           // &PyExc_KeyboardInterrupt
  int (*at_exit)(void (*)());                           // Py_AtExit: the end of Py_FinalizeEx
};

Api g_api;
void (*g_begin)() = nullptr;
void (*g_ends_now)() = nullptr;
std::atomic<bool> g_armed{false};
std::atomic<bool> g_begun{false};
std::atomic<bool> g_ended{false};

template <typename T>
bool find(T* out, const char* name) {
  *out = reinterpret_cast<T>(dlsym(RTLD_DEFAULT, name));
  return *out != nullptr;
}

void ends_now_once() {
  if (!g_ended.exchange(true)) g_ends_now();
}

void begin_once() {
  if (g_begun.exchange(true)) return;
  g_begin();
  // Ended by a KeyboardInterrupt: CPython kills itself with SIGINT once finalized (see the header).
  PyObj* last = g_api.sys_get_object("last_type");
  if (last != nullptr && last == *g_api.keyboard_interrupt) g_api.at_exit(&ends_now_once);
}

// Stands in for threading._shutdown; `self` is the original. The original runs first: until it
// returns, the program's own non-daemon threads may still be working.
PyObj* shutdown_wrapper(PyObj* self, PyObj*) {
  PyObj* result = g_api.call(self, nullptr);
  begin_once();
  return result;  // null with the original's exception set, as before
}

MethodDef g_wrapper_def{"_shutdown", &shutdown_wrapper, kMethNoArgs,
                        "threading._shutdown, then gpushim notes that interpreter teardown begins"};

// Stands in for os._exit; `self` is the original, `args` the caller's. Bad arguments too end the
// run first: the original then raises as before, and the program most likely ends anyway.
PyObj* exit_wrapper(PyObj* self, PyObj* args) {
  ends_now_once();
  return g_api.call(self, args);
}

constexpr int kMethVarArgs = 0x0001;
MethodDef g_exit_def{"_exit", &exit_wrapper, kMethVarArgs,
                     "gpushim writes its exit report, then os._exit(status): exit without cleanup"};

// Replaces module.name with a C function whose `self` is the original.
void wrap(const char* module_name, const char* name, MethodDef* def) {
  PyObj* module = g_api.import_module(module_name);
  if (module == nullptr) {
    g_api.err_clear();
    return;
  }
  PyObj* original = g_api.get_attr(module, name);
  if (original == nullptr) {
    g_api.err_clear();
    g_api.dec_ref(module);
    return;
  }
  PyObj* wrapper = g_api.new_cfunction(def, original, nullptr);
  g_api.dec_ref(original);
  if (wrapper == nullptr || g_api.set_attr(module, name, wrapper) != 0) g_api.err_clear();
  if (wrapper) g_api.dec_ref(wrapper);
  g_api.dec_ref(module);
}

// Runs on the main thread with the GIL held (a pending call).
int install(void*) {
  wrap("threading", "_shutdown", &g_wrapper_def);
  wrap("os", "_exit", &g_exit_def);
  return 0;  // never an exception into the program, whatever happened
}

}  // namespace

bool arm_interpreter_shutdown_hook(void (*begin)(), void (*ends_now)()) {
  Api a{};
  if (!find(&a.is_initialized, "Py_IsInitialized") || !find(&a.add_pending_call, "Py_AddPendingCall") ||
      !find(&a.import_module, "PyImport_ImportModule") || !find(&a.get_attr, "PyObject_GetAttrString") ||
      !find(&a.set_attr, "PyObject_SetAttrString") || !find(&a.new_cfunction, "PyCFunction_NewEx") ||
      !find(&a.call, "PyObject_CallObject") || !find(&a.dec_ref, "Py_DecRef") || !find(&a.err_clear, "PyErr_Clear") ||
      !find(&a.sys_get_object, "PySys_GetObject") || !find(&a.keyboard_interrupt, "PyExc_KeyboardInterrupt") ||
      !find(&a.at_exit, "Py_AtExit"))
    return false;  // no interpreter in this process
  if (!a.is_initialized()) return false;
  if (g_armed.exchange(true)) return true;
  g_api = a;
  g_begin = begin;
  g_ends_now = ends_now;
  if (a.add_pending_call(&install, nullptr) != 0) {  // the queue is full: try again on a later call
    g_armed.store(false);
    return false;
  }
  return true;
}

}  // namespace gpushim
