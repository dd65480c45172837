"""A training loop whose sequence length cycles through eight values, like a real job's, with as
many temporaries as the length asks for, that keeps a slice of every step's hidden state (the
leak). Tensors free their device memory in a finalizer, as PyTorch's do. argv: steps."""
import ctypes
import sys

from cuda_ctypes import check, cuda

KiB = 1 << 10
SHAPES = (64, 96, 128, 160, 192, 224, 256, 288)
KEPT = []


class Tensor:
    def __init__(self, nbytes):
        self.ptr = ctypes.c_void_p()
        check(cuda.cudaMalloc(ctypes.byref(self.ptr), nbytes))

    # The default argument keeps cudaFree reachable while module teardown clears globals.
    def __del__(self, free=cuda.cudaFree):
        free(self.ptr)


def load_model():
    return [Tensor(16 << 20) for _ in range(4)]


def train_step(seq):
    hidden = Tensor(seq * 32 * KiB)
    for _ in range(seq // 32):  # temporaries: their number depends on the shape
        t = Tensor(seq * 8 * KiB)
        del t
    logits = Tensor(seq * 16 * KiB)
    KEPT.append(Tensor(seq * 8 * KiB))  # @leak (a slice of the hidden state, kept)
    del logits, hidden


def main():
    steps = int(sys.argv[1])
    model = load_model()
    for step in range(steps):
        train_step(SHAPES[step % len(SHAPES)])
    del model


main()
