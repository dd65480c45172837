// Leaks one allocation from leak_here. Two files use one large inline function: the linker keeps
// one copy and, in clang's DWARF 5, leaves the other's address range at 0 with its length, over
// _start. The shim's symbolizer, asked about _start, must not name that function's line
// (test_foundation).
#include <cuda_runtime_api.h>

#include "big_inline.h"

volatile int g_sink;
void other_use();

__attribute__((noinline)) void leak_here() {
  void* p = nullptr;
  cudaMalloc(&p, 64);
}

int main() {
  if (g_sink == 12345) big_inline();
  other_use();
  leak_here();
  return 0;
}
