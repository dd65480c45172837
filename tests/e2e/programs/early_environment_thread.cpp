// The front adds PyTorch's variable to the environment in its constructor (front/environment.cpp),
// which runs after the program's dependencies are initialized: here one of them
// (libs/environment_thread.cpp) has a thread calling setenv all the while. Both edits must survive,
// as with any two threads calling setenv, and neither may leave the other a broken array.
//
// Usage: e2e_early_environment_thread   prints {"added":N,"missing":M,"twice":T,"routed":"..."|null}
#include <string.h>

#include <set>
#include <string>

#include "support/test_support.h"

extern "C" int e2e_environment_thread_stop();
extern char** environ;

int main() {
  const int added = e2e_environment_thread_stop();
  int missing = 0;
  for (int i = 0; i < added; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "EARLY_%d", i);
    missing += getenv(name) == nullptr;
  }
  std::set<std::string> names;
  int twice = 0;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = strchr(*e, '=');
    twice += !names.insert(eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e)).second;
  }
  const char* routed = getenv("PYTORCH_CUDA_ALLOC_CONF");
  // A CUDA program like the others: the shim sees one allocation.
  void* p = nullptr;
  if (cudaMalloc(&p, 1 << 20) != cudaSuccess || cudaFree(p) != cudaSuccess) return 1;
  std::printf("{\"added\":%d,\"missing\":%d,\"twice\":%d,\"routed\":%s%s%s}\n", added, missing, twice,
              routed ? "\"" : "", routed ? routed : "null", routed ? "\"" : "");
  return 0;
}
