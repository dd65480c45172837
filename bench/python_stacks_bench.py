#!/usr/bin/env python3
"""Measures what Python stacks cost an allocation (docs/benchmarks.md, "Python stacks").

1. Google Benchmark (libpython_stacks_bench.so), called through ctypes from DEPTH Python frames
   without the GIL (as PyTorch allocates): the stack capture of the allocation hook, with and
   without Python frames, and its parts.
2. End to end: cudaMalloc + cudaFree pairs through the preloaded shim on the simulated device,
   from the same depth, with Python stacks on, off, and with stack capture off. ctypes' own cost
   is in every figure; the differences are the shim's.
3. Repeated-site pairs (issue 30): libpython_pair_bench.so, called once from the same depth, times
   each cudaMalloc+cudaFree (and cudaMallocAsync+cudaFreeAsync) pair itself, 32 native calls
   further down, without the shim and through it: no ctypes in the figures.

usage: python_stacks_bench.py [--build DIR] [--shim PATH] [--depth N] [--pairs N] [--site-pairs N]
                              [--with-gil] [benchmark args...]
"""
import argparse
import ctypes
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def frames_on_stack():
    """Python frames of the calling thread, the caller's own included."""
    f, n = sys._getframe(1), 0
    while f is not None:
        n, f = n + 1, f.f_back
    return n


def at_depth(depth, fn):
    """Calls fn (a Python function) so that its frame is the depth-th on the stack."""
    def down():
        if frames_on_stack() + 1 >= depth:
            return fn()
        return down()
    return down()


def run_google_benchmark(args, extra):
    lib_path = os.path.join(args.build, "bin", "libpython_stacks_bench.so")
    lib = (ctypes.PyDLL if args.with_gil else ctypes.CDLL)(lib_path)
    argv = [b"python_stacks_bench"] + [a.encode() for a in extra]
    arr = (ctypes.c_char_p * (len(argv) + 1))(*argv, None)
    lib.run_python_stack_benchmarks.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    sys.stdout.flush()
    return at_depth(args.depth, lambda: lib.run_python_stack_benchmarks(len(argv), arr))


