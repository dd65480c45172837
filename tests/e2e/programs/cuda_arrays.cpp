// CUDA arrays through the runtime (cudaMallocArray, cudaMalloc3DArray, cudaMallocMipmappedArray)
// and the driver (cuArrayCreate_v2, cuArray3DCreate_v2): two destroyed, three left live, and one
// made in a context of the program's own that cuCtxDestroy then frees. Prints as JSON what the
// live ones hold in elements (CUDA tells no array's size: cuArrayGetMemoryRequirements answers only
// for a deferred-mapping array) and the driver's figure of memory in use, for the test to hold the
// report to.
// With the argument "cap": one array through each API past GPUSHIM_LIMIT (64 MiB) instead, both
// refused, and how the driver's figure moved. With "reset": an array left live across
// cudaDeviceReset, which frees it. With "deferred": a 256 MiB array and a mipmapped array made with
// CUDA_ARRAY3D_DEFERRED_MAPPING under that cap, which take no memory until mapped. With "reuse" (the
// simulated device only): a second thread makes an array in a context of the program's while
// cuArrayDestroy of another array is still waiting for the device, and gets the destroyed array's
// handle (fakecudaReuseArrayHandles); cuCtxDestroy then frees it. With "no-context": a deferred-
// mapping array (which the shim does not account) is destroyed during a global-mode capture on
// another thread, which CUDA refuses; then a thread with no current context destroys it and an
// array of a context of the program's, as CUDA lets it (an H200, 2026-11-29). Prints the codes
// and the handles.
#include <sched.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {

// The bytes of the elements of `levels` mip levels of a `w` x `h` x `d` array (0 for an absent
// extent) of `element`-byte elements, each level half the one before; `layers` when d counts layers.
unsigned long long elements_bytes(size_t w, size_t h, size_t d, size_t element, unsigned levels = 1,
                                  bool layers = false) {
  unsigned long long total = 0;
  for (unsigned l = 0; l < levels; ++l) {
    total += element * w * (h ? h : 1) * (d ? d : 1);
    w = w > 1 ? w / 2 : 1;
    if (h) h = h > 1 ? h / 2 : 1;
    if (d && !layers) d = d > 1 ? d / 2 : 1;
  }
  return total;
}

unsigned long long used_bytes() {
  size_t free = 0, total = 0;
  CHECK(cudaMemGetInfo(&free, &total));  // also the report's driver sample
  return total - free;
}

CUDA_ARRAY3D_DESCRIPTOR descriptor(size_t w, size_t h, size_t d, CUarray_format f, unsigned channels) {
  CUDA_ARRAY3D_DESCRIPTOR out{};
  out.Width = w;
  out.Height = h;
  out.Depth = d;
  out.Format = f;
  out.NumChannels = channels;
  return out;
}

int past_the_cap() {
  CHECK(cudaFree(nullptr));
  const unsigned long long before = used_bytes();
  const cudaChannelFormatDesc float4{32, 32, 32, 32, cudaChannelFormatKindFloat};
  cudaArray_t a = nullptr;
  const cudaError_t runtime = cudaMallocArray(&a, &float4, 4096, 4096);  // 256 MiB
  const cudaError_t last = cudaGetLastError();
  CUarray d = nullptr;
  const CUDA_ARRAY3D_DESCRIPTOR big = descriptor(4096, 4096, 0, CU_AD_FORMAT_FLOAT, 4);
  const CUresult driver = testsupport::driver().Array3DCreate(&d, &big);
  std::printf("{\"runtime\":\"%s\",\"last\":\"%s\",\"driver\":%d,\"used\":%llu}\n", cudaGetErrorName(runtime),
              cudaGetErrorName(last), static_cast<int>(driver), used_bytes() - before);
  return 0;
}

// An array left live when the program resets the device: the reset frees it.
int reset_with_an_array() {
  CHECK(cudaFree(nullptr));
  const cudaChannelFormatDesc float1{32, 0, 0, 0, cudaChannelFormatKindFloat};
  cudaArray_t a = nullptr;
  CHECK(cudaMallocArray(&a, &float1, 1024, 256));
  const unsigned long long bytes = elements_bytes(1024, 256, 0, 4);
  CHECK(cudaDeviceReset());
  std::printf("{\"freed\":%llu}\n", bytes);
  return 0;
}

