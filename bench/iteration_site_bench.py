#!/usr/bin/env python3
"""What exact counting of GPUSHIM_ITERATION_SITE costs a Python program (docs/python.md, "Counting
iterations"; docs/benchmarks.md).

For each interpreter, three runs on the simulated device: without the shim, under the shim
without GPUSHIM_ITERATION_SITE, and with GPUSHIM_ITERATION_SITE=step. Each run times two tight
loops of pure Python calls (no allocation inside the timed loops):
  - site:  step(i), the named function, which calls other(i): the cost on each counted call;
  - other: other(i) only: the cost on code that never calls the site (on 3.11 the frame
           evaluator applies to every call).
Before the loops, one call of step allocates (that allocation names the site to the shim, as the
first allocation inside a training step does). The site run also checks that the report counted
every call of step exactly. Process CPU time, best of --repeat runs.

usage: iteration_site_bench.py [--build DIR] [--calls N] [--repeat N] [--python EXE ...]
"""
import argparse
import ctypes
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(calls):
    """Runs a loop of `calls` calls of step and of other; prints calls per second of each, and how
    many times step was called in all."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e", "python"))
    from cuda_ctypes import check, cuda

    def other(i):
        return i + 1

    def step(i, allocate=False):
        if allocate:
            p = ctypes.c_void_p()
            check(cuda.cudaMalloc(ctypes.byref(p), 4096))
            check(cuda.cudaFree(p))
        return other(i)

    def site_loop(n):
        s = 0
        for i in range(n):
            s += step(i)
        return s

    def other_loop(n):
        s = 0
        for i in range(n):
            s += other(i)
        return s

    step(0, True)
    site_loop(calls // 10)  # warm-up: specialization, first-seen code objects
    other_loop(calls // 10)
    t0 = time.process_time_ns()
    site_loop(calls)
    t1 = time.process_time_ns()
    other_loop(calls)
    t2 = time.process_time_ns()
    print(json.dumps({"site": calls * 1e9 / (t1 - t0), "other": calls * 1e9 / (t2 - t1),
                      "step_calls": 1 + calls // 10 + calls}))


def interpreters(extra):
    found = [sys.executable] + list(extra)
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    found += [p for p in (shutil.which(f"python3.{m}") for m in range(9, 14)) if p]
    found += ["/usr/bin/python3"]  # the distribution's build (Debian's: static, LTO)
    out, seen = [], set()
    for p in found:
        try:
            v = subprocess.run([p, "-c", "import sys; print(sys.version_info[0], sys.version_info[1], sys.executable)"],
                               capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if v.returncode != 0:
            continue
        major, minor, exe = v.stdout.split(maxsplit=2)
        real = os.path.realpath(exe.strip())
        if not (3, 9) <= (int(major), int(minor)) <= (3, 13) or real in seen:
            continue
        seen.add(real)
        out.append((p, f"{major}.{minor}" + (" deb" if real.startswith("/usr/bin/") else "")))
    return out


def run_child(python, env, calls):
    r = subprocess.run([python, __file__, "--child", str(calls)], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"{python} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"), help="build directory")
    ap.add_argument("--calls", type=int, default=2_000_000, help="calls per timed loop")
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration (best kept)")
    ap.add_argument("--python", action="append", default=[], help="another interpreter to measure")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHIM_")}
    base["LD_LIBRARY_PATH"] = os.path.join(build, "fakecuda")
    base["GPUSHIM_SUMMARY"] = "0"
    shim = dict(base, LD_PRELOAD=os.path.join(build, "lib", "libgpushim.so"))
    print(f"Python calls per second, millions (process CPU time, best of {args.repeat}, {args.calls} calls per loop)")
    print(f"{'python':9s} {'loop':6s} {'no shim':>8s} {'shim':>8s} {'shim+site':>10s} {'site/shim':>10s}  counted")
    for python, version in interpreters(args.python):
        rows, counted = {}, "?"
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "report.json")
            configs = (("no shim", dict(base, GPUSHIM_REPORT="off")), ("shim", dict(shim, GPUSHIM_REPORT="off")),
                       ("shim+site", dict(shim, GPUSHIM_REPORT=report, GPUSHIM_ITERATION_SITE="step")))
            for label, env in configs:
                runs = [run_child(python, env, args.calls) for _ in range(args.repeat)]
                rows[label] = {k: max(r[k] for r in runs) for k in ("site", "other")}
                if label == "shim+site":
                    with open(report) as f:
                        got = json.load(f)["growth"]["iterations"]
                    want = runs[-1]["step_calls"]
                    counted = "exact" if got == want else f"WRONG: {got} of {want}"
        for loop in ("site", "other"):
            r = [rows[c][loop] / 1e6 for c in ("no shim", "shim", "shim+site")]
            print(f"{version:9s} {loop:6s} {r[0]:8.2f} {r[1]:8.2f} {r[2]:10.2f} {r[2] / r[1]:9.1%}  {counted}")


main()
