// A library whose constructor starts a thread (unless EARLY_THREAD=0) that waits until the
// program's main stops it: a program's dependencies are initialized before the preload, so the
// front's constructor runs in a process that already has two threads
// (programs/early_environment_thread.cpp, which links it: built beside it, in bin/). The thread
// never touches the environment: glibc's own getenv is unsafe against another thread's setenv (it
// may read an array setenv just freed), so a thread editing it would crash any library's
// constructor that reads it, the front's included, whatever the front then does.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

namespace {

int g_stop = 0;
bool g_started = false;
pthread_t g_thread;

void* wait_for_stop(void*) {
  while (!__atomic_load_n(&g_stop, __ATOMIC_ACQUIRE)) {
    const timespec pause{0, 1000 * 1000};
    nanosleep(&pause, nullptr);
  }
  return nullptr;
}

__attribute__((constructor)) void start() {
  const char* wanted = getenv("EARLY_THREAD");
  if (wanted != nullptr && strcmp(wanted, "0") == 0) return;
  if (pthread_create(&g_thread, nullptr, wait_for_stop, nullptr) != 0) abort();
  g_started = true;
}

}  // namespace

// Stops the thread; whether there was one.
extern "C" bool e2e_environment_thread_stop() {
  if (!g_started) return false;
  __atomic_store_n(&g_stop, 1, __ATOMIC_RELEASE);
  pthread_join(g_thread, nullptr);
  return true;
}
