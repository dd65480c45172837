"""The simulated (or real) CUDA runtime from Python, the way the e2e scripts reach it.

libcudart is loaded with RTLD_GLOBAL and its functions are called through ctypes.CDLL(None), i.e.
dlsym(RTLD_DEFAULT): the preloaded libgpushim.so comes first there. (A handle-scoped lookup,
CDLL("libcudart.so.13").cudaMalloc, would bind to libcudart itself and bypass the preload.)
Imported by scripts run under the shim; the allocating calls stay in the scripts themselves, so
that the stacks the tests check end in the scripts' own lines."""
import ctypes

ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
cuda = ctypes.CDLL(None)             # calls release the GIL
cuda_with_gil = ctypes.PyDLL(None)   # calls keep holding the GIL
for lib in (cuda, cuda_with_gil):
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaMalloc.restype = ctypes.c_int
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    lib.cudaFree.restype = ctypes.c_int
MiB = 1 << 20


def mark_iteration():
    """gpushim_mark_iteration() when the shim is preloaded; a no-op otherwise."""
    fn = getattr(cuda, "gpushim_mark_iteration", None)
    if fn is not None:
        fn.restype = ctypes.c_ulonglong
        return fn()
    return 0


def check(rc):
    if rc != 0:
        raise RuntimeError(f"CUDA error {rc}")
