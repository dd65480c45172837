#include "python/python_call_counter.h"

#include <dlfcn.h>

#include "python/python_code_table.h"
#include "python/python_frame_walker.h"
#include "python/python_memory.h"
#include "python/python_objects.h"
#include "util/log.h"

namespace gpushim {

using PyObj = void;  // PyObject*: only ever passed back to the C API

struct PythonCallCounter::Api {
  uintptr_t (*thread_interp)(uintptr_t tstate);  // PyThreadState_GetInterpreter: reads one field
  // 3.9-3.11: PEP 523. Reading and writing the interpreter's eval_frame field, nothing else.
  void* (*get_eval)(uintptr_t interp);
  void (*set_eval)(uintptr_t interp, void* (*)(void*, void*, int));
  // 3.12+: what registration calls, on the main thread with the GIL held.
  uintptr_t (*main_interp)();
  uintptr_t (*thread_head)(uintptr_t interp);
  uintptr_t (*thread_next)(uintptr_t tstate);
  // _PyEval_AddPendingCall(interp, func, arg, flags) (3.12+, exported for CPython's own tests):
  // flags 0 lets any thread of the interpreter run the call, not only the main thread, which may
  // be waiting in join() while a worker runs the loop. Py_AddPendingCall where it is missing.
  int (*add_pending_call_any_thread)(uintptr_t, int (*)(void*), void*, int);
  int (*add_pending_call)(int (*)(void*), void*);
  PyObj* (*import_module)(const char*);
  PyObj* (*get_attr)(PyObj*, const char*);
  PyObj* (*call_method)(PyObj*, const char*, const char*, ...);
  long (*as_long)(PyObj*);
  PyObj* (*new_cfunction)(void* def, PyObj*, PyObj*);
  void (*inc_ref)(PyObj*);
  void (*dec_ref)(PyObj*);
  void (*err_clear)();
  PyObj* none;
  int (*set_attr)(PyObj*, const char*, PyObj*);                      // PyObject_SetAttrString
  PyObj* (*vectorcall)(PyObj*, void* const*, size_t, PyObj*);          // PyObject_Vectorcall (3.12+)
  PyObj* (*unicode)(const char*);                                      // PyUnicode_FromString
  int (*is_instance)(PyObj*, PyObj*);                                  // PyObject_IsInstance
  PyObj* long_type;                                                    // &PyLong_Type
  PyObj* unicode_type;                                                 // &PyUnicode_Type
};

namespace {

// PyMethodDef: part of the stable ABI, unchanged from 3.9 to 3.13.
struct MethodDef {
  const char* name;
  void* meth;
  int flags;
  const char* doc;
};
constexpr int kMethFastcall = 0x0080;
constexpr size_t kMaxNameChars = 1024;
// Tool ids that sys.monitoring leaves unassigned (0-2 and 5 are the debugger, coverage, profiler
// and optimizer).
constexpr int kToolIds[] = {4, 3};

std::atomic<PythonCallCounter*> g_counter{nullptr};  // the one that installed its hook
PythonCallCounter::Api g_api;

template <typename T>
bool find(T* out, const char* name) {
  *out = reinterpret_cast<T>(dlsym(RTLD_DEFAULT, name));
  return *out != nullptr;
}

MethodDef g_callback_def{"gpushim_py_start", nullptr, kMethFastcall,
                         "gpushim: counts the calls of GPUSHIM_ITERATION_SITE (sys.monitoring PY_START)"};
constexpr int kMethKeywords = 0x0002;
// The original's signature, and like the original no doc.
MethodDef g_use_tool_id_def{"use_tool_id", nullptr, kMethFastcall | kMethKeywords,
                            "use_tool_id($module, tool_id, name, /)\n--\n\n"};

}  // namespace

PythonCallCounter* PythonCallCounter::create(const PythonRuntime& rt, std::string site, IterationCounter* iterations) {
  if (site.empty() || rt.layout == nullptr || iterations == nullptr) return nullptr;
  Api a{};
  if (!find(&a.thread_interp, "PyThreadState_GetInterpreter") || !find(&a.main_interp, "PyInterpreterState_Main"))
    return nullptr;
  if (rt.layout->minor >= 12) {
    if (!find(&a.thread_head, "PyInterpreterState_ThreadHead") ||
        !find(&a.thread_next, "PyThreadState_Next") || !find(&a.add_pending_call, "Py_AddPendingCall") ||
        !find(&a.import_module, "PyImport_ImportModule") || !find(&a.get_attr, "PyObject_GetAttrString") ||
        !find(&a.call_method, "PyObject_CallMethod") || !find(&a.as_long, "PyLong_AsLong") ||
        !find(&a.new_cfunction, "PyCFunction_NewEx") || !find(&a.inc_ref, "Py_IncRef") ||
        !find(&a.dec_ref, "Py_DecRef") || !find(&a.err_clear, "PyErr_Clear") || !find(&a.none, "_Py_NoneStruct") ||
        !find(&a.set_attr, "PyObject_SetAttrString") || !find(&a.vectorcall, "PyObject_Vectorcall") ||
        !find(&a.unicode, "PyUnicode_FromString") || !find(&a.is_instance, "PyObject_IsInstance") ||
        !find(&a.long_type, "PyLong_Type") || !find(&a.unicode_type, "PyUnicode_Type"))
      return nullptr;
    find(&a.add_pending_call_any_thread, "_PyEval_AddPendingCall");
  } else if (!find(&a.get_eval, "_PyInterpreterState_GetEvalFrameFunc") ||
             !find(&a.set_eval, "_PyInterpreterState_SetEvalFrameFunc") || !find(&a.inc_ref, "Py_IncRef")) {
    return nullptr;
  }
  // Every instance reads the same symbols of the one interpreter: the copy is the same each time.
  g_api = a;
  auto* c = new PythonCallCounter(rt, std::move(site), iterations, &g_api);
  // Now, at the process's first CUDA call, which usually comes before the loop: on 3.11 the
  // evaluator changes how calls nest in native frames, and calls already running keep the old
  // nesting (their allocations' stacks differ from later ones in interpreter frames).
  const auto tstate = reinterpret_cast<uintptr_t>(rt.this_thread_state());
  c->arm(tstate != 0 ? a.thread_interp(tstate) : a.main_interp());
  return c;
}

PythonCallCounter::PythonCallCounter(const PythonRuntime& rt, std::string site, IterationCounter* iterations,
                                     const Api* api)
    : rt_(rt), site_(std::move(site)), iterations_(iterations), api_(*api) {}

bool PythonCallCounter::counts_calls_of(uintptr_t code) {
  const int phase = phase_.load(std::memory_order_acquire);
  if (phase == kOff) return false;
  const uintptr_t interp = api_.thread_interp(reinterpret_cast<uintptr_t>(rt_.this_thread_state()));
  if (phase == kIdle) arm(interp);  // the interpreter was not running yet when the shim started
  if (phase_.load(std::memory_order_acquire) != kArmed || interp != interp_.load(std::memory_order_relaxed))
    return false;
  if (is_target(code)) {
    // Another PEP 523 user (TorchDynamo, a debugger) that put its own evaluator in place of ours
    // may not call ours any more: then allocation stacks count again.
    if (api_.get_eval != nullptr && api_.get_eval(interp) != reinterpret_cast<void*>(&eval_hook)) {
      turn_off("another frame evaluator (PEP 523) replaced gpushim's");
      return false;
    }
    return true;
  }
  candidate_.store(code, std::memory_order_release);
  if (api_.get_eval == nullptr) request_registration();
  return false;
}

void PythonCallCounter::arm(uintptr_t interp) {
  if (interp == 0) return;
  // Py_AddPendingCall reaches the main interpreter only.
  if (api_.get_eval == nullptr && api_.add_pending_call_any_thread == nullptr && interp != api_.main_interp()) return;
  PythonCallCounter* none = nullptr;
  if (!g_counter.compare_exchange_strong(none, this) && none != this) {
    phase_.store(kOff, std::memory_order_release);
    return;
  }
  int idle = kIdle;
  if (!phase_.compare_exchange_strong(idle, kArming, std::memory_order_acq_rel)) return;
  interp_.store(interp, std::memory_order_relaxed);
  if (api_.get_eval != nullptr) {
    // Two stores the interpreter reads without a lock; done without the GIL, which this thread
    // may not hold (and must never wait for here). Frames already running are not affected.
    auto* previous = reinterpret_cast<void* (*)(void*, void*, int)>(api_.get_eval(interp));
    if (previous == nullptr) {
      phase_.store(kOff, std::memory_order_release);
      return;
    }
    previous_eval_.store(previous, std::memory_order_release);
    api_.set_eval(interp, &eval_hook);
  }
  phase_.store(kArmed, std::memory_order_release);
}

void PythonCallCounter::request_registration() {
  if (pending_.exchange(true, std::memory_order_acq_rel)) return;
  // Py_AddPendingCall needs neither the GIL nor a thread state; a full queue is tried again at
  // the next allocation inside the function.
  const int rc = api_.add_pending_call_any_thread != nullptr
                     ? api_.add_pending_call_any_thread(interp_.load(std::memory_order_relaxed), &register_pending,
                                                        nullptr, 0)
                     : api_.add_pending_call(&register_pending, nullptr);
  if (rc != 0) pending_.store(false, std::memory_order_release);
}

bool PythonCallCounter::register_target(uintptr_t code) {
  const int n = n_targets_.load(std::memory_order_relaxed);
  // The address was the site's when an allocation saw it; a frame running it proves the object
  // alive, and its name that no other code object has taken the address since.
  std::string name;
  if (n == kMaxTargets || py_load<uintptr_t>(code + kPyObjectType) != rt_.code_type ||
      !copy_python_str(rt_, py_load<uintptr_t>(code + rt_.layout->code_name), kMaxNameChars, &name) ||
      !python_names_function(name, site_)) {
    uintptr_t expected = code;  // stop comparing frames with it
    candidate_.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
    return false;
  }
  api_.inc_ref(reinterpret_cast<PyObj*>(code));  // never released: the address stays this code's
  targets_[n].store(code, std::memory_order_relaxed);
  n_targets_.store(n + 1, std::memory_order_release);
  uintptr_t expected = code;
  candidate_.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
  return true;
}

void PythonCallCounter::count_call(uintptr_t tstate, uintptr_t code, size_t own_frames) {
  if (python_frames_running(rt_, tstate, code, own_frames + 1) > own_frames) return;
  iterations_->add(IterationCounter::kSite);
}

void PythonCallCounter::turn_off(const std::string& why) {
  if (phase_.exchange(kOff, std::memory_order_acq_rel) != kOff)
    log_line("GPUSHIM_ITERATION_SITE: %s; calls are recognised in allocation stacks from now on", why.c_str());
}

// 3.9-3.11, as the interpreter's frame evaluator, with the GIL held: `frame` is a PyFrameObject
// (3.9, 3.10) or a _PyInterpreterFrame (3.11) about to run.
void* PythonCallCounter::eval_hook(void* tstate, void* frame, int throwflag) {
  // Both were stored before the interpreter could call us, but by a thread that need not hold
  // the GIL: on a weakly ordered CPU this thread may see them a moment later. Never null for long.
  PythonCallCounter* c;
  while ((c = g_counter.load(std::memory_order_acquire)) == nullptr) {
  }
  void* (*previous)(void*, void*, int);
  while ((previous = c->previous_eval_.load(std::memory_order_acquire)) == nullptr) {
  }
  const PythonLayout& L = *c->rt_.layout;
  const auto f = reinterpret_cast<uintptr_t>(frame);
  const uintptr_t code = py_load<uintptr_t>(f + L.frame_code);
  if (c->is_target(code) ||
      (code == c->candidate_.load(std::memory_order_relaxed) && c->register_target(code))) {
    // A call starts with its first instruction; a generator resumes, or receives a throw, later.
    const bool starts = L.model == PyFrameModel::kFrameObject
                            ? py_load<int>(f + L.frame_position) < 0
                            : py_load<uintptr_t>(f + L.frame_position) < code + L.code_adaptive;
    // The frame is not on the thread's chain yet: any frame there running the code is an outer call.
    if (throwflag == 0 && starts && c->phase_.load(std::memory_order_relaxed) == kArmed)
      c->count_call(reinterpret_cast<uintptr_t>(tstate), code, 0);
  }
  return previous(tstate, frame, throwflag);
}

// 3.12+: sys.monitoring's PY_START callback, (code, instruction_offset), with the GIL held. The
// new frame is already the innermost of the thread's chain.
void* PythonCallCounter::monitoring_callback(void*, void* const* args, intptr_t nargs) {
  PythonCallCounter* c = g_counter.load(std::memory_order_relaxed);
  const uintptr_t code = nargs >= 1 ? reinterpret_cast<uintptr_t>(args[0]) : 0;
  if (c->phase_.load(std::memory_order_relaxed) == kArmed && c->is_target(code))
    c->count_call(reinterpret_cast<uintptr_t>(c->rt_.this_thread_state()), code, 1);
  c->api_.inc_ref(c->api_.none);
  return c->api_.none;
}

// 3.12+: a pending call, on the main thread with the GIL held. Never leaves an exception set.
int PythonCallCounter::register_pending(void*) {
  PythonCallCounter* c = g_counter.load(std::memory_order_relaxed);
  c->pending_.store(false, std::memory_order_release);
  const uintptr_t code = c->candidate_.load(std::memory_order_acquire);
  if (code == 0 || c->phase_.load(std::memory_order_acquire) != kArmed || c->rt_.is_finalizing() ||
      c->is_target(code))
    return 0;
  // Alive only if a frame runs it. If the call ended before this thread got here, the next
  // allocation inside the function asks again.
  const uintptr_t interp = c->interp_.load(std::memory_order_relaxed);
  size_t running = 0, starting = 0;
  for (uintptr_t ts = c->api_.thread_head(interp); ts != 0; ts = c->api_.thread_next(ts)) {
    const uintptr_t frame = python_outermost_frame_running(c->rt_, ts, code);
    running += frame != 0;
    starting += frame != 0 && c->at_start(frame, code);
  }
  if (running == 0) return 0;
  if (c->monitoring_ == nullptr && !c->setup_monitoring()) {
    c->api_.err_clear();
    c->turn_off("sys.monitoring has no free tool id, or refused the callback");
    return 0;
  }
  // Local events: only this code object is instrumented.
  PyObj* r = c->api_.call_method(c->monitoring_, "set_local_events", "iOl", c->tool_, reinterpret_cast<PyObj*>(code),
                                 c->py_start_);
  if (r == nullptr) {
    c->api_.err_clear();
    c->turn_off("sys.monitoring.set_local_events failed");
    return 0;
  }
  c->api_.dec_ref(r);
  // Only now do allocations stop counting calls of it: the call running now was counted by the
  // allocation that named the code, and PY_START counts the next ones. A call still at its first
  // instruction (its RESUME, where the interpreter ran this pending call) began after that
  // allocation and before its PY_START was instrumented: nothing has counted it.
  if (c->register_target(code))
    for (size_t i = 0; i < starting; ++i) c->iterations_->add(IterationCounter::kSite);
  return 0;
}

bool PythonCallCounter::at_start(uintptr_t frame, uintptr_t code) const {
  const PythonLayout& L = *rt_.layout;
  const auto delta = static_cast<int64_t>(py_load<uintptr_t>(frame + L.frame_position) - (code + L.code_adaptive));
  return delta <= static_cast<int64_t>(py_load<int>(code + L.code_firsttraceable)) * 2;
}

// Under the GIL: takes a free tool id of kToolIds other than `except` for PY_START callbacks, and
// turns PY_START on for every target already found. The id, or -1.
int PythonCallCounter::take_tool(PyObj* mon, int except) {
  int tool = -1;
  for (int id : kToolIds) {
    if (id == except) continue;
    PyObj* owner = api_.call_method(mon, "get_tool", "i", id);
    if (owner == nullptr) {
      api_.err_clear();
      continue;
    }
    const bool free = owner == api_.none;
    api_.dec_ref(owner);
    if (!free) continue;
    // The original: ours (below) would only pass the call on.
    PyObj* r = use_tool_id_ ? api_.call_method(use_tool_id_, "__call__", "is", id, "gpushim")
                            : api_.call_method(mon, "use_tool_id", "is", id, "gpushim");
    if (r == nullptr) {
      api_.err_clear();
      continue;
    }
    api_.dec_ref(r);
    tool = id;
    break;
  }
  if (tool < 0) return -1;
  g_callback_def.meth = reinterpret_cast<void*>(&monitoring_callback);
  PyObj* callback = api_.new_cfunction(&g_callback_def, nullptr, nullptr);
  PyObj* events = callback ? api_.get_attr(mon, "events") : nullptr;
  PyObj* py_start = events ? api_.get_attr(events, "PY_START") : nullptr;
  PyObj* r = py_start ? api_.call_method(mon, "register_callback", "iOO", tool, py_start, callback) : nullptr;
  py_start_ = r != nullptr ? api_.as_long(py_start) : -1;
  for (PyObj* o : {r, py_start, events, callback})
    if (o) api_.dec_ref(o);
  bool ok = r != nullptr && py_start_ > 0;
  for (int i = 0; ok && i < n_targets_.load(std::memory_order_acquire); ++i) {
    PyObj* set = api_.call_method(mon, "set_local_events", "iOl", tool,
                                  reinterpret_cast<PyObj*>(targets_[i].load(std::memory_order_relaxed)), py_start_);
    ok = set != nullptr;
    if (set) api_.dec_ref(set);
  }
  if (!ok) {
    api_.err_clear();
    release_tool(mon, tool);
    return -1;
  }
  return tool;
}

// Under the GIL: stops `tool`'s events and callback on the targets, and frees the id.
void PythonCallCounter::release_tool(PyObj* mon, int tool) {
  for (int i = 0; i < n_targets_.load(std::memory_order_acquire); ++i) {
    PyObj* r = api_.call_method(mon, "set_local_events", "iOi", tool,
                                reinterpret_cast<PyObj*>(targets_[i].load(std::memory_order_relaxed)), 0);
    if (r) api_.dec_ref(r);
  }
  if (py_start_ > 0) {
    PyObj* r = api_.call_method(mon, "register_callback", "ilO", tool, py_start_, api_.none);
    if (r) api_.dec_ref(r);
  }
  PyObj* r = api_.call_method(mon, "free_tool_id", "i", tool);
  if (r) api_.dec_ref(r);
  api_.err_clear();
}

// sys.monitoring.use_tool_id as the program calls it: the program's tools come before this counter.
// A call that will take the id held here (an int and a str, nothing else) moves the counter to
// another free id (or, with none, stops it) first; every call then goes to the original as made.
void* PythonCallCounter::use_tool_id_wrapper(void*, void* const* args, intptr_t nargs, void* kwnames) {
  PythonCallCounter* c = g_counter.load(std::memory_order_relaxed);
  if (c != nullptr && c->tool_ >= 0 && kwnames == nullptr && nargs == 2 &&
      g_api.is_instance(args[0], g_api.long_type) == 1 && g_api.is_instance(args[1], g_api.unicode_type) == 1) {
    const long id = g_api.as_long(args[0]);  // an int: no __index__ of the program's runs
    if (id == -1) g_api.err_clear();
    if (id == c->tool_) {
      PyObj* mon = c->monitoring_;
      const int held = c->tool_;
      const int moved = c->take_tool(mon, held);
      c->release_tool(mon, held);
      c->tool_ = moved;
      if (moved < 0) c->turn_off("the program took sys.monitoring tool id " + std::to_string(held) + ", and no other was free");
    }
  }
  g_api.err_clear();
  return g_api.vectorcall(c != nullptr ? c->use_tool_id_ : nullptr, args, static_cast<size_t>(nargs), kwnames);
}

bool PythonCallCounter::setup_monitoring() {
  PyObj* sys = api_.import_module("sys");
  if (sys == nullptr) return false;
  PyObj* mon = api_.get_attr(sys, "monitoring");
  api_.dec_ref(sys);
  if (mon == nullptr) return false;
  tool_ = take_tool(mon, -1);
  if (tool_ < 0) {
    api_.dec_ref(mon);
    return false;
  }
  monitoring_ = mon;  // kept: set_local_events for each further code object of the site
  // The program's own tools come first (use_tool_id_wrapper). Kept for the process's life.
  // Its self is sys.monitoring and its module "sys.monitoring", as the original's: name, repr and
  // messages read the same.
  use_tool_id_ = api_.get_attr(mon, "use_tool_id");
  PyObj* module_name = use_tool_id_ ? api_.unicode("sys.monitoring") : nullptr;
  if (module_name != nullptr) {
    g_use_tool_id_def.meth = reinterpret_cast<void*>(&use_tool_id_wrapper);
    PyObj* wrapper = api_.new_cfunction(&g_use_tool_id_def, mon, module_name);
    if (wrapper == nullptr || api_.set_attr(mon, "use_tool_id", wrapper) != 0) api_.err_clear();
    if (wrapper) api_.dec_ref(wrapper);
    api_.dec_ref(module_name);
  }
  api_.err_clear();
  return true;
}

}  // namespace gpushim
