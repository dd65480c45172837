// The calls PyTorch's backend:cudaMallocAsync makes (c10/cuda/CUDAMallocAsyncAllocator.cpp), in
// its order: the default pool looked up and its release threshold set to UINT64_MAX with the reuse
// flags on; tensors as cudaMallocAsync/cudaFreeAsync on their streams; record_stream's event dance
// (an event recorded on every stream that used the tensor, waited on by a "unifying" free stream,
// the free on that stream); memory_stats (the four figures of the default pool); empty_cache
// (cudaDeviceSynchronize, then cudaMemPoolTrimTo(pool, 0)); reset_peak_memory_stats (the two
// high-water marks set to 0); and a CUDA graph capture, whose allocations are the graph's.
//
// Every figure read back is checked against what the program allocated, and every byte written is
// checked after crossing streams. Sizes are multiples of 512 B up to 8 MiB and of 2 MiB above, so
// that no policy (nor CUDA) rounds them: "used" is exactly the sum of live tensors.
//
// Prints one JSON line: the high-water marks at the peak (what torch.cuda.max_memory_reserved()
// and max_memory_allocated() would say), whether memory was reused without waiting, and the
// device synchronizations the stream-ordered loop cost. Exits 1 on any mismatch.
#include <cuda.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;
int g_failures = 0;

#define EXPECT(cond, ...)                                                \
  do {                                                                   \
    if (!(cond)) {                                                       \
      ++g_failures;                                                      \
      std::fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);    \
      std::fprintf(stderr, __VA_ARGS__);                                 \
      std::fputc('\n', stderr);                                          \
    }                                                                    \
  } while (0)

struct Figures {
  unsigned long long reserved, reserved_high, used, used_high;
};

// torch.cuda.memory_stats() under the async backend: the four attributes, in PyTorch's order.
Figures read_figures(cudaMemPool_t pool) {
  Figures f{};
  cuuint64_t v = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v));
  f.reserved = v;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &v));
  f.reserved_high = v;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &v));
  f.used = v;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &v));
  f.used_high = v;
  return f;
}

// PyTorch's sync_raw: `dependent` waits for everything issued so far on `dependency`.
void sync_raw(cudaStream_t dependency, cudaStream_t dependent) {
  cudaEvent_t ev;
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CHECK(cudaEventRecord(ev, dependency));
  CHECK(cudaStreamWaitEvent(dependent, ev, 0));
  CHECK(cudaEventDestroy(ev));
}

void* malloc_async(size_t bytes, cudaStream_t s) {
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, bytes, s));
  return p;
}

// Whether a pool of the shim serves the default pool (the shim is there and not passthrough).
bool shim_pooled() {
  gpushim_device_stats st{};
  const char* policy = std::getenv("GPUSHIM_POLICY");
  return testsupport::shim_stats(0, &st) && !(policy && std::strcmp(policy, "passthrough") == 0);
}

// "Used" is what the pool handed out: the tensors' bytes, or more where a pool gave a request a
// larger free block whole (policy rounding, which the report's allocated figures count too). So
// the tensors' bytes are checked against the shim's requested bytes, and used against the shim's
// allocated bytes; under CUDA (or the shim passing through) used is the tensors' bytes.
void expect_used(const Figures& f, size_t requested, const char* when) {
  gpushim_device_stats st{};
  if (!shim_pooled() || !testsupport::shim_stats(0, &st)) {
    EXPECT(f.used == requested, "%s: used %llu, tensors %zu", when, f.used, requested);
    return;
  }
  EXPECT(st.requested_bytes == requested, "%s: shim's requested %llu, tensors %zu", when, st.requested_bytes, requested);
  EXPECT(f.used == st.live_bytes && f.used >= requested, "%s: used %llu, shim's allocated %llu, tensors %zu", when,
         f.used, st.live_bytes, requested);
  EXPECT(f.reserved == st.reserved_bytes, "%s: reserved %llu, shim's %llu", when, f.reserved, st.reserved_bytes);
}

unsigned long long device_syncs() {
  using Fn = unsigned long long (*)();
  static Fn fn = testsupport::driver_test_hook<Fn>("fakecudaDeviceSyncCount");
  return fn ? fn() : 0;
}

}  // namespace

