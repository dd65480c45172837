#include "cuda/real_symbols.h"

#include <dlfcn.h>

#include <initializer_list>

namespace gpushim {
namespace {

using DlsymFn = void* (*)(void*, const char*);

DlsymFn find_real_dlsym() {
  // glibc 2.34 moved dlsym into libc and gave it a new version; older ones only have 2.2.5.
  for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5"})
    if (void* f = dlvsym(RTLD_NEXT, "dlsym", version)) return reinterpret_cast<DlsymFn>(f);
  return &dlsym;
}

template <typename F>
void resolve(F*& slot, const char* name) {
  // A versioned lookup first: it is what the application itself bound to.
  void* f = dlvsym(RTLD_NEXT, name, "libcudart.so.13");
  if (f == nullptr) f = real_dlsym(RTLD_NEXT, name);
  slot = reinterpret_cast<F*>(f);
}

}  // namespace

void* real_dlsym(void* handle, const char* name) {
  static const DlsymFn fn = find_real_dlsym();
  return fn(handle, name);
}

const RealRuntime& real_runtime() {
  static const RealRuntime rt = [] {
    RealRuntime r;
    resolve(r.cudaMalloc, "cudaMalloc");
    resolve(r.cudaFree, "cudaFree");
    resolve(r.cudaMallocAsync, "cudaMallocAsync");
    resolve(r.cudaMallocAsync_ptsz, "cudaMallocAsync_ptsz");
    resolve(r.cudaFreeAsync, "cudaFreeAsync");
    resolve(r.cudaFreeAsync_ptsz, "cudaFreeAsync_ptsz");
    resolve(r.cudaMallocPitch, "cudaMallocPitch");
    resolve(r.cudaMallocManaged, "cudaMallocManaged");
    resolve(r.cudaMallocHost, "cudaMallocHost");
    resolve(r.cudaHostAlloc, "cudaHostAlloc");
    resolve(r.cudaFreeHost, "cudaFreeHost");
    resolve(r.cudaMemGetInfo, "cudaMemGetInfo");
    resolve(r.cudaGetDevice, "cudaGetDevice");
    resolve(r.cudaStreamBeginCapture, "cudaStreamBeginCapture");
    resolve(r.cudaStreamBeginCapture_ptsz, "cudaStreamBeginCapture_ptsz");
    resolve(r.cudaStreamEndCapture, "cudaStreamEndCapture");
    resolve(r.cudaStreamEndCapture_ptsz, "cudaStreamEndCapture_ptsz");
    resolve(r.cudaStreamIsCapturing, "cudaStreamIsCapturing");
    return r;
  }();
  return rt;
}

}  // namespace gpushim
