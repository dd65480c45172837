"""The Python interpreters the Python e2e tests run with: `python3` from PATH first (the one CI
has), then every other CPython 3.9-3.13 found as python3.X on PATH or under pyenv, plus any
listed in GPUSHIM_TEST_PYTHONS (colon-separated paths). Each interpreter once.

TSan builds: a TSan-built shim can only be preloaded into a program that carries the TSan runtime,
which no interpreter does. There the tests run python3's interpreter, from its shared library,
inside an instrumented stand-in (tests/e2e/stand_ins/python.cpp, build/stand-ins/python3), with
the environment that `stand_in_env()` gives (shimtest.base_env adds it). Only that one interpreter:
the other versions differ in layouts, which the normal and ASan runs cover, not in threading."""
import glob
import os
import shutil
import subprocess

from shimtest import BUILD, SANITIZER

STAND_IN = os.path.join(BUILD, "stand-ins", "python3")

# Line 1: version and executable; line 2: the prefix (PYTHONHOME); line 3: the shared library.
_PROBE = ("import os, sys, sysconfig; print(sys.version_info[0], sys.version_info[1], sys.executable); "
          "print(sys.base_prefix); "
          "print(os.path.join(sysconfig.get_config_var('LIBDIR') or '', sysconfig.get_config_var('INSTSONAME') or ''))")


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
            first, prefix, libpython = stdout.splitlines()[:3]
            major, minor, exe = first.split(maxsplit=2)
            out[path] = ((int(major), int(minor)), exe.strip(), prefix, libpython)
    return out


_cache = None
_python3 = None  # python3 from PATH: (version, executable, prefix, shared library)


def interpreters():
    """[(path, (major, minor))], python3 from PATH first; raises if there is no python3. TSan
    builds: [(the stand-in, python3's version)]."""
    global _cache
    if _cache is not None:
        return _cache
    if SANITIZER == "thread":
        stand_in_env()  # raises if python3 has no shared library
        _cache = [(STAND_IN, _probe_python3()[0])]
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
        version, exe = probed[:2]
        if not (3, 9) <= version <= (3, 13) and path != first:
            continue
        real = os.path.realpath(exe)
        if real in seen:
            continue
        seen.add(real)
        found.append((exe, version))
    _cache = found
    return found


def interpreter_cases(cases):
    """[(python, version, case)]: every case on every interpreter, or under a sanitizer each case
    and each interpreter at least once, the interpreters taken in turn. The normal run covers the
    whole product; what a sanitizer can find (memory and threading errors in how the shim reads
    each interpreter) shows on any case, and every case again on each interpreter cost the ASan
    run ~20 CPU-s in test_iterations alone (2026-11-29)."""
    found = interpreters()
    if not SANITIZER:
        return [(python, version, case) for python, version in found for case in cases]
    return [found[i % len(found)] + (cases[i % len(cases)],) for i in range(max(len(found), len(cases)))]


def _probe_python3():
    global _python3
    if _python3 is None:
        first = shutil.which("python3")
        if first is None:
            raise RuntimeError("no python3 on PATH")
        probed = _probe_all([first]).get(first)
        if probed is None:
            raise RuntimeError(f"{first} does not run")
        _python3 = probed
    return _python3


def stand_in_env(required=True):
    """TSan builds: what the stand-in needs to run python3's interpreter (see above). When python3
    has no shared library: raises, or gives nothing if not `required`."""
    _, exe, prefix, libpython = _probe_python3()
    if not os.path.isfile(libpython):
        if not required:
            return {}
        raise RuntimeError(f"TSan builds run {exe} from its shared library, and {libpython} does not exist "
                           "(Debian: apt-get install libpython3.11)")
    return {"STAND_IN_LIBPYTHON": libpython, "PYTHONHOME": prefix}
