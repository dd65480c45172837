// The front adds PyTorch's variable to the environment in its constructor (front/environment.cpp),
// which runs after the program's dependencies are initialized: here one of them
// (libs/environment_thread.cpp) may have started a thread by then. With one thread the front may
// install an environment array of its own (no malloc); with another thread that could be inside
// setenv, only setenv itself (glibc's lock) is safe. Prints where `environ` lies, so the test can
// tell which path was taken, and whether the variable and every entry survived.
//
// Usage: e2e_early_environment_thread
//   prints {"thread":B,"routed":"..."|null,"in_front":B,"twice":N,"entries":N}
#include <dlfcn.h>
#include <string.h>

#include <set>
#include <string>

#include "support/test_support.h"

extern "C" bool e2e_environment_thread_stop();
extern char** environ;

int main() {
  const bool thread = e2e_environment_thread_stop();
  // The array holding the environment: glibc's own (heap or stack) or one of the front's.
  Dl_info info{};
  const bool in_front = dladdr(static_cast<void*>(environ), &info) != 0 && info.dli_fname != nullptr &&
                        strstr(info.dli_fname, "libgpushim.so") != nullptr;
  std::set<std::string> names;
  int twice = 0, entries = 0;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e, ++entries) {
    const char* eq = strchr(*e, '=');
    twice += !names.insert(eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e)).second;
  }
  const char* routed = getenv("PYTORCH_CUDA_ALLOC_CONF");
  // A CUDA program like the others: the shim sees one allocation.
  void* p = nullptr;
  if (cudaMalloc(&p, 1 << 20) != cudaSuccess || cudaFree(p) != cudaSuccess) return 1;
  std::printf("{\"thread\":%s,\"routed\":%s%s%s,\"in_front\":%s,\"twice\":%d,\"entries\":%d}\n",
              thread ? "true" : "false", routed ? "\"" : "", routed ? routed : "null", routed ? "\"" : "",
              in_front ? "true" : "false", twice, entries);
  return 0;
}