int deferred_mapping() {
  CHECK(cudaFree(nullptr));
  const unsigned long long before = used_bytes();
  const testsupport::Driver& drv = testsupport::driver();
  CUDA_ARRAY3D_DESCRIPTOR d = descriptor(4096, 4096, 0, CU_AD_FORMAT_FLOAT, 4);
  d.Flags = CUDA_ARRAY3D_DEFERRED_MAPPING;
  CUarray a = nullptr;
  const CUresult array = drv.Array3DCreate(&a, &d);
  CUmipmappedArray m = nullptr;
  const CUresult mipmapped = drv.MipmappedArrayCreate(&m, &d, 3);
  const unsigned long long used = used_bytes() - before;
  if (array == CUDA_SUCCESS) CHECK_CU(drv.ArrayDestroy(a));
  if (mipmapped == CUDA_SUCCESS) CHECK_CU(drv.MipmappedArrayDestroy(m));
  std::printf("{\"array\":%d,\"mipmapped\":%d,\"used\":%llu}\n", static_cast<int>(array),
              static_cast<int>(mipmapped), used);
  return 0;
}

int reuse_during_destroy() {
  const auto reuse = testsupport::driver_test_hook<void (*)(int)>("fakecudaReuseArrayHandles");
  const auto frees = testsupport::driver_test_hook<unsigned long long (*)()>("fakecudaDriverFreeCount");
  if (reuse == nullptr || frees == nullptr) {  // NVIDIA's driver: nothing to make it reuse a handle
    std::printf("{\"reused\":false}\n");
    return 0;
  }
  CHECK(cudaFree(nullptr));
  const testsupport::Driver& drv = testsupport::driver();
  const testsupport::ProgramContext own = testsupport::make_program_context();
  testsupport::make_current(own.primary);
  reuse(1);
  const CUDA_ARRAY3D_DESCRIPTOR desc = descriptor(128, 128, 16, CU_AD_FORMAT_UNSIGNED_INT16, 1);
  CUarray first = nullptr, second = nullptr;
  CHECK_CU(drv.Array3DCreate(&first, &desc));
  std::atomic<bool> made{false};
  // Keeps the device busy, and so the destroy waiting for it, until the other thread made its array.
  CHECK(testsupport::hold_stream_until(nullptr, &made));
  const unsigned long long before = frees();
  std::thread other([&] {
    while (frees() == before) sched_yield();  // the destroy let go of the handle and waits for the device
    testsupport::make_current(own.context);
    CHECK_CU(drv.Array3DCreate(&second, &desc));
    made.store(true, std::memory_order_release);
  });
  CHECK_CU(drv.ArrayDestroy(first));
  other.join();
  testsupport::destroy_context(own.context);  // frees `second`
  std::printf("{\"reused\":%s,\"bytes\":%llu}\n", second == first ? "true" : "false",
              elements_bytes(128, 128, 16, 2));
  return 0;
}

