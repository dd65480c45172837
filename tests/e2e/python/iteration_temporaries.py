"""GPUSHIM_ITERATION_SITE=train_step, called with an argument of one kind per run (argv: calls, kind,
the path of libe2e_native_helpers.so):
- "str", "tuple", "object", "int": a temporary built for each call and freed when it returns (the
  next call's temporary usually gets the same address, and so does the frame);
- "same": the same objects on every call;
- "indirect": as "same", called from C (map calling a functools.partial);
- "thread": as "same", from a worker thread while the main thread waits in join();
- "tail": as "same", called by map with no Python code between calls, each allocating (in C,
  through an operator) as its last action;
- "recursive": as "same", each call calling train_step once more inside itself (one iteration:
  the outer call);
- "profiled": as "same", under the program's own profile function (sys.setprofile), which must
  still see every call: it prints how many;
- "replaced": as "int", with CPython's own frame evaluator put back halfway (3.9-3.11), as
  another PEP 523 user does when it turns itself off;
- "tools_taken": as "same", after the program took the sys.monitoring tool ids that no tool is
  assigned (3.12+);
- "tools_later": as "same", the program taking id 4 (gpushim's) halfway (3.12+): it prints who
  holds ids 3 and 4 then;
- "tools_later_both": as "same", the program taking id 4, then id 3, a third of the calls apart
  (3.12+): it prints who holds both at the end.
The weights are allocated before the loop. Each call of train_step leaks 64 KiB and allocates and
frees a 4 KiB scratch buffer, so the suspect's bytes per iteration is 64 KiB exactly when every
call counts once."""
import ctypes
import functools
import sys
import threading

from cuda_ctypes import check, cuda

LEAK_BYTES = 64 << 10
kept = []


class Allocator:
    """`ALLOCATE + n` allocates n bytes in C (main sets __add__ from libe2e_native_helpers.so)."""


ALLOCATE = Allocator()


class Batch:
    def __init__(self, n):
        self.n = n


def leak():
    p = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(p), LEAK_BYTES))
    kept.append(p)


def scratch():
    p = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(p), 4096))
    check(cuda.cudaFree(p))


def train_step(batch, nested=False, tail=False):
    if tail:
        # One allocation, made by an operator (not a call instruction, after which the interpreter
        # would stop for pending calls), and nothing after it until the next call has begun.
        return ALLOCATE + LEAK_BYTES
    leak()
    scratch()
    if nested:
        train_step(batch)


def restore_cpython_frame_evaluator():
    """What another PEP 523 user (TorchDynamo) does when it turns itself off (3.9-3.11)."""
    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api._PyInterpreterState_SetEvalFrameFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    api._PyInterpreterState_SetEvalFrameFunc.restype = None
    default = ctypes.cast(api._PyEval_EvalFrameDefault, ctypes.c_void_p)
    api._PyInterpreterState_SetEvalFrameFunc(api.PyInterpreterState_Get(), default)


def loop(calls, kind):
    model = Batch(0)
    if kind == "tail":  # from C, one call right after the other
        list(map(functools.partial(train_step, tail=True), [model] * calls))
        return
    for j in range(calls):
        if kind == "str":
            train_step("batch %d" % (j % 10))
        elif kind == "tuple":
            train_step((j, j + 1))
        elif kind == "object":
            train_step(Batch(j))
        elif kind == "int":
            train_step(1000 + j % 7)
        elif kind == "replaced":
            if j == calls // 2:
                restore_cpython_frame_evaluator()
            train_step(1000 + j % 7)
        elif kind == "indirect":  # from C code: map calling a functools.partial
            list(map(functools.partial(train_step), [model]))
        elif kind == "recursive":
            train_step(model, True)
        else:
            train_step(model)


def main():
    calls, kind = int(sys.argv[1]), sys.argv[2]
    helpers = ctypes.CDLL(sys.argv[3])
    helpers.native_alloc_in_c.argtypes = [ctypes.c_size_t]
    helpers.native_alloc_in_c.restype = ctypes.c_void_p
    Allocator.__add__ = helpers.native_alloc_in_c
    # The model's weights, before the loop as in a real program: the shim starts here.
    weights = ctypes.c_void_p()
    check(cuda.cudaMalloc(ctypes.byref(weights), 1 << 20))
    if kind == "profiled":
        seen = [0]

        def profile(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "train_step":
                seen[0] += 1

        sys.setprofile(profile)
        loop(calls, "same")
        sys.setprofile(None)
        print("profiler saw", seen[0], "calls")
    elif kind == "tools_taken":
        for tool in (3, 4):
            sys.monitoring.use_tool_id(tool, "the program's own")
        loop(calls, "same")
        print("tools", [sys.monitoring.get_tool(t) for t in (3, 4)])
    elif kind == "tools_later":
        loop(calls // 2, "same")
        # A call CPython refuses changes nothing, and the wrapper reads as the original.
        try:
            sys.monitoring.use_tool_id(4, 5)
        except ValueError as e:
            print("refused:", e)
        print(sys.monitoring.use_tool_id.__module__, sys.monitoring.use_tool_id.__qualname__,
              sys.monitoring.use_tool_id.__doc__)
        sys.monitoring.use_tool_id(4, "the program's own")
        print("tools", [sys.monitoring.get_tool(t) for t in (3, 4)])
        loop(calls - calls // 2, "same")
    elif kind == "tools_later_both":
        loop(calls // 3, "same")
        sys.monitoring.use_tool_id(4, "the program's own")
        loop(calls // 3, "same")
        sys.monitoring.use_tool_id(3, "the program's own")
        loop(calls - 2 * (calls // 3), "same")
        print("tools", [sys.monitoring.get_tool(t) for t in (3, 4)])
    elif kind == "thread":
        worker = threading.Thread(target=loop, args=(calls, "same"))
        worker.start()
        worker.join()
    else:
        loop(calls, kind)


main()
