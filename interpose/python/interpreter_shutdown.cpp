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
  PyObj* (*call_kw)(PyObj*, PyObj*, PyObj*);            // PyObject_Call
  int (*parse_args)(PyObj*, PyObj*, const char*, const char* const*, ...);  // PyArg_ParseTupleAndKeywords
  PyObj* (*build_value)(const char*, ...);              // Py_BuildValue
  PyObj* (*unicode)(const char*);                       // PyUnicode_FromString
  void (*dec_ref)(PyObj*);                              // Py_DecRef: the function, not the macro
  void (*err_clear)();
  PyObj* (*sys_get_object)(const char*);                // PySys_GetObject: borrowed, null if unset
  PyObj** keyboard_interrupt;                           // &PyExc_KeyboardInterrupt
  int (*at_exit)(void (*)());                           // Py_AtExit: the end of Py_FinalizeEx
};

Api g_api;
void (*g_begin)() = nullptr;
int (*g_ends_now)(int) = nullptr;
PyObj* g_original_exit = nullptr;  // os._exit as it was: a reference kept for the process's life
std::atomic<bool> g_armed{false};
std::atomic<bool> g_begun{false};
std::atomic<bool> g_ended{false};

template <typename T>
bool find(T* out, const char* name) {
  *out = reinterpret_cast<T>(dlsym(RTLD_DEFAULT, name));
  return *out != nullptr;
}

void ends_now_once() {
  if (!g_ended.exchange(true)) g_ends_now(kNoExitStatus);
}

// os._exit's status: the status to exit with.
int ends_now_with(int status) { return g_ended.exchange(true) ? status : g_ends_now(status); }

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

// Stands in for os._exit (and posix._exit, the same function): `self` is the posix module, as the
// original's, so that pickling, __module__, __qualname__ and the signature read as before; it takes
// the original's arguments, keywords included. Arguments the original would refuse reach it as
// they are, and the run goes on (the program may catch the TypeError). Otherwise the run ends,
// GPUSHIM_EXIT_CODE may replace a status of 0, and the original gets the status as an int (an
// __index__ of the program's runs once, here).
PyObj* exit_wrapper(PyObj*, PyObj* args, PyObj* kwargs) {
  static const char* const kKeywords[] = {"status", nullptr};
  int status = 0;
  if (g_api.parse_args(args, kwargs, "i:_exit", kKeywords, &status) == 0) {
    g_api.err_clear();
    return g_api.call_kw(g_original_exit, args, kwargs);
  }
  PyObj* with_status = g_api.build_value("(i)", ends_now_with(status));
  if (with_status == nullptr) {
    g_api.err_clear();
    return g_api.call_kw(g_original_exit, args, kwargs);
  }
  PyObj* result = g_api.call_kw(g_original_exit, with_status, nullptr);
  g_api.dec_ref(with_status);
  return result;
}

constexpr int kMethVarArgsAndKeywords = 0x0001 | 0x0002;
// The original's signature and doc (CPython 3.9-3.13), which inspect.signature reads.
// CPython's own idiom for a METH_KEYWORDS function: cast through void (*)(), as PyCFunction holds it.
MethodDef g_exit_def{"_exit", reinterpret_cast<PyObj* (*)(PyObj*, PyObj*)>(reinterpret_cast<void (*)()>(&exit_wrapper)),
                     kMethVarArgsAndKeywords,
                     "_exit($module, /, status)\n--\n\nExit to the system with specified status, without normal "
                     "exit processing. (gpushim writes its exit report first.)"};

void wrap_exit() {
  PyObj* posix = g_api.import_module("posix");
  PyObj* os = posix ? g_api.import_module("os") : nullptr;
  PyObj* original = os ? g_api.get_attr(os, "_exit") : nullptr;
  PyObj* module_name = original ? g_api.unicode("posix") : nullptr;
  PyObj* wrapper = module_name ? g_api.new_cfunction(&g_exit_def, posix, module_name) : nullptr;
  if (wrapper != nullptr) {
    g_original_exit = original;  // kept: the wrapper calls it
    original = nullptr;
    if (g_api.set_attr(os, "_exit", wrapper) != 0 || g_api.set_attr(posix, "_exit", wrapper) != 0) g_api.err_clear();
  }
  g_api.err_clear();  // whatever failed above: never an exception into the program
  for (PyObj* o : {wrapper, module_name, original, os, posix})
    if (o != nullptr) g_api.dec_ref(o);
}

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
  wrap_exit();
  return 0;  // never an exception into the program, whatever happened
}

}  // namespace

bool arm_interpreter_shutdown_hook(void (*begin)(), int (*ends_now)(int status)) {
  Api a{};
  if (!find(&a.is_initialized, "Py_IsInitialized") || !find(&a.add_pending_call, "Py_AddPendingCall") ||
      !find(&a.import_module, "PyImport_ImportModule") || !find(&a.get_attr, "PyObject_GetAttrString") ||
      !find(&a.set_attr, "PyObject_SetAttrString") || !find(&a.new_cfunction, "PyCFunction_NewEx") ||
      !find(&a.call, "PyObject_CallObject") || !find(&a.call_kw, "PyObject_Call") ||
      !find(&a.parse_args, "PyArg_ParseTupleAndKeywords") || !find(&a.build_value, "Py_BuildValue") ||
      !find(&a.unicode, "PyUnicode_FromString") || !find(&a.dec_ref, "Py_DecRef") || !find(&a.err_clear, "PyErr_Clear") ||
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
