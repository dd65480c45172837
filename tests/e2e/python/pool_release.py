"""A stream-ordered free from CUDA's own pool (cudaMallocAsync under GPUSHIM_POLICY=passthrough),
issued while a host function holds the stream: CUDA gives the memory back (release threshold 0)
only once the stream gets there, after the shim read the pool at the free. Nothing reads the pool
again before the interpreter's teardown, whose figures the exit report of a Python program shows.
Prints what the pool reserved while the allocation was live and at the end, as JSON."""
import ctypes
import json
import time

from cuda_ctypes import MiB, check, cuda

cuda.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
cuda.cudaMallocAsync.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p]
cuda.cudaFreeAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
cuda.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
cuda.cudaDeviceGetDefaultMemPool.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
cuda.cudaMemPoolGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
cuda.cudaLaunchHostFunc.argtypes = [ctypes.c_void_p, HOST_FN, ctypes.c_void_p]
RESERVED_MEM_CURRENT = 5  # cudaMemPoolAttrReservedMemCurrent

issued = False


def wait_for_free(_):
    while not issued:
        time.sleep(0.001)


def reserved(pool):
    v = ctypes.c_uint64()
    check(cuda.cudaMemPoolGetAttribute(pool, RESERVED_MEM_CURRENT, ctypes.byref(v)))
    return v.value


def main():
    global issued
    stream, pool, p = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cudaStreamCreate(ctypes.byref(stream)))
    check(cuda.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), 0))
    check(cuda.cudaMallocAsync(ctypes.byref(p), 100 * MiB, stream))
    live = reserved(pool)
    host_fn = HOST_FN(wait_for_free)
    check(cuda.cudaLaunchHostFunc(stream, host_fn, None))
    check(cuda.cudaFreeAsync(p, stream))
    issued = True
    check(cuda.cudaStreamSynchronize(stream))
    print(json.dumps({"reserved_live": live, "reserved_end": reserved(pool)}))


main()
