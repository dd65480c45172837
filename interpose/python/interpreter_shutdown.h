// The moment a Python program ends and its interpreter's teardown begins, so that the exit report
// describes the program and not its teardown (docs/python.md, "Teardown").
//
// CPython's Py_FinalizeEx (3.9 to 3.13) first calls threading._shutdown (joins the program's
// non-daemon threads), then the atexit module's callbacks, then tears down modules; finalizers of
// objects that hold device memory (PyTorch tensors, numba and CuPy arrays) run in the last two.
// The hook wraps threading._shutdown: the program's own threads have finished when it returns,
// and no atexit callback or module teardown has run yet. Found with dlsym, never linked.
#pragma once

#include <climits>

namespace gpushim {

// What `ends_now` gets when no status is given (any int is a status os._exit may be given).
constexpr int kNoExitStatus = INT_MIN;

// Two ways a Python program ends without the C library's exit(), where the exit report is
// written, are heard of too: `ends_now` runs (at most once) just before
//   - os._exit(), which multiprocessing's fork and forkserver workers end with (the hook wraps
//     os._exit as well: any thread, GIL held);
//   - the signal CPython kills itself with after its finalization when a KeyboardInterrupt (Ctrl-C)
//     ended the program: exit status 130 needs death by SIGINT, and no exit-time code runs. Told
//     by sys.last_type being KeyboardInterrupt when finalization begins (CPython sets its
//     "unhandled KeyboardInterrupt" flag and prints the exception in that very case); `ends_now`
//     then runs at the end of finalization (Py_AtExit), after module teardown, GIL released.
// Neither may call into Python. `ends_now` gets os._exit's status (kNoExitStatus for the SIGINT
// death) and returns the status to exit with (GPUSHIM_EXIT_CODE's, where its verdict failed a run
// that would exit 0).
//
// Arms the hook once per process when a CPython interpreter is running here: schedules (with
// Py_AddPendingCall, which needs neither the GIL nor a thread state) a call that the main thread
// makes at its next safe point, with the GIL held, and that wraps threading._shutdown and
// os._exit. `begin` runs once, on the main thread with the GIL held, when finalization begins.
// Returns false when there is no interpreter (native programs) or it cannot be armed.
bool arm_interpreter_shutdown_hook(void (*begin)(), int (*ends_now)(int status));

}  // namespace gpushim
