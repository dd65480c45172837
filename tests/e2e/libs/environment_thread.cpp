// A library whose constructor starts a thread that edits the environment (setenv of names of its
// own, EARLY_<i>) and keeps at it until the program's main stops it: a program's dependencies are
// initialized before the preload, so the front's constructor runs while this thread is busy
// (programs/early_environment_thread.cpp).
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

namespace {

int g_stop = 0;
int g_added = 0;  // EARLY_0 .. EARLY_<g_added - 1> were set
pthread_t g_thread;

void* add_variables(void*) {
  char name[32];
  for (int i = 0; i < 100000 && !__atomic_load_n(&g_stop, __ATOMIC_ACQUIRE); ++i) {
    snprintf(name, sizeof name, "EARLY_%d", i);
    setenv(name, "1", 1);
    __atomic_store_n(&g_added, i + 1, __ATOMIC_RELEASE);
  }
  return nullptr;
}

__attribute__((constructor)) void start() {
  if (pthread_create(&g_thread, nullptr, add_variables, nullptr) != 0) abort();
  // Busy before the next constructor runs.
  while (__atomic_load_n(&g_added, __ATOMIC_ACQUIRE) < 20) sched_yield();
}

}  // namespace

// Stops the thread; how many variables it set.
extern "C" int e2e_environment_thread_stop() {
  __atomic_store_n(&g_stop, 1, __ATOMIC_RELEASE);
  pthread_join(g_thread, nullptr);
  return g_added;
}
