// The moment a Python program ends and its interpreter's teardown begins, so that the exit report
// describes the program and not its teardown (docs/python.md, "Teardown").
//
// CPython's Py_FinalizeEx (3.9 to 3.13) first calls threading._shutdown (joins the program's
// non-daemon threads), then the atexit module's callbacks, then tears down modules; finalizers of
// objects that hold device memory (PyTorch tensors, numba and CuPy arrays) run in the last two.
// The hook wraps threading._shutdown: the program's own threads have finished when it returns,
// and no atexit callback or module teardown has run yet. Found with dlsym, never linked.
#pragma once

namespace gpushim {

// Arms the hook once per process when a CPython interpreter is running here: schedules (with
// Py_AddPendingCall, which needs neither the GIL nor a thread state) a call that the main thread
// makes at its next safe point, with the GIL held, and that wraps threading._shutdown. `begin`
// runs once, on the main thread with the GIL held, when finalization begins; it must not call
// into Python. Returns false when there is no interpreter (native programs) or it cannot be armed.
bool arm_interpreter_shutdown_hook(void (*begin)());

}  // namespace gpushim
