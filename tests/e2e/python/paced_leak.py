"""The same training loop at any pace: every step leaks one MiB (kept in a list), uses a scratch
buffer it frees, and marks the iteration. argv: steps, seconds per step."""
import ctypes
import sys
import time

from cuda_ctypes import MiB, check, cuda, mark_iteration

KEPT = []


def step():
    kept = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(kept), 1 * MiB))  # @leak
    KEPT.append(kept)
    scratch = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(scratch), 4 * MiB))
    check(cuda.cudaFree(scratch))


def main():
    steps, pace = int(sys.argv[1]), float(sys.argv[2])
    weights = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(weights), 64 * MiB))
    for _ in range(steps):
        step()
        mark_iteration()
        time.sleep(pace)


main()
