"""The shim's figures for a device, read through gpushim_get_device_stats (interpose/public/gpushim.h),
for the PyTorch jobs of the GPU validation suite (train.py, torch_workloads.py) to put in their results."""
import ctypes


class ShimStats(ctypes.Structure):
    """struct gpushim_device_stats, field for field."""
    _fields_ = [("struct_size", ctypes.c_size_t)] + [(n, ctypes.c_ulonglong) for n in (
        "live_bytes", "live_count", "requested_bytes", "reserved_bytes", "peak_allocated_bytes",
        "peak_reserved_bytes", "total_allocs", "total_frees", "failed_allocs", "reuse_syncs", "ooms",
        "limit_bytes")]


def shim_stats(device_index):
    """The shim's figures for the device, or None when the process runs without it."""
    try:
        fn = ctypes.CDLL(None).gpushim_get_device_stats
    except AttributeError:
        return None
    st = ShimStats()
    st.struct_size = ctypes.sizeof(ShimStats)
    if fn(ctypes.c_int(device_index), ctypes.byref(st)) != 0:
        return None
    return {name: getattr(st, name) for name, _ in ShimStats._fields_[1:]}
