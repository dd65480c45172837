"""What scripts/bench and its corpus section (bench_corpus.py) share: where the tree is, logging,
number formats, the machine and build measured, and the rewriting of one section of a report."""
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEP_MARKER = "<!-- Everything below this line is hand-written and kept by scripts/bench. -->"


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# ---- rendering ----

def fmt_ns(v):
    if v is None:
        return "—"
    if v < 10_000:
        return f"{v:.0f}"
    return f"{v / 1000:.1f} µs" if v < 10_000_000 else f"{v / 1e6:.1f} ms"


def pct(v):
    return f"{100 * v:.1f}%"


def machine():
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return model, os.cpu_count(), platform.release()


def build_info(build):
    info = {}
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                for key in ("CMAKE_BUILD_TYPE", "CMAKE_CXX_COMPILER"):
                    if line.startswith(key + ":"):
                        info[key] = line.split("=", 1)[1].strip()
    except OSError:
        pass
    compiler = info.get("CMAKE_CXX_COMPILER", "c++")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        version = compiler
    return info.get("CMAKE_BUILD_TYPE", "?"), version


def tree_version():
    """The commit measured, and whether the working tree differed from it."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {head}" + (" with uncommitted changes" if dirty else "")


def latency_cell(rows, key, with_p99=True):
    r = rows.get(key)
    if r is None:
        return "—"
    if "error" in r:
        return f"error: {r['error']}"
    return f"{fmt_ns(r['p50_ns'])} / {fmt_ns(r['p99_ns'])}" if with_p99 else fmt_ns(r["p50_ns"])


def replace_section(path, begin, end, section, before=None):
    """Replaces begin..end in `path` with `section`, or inserts it before the first marker of `before`
    that the file has (or at its end)."""
    old = open(path).read() if os.path.exists(path) else KEEP_MARKER + "\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        return head + section.rstrip("\n") + rest.split(end, 1)[1]
    for marker in before or []:
        if marker in old:
            head, rest = old.split(marker, 1)
            return head + section + "\n" + marker + rest
    return old + "\n" + section