int destroy_without_context() {
  CHECK(cudaFree(nullptr));
  const testsupport::Driver& drv = testsupport::driver();
  CUDA_ARRAY3D_DESCRIPTOR deferred_desc = descriptor(64, 64, 0, CU_AD_FORMAT_FLOAT, 1);
  deferred_desc.Flags = CUDA_ARRAY3D_DEFERRED_MAPPING;
  CUarray deferred = nullptr, plain = nullptr;
  CHECK_CU(drv.Array3DCreate(&deferred, &deferred_desc));
  const testsupport::ProgramContext own = testsupport::make_program_context();
  const CUDA_ARRAY3D_DESCRIPTOR desc = descriptor(128, 128, 16, CU_AD_FORMAT_UNSIGNED_INT16, 1);
  CHECK_CU(drv.Array3DCreate(&plain, &desc));
  testsupport::make_current(own.primary);
  // A global-mode capture on another thread: destroying an array is a potentially unsafe call then.
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::atomic<int> stage{0};
  std::thread capturing([&] {
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
    cudaGraph_t g = nullptr;
    (void)cudaStreamEndCapture(s, &g);  // invalidated by the refused call, or empty
    if (g != nullptr) cudaGraphDestroy(g);
    cudaGetLastError();
  });
  while (stage.load() != 1) std::this_thread::yield();
  const CUresult during_capture = drv.ArrayDestroy(deferred);
  stage = 2;
  capturing.join();
  CUresult destroyed[2] = {CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN};
  std::thread([&] { destroyed[0] = drv.ArrayDestroy(deferred), destroyed[1] = drv.ArrayDestroy(plain); }).join();
  CHECK(cudaStreamDestroy(s));
  testsupport::destroy_context(own.context);
  std::printf("{\"during_capture\":%d,\"without_context\":[%d,%d],\"deferred\":\"%p\",\"plain\":\"%p\","
              "\"bytes\":%llu}\n",
              static_cast<int>(during_capture), static_cast<int>(destroyed[0]), static_cast<int>(destroyed[1]),
              static_cast<void*>(deferred), static_cast<void*>(plain), elements_bytes(128, 128, 16, 2));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "cap") == 0) return past_the_cap();
  if (argc > 1 && std::strcmp(argv[1], "reset") == 0) return reset_with_an_array();
  if (argc > 1 && std::strcmp(argv[1], "deferred") == 0) return deferred_mapping();
  if (argc > 1 && std::strcmp(argv[1], "reuse") == 0) return reuse_during_destroy();
  if (argc > 1 && std::strcmp(argv[1], "no-context") == 0) return destroy_without_context();
  CHECK(cudaFree(nullptr));
  const unsigned long long before = used_bytes();
  const testsupport::Driver& drv = testsupport::driver();

  const cudaChannelFormatDesc float4{32, 32, 32, 32, cudaChannelFormatKindFloat};
  const cudaChannelFormatDesc uchar1{8, 0, 0, 0, cudaChannelFormatKindUnsigned};
  cudaArray_t image = nullptr, layers = nullptr;
  CHECK(cudaMallocArray(&image, &float4, 1000, 300));                                  // live
  CHECK(cudaMalloc3DArray(&layers, &uchar1, cudaExtent{64, 64, 8}, cudaArrayLayered));  // destroyed
  cudaMipmappedArray_t mip = nullptr;
  CHECK(cudaMallocMipmappedArray(&mip, &float4, cudaExtent{512, 512, 0}, 6, 0));        // live
  CUarray line = nullptr, volume = nullptr;
  const CUDA_ARRAY_DESCRIPTOR line_desc{4096, 0, CU_AD_FORMAT_FLOAT, 2};
  CHECK_CU(drv.ArrayCreate(&line, &line_desc));                                         // destroyed
  const CUDA_ARRAY3D_DESCRIPTOR volume_desc = descriptor(128, 128, 16, CU_AD_FORMAT_UNSIGNED_INT16, 1);
  CHECK_CU(drv.Array3DCreate(&volume, &volume_desc));                                   // live
  CHECK(cudaFreeArray(layers));
  CHECK_CU(drv.ArrayDestroy(line));

  const unsigned long long live =
      elements_bytes(1000, 300, 0, 16) + elements_bytes(512, 512, 0, 16, 6) + elements_bytes(128, 128, 16, 2);

  // An array of a context the program made: freed with it.
  const testsupport::ProgramContext own = testsupport::make_program_context();
  CUarray in_context = nullptr;
  CHECK_CU(drv.Array3DCreate(&in_context, &volume_desc));
  const unsigned long long in_context_bytes = elements_bytes(128, 128, 16, 2);
  testsupport::make_current(own.primary);
  testsupport::destroy_context(own.context);

  std::printf("{\"live\":%llu,\"count\":3,\"in_context\":%llu,\"used\":%llu}\n", live, in_context_bytes,
              used_bytes() - before);
  return 0;  // the three live arrays are left for the exit report
}
