"""A Python program whose "tensors" come from a stand-in of PyTorch's caching allocator
(build/e2e-libs/libc10_cuda.so): it prints PyTorch's allocator settings as the process sees them,
then makes a step's worth of tensors a few times, keeping some. argv: the stand-in's path, steps."""
import ctypes
import json
import os
import sys

import cuda_ctypes  # noqa: F401  (loads the runtime the stand-in links)

c10 = ctypes.CDLL(sys.argv[1])
c10.c10_cuda_empty.argtypes = [ctypes.c_size_t]
c10.c10_cuda_empty.restype = ctypes.c_void_p
KEPT = []


def train_step():
    for _ in range(4):
        KEPT.append(c10.c10_cuda_empty(3 << 20))  # @tensor


print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("PYTORCH_")}))
for _ in range(int(sys.argv[2])):
    train_step()