int main() {
  CHECK(cudaSetDevice(0));
  // lazy_init_device: the default pool keeps freed memory (threshold UINT64_MAX), reuse flags on.
  cudaMemPool_t pool = nullptr;
  CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  cuuint64_t threshold = UINT64_MAX;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  int enable = 1;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseFollowEventDependencies, &enable));
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &enable));
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &enable));
  threshold = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  EXPECT(threshold == UINT64_MAX, "release threshold read back as %llu", static_cast<unsigned long long>(threshold));
  int flag = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &flag));
  EXPECT(flag == 1, "reuse flag read back as %d", flag);
  cudaStream_t compute, side, unifier;  // the current stream, a side stream, the unifying free stream
  CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&unifier, cudaStreamNonBlocking));

  Figures f = read_figures(pool);
  EXPECT(f.used == 0 && f.used_high == 0 && f.reserved == 0 && f.reserved_high == 0,
         "before any tensor: used %llu/%llu reserved %llu/%llu", f.used, f.used_high, f.reserved, f.reserved_high);

  // ---- stream order: no synchronization from here to the end of the loop ----
  const unsigned long long syncs_before = device_syncs();
  // Freed on a stream, a block is reusable at once on that stream.
  void* a = malloc_async(3 * MiB, compute);
  CHECK(cudaMemsetAsync(a, 0x21, 3 * MiB, compute));
  CHECK(cudaFreeAsync(a, compute));
  void* b = malloc_async(3 * MiB, compute);
  const bool reused_same_stream = a == b;
  CHECK(cudaMemsetAsync(b, 0x22, 3 * MiB, compute));

  // Data crossing streams: written on `compute`, read on `side` after an event.
  void* src = malloc_async(2 * MiB, compute);
  CHECK(cudaMemsetAsync(src, 0x55, 2 * MiB, compute));
  sync_raw(compute, side);
  void* dst = malloc_async(2 * MiB, side);
  CHECK(cudaMemcpyAsync(dst, src, 2 * MiB, cudaMemcpyDeviceToDevice, side));

  // record_stream: a tensor made on `compute`, then used by a slow kernel on `side`.
  void* t = malloc_async(4 * MiB, compute);
  CHECK(cudaMemsetAsync(t, 0x31, 4 * MiB, compute));
  sync_raw(compute, side);
  // The kernel is still writing when the tensors below are made: held on its stream until they
  // are, not only by its 40 ms, which a thread held up on a busy machine could outlast (then
  // handing `t` to `u` is right, and `reused_free_stream` read false).
  std::atomic<bool> made{false};
  CHECK(testsupport::hold_stream_until(side, &made));
  CHECK(testsupport::delayed_fill(t, 0x32, 4 * MiB, 40000, side));  // still writing 40 ms from now
  // Its free (free_impl with recorded streams): the unifier waits for every stream that used it.
  sync_raw(compute, unifier);
  sync_raw(side, unifier);
  CHECK(cudaFreeAsync(t, unifier));
  // New tensors at once, on the current stream (must not get `t` while the kernel writes it) and
  // on the free's stream (may: stream order puts it after the kernel).
  void* u = malloc_async(4 * MiB, compute);
  CHECK(cudaMemsetAsync(u, 0x33, 4 * MiB, compute));
  void* w = malloc_async(4 * MiB, unifier);
  const bool reused_free_stream = w == t;
  made.store(true, std::memory_order_release);
  CHECK(cudaMemsetAsync(w, 0x34, 4 * MiB, unifier));
  const unsigned long long loop_syncs = device_syncs() - syncs_before;

  CHECK(cudaStreamSynchronize(compute));
  CHECK(cudaStreamSynchronize(side));
  CHECK(cudaStreamSynchronize(unifier));
  EXPECT(testsupport::holds(b, 3 * MiB, 0x22), "the block reused on its stream");
  EXPECT(testsupport::holds(dst, 2 * MiB, 0x55), "the copy made on the side stream");
  EXPECT(testsupport::holds(u, 4 * MiB, 0x33), "a tensor allocated while a side-stream kernel wrote a freed one");
  EXPECT(testsupport::holds(w, 4 * MiB, 0x34), "a tensor allocated on the free's stream");
  f = read_figures(pool);
  expect_used(f, 3 * MiB + 2 * MiB + 2 * MiB + 4 * MiB + 4 * MiB, "stream-order phase");
  CHECK(cudaFreeAsync(b, compute));
  CHECK(cudaFreeAsync(src, compute));
  CHECK(cudaFreeAsync(dst, side));
  CHECK(cudaFreeAsync(u, compute));
  CHECK(cudaFreeAsync(w, unifier));
  for (cudaStream_t s : {compute, side, unifier}) CHECK(cudaStreamSynchronize(s));
  f = read_figures(pool);
  const unsigned long long stream_phase_high = f.used_high;
  EXPECT(f.used == 0, "used %llu after the stream-order phase", f.used);


  // ---- the peak: a model's worth of tensors of three size classes, written on their stream ----
  struct Tensor {
    void* p;
    size_t bytes;
    unsigned char tag;
  };
  std::vector<Tensor> tensors;
  size_t total = 0;
  auto add = [&](size_t bytes) {
    const auto tag = static_cast<unsigned char>(0x10 + tensors.size());
    void* p = malloc_async(bytes, compute);
    CHECK(cudaMemsetAsync(p, tag, bytes, compute));
    tensors.push_back({p, bytes, tag});
    total += bytes;
  };
  for (int i = 0; i < 4; ++i) add(24 * MiB);
  for (int i = 0; i < 6; ++i) add(3 * MiB + 512 * i);
  for (int i = 0; i < 20; ++i) add(64 * KiB + 512 * i);
  CHECK(cudaStreamSynchronize(compute));
  f = read_figures(pool);
  expect_used(f, total, "the peak");
  EXPECT(f.used_high == std::max<unsigned long long>(f.used, stream_phase_high), "used high %llu, used %llu",
         f.used_high, f.used);
  EXPECT(f.reserved >= f.used && f.reserved_high >= f.reserved, "reserved %llu high %llu used %llu", f.reserved,
         f.reserved_high, f.used);
  const Figures peak = f;
  // The driver twin, reached by dlsym on libcuda's handle, answers alike.
  auto cu_get = testsupport::driver_function<decltype(&::cuMemPoolGetAttribute)>("cuMemPoolGetAttribute");
  cuuint64_t v = 0;
  CHECK_CU(cu_get(reinterpret_cast<CUmemoryPool>(pool), CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v));
  EXPECT(v == peak.used, "cuMemPoolGetAttribute: used %llu, runtime %llu", static_cast<unsigned long long>(v),
         peak.used);
  CHECK_CU(cu_get(reinterpret_cast<CUmemoryPool>(pool), CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v));
  EXPECT(v == peak.reserved, "cuMemPoolGetAttribute: reserved %llu, runtime %llu", static_cast<unsigned long long>(v),
         peak.reserved);
  for (const Tensor& t : tensors) EXPECT(testsupport::holds(t.p, t.bytes, t.tag), "tensor of %zu bytes", t.bytes);
  for (const Tensor& t : tensors) CHECK(cudaFreeAsync(t.p, compute));
  CHECK(cudaStreamSynchronize(compute));
  f = read_figures(pool);
  EXPECT(f.used == 0 && f.used_high == peak.used_high, "after the frees: used %llu high %llu", f.used, f.used_high);

  // ---- empty_cache: everything freed goes back ----
  cudaMemPool_t again = nullptr;
  CHECK(cudaDeviceGetDefaultMemPool(&again, 0));
  EXPECT(again == pool, "the default pool changed");
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemPoolTrimTo(again, 0));
  f = read_figures(pool);
  EXPECT(f.used == 0 && f.reserved == 0, "after empty_cache: used %llu reserved %llu", f.used, f.reserved);
  EXPECT(f.reserved_high == peak.reserved_high && f.used_high == peak.used_high,
         "empty_cache moved the highs: %llu/%llu, were %llu/%llu", f.reserved_high, f.used_high, peak.reserved_high,
         peak.used_high);

  // ---- reset_peak_memory_stats: the highs restart from the current figures. One of the two
  // through the driver twin as cudaGetDriverEntryPointByVersion hands it out (cuGetProcAddress).
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CHECK(cudaGetDriverEntryPointByVersion("cuMemPoolSetAttribute", &fn, 11020, cudaEnableDefault, &found));
  EXPECT(found == cudaDriverEntryPointSuccess && fn != nullptr, "no cuMemPoolSetAttribute entry point");
  cuuint64_t zero = 0;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
  CHECK_CU(reinterpret_cast<decltype(&::cuMemPoolSetAttribute)>(fn)(reinterpret_cast<CUmemoryPool>(pool),
                                                                     CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
  f = read_figures(pool);
  EXPECT(f.used_high == 0 && f.reserved_high == 0, "after the reset: highs %llu/%llu", f.used_high, f.reserved_high);
  void* small = malloc_async(8 * MiB, compute);
  CHECK(cudaFreeAsync(small, compute));
  CHECK(cudaStreamSynchronize(compute));
  f = read_figures(pool);
  EXPECT(f.used == 0 && f.used_high == 8 * MiB, "after one 8 MiB tensor: used %llu high %llu", f.used, f.used_high);
  EXPECT(f.reserved_high >= 8 * MiB && f.reserved_high <= peak.reserved_high && f.reserved_high >= f.reserved,
         "after one 8 MiB tensor: reserved %llu high %llu", f.reserved, f.reserved_high);
  // CUDA's rules: a high-water mark only resets to 0, the current figures are read-only.
  cuuint64_t five = 5;
  EXPECT(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &five) == cudaErrorInvalidValue, "high set to 5");
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "the error was not the runtime's last error");
  EXPECT(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &zero) == cudaErrorInvalidValue,
         "reserved current set");
  (void)cudaGetLastError();

  // ---- a pool of the program's own, made current: CUDA's, not the default pool's ----
  cudaMemPool_t mine = testsupport::new_device_pool(0);
  CHECK(cudaDeviceSetMemPool(0, mine));
  void* m = malloc_async(1 * MiB, compute);
  CUmemoryPool owner = nullptr;
  CHECK_CU(testsupport::driver().PointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                                                     reinterpret_cast<CUdeviceptr>(m)));
  EXPECT(owner == reinterpret_cast<CUmemoryPool>(mine), "cudaMallocAsync after cudaDeviceSetMemPool: pool %p", owner);
  CHECK(cudaMemPoolGetAttribute(mine, cudaMemPoolAttrUsedMemCurrent, &v));
  EXPECT(v == 1 * MiB, "the program's pool: used %llu", static_cast<unsigned long long>(v));
  CHECK(cudaFreeAsync(m, compute));
  CHECK(cudaStreamSynchronize(compute));
  CHECK(cudaDeviceSetMemPool(0, pool));
  CHECK(cudaMemPoolDestroy(mine));

  // ---- a CUDA graph: allocations on the capturing stream are the graph's ----
  const Figures before_capture = read_figures(pool);
  cudaStream_t cap;
  CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
  CHECK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal));
  void* g1 = malloc_async(2 * MiB, cap);  // a temporary inside the graph
  CHECK(cudaMemsetAsync(g1, 0x66, 2 * MiB, cap));
  // A real job's capture lasts long enough for the shim's periodic bookkeeping to fall inside it
  // (the test runs it every millisecond): none of it may be a call the capture forbids.
  usleep(3000);
  void* g2 = malloc_async(2 * MiB, cap);  // the graph's output, kept after it
  CHECK(cudaMemcpyAsync(g2, g1, 2 * MiB, cudaMemcpyDeviceToDevice, cap));
  CHECK(cudaFreeAsync(g1, cap));
  cudaGraph_t graph;
  CHECK(cudaStreamEndCapture(cap, &graph));
  f = read_figures(pool);
  EXPECT(f.used == before_capture.used, "capture changed the default pool's used figure: %llu, was %llu", f.used,
         before_capture.used);
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, cap));
  CHECK(cudaStreamSynchronize(cap));
  EXPECT(testsupport::holds(g2, 2 * MiB, 0x66), "the graph's output");
  CHECK(cudaFreeAsync(g2, cap));  // an uncaptured free of a captured allocation: legal
  CHECK(cudaStreamSynchronize(cap));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  f = read_figures(pool);
  EXPECT(f.used == 0, "used %llu at the end", f.used);
  EXPECT(f.used_high <= peak.used_high && f.reserved_high <= peak.reserved_high, "a later high passed the peak");

  for (cudaStream_t s : {compute, side, unifier, cap}) CHECK(cudaStreamDestroy(s));
  std::printf(
      "{\"failures\": %d, \"peak_used\": %llu, \"peak_reserved\": %llu, \"reused_same_stream\": %s, "
      "\"reused_free_stream\": %s, \"loop_device_syncs\": %llu}\n",
      g_failures, peak.used_high, peak.reserved_high, reused_same_stream ? "true" : "false",
      reused_free_stream ? "true" : "false", loop_syncs);
  return g_failures == 0 ? 0 : 1;
}
