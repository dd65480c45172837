// Streams and events: asynchronous execution, stream order, legacy default stream semantics,
// per-thread default streams, implicit synchronization of cuMemFree, stream-ordered free.
//
// The delayed fill is the probe: it holds its stream for a while and then writes a value, so the
// final contents of a buffer tell which operation ran last.
#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <thread>

#include "test_util.h"

namespace fakecuda_test {
namespace {

constexpr size_t kBytes = 64 << 10;

class Streams : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    ASSERT_CU(cuMemAlloc(&buf_, kBytes));
    ASSERT_CU(cuMemsetD8(buf_, 0, kBytes));
  }
  void TearDown() override {
    cuCtxSynchronize();
    cuMemFree(buf_);
    DriverTest::TearDown();
  }
  unsigned char At(size_t i) const { return reinterpret_cast<const unsigned char*>(buf_)[i]; }
  bool AllEqual(unsigned char v) const {
    for (size_t i = 0; i < kBytes; i += 997) {
      if (At(i) != v) return false;
    }
    return At(kBytes - 1) == v;
  }
  CUresult Fill(unsigned char v, unsigned delay_us, CUstream s) { return fakecuLaunchDelayedFill(buf_, v, kBytes, delay_us, s); }

  CUdeviceptr buf_ = 0;
};

