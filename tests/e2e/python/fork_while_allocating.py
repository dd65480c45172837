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


# CUDA starts before the threads do, through calls the shim does not hook: a fork while another
# thread initializes CUDA itself leaves the child waiting on CUDA's own state (the simulated
# device's static initialization; real CUDA makes no promise either; under ThreadSanitizer, its
# own pthread_once and dlopen interceptors, which stay locked in fork children). A fork during the
# shim's initialization is still possible here, and is what e2e_fork_during_init tests on purpose.
cuda.cudaSetDevice(0)
cuda.cudaDeviceSynchronize()
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
