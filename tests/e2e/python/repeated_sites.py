"""The same few call sites allocating again and again, as a training loop does, so that the shim's
stack cache answers most of them: each allocation must still get its own stack. The innermost
Python frame (alloc) is the same for every site; what tells them apart is a line further out, an
outer caller, or a recursion depth. Each site allocates its own size (KiB) so the test can find it.
Lines marked `# @<tag>` are the ones the test expects."""
import ctypes

from cuda_ctypes import check, cuda

KiB = 1024
ROUNDS = 12
KEEP = []


def alloc(size):
    p = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(p), size))  # @alloc
    KEEP.append(p)


def two_lines():
    alloc(4 * KiB)  # @line_a
    alloc(8 * KiB)  # @line_b


def middle(size):
    alloc(size)  # @middle_call


def outer_a():
    middle(12 * KiB)  # @outer_a_call


def outer_b():
    middle(16 * KiB)  # @outer_b_call


def recurse(n, size):
    if n == 0:
        alloc(size)  # @recurse_alloc
    else:
        recurse(n - 1, size)  # @recurse_call


def step(i):
    two_lines()  # @step_two_lines
    for caller in (outer_a, outer_b) if i % 2 else (outer_b, outer_a):
        caller()  # @step_outer
    depth = i % 4 if i % 8 < 4 else 3 - i % 4  # up, then down
    recurse(depth, (20 + 4 * depth) * KiB)  # @step_recurse


for i in range(ROUNDS):
    step(i)  # @module_step
