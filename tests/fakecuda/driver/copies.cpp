// Copies, memsets, host functions and the test-only delayed fill "kernel".
//
// Device memory is host memory, so every operation is a memcpy/memset executed by the stream's
// worker. Synchronous variants go to the legacy default stream (the per-thread one for _ptds) and
// wait, which gives them CUDA's implicit ordering with other blocking streams.
#include <algorithm>
#include <cstring>

#include "driver.h"
#include "../fakecuda.h"

namespace fakecuda {
namespace {

// What an address of a copy must be: device memory, host memory (the host side of HtoD/DtoH), or
// either (cuMemcpy, where unified addressing tells the direction).
enum class Side { kDevice, kHost, kAny };

CUresult CheckSide(State& s, Side side, std::uintptr_t p, std::size_t n, const Access& access) {
  if (p == 0) return CUDA_ERROR_INVALID_VALUE;
  switch (side) {
    case Side::kDevice: return CheckDeviceRange(s, p, n, access);
    case Side::kHost: return CheckHostRange(s, p, n, access);
    case Side::kAny: break;
  }
  return CheckAnyRange(s, p, n, access);
}

struct Range {
  Side side;
  std::uintptr_t p;
  std::size_t n;
};

// The operation to enqueue, built once the pointers are validated (under the state lock).
struct PreparedOp {
  std::function<void()> run;
  bool wait = false;  // the call returns only once the op has run
};
using Prepare = std::function<PreparedOp(State&)>;

// The device memory an op on `ranges` accesses (cuMemUnmap's check, RequireNoQueuedAccess).
std::vector<Touch> touches_of(std::initializer_list<Range> ranges) {
  std::vector<Touch> out;
  for (const Range& range : ranges)
    if (range.n != 0) out.push_back(Touch{range.p, range.n});
  return out;
}

// Validates `ranges`, then enqueues the op in the order of stream `hStream` (asynchronous APIs) or
// of the default stream (synchronous APIs, which also wait for it).
CUresult Launch(const char* call, std::initializer_list<Range> ranges, bool sync, CUstream hStream, bool per_thread,
                const Prepare& prepare) {
  State& s = GetState();
  std::unique_lock lk(s.mu);
  Stream* st = nullptr;
  if (sync) {
    Context* ctx = nullptr;
    if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
    st = per_thread ? PerThreadStream(s, ctx) : LegacyStream(s, ctx);
  } else if (CUresult r = ResolveStream(s, hStream, per_thread, &st, "a cuMemcpy*Async/cuMemset*Async"); r != CUDA_SUCCESS) {
    return r;
  }
  const Access access{call, st->capture ? st->capture->id : 0, false, st->ctx->device};
  for (const Range& range : ranges) {
    if (range.n == 0) continue;
    if (CUresult r = CheckSide(s, range.side, range.p, range.n, access); r != CUDA_SUCCESS) return r;
  }
  if (std::all_of(ranges.begin(), ranges.end(), [](const Range& r) { return r.n == 0; })) return CUDA_SUCCESS;
  if (sync) {
    // Not a "potentially unsafe" call: an H200 ran cuMemcpyDtoH during a global capture of a
    // non-blocking stream and left the capture active (2026-11-27, tests/gpu/capture_queries_h200.jsonl).
    // Only the legacy stream's implicit dependency on a blocking capturing stream conflicts.
    if (!per_thread) {
      if (CUresult r = CheckLegacyImplicitDependency(s, st->ctx); r != CUDA_SUCCESS) return r;
    }
    return SubmitAndWait(s, lk, st, prepare(s).run, touches_of(ranges));
  }
  PreparedOp op = prepare(s);
  SubmitOptions opts;
  opts.replayable = true;
  opts.touches = touches_of(ranges);
  if (!op.wait || st->capture) return Submit(s, st, std::move(op.run), std::move(opts));
  return SubmitAndWait(s, lk, st, std::move(op.run), std::move(opts.touches));
}

bool IsPageable(State& s, std::uintptr_t p) { return FindRegion(s, p) == nullptr; }

// Asynchronous copies involving pageable (not page-locked) host memory behave as in CUDA: the
// source is staged at call time, so the caller may reuse its buffer once the call returns, and a
// copy into pageable memory completes before the call returns.
CUresult Copy(const char* call, Side dst_side, std::uintptr_t dst, Side src_side, std::uintptr_t src, std::size_t n,
              bool sync, CUstream h, bool per_thread) {
  return Launch(call, {{dst_side, dst, n}, {src_side, src, n}}, sync, h, per_thread, [=](State& s) {
    PreparedOp op;
    if (!sync && IsPageable(s, src) && !IsPageable(s, dst)) {
      auto staged = std::make_shared<std::vector<unsigned char>>(n);
      std::memcpy(staged->data(), reinterpret_cast<const void*>(src), n);
      op.run = DeviceWork([dst, staged] {
        PopulateForWrite(dst, staged->size());
        std::memcpy(reinterpret_cast<void*>(dst), staged->data(), staged->size());
      });
      return op;
    }
    op.run = DeviceWork([dst, src, n] {
      PopulateForWrite(dst, n);
      std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    });
    op.wait = IsPageable(s, dst);
    return op;
  });
}

template <typename T>
CUresult Memset(const char* call, CUdeviceptr dst, T value, std::size_t count, bool sync, CUstream h, bool per_thread) {
  if (dst % sizeof(T) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (count > SIZE_MAX / sizeof(T)) return CUDA_ERROR_INVALID_VALUE;
  return Launch(call, {{Side::kDevice, dst, count * sizeof(T)}}, sync, h, per_thread, [=](State&) {
    return PreparedOp{DeviceWork([dst, value, count] {
      PopulateForWrite(dst, count * sizeof(T));
      if constexpr (sizeof(T) == 1) {
        std::memset(reinterpret_cast<void*>(dst), value, count);
      } else {
        std::fill_n(reinterpret_cast<T*>(dst), count, value);
      }
    })};
  });
}

CUresult LaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData, bool ptsz) {
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuLaunchHostFunc"); r != CUDA_SUCCESS) return r;
  SubmitOptions opts;
  opts.replayable = true;
  return Submit(
      s, st,
      [fn, userData] {
        HostFunctionScope scope("cuLaunchHostFunc");
        fn(userData);
      },
      std::move(opts));
}

CUresult DelayedFill(CUdeviceptr dst, int value, size_t bytes, unsigned int delay_us, CUstream h, bool ptsz) {
  // Sleeps on the stream's worker, so everything queued behind it waits too, like a slow kernel.
  return Launch("fakecuLaunchDelayedFill", {{Side::kDevice, dst, bytes}}, false, h, ptsz, [=](State&) {
    return PreparedOp{DeviceWork([dst, value, bytes, delay_us] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      PopulateForWrite(dst, bytes);
      std::memset(reinterpret_cast<void*>(dst), value, bytes);
    })};
  });
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

namespace {
auto Ptr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
constexpr bool kSync = true, kAsync = false, kLegacy = false, kPerThread = true;
}  // namespace

// ---- unified (any direction) ----
CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return Copy(__func__, Side::kAny, dst, Side::kAny, src, ByteCount, kSync, nullptr, kLegacy);
}
CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return Copy(__func__, Side::kAny, dst, Side::kAny, src, ByteCount, kSync, nullptr, kPerThread);
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  return Copy(__func__, Side::kAny, dst, Side::kAny, src, ByteCount, kAsync, hStream, kLegacy);
}
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  return Copy(__func__, Side::kAny, dst, Side::kAny, src, ByteCount, kAsync, hStream, kPerThread);
}

