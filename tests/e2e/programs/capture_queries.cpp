// Which driver calls CUDA refuses while a stream captures, and which of them invalidate the
// capture: every call here is made inside a fresh capture (after a captured cuMemAllocAsync, as a
// CUDA graph's first allocation), from the capturing thread and from another, in the three
// capture modes. One JSON line per case. Recorded on an H200 in tests/gpu/capture_queries_h200.jsonl;
// test_caching.CaptureQueries holds the simulated device to those answers, and the shim to the
// device's own. The driver is reached through dlsym, as the other programs do (support/driver_api.h),
// so that the program runs unchanged on NVIDIA's libraries.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/driver_api.h"

namespace {

// A driver function by the name cuda.h gives it (cuMemAlloc is cuMemAlloc_v2): expanded first.
#define CU_NAME(f) #f
#define CU(f) testsupport::driver_function<decltype(&::f)>(CU_NAME(f))

struct Query {
  const char* name;
  std::function<CUresult(CUstream capturing, CUdeviceptr graph_memory)> call;
};

const char* error_name(CUresult r) {
  const char* n = nullptr;
  CU(cuGetErrorName)(r, &n);
  return n != nullptr ? n : "?";
}

const char* status_name(CUstreamCaptureStatus s) {
  return s == CU_STREAM_CAPTURE_STATUS_NONE ? "none" : s == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "active" : "invalidated";
}

// The driver's code for a runtime call's answer, so that every case prints the same kind of name.
CUresult driver_result(cudaError_t e) {
  cudaGetLastError();
  return e == cudaSuccess                          ? CUDA_SUCCESS
         : e == cudaErrorStreamCaptureUnsupported ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
         : e == cudaErrorStreamCaptureInvalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                                                  : CUDA_ERROR_UNKNOWN;
}

// A capture on a new stream, with one captured allocation (a CUDA graph's first), as every case has.
CUstream begin_capture(CUstreamCaptureMode mode, CUdeviceptr* graph_memory) {
  CUstream s = nullptr;
  CHECK_CU(CU(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING));
  CHECK_CU(CU(cuStreamBeginCapture)(s, mode));
  CHECK_CU(CU(cuMemAllocAsync)(graph_memory, 2 << 20, s));
  return s;
}

// Reads whether `s` still captures, ends the capture, prints the case's line and destroys `s`.
void end_capture_and_print(CUstream s, const char* thread, const char* mode, const std::string& call, CUresult result) {
  CUstreamCaptureStatus after = CU_STREAM_CAPTURE_STATUS_NONE;
  CHECK_CU(CU(cuStreamIsCapturing)(s, &after));
  CUgraph graph = nullptr;
  const CUresult end = CU(cuStreamEndCapture)(s, &graph);
  if (graph != nullptr) CHECK_CU(CU(cuGraphDestroy)(graph));
  std::printf("{\"thread\":\"%s\",\"mode\":\"%s\",\"call\":\"%s\",\"result\":\"%s\",\"capture_after\":\"%s\",\"end\":\"%s\"}\n",
              thread, mode, call.c_str(), error_name(result), status_name(after), error_name(end));
  CHECK_CU(CU(cuStreamDestroy)(s));
}

}  // namespace

