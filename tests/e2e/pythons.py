"""The Python interpreters the Python e2e tests run with: `python3` from PATH first (the one CI
has), then every other CPython 3.9-3.13 found as python3.X on PATH or under pyenv, plus any
listed in GPUSHIM_TEST_PYTHONS (colon-separated paths). Each interpreter once."""
import glob
import os
import shutil
import subprocess


_PROBE = "import sys; print(sys.version_info[0], sys.version_info[1], sys.executable)"


def _probe_all(paths):
    """{path: ((major, minor), executable)} for the paths that run; all started at once."""
    procs = {}
    for path in dict.fromkeys(paths):
        try:
            procs[path] = subprocess.Popen([path, "-c", _PROBE], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                           text=True)
        except OSError:
            pass
    out = {}
    for path, proc in procs.items():
        try:
            stdout, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            continue
        if proc.returncode == 0:
            major, minor, exe = stdout.split(maxsplit=2)
            out[path] = ((int(major), int(minor)), exe.strip())
    return out


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
    # pyenv's shims (slow to start, and only proxies for the installs globbed below) are skipped.
    candidates += [p for p in (shutil.which(f"python3.{m}") for m in range(9, 14))
                   if p and os.path.basename(os.path.dirname(p)) != "shims"]
    candidates += ["/usr/bin/python3"]  # the distribution's build (Debian's is static, LTO, stripped)
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates += sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3")))
    candidates += [p for p in os.environ.get("GPUSHIM_TEST_PYTHONS", "").split(":") if p]
    probed_all = _probe_all(candidates)
    found, seen = [], set()
    for path in candidates:
        probed = probed_all.get(path)
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
