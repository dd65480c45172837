/* Test hooks of the simulated CUDA device (tests/fakecuda).
 *
 * The fake libcuda.so.1 / libcudart.so.13 behave like NVIDIA's libraries for the API subset gpushim
 * needs; the functions below exist only in the fakes. Link the fake libraries (or dlsym these names)
 * to use them; they are absent from real CUDA installations.
 *
 * Environment (read once per process, invalid values are reported on stderr as "fakecuda: ..."
 * and replaced by the default):
 *   FAKECUDA_DEVICES      number of devices (default 1, at most 64)
 *   FAKECUDA_MEM          capacity per device: 16GiB (default), 512MiB, 1G, 1.5GiB, plain bytes
 *   FAKECUDA_FAIL_ALLOC   fail the Nth device-memory allocation call (1-based) with
 *                         CUDA_ERROR_OUT_OF_MEMORY; a list "3,7" fails several
 *   FAKECUDA_CONTEXT_MEM  device memory charged when a primary context becomes active (default 0)
 */
#ifndef GPUSHIM_TESTS_FAKECUDA_FAKECUDA_H_
#define GPUSHIM_TESTS_FAKECUDA_FAKECUDA_H_

#include <stddef.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernel stand-ins --------------------------------------------------------------------------- */

/* The simulated device runs no device code: a launched kernel is a stream-ordered no-op, unless a
 * host function stands in for its name. The stand-in runs on the stream's worker, in stream order
 * (and again on every replay of a graph that captured the launch), with the launch's arguments as
 * kernelParams would give them: args[i] points at a copy, taken at launch time, of argument i. */
typedef struct {
  unsigned grid[3];
  unsigned block[3];
  size_t shared_bytes;
} fakecudaLaunchDims;
typedef void (*fakecudaKernelStandIn)(void** args, const fakecudaLaunchDims* dims, void* user);

/* ---- exported by the fake libcudart.so.13 (version node libcudart.so.13) ---------------------- */

/* A "kernel": in the order of `stream` it sleeps `delay_us` microseconds on the stream's worker and
 * then memset()s `bytes` bytes of device memory at `dst` to `value`. Work queued behind it on the
 * stream waits, as behind a slow kernel. Stream 0 is the legacy default stream. Returns cudaSuccess
 * or a cudaError_t (e.g. cudaErrorInvalidValue when [dst, dst+bytes) is not device memory). While
 * the stream is capturing, the fill is recorded into the graph instead. */
int fakecudaLaunchDelayedFill(void* dst, int value, size_t bytes, unsigned delay_us, cudaStream_t stream);

/* on != 0: the runtime's teardown at exit (the handler it registers with atexit when it initializes)
 * also releases the primary contexts it retained, as NVIDIA's runtime may: the last release destroys
 * a context, with the memory pools of its device. Off by default. */
void fakecudaReleaseContextsAtTeardown(int on);

/* Registers `fn` to stand in for every kernel named `name` (the mangled name for C++ kernels, e.g.
 * "_Z9fill_iotaPii"); `arg_sizes[i]` is the size in bytes of argument i. fn == NULL removes it.
 * Runtime form of fakecuSetKernelStandIn. */
int fakecudaSetKernelStandIn(const char* name, fakecudaKernelStandIn fn, void* user, const size_t* arg_sizes,
                             int num_args);

/* ---- exported by the fake libcuda.so.1 ------------------------------------------------------------ */

/* Bytes charged against the capacity of `device`: device-located allocations (cuMemAlloc*,
 * cuMemAllocAsync*, graph memory, device-located cuMemCreate; each rounded up to 512 bytes, VMM
 * ones to 2 MiB) plus FAKECUDA_CONTEXT_MEM for an active primary context. 0 for a bad ordinal. */
size_t fakecudaDeviceUsedBytes(int device);

/* Number of device-memory allocation calls that reached the driver so far (the counter that
 * FAKECUDA_FAIL_ALLOC indexes): cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAllocAsync(_ptsz),
 * cuMemAllocFromPoolAsync(_ptsz), device-located cuMemCreate, cuMemAllocManaged,
 * cuGraphAddMemAllocNode. Calls rejected for invalid arguments or a missing context are not
 * counted; injected failures are. */
unsigned long long fakecudaDriverAllocCount(void);

/* Number of successful device-memory release calls: cuMemFree_v2, cuMemFreeAsync(_ptsz),
 * cuMemRelease of a device-located allocation, cuArrayDestroy and cuMipmappedArrayDestroy (counted
 * before the destroy waits for the device). */
unsigned long long fakecudaDriverFreeCount(void);

/* on != 0: from now on, the next array (mipmapped array) made gets the handle of the one last
 * destroyed, if any, as NVIDIA's driver, whose handles are host pointers, may hand one out again,
 * even before the destroy returned to its caller. Otherwise handles are never reused (the default). */
void fakecudaReuseArrayHandles(int on);

/* Number of device-wide synchronizations: cuCtxSynchronize plus the implicit ones of cuMemFree_v2
 * (not of memory from cuMemAllocAsync, which CUDA does not wait for), cuMemFreeHost and cuMemUnmap. Lets tests check that a pool batches its synchronizations. */
unsigned long long fakecudaDeviceSyncCount(void);

/* How many times cuGetProcAddress / cuGetProcAddress_v2 were asked for `symbol` with this
 * `cudaVersion` and `flags`. Pass cudaVersion -1 and/or flags ~0ULL to match any. */
unsigned long long fakecudaProcAddressQueryCount(const char* symbol, int cudaVersion, unsigned long long flags);

/* Driver-level form of fakecudaLaunchDelayedFill (what the runtime calls, obtained through
 * cuGetProcAddress_v2("fakecuLaunchDelayedFill", ...)); the _ptsz variant treats stream 0 as the
 * per-thread default stream. */
CUresult fakecuLaunchDelayedFill(CUdeviceptr dst, int value, size_t bytes, unsigned int delay_us, CUstream hStream);
CUresult fakecuLaunchDelayedFill_ptsz(CUdeviceptr dst, int value, size_t bytes, unsigned int delay_us,
                                      CUstream hStream);

/* Driver form of fakecudaSetKernelStandIn; CUDA_ERROR_INVALID_VALUE for a null name or bad sizes. */
CUresult fakecuSetKernelStandIn(const char* name, fakecudaKernelStandIn fn, void* user, const size_t* arg_sizes,
                                int num_args);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* GPUSHIM_TESTS_FAKECUDA_FAKECUDA_H_ */
