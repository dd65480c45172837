// CUDA calls with bad arguments, each followed by cudaGetLastError. Prints every result as JSON so
// a test can compare the answers with and without the shim: they must be identical, return code
// and last error alike. Then the same for driver-API calls (their code only: the driver keeps no
// last error), reached the way libraries reach them (dlopen + dlsym on libcuda.so.1). Needs two
// devices (FAKECUDA_DEVICES=2 on the simulated device).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {

std::vector<std::pair<std::string, std::string>> g_results;

void note(const char* what, cudaError_t e, const std::string& extra = "") {
  const cudaError_t last = cudaGetLastError();
  std::string s = std::string(cudaGetErrorName(e)) + "/" + cudaGetErrorName(last);
  if (!extra.empty()) s += "/" + extra;
  g_results.emplace_back(what, s);
}

std::string null_or_not(const void* p) { return p == nullptr ? "null" : "set"; }

void note_driver(const char* what, CUresult r) { g_results.emplace_back(what, "CUresult " + std::to_string(r)); }

// Bad calls straight to the driver API; `keep` is a live device block that must survive them.
void driver_calls(void* keep) {
  const testsupport::Driver& cu = testsupport::driver();
  const CUdeviceptr k = reinterpret_cast<CUdeviceptr>(keep);
  CUdeviceptr d = 0;
  size_t p = 0;
  void* heap = std::malloc(64);
  note_driver("cu_alloc_null_out", cu.MemAlloc(nullptr, 16));
  note_driver("cu_alloc_zero", cu.MemAlloc(&d, 0));
  note_driver("cu_alloc_size_max", cu.MemAlloc(&d, SIZE_MAX));
  note_driver("cu_free_zero", cu.MemFree(0));
  note_driver("cu_free_host_heap", cu.MemFree(reinterpret_cast<CUdeviceptr>(heap)));
  note_driver("cu_free_interior_of_runtime_block", cu.MemFree(k + 4096));
  note_driver("cu_free_host_of_device_ptr", cu.MemFreeHost(keep));
  note_driver("cu_free_host_of_heap", cu.MemFreeHost(heap));
  note_driver("cu_pitch_null_pitch", cu.MemAllocPitch(&d, nullptr, 16, 16, 4));
  note_driver("cu_pitch_zero_width", cu.MemAllocPitch(&d, &p, 0, 16, 4));
  note_driver("cu_pitch_bad_element", cu.MemAllocPitch(&d, &p, 16, 16, 3));
  note_driver("cu_mem_get_info_null", cu.MemGetInfo(nullptr, nullptr));
  CUdeviceptr twice = 0;
  CHECK_CU(cu.MemAlloc(&twice, 8192));
  note_driver("cu_free_first", cu.MemFree(twice));
  note_driver("cu_free_second", cu.MemFree(twice));
  void* pinned = nullptr;
  CHECK_CU(cu.MemAllocHost(&pinned, 4096));
  note_driver("cu_free_of_pinned_host", cu.MemFree(reinterpret_cast<CUdeviceptr>(pinned)));
  note_driver("cu_free_host_of_pinned", cu.MemFreeHost(pinned));
  std::free(heap);
  // On a thread with no current context the driver has none to free in (the runtime would bind
  // one), whatever the pointer; a created stream names its own.
  void* spare = nullptr;
  CHECK(cudaMalloc(&spare, 4096));
  cudaStream_t created = nullptr;
  CHECK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
  std::thread([&] {
    note_driver("cu_free_no_context", cu.MemFree(k));
    note_driver("cu_free_async_no_context", cu.MemFreeAsync(k, nullptr));
    note_driver("cu_free_async_created_stream_no_context",
                cu.MemFreeAsync(reinterpret_cast<CUdeviceptr>(spare), reinterpret_cast<CUstream>(created)));
  }).join();
  CHECK(cudaStreamSynchronize(created));
  CHECK(cudaStreamDestroy(created));
  // A thread's cudaFree makes the primary context current there, as a cudaMalloc does, and its
  // driver calls then have one.
  void* first = nullptr;
  void* second = nullptr;
  CHECK(cudaMalloc(&first, 4096));
  CHECK(cudaMalloc(&second, 4096));
  std::thread([&] {
    note("free_on_fresh_thread", cudaFree(first));
    CUcontext current = nullptr;
    CHECK_CU(testsupport::driver_function<CUresult (*)(CUcontext*)>("cuCtxGetCurrent")(&current));
    g_results.emplace_back("context_after_free", null_or_not(current));
    note_driver("cu_free_after_free", cu.MemFree(reinterpret_cast<CUdeviceptr>(second)));
  }).join();
}

}  // namespace

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  void* keep = nullptr;
  CHECK(cudaMalloc(&keep, 1 << 20));
  CHECK(cudaMemset(keep, 0x3c, 1 << 20));
  void* p = nullptr;
  size_t pitch = 12345;

  note("malloc_null_out", cudaMalloc(nullptr, 16));
  p = &pitch;
  const cudaError_t malloc_zero = cudaMalloc(&p, 0);
  note("malloc_zero", malloc_zero, null_or_not(p));
  note("malloc_size_max", cudaMalloc(&p, SIZE_MAX));
  note("malloc_size_max_minus_page", cudaMalloc(&p, SIZE_MAX - 4095));
  note("malloc_2_pow_62", cudaMalloc(&p, size_t{1} << 62));
  note("malloc_async_null_out", cudaMallocAsync(nullptr, 16, s));
  p = &pitch;
  const cudaError_t async_zero = cudaMallocAsync(&p, 0, s);
  note("malloc_async_zero", async_zero, null_or_not(p));
  if (async_zero == cudaSuccess && p != nullptr && p != &pitch) cudaFreeAsync(p, s);
  note("malloc_async_size_max", cudaMallocAsync(&p, SIZE_MAX, s));
  note("pitch_null_out", cudaMallocPitch(nullptr, &pitch, 16, 16));
  note("pitch_null_pitch", cudaMallocPitch(&p, nullptr, 16, 16));
  note("pitch_width_size_max", cudaMallocPitch(&p, &pitch, SIZE_MAX, 2));
  note("pitch_height_size_max", cudaMallocPitch(&p, &pitch, 1024, SIZE_MAX));
  p = &pitch;
  pitch = 12345;
  const cudaError_t pitch_zero_w = cudaMallocPitch(&p, &pitch, 0, 16);
  note("pitch_zero_width", pitch_zero_w, null_or_not(p) + "/" + std::to_string(pitch));
  if (pitch_zero_w == cudaSuccess && p != &pitch) cudaFree(p);
  p = &pitch;
  pitch = 12345;
  const cudaError_t pitch_zero_h = cudaMallocPitch(&p, &pitch, 16, 0);
  note("pitch_zero_height", pitch_zero_h, null_or_not(p) + "/" + std::to_string(pitch));
  if (pitch_zero_h == cudaSuccess && p != &pitch) cudaFree(p);
  note("managed_null_out", cudaMallocManaged(nullptr, 16, cudaMemAttachGlobal));
  note("managed_size_max", cudaMallocManaged(&p, SIZE_MAX, cudaMemAttachGlobal));
  note("host_null_out", cudaMallocHost(nullptr, 16));
  note("host_alloc_size_max", cudaHostAlloc(&p, SIZE_MAX, 0));

  void* heap = std::malloc(256);
  int on_stack = 0;
  note("free_host_heap", cudaFree(heap));
  note("free_stack", cudaFree(&on_stack));
  note("free_interior", cudaFree(static_cast<char*>(keep) + 4096));
  note("free_misaligned", cudaFree(static_cast<char*>(keep) + 1));
  note("free_async_host_heap", cudaFreeAsync(heap, s));
  note("free_async_null", cudaFreeAsync(nullptr, s));
  note("free_host_of_device_ptr", cudaFreeHost(keep));
  note("free_host_of_heap_ptr", cudaFreeHost(heap));
  std::free(heap);

  void* twice = nullptr;
  CHECK(cudaMalloc(&twice, 8192));
  note("free_first", cudaFree(twice));
  note("free_second", cudaFree(twice));

  // A pointer from another device, freed while device 0 is current: legal with unified addressing.
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  if (devices >= 2) {
    void* other = nullptr;
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&other, 1 << 16));
    CHECK(cudaSetDevice(0));
    note("free_other_device", cudaFree(other));
    note("free_other_device_again", cudaFree(other));
    void* other_async = nullptr;
    CHECK(cudaSetDevice(1));
    CHECK(cudaMallocAsync(&other_async, 1 << 16, nullptr));
    CHECK(cudaSetDevice(0));
    note("free_async_other_device", cudaFreeAsync(other_async, nullptr));
  }

  driver_calls(keep);

  size_t free_b = 0, total_b = 0;
  note("mem_get_info_null_null", cudaMemGetInfo(nullptr, nullptr));
  note("mem_get_info_null_total", cudaMemGetInfo(nullptr, &total_b));
  note("mem_get_info_free_null", cudaMemGetInfo(&free_b, nullptr));

  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaDeviceSynchronize());
  std::vector<unsigned char> back(1 << 20);
  CHECK(cudaMemcpy(back.data(), keep, back.size(), cudaMemcpyDeviceToHost));
  bool intact = true;
  for (unsigned char c : back) intact &= c == 0x3c;
  CHECK(cudaFree(keep));
  std::printf("{");
  for (const auto& [k, v] : g_results) std::printf("\"%s\":\"%s\",", k.c_str(), v.c_str());
  std::printf("\"devices\":%d,\"intact\":%s}\n", devices, intact ? "true" : "false");
  return 0;
}
