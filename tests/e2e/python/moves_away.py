"""Allocates (the first CUDA call), then changes its working directory into a new folder, as
Hydra's job.chdir does, allocates again and exits; with `delete`, it removes that folder while in
it first. Prints nothing."""
import ctypes
import os
import sys

from cuda_ctypes import MiB, check, cuda

p = ctypes.c_void_p()
check(cuda.cudaMalloc(ctypes.byref(p), 1 * MiB))
os.mkdir("elsewhere")
os.chdir("elsewhere")
if sys.argv[1] == "delete":
    os.rmdir(os.getcwd())
q = ctypes.c_void_p()
check(cuda.cudaMalloc(ctypes.byref(q), 2 * MiB))
