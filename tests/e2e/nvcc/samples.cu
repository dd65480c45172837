// Programs in the style of NVIDIA's public CUDA samples, one per mode (argv[1]), built by nvcc
// (tests/e2e/CMakeLists.txt) and run by tests/e2e/nvcc_programs.py:
//   ipc             memory and an event shared with a child process (simpleIPC): the child waits
//                   on the parent's event, so it sees the slow kernel's writes, then overwrites them
//   vmm             cuMemCreate/cuMemMap memory exported as a POSIX fd to a child that maps it too
//                   (memMapIPCDrv); the allocation is created before any context is current
//   host-register   cudaHostRegister'd memory written by a kernel through its device alias, and
//                   asynchronous copies into it (simpleHostRegister / simpleZeroCopy)
//   pools           stream-ordered allocation from an explicit pool and the default pool, ordered
//                   across streams by an event, and a graph with memory nodes captured from a
//                   stream and launched three times (streamOrderedAllocation, graphMemoryNodes)
// Prints "pid <n>" first (the tests find this process's report by it) and "OK" at the end; any
// failure prints "FAILED ..." and exits 2. Children are this program again, with an internal mode.
// Kernels run as host stand-ins on the simulated device (fakecudaSetKernelStandIn via dlsym).
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#define CHECK(call)                                                                               \
  do {                                                                                            \
    cudaError_t err_ = (call);                                                                    \
    if (err_ != cudaSuccess) {                                                                    \
      std::printf("FAILED %s: %s (%d)\n", #call, cudaGetErrorName(err_), static_cast<int>(err_)); \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

#define CHECK_CU(call)                                                  \
  do {                                                                  \
    CUresult err_ = (call);                                             \
    if (err_ != CUDA_SUCCESS) {                                         \
      const char* name_ = nullptr;                                      \
      cuGetErrorName(err_, &name_);                                     \
      std::printf("FAILED %s: %s (%d)\n", #call, name_, (int)err_);     \
      std::exit(2);                                                     \
    }                                                                   \
  } while (0)

#define EXPECT(cond)                     \
  do {                                   \
    if (!(cond)) {                       \
      std::printf("FAILED %s\n", #cond); \
      std::exit(2);                      \
    }                                    \
  } while (0)

constexpr int kN = 1 << 14;

extern "C" __global__ void fill_u32(unsigned* out, unsigned value, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value + static_cast<unsigned>(i);
}

extern "C" __global__ void slow_fill_u32(unsigned* out, unsigned value, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value + static_cast<unsigned>(i);
}

// ---- stand-ins for the simulated device ----
struct LaunchDims {
  unsigned grid[3];
  unsigned block[3];
  size_t shared_bytes;
};

static unsigned g_slow_us = 30000;  // how long slow_fill_u32 runs on the simulated device

static void fill_on_host(void** args, const LaunchDims*, void* user) {
  if (user != nullptr) usleep(*static_cast<unsigned*>(user));  // slow_fill_u32: runs on after the launch
  unsigned* out = *static_cast<unsigned**>(args[0]);
  unsigned value = *static_cast<unsigned*>(args[1]);
  int n = *static_cast<int*>(args[2]);
  for (int i = 0; i < n; ++i) out[i] = value + static_cast<unsigned>(i);
}

static void register_stand_ins() {
  using SetStandIn = int (*)(const char*, void (*)(void**, const LaunchDims*, void*), void*, const size_t*, int);
  auto set = reinterpret_cast<SetStandIn>(dlsym(RTLD_DEFAULT, "fakecudaSetKernelStandIn"));
  if (set == nullptr) return;  // NVIDIA's runtime: the kernels themselves run
  const size_t sizes[] = {sizeof(unsigned*), sizeof(unsigned), sizeof(int)};
  set("fill_u32", fill_on_host, nullptr, sizes, 3);
  set("slow_fill_u32", fill_on_host, &g_slow_us, sizes, 3);
}

static void expect_pattern(const unsigned* host, unsigned value, const char* what) {
  for (int i = 0; i < kN; ++i) {
    if (host[i] != value + static_cast<unsigned>(i)) {
      std::printf("FAILED %s: [%d] = %#x, want %#x\n", what, i, host[i], value + static_cast<unsigned>(i));
      std::exit(2);
    }
  }
}

static std::string hex(const void* data, size_t n) {
  std::string out;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof(b), "%02x", static_cast<const unsigned char*>(data)[i]);
    out += b;
  }
  return out;
}

static void unhex(const char* text, void* data, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    unsigned v = 0;
    std::sscanf(text + 2 * i, "%2x", &v);
    static_cast<unsigned char*>(data)[i] = static_cast<unsigned char>(v);
  }
}

// Runs this program again with `args`; returns its exit status.
static int run_child(const std::vector<std::string>& args) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    static char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[len > 0 ? len : 0] = '\0';
    argv.push_back(self);
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(self, argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// ---- ipc ----
static int ipc_parent() {
  unsigned* d = nullptr;
  CHECK(cudaMalloc(&d, kN * sizeof(unsigned)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t written;
  CHECK(cudaEventCreateWithFlags(&written, cudaEventInterprocess | cudaEventDisableTiming));
  int n = kN;
  g_slow_us = 300000;  // longer than the child takes to start and open the handles
  slow_fill_u32<<<(kN + 255) / 256, 256, 0, s>>>(d, 1000u, n);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(written, s));
  cudaIpcMemHandle_t mem;
  cudaIpcEventHandle_t ev;
  CHECK(cudaIpcGetMemHandle(&mem, d));
  CHECK(cudaIpcGetEventHandle(&ev, written));
  // The child starts while the kernel still runs: only the event makes its read safe.
  EXPECT(run_child({"ipc-child", hex(&mem, sizeof(mem)), hex(&ev, sizeof(ev))}) == 0);
  std::vector<unsigned> host(kN);
  CHECK(cudaMemcpy(host.data(), d, kN * sizeof(unsigned), cudaMemcpyDeviceToHost));
  expect_pattern(host.data(), 5000u, "parent after the child wrote");
  CHECK(cudaEventDestroy(written));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
  return 0;
}

static int ipc_child(const char* mem_hex, const char* ev_hex) {
  cudaIpcMemHandle_t mem;
  cudaIpcEventHandle_t ev;
  unhex(mem_hex, &mem, sizeof(mem));
  unhex(ev_hex, &ev, sizeof(ev));
  cudaEvent_t written;
  CHECK(cudaIpcOpenEventHandle(&written, ev));
  unsigned* d = nullptr;
  CHECK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&d), mem, cudaIpcMemLazyEnablePeerAccess));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamWaitEvent(s, written, 0));
  std::vector<unsigned> host(kN);
  CHECK(cudaMemcpyAsync(host.data(), d, kN * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  expect_pattern(host.data(), 1000u, "child after waiting on the parent's event");
  int n = kN;
  fill_u32<<<(kN + 255) / 256, 256, 0, s>>>(d, 5000u, n);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaIpcCloseMemHandle(d));
  CHECK(cudaEventDestroy(written));
  CHECK(cudaStreamDestroy(s));
  return 0;
}

// ---- vmm (driver API) ----
static CUdeviceptr map_everywhere(CUmemGenericAllocationHandle h, size_t size) {
  CUdeviceptr va = 0;
  CHECK_CU(cuMemAddressReserve(&va, size, 0, 0, 0));
  CHECK_CU(cuMemMap(va, size, 0, h, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_CU(cuMemSetAccess(va, size, &access, 1));
  return va;
}

static CUmemAllocationProp shareable_device_memory() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

static int vmm_parent() {
  CHECK_CU(cuInit(0));
  CUmemAllocationProp prop = shareable_device_memory();
  size_t granularity = 0;
  CHECK_CU(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const size_t size = ((kN * sizeof(unsigned) + granularity - 1) / granularity) * granularity;
  // No context is current yet: the device comes from the allocation's properties.
  CUmemGenericAllocationHandle h = 0;
  CHECK_CU(cuMemCreate(&h, size, &prop, 0));
  CUcontext ctx = nullptr;
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK_CU(cuCtxSetCurrent(ctx));
  CUdeviceptr va = map_everywhere(h, size);
  CHECK_CU(cuMemsetD32(va, 0x600df00d, kN));
  int fd = -1;
  CHECK_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT(run_child({"vmm-child", std::to_string(fd), std::to_string(size)}) == 0);
  close(fd);
  std::vector<unsigned> host(kN);
  CHECK_CU(cuMemcpyDtoH(host.data(), va, kN * sizeof(unsigned)));
  expect_pattern(host.data(), 77u, "parent after the child wrote through its mapping");
  CHECK_CU(cuMemUnmap(va, size));
  CHECK_CU(cuMemAddressFree(va, size));
  CHECK_CU(cuMemRelease(h));
  CHECK_CU(cuDevicePrimaryCtxRelease(0));
  return 0;
}

static int vmm_child(int fd, size_t size) {
  CHECK_CU(cuInit(0));
  CUcontext ctx = nullptr;
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK_CU(cuCtxSetCurrent(ctx));
  CUmemGenericAllocationHandle h = 0;
  CHECK_CU(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  CUdeviceptr va = map_everywhere(h, size);
  std::vector<unsigned> host(kN);
  CHECK_CU(cuMemcpyDtoH(host.data(), va, kN * sizeof(unsigned)));
  for (int i = 0; i < kN; ++i) EXPECT(host[i] == 0x600df00du);
  for (int i = 0; i < kN; ++i) host[i] = 77u + static_cast<unsigned>(i);
  CHECK_CU(cuMemcpyHtoD(va, host.data(), kN * sizeof(unsigned)));
  CHECK_CU(cuMemUnmap(va, size));
  CHECK_CU(cuMemAddressFree(va, size));
  CHECK_CU(cuMemRelease(h));
  return 0;
}

// ---- host-register ----
static int host_register() {
  std::vector<unsigned> buffer(kN, 0);
  CHECK(cudaHostRegister(buffer.data(), kN * sizeof(unsigned), cudaHostRegisterMapped));
  unsigned* alias = nullptr;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&alias), buffer.data(), 0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int n = kN;
  fill_u32<<<(kN + 255) / 256, 256, 0, s>>>(alias, 42u, n);  // zero-copy: the kernel writes host memory
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(s));
  expect_pattern(buffer.data(), 42u, "zero-copy write");
  unsigned* d = nullptr;
  CHECK(cudaMalloc(&d, kN * sizeof(unsigned)));
  fill_u32<<<(kN + 255) / 256, 256, 0, s>>>(d, 7u, n);
  CHECK(cudaMemcpyAsync(buffer.data(), d, kN * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  expect_pattern(buffer.data(), 7u, "async copy into registered memory");
  EXPECT(cudaHostRegister(buffer.data(), 64, 0) == cudaErrorHostMemoryAlreadyRegistered);
  EXPECT(cudaGetLastError() == cudaErrorHostMemoryAlreadyRegistered);
  CHECK(cudaHostUnregister(buffer.data()));
  CHECK(cudaFree(d));
  CHECK(cudaStreamDestroy(s));
  return 0;
}

// ---- pools and graph memory nodes ----
static int pools() {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool;
  CHECK(cudaMemPoolCreate(&pool, &props));
  cudaStream_t a, b;
  CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t produced;
  CHECK(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
  const size_t bytes = kN * sizeof(unsigned);
  unsigned *x = nullptr, *y = nullptr;
  std::vector<unsigned> host(kN);
  int n = kN;
  for (int round = 0; round < 3; ++round) {
    CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&x), bytes, pool, a));
    slow_fill_u32<<<(kN + 255) / 256, 256, 0, a>>>(x, 100u * round, n);
    CHECK(cudaEventRecord(produced, a));
    CHECK(cudaStreamWaitEvent(b, produced, 0));
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&y), bytes, b));
    CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, b));
    CHECK(cudaMemcpyAsync(host.data(), y, bytes, cudaMemcpyDeviceToHost, b));
    CHECK(cudaFreeAsync(y, b));
    CHECK(cudaEventRecord(produced, b));
    CHECK(cudaStreamWaitEvent(a, produced, 0));
    CHECK(cudaFreeAsync(x, a));  // after b has copied out of it
    CHECK(cudaStreamSynchronize(b));
    expect_pattern(host.data(), 100u * round, "stream-ordered copy across streams");
  }
  CHECK(cudaStreamSynchronize(a));

  // A graph with memory nodes: allocation, kernel, copy out, free, captured from stream a.
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
  unsigned* scratch = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch), bytes, a));
  fill_u32<<<(kN + 255) / 256, 256, 0, a>>>(scratch, 9u, n);
  CHECK(cudaMemcpyAsync(host.data(), scratch, bytes, cudaMemcpyDeviceToHost, a));
  CHECK(cudaFreeAsync(scratch, a));
  CHECK(cudaStreamEndCapture(a, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int launch = 0; launch < 3; ++launch) {
    std::memset(host.data(), 0, bytes);
    CHECK(cudaGraphLaunch(exec, a));
    CHECK(cudaStreamSynchronize(a));
    expect_pattern(host.data(), 9u, "graph launch");
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaEventDestroy(produced));
  CHECK(cudaStreamDestroy(a));
  CHECK(cudaStreamDestroy(b));
  CHECK(cudaMemPoolDestroy(pool));
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "ipc-child" && argc == 4) {
    register_stand_ins();
    return ipc_child(argv[2], argv[3]);
  }
  if (mode == "vmm-child" && argc == 4) return vmm_child(std::atoi(argv[2]), std::strtoull(argv[3], nullptr, 10));
  std::printf("pid %d\n", static_cast<int>(getpid()));
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  register_stand_ins();
  int rc = 2;
  if (mode == "ipc") {
    rc = ipc_parent();
  } else if (mode == "vmm") {
    rc = vmm_parent();
  } else if (mode == "host-register") {
    rc = host_register();
  } else if (mode == "pools") {
    rc = pools();
  } else {
    std::printf("FAILED usage: samples ipc|vmm|host-register|pools\n");
  }
  if (rc == 0) std::printf("OK\n");
  return rc;
}
