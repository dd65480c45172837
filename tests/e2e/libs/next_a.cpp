// RTLD_NEXT chain, first link: e2e_next_probe here calls the next definition in the search order
// (libe2e_next_b's), the way wrappers such as LLVM OpenMP's tool loader do. If dlsym answered
// RTLD_NEXT for anyone but this library, it would find this very function again and loop.
#include <dlfcn.h>

#include <cstdio>
#include <string>

extern "C" __attribute__((noinline)) const char* e2e_next_probe() {
  static std::string answer;
  using Probe = const char* (*)();
  auto next = reinterpret_cast<Probe>(dlsym(RTLD_NEXT, "e2e_next_probe"));
  if (next == nullptr) return "A>(none)";
  if (next == &e2e_next_probe) return "A>A (RTLD_NEXT resolved for the wrong caller)";
  answer = std::string("A>") + next();
  return answer.c_str();
}
