// Test entry point. Besides running gtest, this binary doubles as the "other process" of the
// cross-process tests: RunChild() re-executes it with --child=<mode> arguments.
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

extern char** environ;

namespace fakecuda_test {
namespace {

int Fail(const char* what, int code) {
  std::printf("child: %s failed with %d\n", what, code);
  return 1;
}

// Legacy IPC importer: open the handle, check every byte, overwrite them, close.
// args: <handle as 128 hex digits> <size> <expected byte> <new byte>
int ChildIpcOpen(char** argv) {
  cudaIpcMemHandle_t handle{};
  const char* hex = argv[0];
  for (std::size_t i = 0; i < sizeof(handle.reserved); ++i) {
    unsigned v = 0;
    std::sscanf(hex + 2 * i, "%2x", &v);
    handle.reserved[i] = static_cast<char>(v);
  }
  const std::size_t size = std::strtoull(argv[1], nullptr, 10);
  const int expected = std::atoi(argv[2]);
  const int replacement = std::atoi(argv[3]);
  void* p = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
    return Fail("cudaIpcOpenMemHandle", e);
  }
  std::vector<unsigned char> host(size);
  if (cudaError_t e = cudaMemcpy(host.data(), p, size, cudaMemcpyDeviceToHost); e != cudaSuccess) {
    return Fail("cudaMemcpy", e);
  }
  for (std::size_t i = 0; i < size; ++i) {
    if (host[i] != expected) {
      std::printf("child: byte %zu is %d, expected %d\n", i, host[i], expected);
      return 1;
    }
  }
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
    return Fail("cudaPointerGetAttributes", attr.type);
  }
  if (cudaError_t e = cudaMemset(p, replacement, size); e != cudaSuccess) return Fail("cudaMemset", e);
  if (cudaError_t e = cudaIpcCloseMemHandle(p); e != cudaSuccess) return Fail("cudaIpcCloseMemHandle", e);
  std::printf("child: ok\n");
  return 0;
}

// VMM importer: import a POSIX fd, map it, check and overwrite the bytes.
// args: <fd> <size> <expected byte> <new byte>
int ChildVmmImport(char** argv) {
  const int fd = std::atoi(argv[0]);
  const std::size_t size = std::strtoull(argv[1], nullptr, 10);
  const int expected = std::atoi(argv[2]);
  const int replacement = std::atoi(argv[3]);
  CUcontext ctx = nullptr;
  if (CUresult r = cuInit(0); r != CUDA_SUCCESS) return Fail("cuInit", r);
  if (CUresult r = cuDevicePrimaryCtxRetain(&ctx, 0); r != CUDA_SUCCESS) return Fail("retain", r);
  cuCtxSetCurrent(ctx);
  CUmemGenericAllocationHandle h = 0;
  if (CUresult r = cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS) {
    return Fail("cuMemImportFromShareableHandle", r);
  }
  CUdeviceptr va = 0;
  if (CUresult r = cuMemAddressReserve(&va, size, 0, 0, 0); r != CUDA_SUCCESS) return Fail("reserve", r);
  if (CUresult r = cuMemMap(va, size, 0, h, 0); r != CUDA_SUCCESS) return Fail("map", r);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = cuMemSetAccess(va, size, &access, 1); r != CUDA_SUCCESS) return Fail("access", r);
  auto* bytes = reinterpret_cast<unsigned char*>(va);
  for (std::size_t i = 0; i < size; i += 4096) {
    if (bytes[i] != expected) {
      std::printf("child: byte %zu is %d, expected %d\n", i, bytes[i], expected);
      return 1;
    }
  }
  if (CUresult r = cuMemsetD8(va, static_cast<unsigned char>(replacement), size); r != CUDA_SUCCESS) {
    return Fail("memset", r);
  }
  cuMemUnmap(va, size);
  cuMemRelease(h);
  cuMemAddressFree(va, size);
  std::printf("child: ok\n");
  return 0;
}

// Exits (through exit(), running atexit handlers and static destructors) while a stream still
// has seconds of queued work. Must neither hang nor crash.
int ChildExitWithPendingWork() {
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, 1 << 20); e != cudaSuccess) return Fail("cudaMalloc", e);
  cudaStream_t s = nullptr;
  cudaStreamCreate(&s);
  for (int i = 0; i < 3; ++i) fakecudaLaunchDelayedFill(p, i, 1 << 20, 1000000, s);
  fakecudaLaunchDelayedFill(p, 7, 1 << 20, 1000000, nullptr);
  std::printf("child: exiting\n");
  std::fflush(stdout);
  std::exit(0);
}

