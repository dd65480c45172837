"""Allocates once (so that the shim writes a report) and prints, as JSON, the environment
variables the launcher sets."""
import ctypes
import json
import os

from cuda_ctypes import MiB, check, cuda

p = ctypes.c_void_p()
check(cuda.cudaMalloc(ctypes.byref(p), 1 * MiB))
print(json.dumps({k: v for k, v in os.environ.items()
                  if k.startswith("GPUSHIM_") or k in ("LD_PRELOAD", "PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_CUDA_ALLOC_CONF")}))