// ---- host to device ----
CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  return Copy(__func__, Side::kDevice, dstDevice, Side::kHost, Ptr(srcHost), ByteCount, kSync, nullptr, kLegacy);
}
CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  return Copy(__func__, Side::kDevice, dstDevice, Side::kHost, Ptr(srcHost), ByteCount, kSync, nullptr, kPerThread);
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream) {
  return Copy(__func__, Side::kDevice, dstDevice, Side::kHost, Ptr(srcHost), ByteCount, kAsync, hStream, kLegacy);
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                           CUstream hStream) {
  return Copy(__func__, Side::kDevice, dstDevice, Side::kHost, Ptr(srcHost), ByteCount, kAsync, hStream, kPerThread);
}

// ---- device to host ----
CUresult CUDAAPI cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return Copy(__func__, Side::kHost, Ptr(dstHost), Side::kDevice, srcDevice, ByteCount, kSync, nullptr, kLegacy);
}
CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return Copy(__func__, Side::kHost, Ptr(dstHost), Side::kDevice, srcDevice, ByteCount, kSync, nullptr, kPerThread);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  return Copy(__func__, Side::kHost, Ptr(dstHost), Side::kDevice, srcDevice, ByteCount, kAsync, hStream, kLegacy);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  return Copy(__func__, Side::kHost, Ptr(dstHost), Side::kDevice, srcDevice, ByteCount, kAsync, hStream, kPerThread);
}

