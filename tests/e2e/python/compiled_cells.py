"""Snippets compiled and run one after another, each freed once it ran, as IPython runs cells:
the next snippet's code object, file name and line table often take the addresses of the last
one's. Cell i allocates i MiB at line i + 1 of the file "<cell-i>". argv[1]: "linecache" registers
each cell's source in linecache first, as IPython does (which keeps each file name alive); "plain"
does not, so the file names are freed with the code too."""
import ctypes
import linecache
import sys

from cuda_ctypes import MiB, check, cuda

KEEP = []


def alloc(size):
    p = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(p), size))
    KEEP.append(p)


for i in range(1, 21):
    src = "\n" * i + f"alloc({i} * {MiB})\n"
    filename = f"<cell-{i:03d}>"
    if sys.argv[1] == "linecache":
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    code = compile(src, filename, "exec")
    exec(code, {"alloc": alloc})  # @exec_cell
    del code
print("ok")
