"""GPUSHIM_ITERATION_SITE=train_step: every call must count once, whatever addresses the frames
and the argument objects reuse. argv: calls, then the argument kind: "int" (a temporary int
1000 + j, freed when the call returns), "float", or "loop" (one call per step, three allocations
in a loop inside it, with the same arguments)."""
import ctypes
import sys

from cuda_ctypes import check, cuda


def allocate_and_free():
    p = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(p), 4096))
    check(cuda.cudaFree(p))


def train_step(step, passes=1):
    for _ in range(passes):
        allocate_and_free()


def main():
    calls, kind = int(sys.argv[1]), sys.argv[2]
    for j in range(calls):
        if kind == "int":
            train_step(1000 + j)
        elif kind == "float":
            train_step(0.5 + j)
        else:
            train_step(j, 3)


main()
