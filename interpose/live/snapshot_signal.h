// The signal that asks a running process for a snapshot report (GPUSHIM_SNAPSHOT_SIGNAL).
//
// A signal disposition is process-wide, so this state is too. The handler only counts the request
// and posts a semaphore, both async-signal-safe; the live worker thread does the work.
#pragma once

#include <semaphore.h>

#include <cstdint>

namespace gpushim {

// Installs the handler for `signo`, posting `wake` on each delivery, unless the program already
// handles or ignores the signal: the program's choice wins, nothing changes, one notice line says
// so, and the result is false. Call once, at the first CUDA call.
bool install_snapshot_signal(int signo, sem_t* wake);

// Deliveries since the last call (several signals before the worker wakes make one snapshot).
uint64_t take_snapshot_requests();

// Puts back the disposition the signal had before install_snapshot_signal, if our handler is still
// the one installed (a program that replaced it keeps its own). For fork children, which write
// nothing and must behave as without the shim. Async-signal-safe.
void restore_snapshot_signal();

}  // namespace gpushim
