// RTLD_NEXT chain, first link: e2e_next_probe here calls the next definition in the search order
// (libe2e_next_b's, a dependency of this library), the way wrappers such as LLVM OpenMP's tool
// loader do. Answered for anyone but this library, RTLD_NEXT would find this very function again
// (and loop) or nothing at all.
#include <dlfcn.h>

#include <cstdio>
#include <string>

extern "C" int e2e_next_b_present();  // keeps libe2e_next_b linked (--as-needed would drop it)

extern "C" __attribute__((noinline)) const char* e2e_next_probe() {
  static std::string answer;
  if (e2e_next_b_present() != 1) return "A>(libe2e_next_b missing)";
  using Probe = const char* (*)();
  auto next = reinterpret_cast<Probe>(dlsym(RTLD_NEXT, "e2e_next_probe"));
  if (next == nullptr) return "A>(none)";
  if (next == &e2e_next_probe) return "A>A (RTLD_NEXT resolved for the wrong caller)";
  answer = std::string("A>") + next();
  return answer.c_str();
}
