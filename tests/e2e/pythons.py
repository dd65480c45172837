"""The Python interpreters the Python e2e tests run with: `python3` from PATH first (the one CI
has), then every other CPython 3.9-3.13 found as python3.X on PATH or under pyenv, plus any
listed in GPUSHIM_TEST_PYTHONS (colon-separated paths). Each interpreter once."""
import glob
import os
import shutil
import subprocess


def _probe(path):
    try:
        out = subprocess.run([path, "-c", "import sys; print(sys.version_info[0], sys.version_info[1], sys.executable)"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    major, minor, exe = out.stdout.split(maxsplit=2)
    return (int(major), int(minor)), exe.strip()


_cache = None


def interpreters():
    """[(path, (major, minor))], python3 from PATH first; raises if there is no python3."""
    global _cache
    if _cache is not None:
        return _cache
    first = shutil.which("python3")
    if first is None:
        raise RuntimeError("no python3 on PATH")
    candidates = [first]
    candidates += [p for p in (shutil.which(f"python3.{m}") for m in range(9, 14)) if p]
    candidates += ["/usr/bin/python3"]  # the distribution's build (Debian's is static, LTO, stripped)
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates += sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3")))
    candidates += [p for p in os.environ.get("GPUSHIM_TEST_PYTHONS", "").split(":") if p]
    found, seen = [], set()
    for path in candidates:
        probed = _probe(path)
        if probed is None:
            continue
        version, exe = probed
        if not (3, 9) <= version <= (3, 13) and path != first:
            continue
        real = os.path.realpath(exe)
        if real in seen:
            continue
        seen.add(real)
        found.append((exe, version))
    _cache = found
    return found