// ---- device to device ----
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  return Copy(__func__, Side::kDevice, dstDevice, Side::kDevice, srcDevice, ByteCount, kSync, nullptr, kLegacy);
}
CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  return Copy(__func__, Side::kDevice, dstDevice, Side::kDevice, srcDevice, ByteCount, kSync, nullptr, kPerThread);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream) {
  return Copy(__func__, Side::kDevice, dstDevice, Side::kDevice, srcDevice, ByteCount, kAsync, hStream, kLegacy);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                           CUstream hStream) {
  return Copy(__func__, Side::kDevice, dstDevice, Side::kDevice, srcDevice, ByteCount, kAsync, hStream, kPerThread);
}

// ---- memset ----
CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  return Memset(__func__, dstDevice, uc, N, kSync, nullptr, kLegacy);
}
CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  return Memset(__func__, dstDevice, uc, N, kSync, nullptr, kPerThread);
}
CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  return Memset(__func__, dstDevice, us, N, kSync, nullptr, kLegacy);
}
CUresult CUDAAPI cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  return Memset(__func__, dstDevice, us, N, kSync, nullptr, kPerThread);
}
CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  return Memset(__func__, dstDevice, ui, N, kSync, nullptr, kLegacy);
}
CUresult CUDAAPI cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  return Memset(__func__, dstDevice, ui, N, kSync, nullptr, kPerThread);
}
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  return Memset(__func__, dstDevice, uc, N, kAsync, hStream, kLegacy);
}
CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  return Memset(__func__, dstDevice, uc, N, kAsync, hStream, kPerThread);
}
CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
  return Memset(__func__, dstDevice, us, N, kAsync, hStream, kLegacy);
}
CUresult CUDAAPI cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
  return Memset(__func__, dstDevice, us, N, kAsync, hStream, kPerThread);
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  return Memset(__func__, dstDevice, ui, N, kAsync, hStream, kLegacy);
}
CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  return Memset(__func__, dstDevice, ui, N, kAsync, hStream, kPerThread);
}

// ---- host functions ----
CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  return LaunchHostFunc(hStream, fn, userData, false);
}
CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  return LaunchHostFunc(hStream, fn, userData, true);
}

// ---- test-only "kernel" (see fakecuda.h) ----
CUresult fakecuLaunchDelayedFill(CUdeviceptr dst, int value, size_t bytes, unsigned int delay_us, CUstream hStream) {
  return DelayedFill(dst, value, bytes, delay_us, hStream, false);
}
CUresult fakecuLaunchDelayedFill_ptsz(CUdeviceptr dst, int value, size_t bytes, unsigned int delay_us,
                                      CUstream hStream) {
  return DelayedFill(dst, value, bytes, delay_us, hStream, true);
}