TEST_F(Streams, WorkIsAsynchronousAndInOrder) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_CU(Fill(1, kDelayUs, s));
  ASSERT_CU(cuMemsetD8Async(buf_, 2, kBytes, s));
  EXPECT_LT(Seconds(start), 0.1);  // returned before the work ran
  EXPECT_EQ(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(At(0), 0);
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_GE(Seconds(start), 0.15);
  EXPECT_EQ(cuStreamQuery(s), CUDA_SUCCESS);
  EXPECT_TRUE(AllEqual(2));  // the memset ran after the fill
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(Streams, LegacyStreamWaitsForBlockingStreams) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  ASSERT_CU(Fill(1, kDelayUs, s));
  ASSERT_CU(cuMemsetD8Async(buf_, 2, kBytes, nullptr));  // legacy default stream
  ASSERT_CU(cuStreamSynchronize(CU_STREAM_LEGACY));
  EXPECT_TRUE(AllEqual(2));
  EXPECT_EQ(cuStreamQuery(s), CUDA_SUCCESS);  // legacy work waited for s
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(Streams, BlockingStreamWaitsForLegacyStream) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  ASSERT_CU(Fill(1, kDelayUs, CU_STREAM_LEGACY));
  ASSERT_CU(cuMemsetD8Async(buf_, 2, kBytes, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_TRUE(AllEqual(2));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(Streams, NonBlockingStreamsAreExempt) {
  CUstream nb = nullptr;
  ASSERT_CU(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  unsigned flags = 0;
  ASSERT_CU(cuStreamGetFlags(nb, &flags));
  EXPECT_EQ(flags, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
  // Non-blocking work does not wait for the legacy stream...
  ASSERT_CU(Fill(1, kDelayUs, nullptr));
  ASSERT_CU(cuMemsetD8Async(buf_, 2, kBytes, nb));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_CU(cuStreamSynchronize(nb));
  EXPECT_LT(Seconds(start), 0.15);
  EXPECT_TRUE(AllEqual(2));
  ASSERT_CU(cuStreamSynchronize(nullptr));
  EXPECT_TRUE(AllEqual(1));
  // ...and the legacy stream does not wait for non-blocking work.
  ASSERT_CU(Fill(3, kDelayUs, nb));
  ASSERT_CU(cuMemsetD8Async(buf_, 4, kBytes, nullptr));
  const auto start2 = std::chrono::steady_clock::now();
  ASSERT_CU(cuStreamSynchronize(nullptr));
  EXPECT_LT(Seconds(start2), 0.15);
  EXPECT_TRUE(AllEqual(4));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_TRUE(AllEqual(3));
  ASSERT_CU(cuStreamDestroy(nb));
}

TEST_F(Streams, SynchronousCopiesWaitForBlockingStreams) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  ASSERT_CU(Fill(5, kDelayUs, s));
  std::vector<unsigned char> out(kBytes);
  ASSERT_CU(cuMemcpyDtoH(out.data(), buf_, kBytes));  // legacy stream: after the fill
  EXPECT_EQ(out[0], 5);
  EXPECT_EQ(out[kBytes - 1], 5);
  ASSERT_CU(cuStreamDestroy(s));
}

size_t ThreadCount() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

// A synchronous copy or memset with nothing queued before it runs on the calling thread, as a GPU
// answers it in microseconds: no worker thread is started for it (a context of its own, whose
// legacy stream no earlier test used).
TEST_F(Streams, SynchronousWorkOnAnIdleStreamRunsOnTheCaller) {
  InFreshProcess([] {
    CUcontext ctx = nullptr;
    ASSERT_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
    CUdeviceptr d = 0;
    ASSERT_CU(cuMemAlloc(&d, kBytes));
    const size_t threads = ThreadCount();
    std::vector<unsigned char> in(kBytes, 7), out(kBytes, 0);
    ASSERT_CU(cuMemcpyHtoD(d, in.data(), kBytes));
    ASSERT_CU(cuMemcpyDtoH(out.data(), d, kBytes));
    EXPECT_EQ(out, in);
    ASSERT_CU(cuMemsetD8(d, 9, kBytes));
    ASSERT_CU(cuMemcpyDtoH(out.data(), d, kBytes));
    EXPECT_EQ(out, std::vector<unsigned char>(kBytes, 9));
    EXPECT_EQ(ThreadCount(), threads);
    ASSERT_CU(cuMemFree(d));
    ASSERT_CU(cuCtxDestroy(ctx));
  });
}

// Work submitted to the stream while such a copy runs queues behind it: the worker must not take
// the caller's op, nor run what follows before it is done.
TEST_F(Streams, WorkSubmittedWhileTheCallerRunsACopyWaitsBehindIt) {
  constexpr size_t kLarge = 64 << 20;
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, kLarge));
  const std::vector<unsigned char> in(kLarge, 0xab);
  bool overlapped = false;
  for (int attempt = 0; attempt < 5 && !overlapped; ++attempt) {
    std::atomic<bool> copy_returned{false}, seen_busy{false};
    std::thread other([&] {
      ASSERT_CU(cuCtxSetCurrent(ctx_));
      while (!copy_returned.load() && cuStreamQuery(nullptr) == CUDA_SUCCESS) {
      }
      if (copy_returned.load()) return;
      seen_busy = true;
      ASSERT_CU(cuMemsetD8Async(d, 0x11, kLarge, nullptr));
    });
    ASSERT_CU(cuMemcpyHtoD(d, in.data(), kLarge));
    copy_returned = true;
    other.join();
    ASSERT_CU(cuCtxSynchronize());
    if (!seen_busy) continue;
    overlapped = true;
    std::vector<unsigned char> out(kLarge);
    ASSERT_CU(cuMemcpyDtoH(out.data(), d, kLarge));
    EXPECT_EQ(std::count(out.begin(), out.end(), 0x11), static_cast<long>(kLarge));  // the memset ran last
  }
  EXPECT_TRUE(overlapped) << "the other thread never saw the copy in flight";
  ASSERT_CU(cuMemFree(d));
}

// A stream destroyed while the caller runs its copy stays listed until the copy is done: a
// context synchronization from another thread waits for it (it returned at once: the stream had
// been forgotten, as one without a worker was).
TEST_F(Streams, AStreamDestroyedWhileTheCallerRunsItsCopyIsStillWaitedFor) {
  constexpr size_t kLarge = 256 << 20;
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, kLarge));
  ASSERT_CU(cuMemsetD8(d, 0xab, kLarge));
  bool overlapped = false;
  for (int attempt = 0; attempt < 5 && !overlapped; ++attempt) {
    // Pageable and untouched: the copy (on the caller, the stream being idle) faults its pages in.
    std::unique_ptr<unsigned char[]> host(new unsigned char[kLarge]);
    CUstream s = nullptr;
    ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
    std::atomic<bool> copy_returned{false};
    std::atomic<int> last_byte{-1};
    std::thread other([&] {
      ASSERT_CU(cuCtxSetCurrent(ctx_));
      while (!copy_returned.load() && cuStreamQuery(s) == CUDA_SUCCESS) {
      }
      if (copy_returned.load()) return;
      ASSERT_CU(cuStreamDestroy(s));
      ASSERT_CU(cuCtxSynchronize());  // every op issued so far, the destroyed stream's included
      last_byte = host[kLarge - 1];
    });
    ASSERT_CU(cuMemcpyDtoHAsync(host.get(), d, kLarge, s));
    copy_returned = true;
    other.join();
    if (last_byte.load() < 0) {
      ASSERT_CU(cuStreamDestroy(s));
      continue;
    }
    overlapped = true;
    EXPECT_EQ(last_byte.load(), 0xab);
  }
  EXPECT_TRUE(overlapped) << "the other thread never saw the copy in flight";
  ASSERT_CU(cuMemFree(d));
}

