// Legacy CUDA IPC across two processes, on allocations a pool may carve from shared segments:
//   e2e_ipc                 exports three buffers and, for each handle it gets, runs
//                           `e2e_ipc import <handle> <size> <byte>` to check the bytes it sees;
//   e2e_ipc import H N B    opens handle H and checks that its first N bytes all equal B.
// A buffer the shim cannot export exactly must be refused (cudaIpcGetMemHandle fails), never
// exported with the wrong bytes behind it.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "support/test_support.h"

extern char** environ;

namespace {

std::string to_hex(const cudaIpcMemHandle_t& h) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned char c : std::string(h.reserved, sizeof(h.reserved))) s += digits[c >> 4], s += digits[c & 15];
  return s;
}

bool from_hex(const char* s, cudaIpcMemHandle_t* h) {
  if (std::strlen(s) != 2 * sizeof(h->reserved)) return false;
  for (size_t i = 0; i < sizeof(h->reserved); ++i) {
    unsigned v = 0;
    if (std::sscanf(s + 2 * i, "%2x", &v) != 1) return false;
    h->reserved[i] = static_cast<char>(v);
  }
  return true;
}

int import(const char* hex, size_t size, int byte) {
  cudaIpcMemHandle_t h;
  if (!from_hex(hex, &h)) return 2;
  void* p = nullptr;
  CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  std::vector<unsigned char> host(size);
  CHECK(cudaMemcpy(host.data(), p, size, cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (unsigned char c : host) wrong += c != byte;
  CHECK(cudaIpcCloseMemHandle(p));
  std::printf("{\"wrong_bytes\":%zu}\n", wrong);
  return wrong == 0 ? 0 : 4;
}

// Runs the importer for `h`; returns its exit status.
int run_importer(const char* self, const cudaIpcMemHandle_t& h, size_t size, int byte) {
  const std::string hex = to_hex(h), n = std::to_string(size), b = std::to_string(byte);
  char* argv[] = {const_cast<char*>(self), const_cast<char*>("import"), const_cast<char*>(hex.c_str()),
                  const_cast<char*>(n.c_str()), const_cast<char*>(b.c_str()), nullptr};
  pid_t pid;
  if (posix_spawn(&pid, self, nullptr, nullptr, argv, environ) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "import") == 0) return import(argv[2], std::stoul(argv[3]), std::atoi(argv[4]));

  struct Buffer {
    const char* name;
    size_t size;
    int byte;
    void* p;
  };
  // A large buffer (a segment of its own under the caching pool), then two small neighbours (the
  // second lies inside a segment the first one starts).
  Buffer bufs[] = {{"large", 32u << 20, 0x5a, nullptr}, {"small_first", 4096, 0x11, nullptr},
                   {"small_second", 4096, 0x22, nullptr}};
  for (Buffer& b : bufs) {
    CHECK(cudaMalloc(&b.p, b.size));
    CHECK(cudaMemset(b.p, b.byte, b.size));
  }
  CHECK(cudaDeviceSynchronize());
  std::printf("{");
  bool first = true;
  for (Buffer& b : bufs) {
    cudaIpcMemHandle_t h;
    const cudaError_t e = cudaIpcGetMemHandle(&h, b.p);
    const int child = e == cudaSuccess ? run_importer(argv[0], h, b.size, b.byte) : -1;
    std::printf("%s\"%s\":{\"get\":\"%s\",\"importer_exit\":%d}", first ? "" : ",", b.name, cudaGetErrorName(e), child);
    first = false;
  }
  std::printf("}\n");
  return 0;
}