// fork() after using the device, with work in flight: neither side may deadlock, the child cannot
// use CUDA (as with real CUDA) but exits normally.
int ChildFork() {
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, 1 << 20); e != cudaSuccess) return Fail("cudaMalloc", e);
  cudaStream_t s = nullptr;
  cudaStreamCreate(&s);
  fakecudaLaunchDelayedFill(p, 1, 1 << 20, 200000, s);
  std::thread busy([] {
    // Keep the driver's lock busy while the main thread forks.
    for (int i = 0; i < 2000; ++i) {
      size_t f = 0, t = 0;
      cudaMemGetInfo(&f, &t);
    }
  });
  const pid_t pid = fork();
  if (pid == 0) {
    void* q = nullptr;
    const cudaError_t e = cudaMalloc(&q, 4096);
    size_t f = 0, t = 0;
    const CUresult r = cuMemGetInfo(&f, &t);
    std::printf("grandchild: cudaMalloc=%d cuMemGetInfo=%d\n", e, r);
    std::fflush(stdout);
    // _exit, not exit: until it execs, the child of a multithreaded process may only make
    // async-signal-safe calls. exit() runs every handler, and in ASan builds LeakSanitizer's exit
    // check, which can wait forever on an allocator lock the busy thread held at the fork (11 hangs
    // in 30 runs). The CUDA calls above are what this test is about.
    _exit(e == cudaErrorInitializationError && r == CUDA_ERROR_NOT_INITIALIZED ? 0 : 3);
  }
  busy.join();
  int status = 0;
  for (int i = 0; i < 500; ++i) {  // 5 s
    if (waitpid(pid, &status, WNOHANG) == pid) {
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return Fail("grandchild", status);
      if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return Fail("sync", e);
      std::printf("child: ok\n");
      return 0;
    }
    usleep(10000);
  }
  kill(pid, SIGKILL);
  return Fail("grandchild hung", -1);
}

// fork() from a thread that never called CUDA while three threads allocate: each grandchild's
// first call binds the thread (the runtime's lock, then the driver's cuCtxSetCurrent), so it must
// find neither lock held by a parent thread. Prints the number of grandchildren that hung.
int ChildForkWhileAllocating() {
  if (cudaError_t e = cudaFree(nullptr); e != cudaSuccess) return Fail("cudaFree", e);
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back([&stop, w] {
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      while (!stop.load()) {
        void* p = nullptr;
        if (w == 0 ? cudaMallocAsync(&p, 4096, s) == cudaSuccess : cudaMalloc(&p, 4096) == cudaSuccess) {
          w == 0 ? cudaFreeAsync(p, s) : cudaFree(p);
        }
      }
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    });
  }
  int hung = 0, failed = 0;
  std::thread forker([&] {  // never calls CUDA itself: its child's first call binds
    for (int i = 0; i < 20; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        void* q = nullptr;
        const cudaError_t e = cudaMalloc(&q, 4096);
        _exit(e == cudaErrorInitializationError ? 0 : 3);
      }
      int status = 0;
      int waited = 0;
      while (waitpid(pid, &status, WNOHANG) != pid) {
        if (++waited > 500) {  // 5 s
          ++hung;
          kill(pid, SIGKILL);
          waitpid(pid, &status, 0);
          break;
        }
        usleep(10000);
      }
      if (waited <= 500 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) ++failed;
    }
  });
  forker.join();
  stop = true;
  for (auto& w : workers) w.join();
  std::printf("forks=20 hung=%d failed=%d\n", hung, failed);
  return hung == 0 && failed == 0 ? 0 : 1;
}

int ChildPrintConfig() {
  int count = 0;
  cudaGetDeviceCount(&count);
  size_t free_b = 0, total = 0;
  cudaMemGetInfo(&free_b, &total);
  std::printf("devices=%d total=%zu free=%zu\n", count, total, free_b);
  return 0;
}

// The fraction of [p, p + bytes) whose pages are in memory.
double Resident(void* p, std::size_t bytes) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in(bytes / page);
  if (mincore(p, bytes, in.data()) != 0) return -1;
  std::size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return static_cast<double>(n) / static_cast<double>(in.size());
}

