"""A leak held by Python objects that free their device memory in a finalizer, as PyTorch, numba
and CuPy do: every step keeps one buffer in a global list. At exit the interpreter's teardown frees
them all (module teardown runs __del__; "finalize" mode frees them from weakref.finalize's atexit
callback instead). argv: steps, then "del" or "finalize"."""
import ctypes
import sys
import time
import weakref

from cuda_ctypes import MiB, check, cuda

LEAKED = []


class DeviceBuffer:
    def __init__(self, size, finalize):
        self.ptr = ctypes.c_void_p()
        check(cuda.cudaMalloc(ctypes.byref(self.ptr), size))  # @alloc
        self.finalize = finalize
        if finalize:
            weakref.finalize(self, cuda.cudaFree, ctypes.c_void_p(self.ptr.value))

    # The default argument keeps cudaFree reachable while module teardown clears globals.
    def __del__(self, free=cuda.cudaFree):
        if not self.finalize:
            free(self.ptr)


def leaky_step(finalize):
    LEAKED.append(DeviceBuffer(1 * MiB, finalize))  # @leak
    scratch = DeviceBuffer(4 * MiB, finalize)
    del scratch


def main():
    steps = int(sys.argv[1])
    finalize = sys.argv[2] == "finalize"
    for _ in range(steps):
        leaky_step(finalize)
        time.sleep(0.004)


main()
