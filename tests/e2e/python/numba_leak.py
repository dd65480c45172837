"""numba, a real client no one here wrote: device arrays appended to a global list every step (the
planted leak), beside a scratch array dropped every step and weights allocated once. numba frees
device arrays from finalizers, so at exit its teardown frees the leaked arrays too.
argv: steps."""
import sys
import time

import numpy as np
from numba import cuda

KEPT = []


def train_step(step):
    scratch = cuda.device_array(4 << 20, dtype=np.uint8)
    KEPT.append(cuda.device_array(1 << 20, dtype=np.uint8))  # @leak
    return scratch.size + step


def main():
    steps = int(sys.argv[1])
    weights = cuda.device_array(8 << 20, dtype=np.uint8)  # @weights
    for step in range(steps):
        train_step(step)
        time.sleep(0.004)
    return weights


main()