// Frees memory it wrote and says how much of it stays in memory: below the device's budget of kept
// free bytes (a quarter of FAKECUDA_MEM), then past it.
int ChildArenaResidency() {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  void* a = nullptr;
  void* b = nullptr;
  if (cudaError_t e = cudaMalloc(&a, 32 * kMiB); e != cudaSuccess) return Fail("cudaMalloc", e);
  cudaMemset(a, 0x5a, 32 * kMiB);
  cudaFree(a);
  const double kept = Resident(a, 32 * kMiB);
  if (cudaError_t e = cudaMalloc(&b, 160 * kMiB); e != cudaSuccess) return Fail("cudaMalloc", e);
  cudaMemset(b, 0x5a, 160 * kMiB);
  cudaFree(b);
  std::printf("same_address=%d kept=%.3f past_budget=%.3f\n", a == b, kept, Resident(b, 160 * kMiB));
  return 0;
}

// Initializes the runtime and reports which driver lookups it made, as "name@version/flags=count".
int ChildRuntimeQueries() {
  if (cudaError_t e = cudaFree(nullptr); e != cudaSuccess) return Fail("cudaFree", e);
  struct Query {
    const char* name;
    int version;
    unsigned long long flags;
  };
  const Query queries[] = {
      {"", -1, ~0ULL},
      {"cuGetProcAddress", 12000, 0},
      {"cuMemAlloc", 3020, 0},
      {"cuMemFree", 3020, 0},
      {"cuMemAllocPitch", 3020, 0},
      {"cuMemGetInfo", 3020, 0},
      {"cuMemAllocManaged", 6000, 0},
      {"cuMemHostAlloc", 2020, 0},
      {"cuMemAllocAsync", 11020, 0},
      {"cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
      {"cuMemAllocFromPoolAsync", 11020, 0},
      {"cuMemAllocFromPoolAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
      {"cuMemFreeAsync", 11020, 0},
      {"cuMemFreeAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
      {"cuIpcOpenMemHandle", 4010, 0},
      {"cuIpcOpenMemHandle", 11000, 0},
      {"cuGraphAddMemAllocNode", 11040, 0},
      {"cuDeviceGraphMemTrim", 11040, 0},
      {"cuGetExportTable", -1, ~0ULL},
      {"cuMemAlloc_v2", -1, ~0ULL},
  };
  for (const Query& q : queries) {
    const std::string flags = q.flags == ~0ULL ? "any" : std::to_string(q.flags);
    std::printf("%s@%d/%s=%llu\n", q.name, q.version, flags.c_str(),
                fakecudaProcAddressQueryCount(q.name, q.version, q.flags));
  }
  return 0;
}

int RunChildMode(const std::string& mode, char** rest) {
  if (mode == "runtime-queries") return ChildRuntimeQueries();
  if (mode == "ipc-open") return ChildIpcOpen(rest);
  if (mode == "vmm-import") return ChildVmmImport(rest);
  if (mode == "exit-pending") return ChildExitWithPendingWork();
  if (mode == "fork") return ChildFork();
  if (mode == "fork-while-allocating") return ChildForkWhileAllocating();
  if (mode == "print-config") return ChildPrintConfig();
  if (mode == "arena-residency") return ChildArenaResidency();
  std::printf("unknown child mode %s\n", mode.c_str());
  return 2;
}

}  // namespace

ChildResult RunChild(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                     double timeout_s) {
  ChildResult result;
  int out[2];
  if (pipe(out) != 0) return result;
  std::vector<std::string> argv_s = {"/proc/self/exe"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (env.count(entry.substr(0, entry.find('='))) == 0) env_s.push_back(entry);
  }
  for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, out[1], 2);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    return result;
  }
  bool timed_out = false;
  char buf[4096];
  while (true) {
    const double left = timeout_s - Seconds(start);
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{out[0], POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    result.output.append(buf, static_cast<std::size_t>(n));
  }
  close(out[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  result.seconds = Seconds(start);
  result.exit_code = (!timed_out && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace fakecuda_test

int main(int argc, char** argv) {
  if (argc >= 2 && std::strncmp(argv[1], "--child=", 8) == 0) {
    return fakecuda_test::RunChildMode(argv[1] + 8, argv + 2);
  }
  ::testing::InitGoogleTest(&argc, argv);
  // Misuse death tests run while the simulated device's stream workers exist: the child re-runs
  // the test from the start instead of forking a multi-threaded process.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return RUN_ALL_TESTS();
}