int main() {
  if (cudaFree(nullptr) != cudaSuccess) return 2;  // the runtime's context, as a program's first call makes it
  CHECK_CU(CU(cuInit)(0));
  CUdevice dev = 0;
  CHECK_CU(CU(cuDeviceGet)(&dev, 0));
  CUcontext primary = nullptr;
  CHECK_CU(CU(cuDevicePrimaryCtxRetain)(&primary, dev));
  CHECK_CU(CU(cuCtxSetCurrent)(primary));
  CUmemoryPool pool = nullptr;
  CHECK_CU(CU(cuDeviceGetDefaultMemPool)(&pool, dev));
  CUstream other = nullptr;
  CHECK_CU(CU(cuStreamCreate)(&other, CU_STREAM_NON_BLOCKING));
  // The pool has memory, so that its queries have something to report, and a pool of the shim has a
  // free 4 KiB block on `other`, so that serving the allocation there needs no new segment.
  for (const size_t bytes : {size_t{1} << 20, size_t{4096}}) {
    CUdeviceptr warm = 0;
    CHECK_CU(CU(cuMemAllocAsync)(&warm, bytes, other));
    CHECK_CU(CU(cuMemFreeAsync)(warm, other));
    void* p = nullptr;  // and through the runtime, the path a pool of the shim serves
    if (cudaMallocAsync(&p, bytes, reinterpret_cast<cudaStream_t>(other)) != cudaSuccess ||
        cudaFreeAsync(p, reinterpret_cast<cudaStream_t>(other)) != cudaSuccess)
      return 2;
  }
  CHECK_CU(CU(cuStreamSynchronize)(other));
  CUdeviceptr held = 0;
  CHECK_CU(CU(cuMemAlloc)(&held, 1 << 20));
  CUevent event = nullptr, done = nullptr;
  CHECK_CU(CU(cuEventCreate)(&event, CU_EVENT_DISABLE_TIMING));
  CHECK_CU(CU(cuEventCreate)(&done, CU_EVENT_DISABLE_TIMING));
  CHECK_CU(CU(cuEventRecord)(done, other));
  CHECK_CU(CU(cuStreamSynchronize)(other));
  auto pool_attribute = [&](CUmemPool_attribute a) {
    return [&, a](CUstream, CUdeviceptr) {
      cuuint64_t v = 0;
      return CU(cuMemPoolGetAttribute)(pool, a, &v);
    };
  };
  const std::vector<Query> queries = {
      {"nothing", [](CUstream, CUdeviceptr) { return CUDA_SUCCESS; }},
      {"cuMemPoolGetAttribute(RESERVED_MEM_CURRENT)", pool_attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)},
      {"cuMemPoolGetAttribute(USED_MEM_CURRENT)", pool_attribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT)},
      {"cuMemPoolGetAttribute(RELEASE_THRESHOLD)", pool_attribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)},
      {"cuDeviceGetMemPool", [&](CUstream, CUdeviceptr) { CUmemoryPool p; return CU(cuDeviceGetMemPool)(&p, dev); }},
      {"cuDeviceGetDefaultMemPool", [&](CUstream, CUdeviceptr) { CUmemoryPool p; return CU(cuDeviceGetDefaultMemPool)(&p, dev); }},
      {"cuMemGetInfo_v2", [](CUstream, CUdeviceptr) { size_t f, t; return CU(cuMemGetInfo)(&f, &t); }},
      {"cuPointerGetAttribute(CONTEXT, held)",
       [&](CUstream, CUdeviceptr) { CUcontext c; return CU(cuPointerGetAttribute)(&c, CU_POINTER_ATTRIBUTE_CONTEXT, held); }},
      {"cuPointerGetAttribute(MEMPOOL_HANDLE, graph alloc)",
       [](CUstream, CUdeviceptr g) { CUmemoryPool p; return CU(cuPointerGetAttribute)(&p, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, g); }},
      {"cuMemGetAddressRange(held)",
       [&](CUstream, CUdeviceptr) { CUdeviceptr b; size_t n; return CU(cuMemGetAddressRange)(&b, &n, held); }},
      {"cuCtxGetDevice", [](CUstream, CUdeviceptr) { CUdevice d; return CU(cuCtxGetDevice)(&d); }},
      {"cuDevicePrimaryCtxGetState",
       [&](CUstream, CUdeviceptr) { unsigned f; int a; return CU(cuDevicePrimaryCtxGetState)(dev, &f, &a); }},
      {"cuStreamGetCaptureInfo",
       [](CUstream s, CUdeviceptr) {
         CUstreamCaptureStatus st;
         return CU(cuStreamGetCaptureInfo)(s, &st, nullptr, nullptr, nullptr, nullptr, nullptr);
       }},
      {"cuStreamGetCtx(capturing)", [](CUstream s, CUdeviceptr) { CUcontext c; return CU(cuStreamGetCtx)(s, &c); }},
      {"cuEventRecord(other stream)", [&](CUstream, CUdeviceptr) { return CU(cuEventRecord)(event, other); }},
      {"cuEventQuery(completed event)", [&](CUstream, CUdeviceptr) { return CU(cuEventQuery)(done); }},
      {"cuStreamQuery(other stream)", [&](CUstream, CUdeviceptr) { return CU(cuStreamQuery)(other); }},
      {"cuMemAllocAsync+cuMemFreeAsync(other stream)",
       [&](CUstream, CUdeviceptr) {
         CUdeviceptr p;
         CUresult r = CU(cuMemAllocAsync)(&p, 4096, other);
         return r == CUDA_SUCCESS ? CU(cuMemFreeAsync)(p, other) : r;
       }},
      {"cudaMallocAsync+cudaFreeAsync(other stream)",
       [&](CUstream, CUdeviceptr) {
         void* p = nullptr;
         cudaError_t e = cudaMallocAsync(&p, 4096, reinterpret_cast<cudaStream_t>(other));
         if (e == cudaSuccess) e = cudaFreeAsync(p, reinterpret_cast<cudaStream_t>(other));
         return driver_result(e);
       }},
      {"cuMemPoolTrimTo", [&](CUstream, CUdeviceptr) { return CU(cuMemPoolTrimTo)(pool, 1ull << 40); }},
      {"cuMemPoolSetAttribute(RELEASE_THRESHOLD)",
       [&](CUstream, CUdeviceptr) {
         cuuint64_t v = 0;
         return CU(cuMemPoolSetAttribute)(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v);
       }},
      {"cuMemPoolSetAttribute(USED_MEM_HIGH, 0)",
       [&](CUstream, CUdeviceptr) {
         cuuint64_t v = 0;
         return CU(cuMemPoolSetAttribute)(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v);
       }},
      // The shim asks whether a capture forbids unsafe calls with this one (Shim::capture_forbids_unsafe_call).
      {"cuMemFree(0)", [](CUstream, CUdeviceptr) { return CU(cuMemFree)(0); }},
      {"cuStreamSynchronize(other stream)", [&](CUstream, CUdeviceptr) { return CU(cuStreamSynchronize)(other); }},
      {"cuEventSynchronize(completed event)", [&](CUstream, CUdeviceptr) { return CU(cuEventSynchronize)(done); }},
      {"cuMemsetD8(sync)", [&](CUstream, CUdeviceptr) { return CU(cuMemsetD8)(held, 0, 64); }},
      {"cuMemcpyDtoH(sync)",
       [&](CUstream, CUdeviceptr) {
         char b[8];
         return CU(cuMemcpyDtoH)(b, held, sizeof b);
       }},
  };
  // The call from the capturing thread, from another thread with the context current, and from a
  // thread with no current context (a monitoring thread asking for memory figures, say).
  enum class Caller { kCapturing, kOther, kBare };
  for (const Caller caller : {Caller::kCapturing, Caller::kOther, Caller::kBare}) {
    for (const auto& [mode, label] : {std::pair{CU_STREAM_CAPTURE_MODE_GLOBAL, "global"},
                                      std::pair{CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, "thread_local"},
                                      std::pair{CU_STREAM_CAPTURE_MODE_RELAXED, "relaxed"}}) {
      for (const Query& q : queries) {
        CUdeviceptr g = 0;
        const CUstream s = begin_capture(mode, &g);
        CUresult result = CUDA_SUCCESS;
        if (caller == Caller::kCapturing) {
          result = q.call(s, g);
        } else {
          std::thread([&] {
            if (caller == Caller::kOther) CU(cuCtxSetCurrent)(primary);
            result = q.call(s, g);
          }).join();
        }
        end_capture_and_print(s, caller == Caller::kCapturing ? "capturing" : caller == Caller::kOther ? "other" : "bare",
                              label, q.name, result);
      }
    }
  }
  // A capture that another thread tried to end: CUDA refuses the end and ends the capture all the
  // same (the H200's answer); a pool must then take the capture for over too.
  {
    CUdeviceptr g = 0;
    const CUstream s = begin_capture(CU_STREAM_CAPTURE_MODE_GLOBAL, &g);
    CUresult ended = CUDA_SUCCESS;
    std::thread([&] {
      CU(cuCtxSetCurrent)(primary);
      CUgraph graph = nullptr;
      ended = CU(cuStreamEndCapture)(s, &graph);
    }).join();
    void* p = nullptr;  // through the runtime: the path a pool of the shim serves
    CUresult result = driver_result(cudaMallocAsync(&p, 4096, reinterpret_cast<cudaStream_t>(other)));
    if (result == CUDA_SUCCESS) result = CU(cuMemFreeAsync)(reinterpret_cast<CUdeviceptr>(p), other);
    end_capture_and_print(s, "capturing", "global",
                          std::string("after an end from another thread (") + error_name(ended) +
                              "): cudaMallocAsync+cuMemFreeAsync(other stream)",
                          result);
  }
  CHECK_CU(CU(cuMemFree)(held));
  CHECK_CU(CU(cuEventDestroy)(event));
  CHECK_CU(CU(cuEventDestroy)(done));
  CHECK_CU(CU(cuStreamDestroy)(other));
  return 0;
}
