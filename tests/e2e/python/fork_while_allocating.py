"""Threads allocate through freshly compiled functions (so the shim keeps taking its locks: the
Python code table's, the time series', the pool's) while the main thread forks; every child
allocates once through another new function and exits. A lock inherited held would hang a child
(it did: the caching pool's, before the shim stopped using pools in fork children)."""
import ctypes
import os
import sys
import threading

from cuda_ctypes import MiB, cuda

stop = False


def make_allocator(n):
    # A new code object each time: its first allocation goes through the code table's slow path.
    ns = {"cuda": cuda, "ctypes": ctypes}
    exec(compile(f"def alloc_{n}(size):\n    p = ctypes.c_void_p()\n    cuda.cudaMalloc(ctypes.byref(p), size)\n"
                 f"    cuda.cudaFree(p)\n", f"<generated {n}>", "exec"), ns)
    return ns[f"alloc_{n}"]


def worker(base):
    n = base
    while not stop:
        make_allocator(n)(1 * MiB)
        n += 2


# The runtime loads the driver before the first fork. Under ThreadSanitizer, a fork while another
# thread loads it leaves the child's first CUDA call waiting forever: TSan's own pthread_once and
# dlopen interceptors stay locked in fork children (glibc resets its own). This call makes no
# allocation: the shim still starts in the threads' first ones, while the main thread forks.
count = ctypes.c_int()
if cuda.cudaGetDeviceCount(ctypes.byref(count)) != 0:
    sys.exit("cudaGetDeviceCount failed")

threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
forks = int(sys.argv[1])
for i in range(forks):
    pid = os.fork()
    if pid == 0:
        make_allocator(10_000_000 + i)(4096)  # result ignored: a real GPU refuses CUDA after fork
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        print("child failed", status)
        sys.exit(1)
stop = True
for t in threads:
    t.join()
print("forked", forks)
