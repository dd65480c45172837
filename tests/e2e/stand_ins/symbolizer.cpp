// llvm-symbolizer for TSan builds. TSan starts the symbolizer with the environment of the program it
// reports on, LD_PRELOAD included, and a TSan-built shim cannot load into the (uninstrumented)
// symbolizer, so reports came out without function names. This instrumented stand-in (the shim
// loads into it) runs the real symbolizer without the preload. TSAN_OPTIONS names it
// (external_symbolizer_path, CMakeLists.txt); its name must start with llvm-symbolizer.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

int main(int, char** argv) {
  unsetenv("LD_PRELOAD");
  execv(GPUSHIM_LLVM_SYMBOLIZER, argv);
  std::perror("llvm-symbolizer stand-in: " GPUSHIM_LLVM_SYMBOLIZER);
  return 127;
}
