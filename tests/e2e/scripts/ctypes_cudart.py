"""Python reaching the CUDA runtime through ctypes: CDLL loads libcudart with RTLD_LOCAL and looks
cudaMalloc up on that handle (dlsym), a path LD_PRELOAD alone never sees. Allocates, frees one
buffer, keeps the others, and prints what it kept."""
import ctypes
import json
import sys

cudart = ctypes.CDLL("libcudart.so.13")
cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
cudart.cudaFree.argtypes = [ctypes.c_void_p]

sizes = [int(s) for s in sys.argv[1:]] or [1 << 20, 3 << 20, 5 << 20]
kept = []
for i, size in enumerate(sizes):
    p = ctypes.c_void_p()
    err = cudart.cudaMalloc(ctypes.byref(p), size)
    if err != 0:
        print(json.dumps({"error": err}))
        sys.exit(1)
    if i == 0:
        if cudart.cudaFree(p) != 0:
            sys.exit(1)
    else:
        kept.append(size)
print(json.dumps({"kept_bytes": sum(kept), "kept_count": len(kept), "allocs": len(sizes), "frees": 1}))