def child_pairs(depth, pairs):
    """Runs under the shim: prints ns per cudaMalloc+cudaFree pair at `depth` frames."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e", "python"))
    from cuda_ctypes import cuda
    p = ctypes.c_void_p()
    ref = ctypes.byref(p)
    malloc, free = cuda.cudaMalloc, cuda.cudaFree

    def loop():
        for _ in range(pairs // 10):  # warm-up: first-seen code objects, pool segments
            malloc(ref, 4096)
            free(p)
        # CPU time of the process: the build machines are shared, and wall time there measures
        # the neighbours as much as us.
        t0 = time.process_time_ns()
        for _ in range(pairs):
            malloc(ref, 4096)
            free(p)
        return (time.process_time_ns() - t0) / pairs

    print(at_depth(depth, loop))


def shim_env(args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHIM_") and k != "LD_PRELOAD"}
    env["LD_LIBRARY_PATH"] = os.path.join(args.build, "fakecuda")
    env["GPUSHIM_REPORT"] = "off"
    env["GPUSHIM_SUMMARY"] = "0"
    return env


# Issue 30's target for a repeated site with native stacks at depth 32 plus 20 Python frames.
SITE_TARGET_NS = 400
SITE_NATIVE_FRAMES = 32


def pair_child(api, depth, native_frames, pairs):
    """Runs (under the shim or not): prints p50 and p99 ns per pair of the repeated site."""
    lib = ctypes.CDLL(os.environ["PAIR_BENCH_LIB"])
    p50, p99 = ctypes.c_double(), ctypes.c_double()
    rc = at_depth(depth, lambda: lib.python_pair_bench(api, native_frames, pairs, ctypes.byref(p50), ctypes.byref(p99)))
    if rc != 0:
        sys.exit(f"python_pair_bench failed: {rc}")
    print(p50.value, p99.value)


def run_site_pairs(args):
    """Repeated-site pairs: 3 runs per configuration, interleaved; the lowest and the median p50."""
    shim = os.path.abspath(args.shim or os.path.join(args.build, "lib", "libgpushim.so"))
    env = shim_env(args)
    env["PAIR_BENCH_LIB"] = os.path.join(args.build, "bin", "libpython_pair_bench.so")
    configs = [("no shim (simulated runtime)", None),
               ("shim, stacks off", {"GPUSHIM_STACK_DEPTH": "0"}),
               (f"shim, {SITE_NATIVE_FRAMES} native frames, Python stacks off",
                {"GPUSHIM_STACK_DEPTH": str(SITE_NATIVE_FRAMES), "GPUSHIM_PYTHON_STACKS": "0"}),
               (f"shim, {SITE_NATIVE_FRAMES} native + {args.depth} Python frames",
                {"GPUSHIM_STACK_DEPTH": str(SITE_NATIVE_FRAMES)})]
    results = {}
    for _ in range(args.site_runs):
        for api, api_name in ((0, "cudaMalloc+cudaFree"), (1, "cudaMallocAsync+cudaFreeAsync")):
            for label, extra in configs:
                e = dict(env, **(extra or {}))
                if extra is not None:
                    e["LD_PRELOAD"] = shim
                    e["GPUSHIM_POLICY"] = "caching"
                out = subprocess.run([sys.executable, __file__, "--pair-child", str(api), str(args.depth),
                                      str(SITE_NATIVE_FRAMES), str(args.site_pairs)], env=e, check=True,
                                     capture_output=True, text=True).stdout.split()
                results.setdefault((api_name, label), []).append((float(out[0]), float(out[1])))
    print(f"\nRepeated-site pairs of 4 KiB (caching policy, simulated device): each pair timed alone, "
          f"{SITE_NATIVE_FRAMES} native calls under {args.depth} Python frames, GIL released; "
          f"p50 / p99 ns per pair, lowest and median p50 of {args.site_runs} runs of {args.site_pairs} pairs:")
    for (api_name, label), runs in results.items():
        p50s = sorted(r[0] for r in runs)
        p99 = sorted(r[1] for r in runs)[len(runs) // 2]
        print(f"  {api_name:30s} {label:42s} {p50s[0]:6.0f} (median {p50s[len(runs) // 2]:6.0f}) / {p99:7.0f}")
    for api_name in ("cudaMalloc+cudaFree", "cudaMallocAsync+cudaFreeAsync"):
        p50 = min(r[0] for r in results[(api_name, configs[-1][0])])
        print(f"  target: {api_name} with {SITE_NATIVE_FRAMES} native + {args.depth} Python frames "
              f"<= {SITE_TARGET_NS} ns: {'met' if p50 <= SITE_TARGET_NS else 'NOT met'} ({p50:.0f} ns, lowest run)")


def run_end_to_end(args):
    shim = os.path.abspath(args.shim or os.path.join(args.build, "lib", "libgpushim.so"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHIM_")}
    env["LD_LIBRARY_PATH"] = os.path.join(args.build, "fakecuda")
    env["GPUSHIM_REPORT"] = "off"
    env["GPUSHIM_SUMMARY"] = "0"
    rows = []
    for label, extra in (("python stacks on", {}), ("python stacks off", {"GPUSHIM_PYTHON_STACKS": "0"}),
                         ("stack capture off", {"GPUSHIM_STACK_DEPTH": "0"})):
        e = dict(env, LD_PRELOAD=shim, **extra)
        best = min(float(subprocess.run([sys.executable, __file__, "--child", str(args.depth), str(args.pairs)], env=e,
                                        check=True, capture_output=True, text=True).stdout) for _ in range(3))
        rows.append((label, best))
    print(f"\nEnd to end, cudaMalloc+cudaFree from {args.depth} Python frames through ctypes "
          f"(caching policy, simulated device, process CPU time, best of 3 runs of {args.pairs} pairs):")
    for label, ns in rows:
        print(f"  {label:20s} {ns:8.0f} ns per pair")
    print(f"  Python frames add   {rows[0][1] - rows[1][1]:8.0f} ns per pair (on - off)")
    print(f"  all stacks add      {rows[0][1] - rows[2][1]:8.0f} ns per pair (on - capture off)")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child_pairs(int(sys.argv[2]), int(sys.argv[3]))
        return
    if len(sys.argv) == 6 and sys.argv[1] == "--pair-child":
        pair_child(*(int(a) for a in sys.argv[2:]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"), help="build directory")
    ap.add_argument("--depth", type=int, default=20, help="Python frames on the stack at each capture")
    ap.add_argument("--pairs", type=int, default=20000, help="pairs per end-to-end run (0: skip)")
    ap.add_argument("--site-pairs", type=int, default=100000, help="pairs per repeated-site run (0: skip)")
    ap.add_argument("--site-runs", type=int, default=3, help="runs of each repeated-site configuration")
    ap.add_argument("--shim", help="libgpushim.so to preload (default: the build's)")
    ap.add_argument("--with-gil", action="store_true", help="call the benchmarks holding the GIL (ctypes.PyDLL)")
    args, extra = ap.parse_known_args()
    print(f"Python {sys.version.split()[0]} ({sys.executable}), {args.depth} Python frames, "
          f"GIL {'held' if args.with_gil else 'released'}")
    if run_google_benchmark(args, extra) != 0:
        sys.exit(1)
    if args.pairs > 0:
        run_end_to_end(args)
    if args.site_pairs > 0:
        run_site_pairs(args)


main()
