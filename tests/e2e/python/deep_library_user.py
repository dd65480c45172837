"""The user's code calls a library that reaches cudaMalloc through a deep stack of its own frames
(like PyTorch's dozens of c10/ATen frames, or numba's driver). The library is written at run time
into <argv[1]>/lib/python3/site-packages/deeplib (where pip would put it). argv: that directory,
then the steps, then "oom" to keep allocating until the device refuses."""
import os
import sys

SITE = os.path.join(sys.argv[1], "lib", "python3", "site-packages")
HELPERS = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(SITE, "deeplib"), exist_ok=True)
with open(os.path.join(SITE, "deeplib", "__init__.py"), "w") as f:
    f.write("import ctypes, sys\nsys.path.insert(0, %r)\nfrom cuda_ctypes import cuda, check\n\n" % HELPERS)
    f.write("def layer0(size):\n    p = ctypes.c_void_p()\n    err = cuda.cudaMalloc(ctypes.byref(p), size)\n"
            "    return p if err == 0 else None\n\n")
    for i in range(1, 16):
        f.write("def layer%d(size):\n    return layer%d(size)\n\n" % (i, i - 1))
    f.write("def empty(size):\n    return layer15(size)\n")
sys.path.insert(0, SITE)
import deeplib  # noqa: E402

KEPT = []


def train_step(size):
    return deeplib.empty(size)  # @user


def main():
    steps = int(sys.argv[2])
    for _ in range(steps):
        KEPT.append(train_step(1 << 20))
    if sys.argv[3:] == ["oom"]:
        while train_step(64 << 20) is not None:
            pass


main()
