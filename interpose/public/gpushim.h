/* gpushim's public C API: optional calls a program can make into the preloaded shim.
 *
 * Nothing here is needed to use gpushim (it works without code changes). Resolve these with
 * dlsym(RTLD_DEFAULT, "gpushim_...") so the program also runs without the preload, or call them
 * from Python with ctypes.CDLL(None). */
#ifndef GPUSHIM_PUBLIC_GPUSHIM_H_
#define GPUSHIM_PUBLIC_GPUSHIM_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct gpushim_device_stats {
  size_t struct_size;                       /* set by the caller: sizeof(struct gpushim_device_stats) */
  unsigned long long live_bytes;            /* allocated (policy-rounded) bytes live now */
  unsigned long long live_count;
  unsigned long long requested_bytes;       /* what callers asked for, live now */
  unsigned long long reserved_bytes;        /* held from the driver */
  unsigned long long peak_allocated_bytes;
  unsigned long long peak_reserved_bytes;
  unsigned long long total_allocs;
  unsigned long long total_frees;
  unsigned long long failed_allocs;
  unsigned long long reuse_syncs;           /* synchronizations paid to make freed memory reusable */
  unsigned long long ooms;
  unsigned long long limit_bytes;           /* GPUSHIM_LIMIT in bytes, 0 = none */
};

/* Fills *out with the current figures of `device`. Returns 0, or -1 if the shim is not active or
 * the device has not been used. */
int gpushim_get_device_stats(int device, struct gpushim_device_stats* out);

/* Marks the end of one iteration of the program's main loop (a training step, a batch). The growth
 * section of the report then gives leak rates in bytes per iteration as well as per second. Cheap
 * (one atomic add), callable from any thread, from Python with
 * ctypes.CDLL(None).gpushim_mark_iteration(). Returns the number of iterations marked so far
 * (together with GPUSHIM_ITERATION_SITE activations, if set), or 0 if the shim is not active: marks
 * count from the process's first CUDA allocation call. */
unsigned long long gpushim_mark_iteration(void);
/* Host memory the shim uses for its own bookkeeping (stack table, live-allocation index, pool
 * metadata), in bytes: the report's shim_host_bytes, now. 0 if the shim is not active. */
unsigned long long gpushim_host_bytes(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GPUSHIM_PUBLIC_GPUSHIM_H_ */