TEST_F(Streams, EventsRecordQuerySynchronizeElapsed) {
  CUstream s = nullptr;
  CUevent start = nullptr, end = nullptr, untimed = nullptr, never = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
  ASSERT_CU(cuEventCreate(&end, CU_EVENT_DEFAULT));
  ASSERT_CU(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventCreate(&never, CU_EVENT_DEFAULT));
  EXPECT_EQ(cuEventQuery(never), CUDA_SUCCESS);  // never recorded: complete
  ASSERT_CU(cuEventRecord(start, s));
  ASSERT_CU(Fill(1, kDelayUs, s));
  ASSERT_CU(cuEventRecord(end, s));
  ASSERT_CU(cuEventRecord(untimed, s));
  EXPECT_EQ(cuEventQuery(end), CUDA_ERROR_NOT_READY);
  float ms = 0;
  EXPECT_EQ(cuEventElapsedTime(&ms, start, end), CUDA_ERROR_NOT_READY);
  ASSERT_CU(cuEventSynchronize(end));
  EXPECT_EQ(cuEventQuery(end), CUDA_SUCCESS);
  EXPECT_TRUE(AllEqual(1));
  ASSERT_CU(cuEventElapsedTime(&ms, start, end));
  EXPECT_GE(ms, 150.0f);
  EXPECT_LT(ms, 5000.0f);
  EXPECT_EQ(cuEventElapsedTime(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventElapsedTime(&ms, start, never), CUDA_ERROR_INVALID_HANDLE);
  for (CUevent e : {start, end, untimed, never}) ASSERT_CU(cuEventDestroy(e));
  EXPECT_DEATH(cuEventQuery(start), "fakecuda: misuse: cuEventQuery: event 0x[0-9a-f]+ was destroyed \\(cuEventDestroy_v2\\)");
  ASSERT_CU(cuStreamDestroy(s));
}

// An event with nothing queued before it is complete when recorded, as a GPU completes it within
// microseconds: no worker thread is involved (handing it to one took tens of microseconds on a
// loaded machine, every plain-free fence of the pools' benchmarks). Behind queued work, or behind
// what the legacy stream rules make it wait for, it is not.
TEST_F(Streams, AnEventWithNothingBeforeItIsCompleteWhenRecorded) {
  CUstream s = nullptr, blocking = nullptr;
  CUevent e = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
  ASSERT_CU(cuEventCreate(&e, CU_EVENT_DEFAULT));
  for (CUstream on : {s, blocking, static_cast<CUstream>(nullptr)}) {
    ASSERT_CU(cuEventRecord(e, on));
    EXPECT_EQ(cuEventQuery(e), CUDA_SUCCESS);
  }
  ASSERT_CU(Fill(1, kDelayUs, s));
  ASSERT_CU(cuEventRecord(e, s));
  EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  ASSERT_CU(cuEventRecord(e, nullptr));  // s is non-blocking: the legacy stream does not wait for it
  EXPECT_EQ(cuEventQuery(e), CUDA_SUCCESS);
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_CU(Fill(2, kDelayUs, blocking));
  ASSERT_CU(cuEventRecord(e, nullptr));  // the legacy stream waits for blocking streams
  EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  ASSERT_CU(cuEventSynchronize(e));
  EXPECT_TRUE(AllEqual(2));
  ASSERT_CU(Fill(3, kDelayUs, nullptr));
  ASSERT_CU(cuEventRecord(e, blocking));  // and a blocking stream for the legacy stream
  EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  ASSERT_CU(cuEventSynchronize(e));
  EXPECT_TRUE(AllEqual(3));
  ASSERT_CU(cuEventDestroy(e));
  ASSERT_CU(cuStreamDestroy(s));
  ASSERT_CU(cuStreamDestroy(blocking));
}

TEST_F(Streams, StreamWaitEventOrdersAcrossStreams) {
  CUstream a = nullptr, b = nullptr;
  CUevent e = nullptr;
  ASSERT_CU(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(Fill(1, kDelayUs, a));
  ASSERT_CU(cuEventRecord(e, a));
  ASSERT_CU(cuStreamWaitEvent(b, e, 0));
  ASSERT_CU(cuMemsetD8Async(buf_, 2, kBytes, b));
  EXPECT_EQ(cuStreamQuery(b), CUDA_ERROR_NOT_READY);
  ASSERT_CU(cuStreamSynchronize(b));
  EXPECT_TRUE(AllEqual(2));  // without the wait the fill would have landed last
  ASSERT_CU(cuEventDestroy(e));
  ASSERT_CU(cuStreamDestroy(a));
  ASSERT_CU(cuStreamDestroy(b));
}

TEST_F(Streams, CtxSynchronizeWaitsForEveryStream) {
  std::vector<CUstream> streams(4);
  std::vector<CUdeviceptr> bufs(4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_CU(cuStreamCreate(&streams[i], i % 2 ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT));
    ASSERT_CU(cuMemAlloc(&bufs[i], 4096));
    ASSERT_CU(fakecuLaunchDelayedFill(bufs[i], 10 + i, 4096, 50000 * (i + 1), streams[i]));
  }
  const auto syncs = fakecudaDeviceSyncCount();
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(fakecudaDeviceSyncCount(), syncs + 1);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(reinterpret_cast<unsigned char*>(bufs[i])[4095], 10 + i);
    EXPECT_EQ(cuStreamQuery(streams[i]), CUDA_SUCCESS);
    ASSERT_CU(cuStreamDestroy(streams[i]));
    ASSERT_CU(cuMemFree(bufs[i]));
  }
}

TEST_F(Streams, MemFreeSynchronizesTheDevice) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr victim = 0;
  ASSERT_CU(cuMemAlloc(&victim, 4096));
  ASSERT_CU(Fill(7, kDelayUs, s));  // unrelated work still running
  const auto syncs = fakecudaDeviceSyncCount();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_CU(cuMemFree(victim));
  EXPECT_GE(Seconds(start), 0.15);
  EXPECT_EQ(cuStreamQuery(s), CUDA_SUCCESS);
  EXPECT_EQ(fakecudaDeviceSyncCount(), syncs + 1);
  EXPECT_TRUE(AllEqual(7));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(Streams, FreeAsyncIsStreamOrdered) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const size_t used = fakecudaDeviceUsedBytes(0);
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocAsync(&p, 1 << 20, s));
  // The default pool reserves a whole 32 MiB chunk for it, as an H100's does (driver.h, MemPool).
  const size_t chunk = size_t{32} << 20;
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used + chunk);
  ASSERT_CU(fakecuLaunchDelayedFill(p, 1, 1 << 20, kDelayUs, s));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_CU(cuMemFreeAsync(p, s));
  EXPECT_LT(Seconds(start), 0.1);                              // does not synchronize
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used + chunk);         // not released yet
  EXPECT_EQ(cuMemFreeAsync(p, s), CUDA_ERROR_INVALID_VALUE);   // already being freed
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);
  ASSERT_CU(cuStreamDestroy(s));
}

