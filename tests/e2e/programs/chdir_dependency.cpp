// Linked with libs/chdir_at_load.cpp, whose constructor moves the process to "/" before the
// preload's constructor runs. The test starts this under a relative LD_PRELOAD: the front must
// still find its core (beside the file it was loaded from, whatever the working directory), and
// account the one allocation.
//
// Usage: e2e_chdir_dependency [FILE]   prints {"cwd":"...","malloc":N,"free":N}
// FILE (an absolute path) is mapped first: its line in /proc/self/maps comes before the front's.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "support/test_support.h"

extern "C" const char* e2e_chdir_at_load_cwd();

int main(int argc, char** argv) {
  if (argc > 1) {
    const int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
    if (fd < 0 || mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED) return 3;
    close(fd);
  }
  void* p = nullptr;
  const cudaError_t m = cudaMalloc(&p, 1 << 20);
  const cudaError_t f = m == cudaSuccess ? cudaFree(p) : cudaSuccess;
  std::printf("{\"cwd\":\"%s\",\"malloc\":%d,\"free\":%d}\n", e2e_chdir_at_load_cwd(), static_cast<int>(m),
              static_cast<int>(f));
  return 0;
}
