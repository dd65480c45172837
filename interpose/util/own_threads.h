// The shim's own threads (gpushim-exit, gpushim-live, gpushim-trace) wait for work for the life of
// the process, and a Linux process lives while any of its threads does. A program whose main thread
// calls pthread_exit() ends, without the shim, when its last thread ends (glibc calls exit(0) there);
// with the shim's threads still waiting it lived on forever, and its pending SIGTERM could never be
// delivered (our threads block every signal). So each of our threads registers here and, while it
// waits, asks about once a second whether the program has a thread left; when it has none, the
// process ends as glibc would have ended it.
#pragma once

namespace gpushim {

// Called by each of our threads as it starts.
void note_own_thread();
// Called from our threads' idle waits: exit(0) when the main thread has ended and every thread
// left is ours. Reads one /proc file at most once a second while the main thread lives.
void end_process_if_orphaned();

}  // namespace gpushim
