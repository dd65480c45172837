"""Device allocations from Python in every shape the shim must attribute to the right source line.
Lines marked `# @<tag>` are the ones the test expects in the stacks; each scenario allocates a
distinct size (MiB) so the test can find its site. argv[1]: path of libe2e_native_helpers.so."""
import ctypes
import sys
import threading

from cuda_ctypes import MiB, check, cuda, cuda_with_gil

helpers = ctypes.CDLL(sys.argv[1])
helpers.native_alloc_in_c.argtypes = [ctypes.c_size_t]
helpers.native_alloc_in_c.restype = ctypes.c_void_p
helpers.native_thread_alloc.argtypes = [ctypes.c_size_t]
helpers.native_thread_alloc.restype = ctypes.c_void_p
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int)
helpers.native_call_back.argtypes = [CALLBACK]
helpers_with_gil = ctypes.PyDLL(sys.argv[1])
helpers_with_gil.native_alloc_in_c.argtypes = [ctypes.c_size_t]
helpers_with_gil.native_alloc_in_c.restype = ctypes.c_void_p
KEEP = []


def plain(size):
    p = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(p), size))  # @plain_alloc
    KEEP.append(p)


def caller():
    plain(1 * MiB)  # @caller_call


class Model:
    def build(self):
        p = ctypes.c_void_p()
        check(cuda.cudaMalloc(ctypes.byref(p), 2 * MiB))  # @method_alloc
        KEEP.append(p)


def generate():
    for _ in range(2):
        p = ctypes.c_void_p()
        check(cuda.cudaMalloc(ctypes.byref(p), 3 * MiB))  # @generator_alloc
        yield p


def consume():
    for p in generate():  # @consume_call
        KEEP.append(p)


def recurse(depth):
    if depth == 0:
        p = ctypes.c_void_p()
        check(cuda.cudaMalloc(ctypes.byref(p), 4 * MiB))  # @recurse_alloc
        KEEP.append(p)
        return
    recurse(depth - 1)  # @recurse_call


def thread_worker():
    p = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(p), 5 * MiB))  # @thread_alloc
    KEEP.append(p)


def call_native():
    KEEP.append(helpers.native_alloc_in_c(7 * MiB))  # @native_call


def python_callback():
    p = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(p), 8 * MiB))  # @callback_alloc
    KEEP.append(p)
    return 0


def with_callback():
    return helpers.native_call_back(CALLBACK(python_callback))  # @with_callback_call


def call_native_holding_gil():
    KEEP.append(helpers_with_gil.native_alloc_in_c(9 * MiB))  # @native_gil_call


def plain_holding_gil():
    p = ctypes.c_void_p()
    check(cuda_with_gil.cudaMalloc(ctypes.byref(p), 10 * MiB))  # @gil_alloc
    KEEP.append(p)


caller()  # @module_caller
Model().build()  # @module_method
consume()  # @module_consume
recurse(24)  # @module_recurse
t = threading.Thread(target=thread_worker)
t.start()
t.join()
KEEP.append(helpers.native_thread_alloc(6 * MiB))
call_native()  # @module_native
with_callback()  # @module_callback
call_native_holding_gil()  # @module_native_gil
plain_holding_gil()  # @module_gil
print("ok", sys.version_info[0], sys.version_info[1])
