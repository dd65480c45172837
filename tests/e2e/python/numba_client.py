"""numba's CUDA driver binding (Debian's python3-numba, a client no one here wrote) exercising
everything it does with memory, checking every result. Prints one line per step and "OK" at the end.

argv[1]:
  all [--per-process]
             detection, to_device, device_array, copies, slices, streams, events, pinned / mapped /
             managed arrays, host registration (cuda.pinned / cuda.mapped), memset, get_memory_info,
             deallocation, and IPC of a device array to a child process. Whether the arrays hold
             device memory and give it all back is read from the device's free memory (cuMemGetInfo),
             which only this process changes on the simulated device; with --per-process (a GPU,
             where other processes change it too) from numba's own table of live allocations instead
  oom        a device of 64 MiB (or GPUSHIM_LIMIT=64MiB): three dropped 16 MiB arrays stay in numba's
             pending-deallocation queue, so a 32 MiB allocation runs out of memory once; numba then
             flushes the queue and retries, and the retry succeeds
  ipc-child  (internal) opens the pickled IPC handle read from stdin, checks and rewrites the array
No kernels: compiling them needs NVVM (libnvvm), which neither Debian's numba nor this toolkit ships.
"""
import gc
import os
import pickle
import subprocess
import sys

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import driver

MiB = 1 << 20


def step(name):
    print(name, flush=True)


def flush_deallocations():
    gc.collect()  # device arrays caught in reference cycles (numba's views) are freed by the collector
    ctx = cuda.current_context()
    ctx.memory_manager.deallocations.clear()  # device memory is queued here (numba 0.56)
    ctx.deallocations.clear()                 # streams, events, modules


def free_bytes():
    return cuda.current_context().get_memory_info().free


def held_bytes():
    """What this process holds through numba: its table of live allocations."""
    return sum(m.size for m in cuda.current_context().memory_manager.allocations.values())


def run_all(per_process):
    step("detect")
    assert cuda.detect()
    assert len(cuda.gpus) >= 1
    baseline = held_bytes() if per_process else free_bytes()

    step("to_device / device_array / copies")
    host = np.arange(MiB // 4, dtype=np.float32)
    a = cuda.to_device(host)
    b = cuda.device_array_like(a)
    b.copy_to_device(a)
    assert np.array_equal(b.copy_to_host(), host)
    if per_process:
        assert held_bytes() >= baseline + 2 * MiB, (held_bytes(), baseline)
    else:
        assert free_bytes() <= baseline - 2 * MiB

    step("slices")
    assert np.array_equal(a[1000:2000].copy_to_host(), host[1000:2000])
    a[10:20].copy_to_device(np.full(10, -1, dtype=np.float32))  # a view: writes into a
    expect = host.copy()
    expect[10:20] = -1
    assert np.array_equal(a.copy_to_host(), expect)

    step("streams and events")
    s = cuda.stream()
    start, end = cuda.event(), cuda.event()
    start.record(s)
    c = cuda.to_device(host, stream=s)
    out = np.empty_like(host)
    c.copy_to_host(out, stream=s)
    end.record(s)
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) >= 0
    s.synchronize()
    assert np.array_equal(out, host)

    step("pinned, mapped and managed arrays")
    pinned = cuda.pinned_array(4096, dtype=np.int32)
    pinned[:] = 7
    d = cuda.to_device(pinned)
    assert int(d.copy_to_host().sum()) == 7 * 4096
    mapped = cuda.mapped_array(4096, dtype=np.int32)
    mapped[:] = 3
    through_alias = cuda.device_array(4096, dtype=np.int32)
    driver.device_to_device(through_alias, mapped, mapped.nbytes)  # from the mapped array's device alias
    assert int(through_alias.copy_to_host().sum()) == 3 * 4096
    managed = cuda.managed_array(4096, dtype=np.int32)
    managed[:] = 2
    assert int(managed.sum()) == 2 * 4096

    step("host registration")
    plain = np.ones(1 << 16, dtype=np.uint8)
    with cuda.pinned(plain):
        r = cuda.to_device(plain)
        assert int(r.copy_to_host().sum()) == 1 << 16
    with cuda.mapped(plain) as alias:  # registered with DEVICEMAP: a host array with a device alias
        assert int(np.asarray(alias).sum()) == 1 << 16
        # Unified addressing: the device alias of registered memory is its host address.
        assert alias.device_ctypes_pointer.value == plain.ctypes.data

    step("memset")
    driver.device_memset(b, 0, b.nbytes)
    assert not b.copy_to_host().any()

    step("ipc")
    shared = cuda.to_device(np.arange(4096, dtype=np.int64))
    handle = pickle.dumps(shared.get_ipc_handle())
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "ipc-child"], input=handle,
                           capture_output=True, env=dict(os.environ, GPUSHIM_REPORT="off"))
    assert child.returncode == 0, child.stderr.decode()
    assert np.array_equal(shared.copy_to_host(), np.arange(4096, dtype=np.int64) * 2)

    step("deallocation")
    del a, b, c, d, r, shared, pinned, mapped, managed, through_alias
    flush_deallocations()  # every queued cuMemFree is made here; numba raises if one fails
    if per_process:
        assert held_bytes() == baseline == 0, (held_bytes(), baseline)
    else:
        assert free_bytes() == baseline, (free_bytes(), baseline)
    print("OK")


def run_ipc_child():
    handle = pickle.loads(sys.stdin.buffer.read())
    with handle as arr:
        values = arr.copy_to_host()
        assert np.array_equal(values, np.arange(4096, dtype=np.int64)), values[:8]
        arr.copy_to_device(values * 2)
        cuda.synchronize()


def run_oom():
    step("fill the queue")
    dropped = [cuda.device_array(16 * MiB, dtype=np.uint8) for _ in range(3)]
    del dropped  # numba only queues the frees (NUMBA_CUDA_MAX_PENDING_DEALLOCS_* set by the test)
    step("allocate past the capacity")
    big = cuda.device_array(32 * MiB, dtype=np.uint8)  # OOM, flush, retry
    big[:4].copy_to_device(np.arange(4, dtype=np.uint8))
    assert list(big[:4].copy_to_host()) == [0, 1, 2, 3]
    del big
    flush_deallocations()
    print("OK")


if __name__ == "__main__":
    if sys.argv[1] == "all":
        run_all("--per-process" in sys.argv[2:])
    else:
        {"oom": run_oom, "ipc-child": run_ipc_child}[sys.argv[1]]()
