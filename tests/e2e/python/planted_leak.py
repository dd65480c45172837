"""A training-loop-shaped program with a planted leak: load_model allocates large buffers once
(flat, like weights); every call of leaky_step leaks one MiB and uses a temporary it frees.
argv: iterations, then "marks" to call gpushim_mark_iteration() after each step."""
import ctypes
import sys
import time

from cuda_ctypes import MiB, check, cuda, mark_iteration

WEIGHTS = []
LEAKED = []


def load_model():
    for _ in range(4):
        p = ctypes.c_void_p()
        check(cuda.cudaMalloc(ctypes.byref(p), 64 * MiB))  # @weights
        WEIGHTS.append(p)


def leaky_step(step):
    kept = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(kept), 1 * MiB))  # @leak
    LEAKED.append(kept)  # the bug: kept past the step
    scratch = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(scratch), 8 * MiB))  # @scratch
    check(cuda.cudaFree(scratch))
    return step


def main():
    iterations = int(sys.argv[1])
    marks = "marks" in sys.argv[2:]
    load_model()
    start = time.monotonic()
    for step in range(iterations):
        leaky_step(step)  # @step_call
        if marks:
            mark_iteration()
        time.sleep(0.004)
    # The loop's own time: what the report's growth rate is checked against (it depends on the device).
    print(f'{{"loop_s":{time.monotonic() - start:.6f}}}', flush=True)


main()
