// SIGTERM and SIGINT, the way batch systems (Slurm, Kubernetes, torchrun) and people stop jobs:
// when the program left them at the default disposition, the report is written first, then the
// signal is raised again with that disposition, so the process ends exactly as it would have.
//
// No deadlock whatever the signal interrupts: the handler only stores the signal number and posts
// a semaphore (both async-signal-safe) and returns, so the interrupted thread goes on and releases
// any lock of the shim (or of malloc, the driver, ...) it held. The report is written by a thread
// of our own, waiting on that semaphore with every signal blocked, like any exit-time report. A
// second termination signal before the report is done ends the process at once.
#pragma once

namespace gpushim {

// Installs the handler on SIGTERM and SIGINT where the disposition is SIG_DFL (the program's own
// handler or SIG_IGN wins, untouched) and starts the thread that runs `write_report` on delivery.
// Call once, at the first CUDA call. False when neither signal was taken.
bool install_termination_report(void (*write_report)());

// A fork child has no such thread: the dispositions we changed go back to SIG_DFL, as without us.
void restore_termination_signals();

}  // namespace gpushim