// As in CUDA: an async copy from pageable memory stages the source before returning (the caller may
// reuse its buffer at once); an async copy into pageable memory completes before returning; copies
// to and from page-locked memory stay asynchronous.
TEST_F(Streams, PageableHostMemoryIsStagedOrWaitedFor) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<unsigned char> pageable(kBytes, 0x11);
  ASSERT_CU(Fill(1, kDelayUs, s));
  ASSERT_CU(cuMemcpyHtoDAsync(buf_, pageable.data(), kBytes, s));
  std::fill(pageable.begin(), pageable.end(), 0x22);  // reused right away
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_TRUE(AllEqual(0x11));

  ASSERT_CU(Fill(3, kDelayUs, s));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_CU(cuMemcpyDtoHAsync(pageable.data(), buf_, kBytes, s));
  EXPECT_GE(Seconds(start), 0.15);  // waited for the fill, then copied
  EXPECT_EQ(pageable[0], 3);
  EXPECT_EQ(pageable[kBytes - 1], 3);

  void* pinned = nullptr;
  ASSERT_CU(cuMemAllocHost(&pinned, kBytes));
  std::memset(pinned, 0, kBytes);
  ASSERT_CU(Fill(4, kDelayUs, s));
  const auto start2 = std::chrono::steady_clock::now();
  ASSERT_CU(cuMemcpyDtoHAsync(pinned, buf_, kBytes, s));
  EXPECT_LT(Seconds(start2), 0.1);
  EXPECT_EQ(static_cast<unsigned char*>(pinned)[0], 0);
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(static_cast<unsigned char*>(pinned)[0], 4);
  ASSERT_CU(cuMemFreeHost(pinned));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(Streams, HostFunctionsRunInStreamOrder) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  struct Probe {
    const unsigned char* buf;
    std::atomic<int> seen{-1};
  } probe{reinterpret_cast<const unsigned char*>(buf_)};
  ASSERT_CU(Fill(6, kDelayUs / 2, s));
  ASSERT_CU(cuLaunchHostFunc(s, [](void* p) {
    auto* pr = static_cast<Probe*>(p);
    pr->seen = pr->buf[0];
  }, &probe));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(probe.seen.load(), 6);
  ASSERT_CU(cuStreamDestroy(s));
}

