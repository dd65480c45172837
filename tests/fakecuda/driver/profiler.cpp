// cuProfilerStart / cuProfilerStop. No profiler is ever attached to the simulated device; like CUDA
// without one, the calls succeed when a context is current.
#include "driver.h"

#include <cudaProfiler.h>  // after driver.h: cuda.h must see __CUDA_API_VERSION_INTERNAL first

using namespace fakecuda;

CUresult CUDAAPI cuProfilerStart(void) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  return CurrentContext(s, &ctx);
}

CUresult CUDAAPI cuProfilerStop(void) { return cuProfilerStart(); }
