"""Edits the C environment with the C library's own functions, then prints (as JSON) what a child
process inherits: front/environment.cpp hands the program an environment array of the shim's own,
and setenv, unsetenv and exec must all keep working on it. Touches no CUDA."""
import ctypes
import json
import subprocess
import sys

libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
routed = libc.getenv(b"PYTORCH_CUDA_ALLOC_CONF")
libc.setenv(b"ADDED_AFTER", b"1", 1)     # grows the array: glibc copies it into one of its own
libc.setenv(b"KEPT", b"changed", 1)      # replaced in place
libc.unsetenv(b"REMOVED")                # removed in place
# env=None: the child inherits the C environment itself, not os.environ's copy.
child = subprocess.run([sys.argv[1]], capture_output=True, text=True, check=True).stdout.splitlines()
print(json.dumps({"routed": routed.decode() if routed is not None else None, "child": child}))