// cuEventSynchronize waits for the record current at the call, even when another thread records
// the event again on another stream, and destroys the first, while it waits (a review helper's
// reproducer, 2026-11-29: the wait slept on the first stream's condition while checking the
// second, and never woke; with the first stream destroyed it slept on a destroyed condition).
TEST_F(Streams, AnEventRecordedAgainElsewhereWhileAThreadWaitsOnIt) {
  CUstream a = nullptr, b = nullptr;
  ASSERT_CU(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CUevent ev = nullptr, later = nullptr;
  ASSERT_CU(cuEventCreate(&ev, 0));
  ASSERT_CU(cuEventCreate(&later, 0));
  static std::atomic<bool> release{false};
  release = false;
  ASSERT_CU(cuLaunchHostFunc(a, [](void*) {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }, nullptr));
  ASSERT_CU(cuEventRecord(ev, a));
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&ctx));
  std::atomic<int> waited{-1};
  std::thread waiter([&] {
    cuCtxSetCurrent(ctx);
    waited = cuEventSynchronize(ev);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_CU(cuStreamDestroy(a));
  ASSERT_CU(cuEventRecord(ev, b));  // b is idle: complete at once
  release = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_CU(cuEventRecord(later, b));
  ASSERT_CU(cuEventSynchronize(later));
  const auto start = std::chrono::steady_clock::now();
  while (waited.load() == -1 && Seconds(start) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(waited.load(), CUDA_SUCCESS) << "cuEventSynchronize still waits";
  if (waited.load() == -1) {
    waiter.detach();  // a hang here would otherwise hang the whole binary
    return;
  }
  waiter.join();
  ASSERT_CU(cuEventDestroy(ev));
  ASSERT_CU(cuEventDestroy(later));
  ASSERT_CU(cuStreamDestroy(b));
}

TEST_F(Streams, DestroyingAStreamLetsItsWorkFinish) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(Fill(8, kDelayUs / 2, s));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_CU(cuStreamDestroy(s));
  EXPECT_LT(Seconds(start), 0.05);
  EXPECT_DEATH(cuStreamQuery(s), "fakecuda: misuse: cuStreamQuery: stream 0x[0-9a-f]+ was destroyed \\(cuStreamDestroy_v2\\)");
  ASSERT_CU(cuCtxSynchronize());  // still waits for the destroyed stream's work
  EXPECT_TRUE(AllEqual(8));
}

TEST_F(Streams, InvalidHandles) {
  // A handle that never existed is misuse, like a destroyed one (misuse_test.cpp).
  EXPECT_DEATH(cuStreamSynchronize(reinterpret_cast<CUstream>(0x1234)),
               "^fakecuda: misuse: cuStreamSynchronize: stream 0x1234 was never created\n$");
  EXPECT_EQ(cuStreamDestroy(nullptr), CUDA_ERROR_INVALID_HANDLE);  // an H100's answer (2026-11-26)
  EXPECT_DEATH(cuEventRecord(reinterpret_cast<CUevent>(0x1234), nullptr),
               "fakecuda: misuse: cuEventRecord: event 0x1234 was never created");
  CUstream s = nullptr;
  EXPECT_EQ(cuStreamCreate(&s, 0x10), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(fakecuLaunchDelayedFill(buf_ + kBytes - 16, 0, 32, 0, nullptr), CUDA_ERROR_INVALID_VALUE);
}

}  // namespace
}  // namespace fakecuda_test
