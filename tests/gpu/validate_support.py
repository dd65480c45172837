"""What scripts/gpu-validate is built on: the GPU and NVML seen through ctypes, children run with a
time limit and a failure that always says why, and the results folder written as results arrive.
Kept apart from the parts themselves so that each file holds one concern."""
import ctypes
import glob
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

MiB = 1 << 20


class Gpu:
    def __init__(self):
        self.name = self.driver = self.bus_id = None
        self.total = 0

    @staticmethod
    def detect(simulated_dir=None):
        """(Gpu, None) for the first visible NVIDIA GPU, or (None, why not). With `simulated_dir`,
        the simulated device there stands in for one (a check of this script, not of gpushim)."""
        try:
            cuda = ctypes.CDLL(os.path.join(simulated_dir, "libcuda.so.1") if simulated_dir else "libcuda.so.1")
        except OSError:
            return None, "no NVIDIA driver here (libcuda.so.1 not found)"
        if hasattr(cuda, "fakecudaDeviceUsedBytes") != bool(simulated_dir):
            return None, "libcuda.so.1 on the library path is the simulated device, not NVIDIA's driver"
        if cuda.cuInit(0) != 0:
            return None, "cuInit failed: the driver found no usable GPU"
        n = ctypes.c_int(0)
        if cuda.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value == 0:
            return None, "no CUDA device visible (check CUDA_VISIBLE_DEVICES)"
        g = Gpu()
        dev = ctypes.c_int(0)
        cuda.cuDeviceGet(ctypes.byref(dev), 0)
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(name, 256, dev)
        g.name = name.value.decode()
        total = ctypes.c_size_t(0)
        cuda.cuDeviceTotalMem_v2(ctypes.byref(total), dev)
        g.total = total.value
        ver = ctypes.c_int(0)
        cuda.cuDriverGetVersion(ctypes.byref(ver))
        g.driver = f"CUDA driver API {ver.value // 1000}.{ver.value % 1000 // 10}"
        bus = ctypes.create_string_buffer(64)
        if cuda.cuDeviceGetPCIBusId(bus, 64, dev) == 0:
            g.bus_id = bus.value
        nvml = Nvml.open(g.bus_id)
        if nvml and nvml.driver_version:
            g.driver = f"driver {nvml.driver_version}, {g.driver}"
        return g, None


class Nvml:
    """Device memory in use, from NVML (what nvidia-smi shows), polled by a thread."""

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    @staticmethod
    def open(bus_id):
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return None
            n = Nvml()
            n.lib = lib
            n.handle = ctypes.c_void_p()
            if bus_id is None or lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id, ctypes.byref(n.handle)) != 0:
                if lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(n.handle)) != 0:
                    return None
            buf = ctypes.create_string_buffer(96)
            n.driver_version = buf.value.decode() if lib.nvmlSystemGetDriverVersion(buf, 96) == 0 else None
            return n
        except (OSError, AttributeError):
            return None

    def used(self):
        m = Nvml.Memory()
        return m.used if self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(m)) == 0 else None


class PeakMonitor:
    """Highest device memory in use while a child runs, less what was in use before it started."""

    def __init__(self, nvml, period_s=0.002):
        self.nvml, self.period = nvml, period_s
        self.base = nvml.used() if nvml else None
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            u = self.nvml.used()
            if u is not None:
                self.peak = max(self.peak, u)
            time.sleep(self.period)

    def __enter__(self):
        if self.nvml:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.nvml:
            self._thread.join()

    def result(self):
        return None if self.base is None else max(0, self.peak - self.base)


def find_cudart_dir():
    """Directory of NVIDIA's libcudart.so.13: the toolkit, the loader cache, or a pip wheel."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "lib64"))
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "targets", "x86_64-linux", "lib"))
    for top in ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-1*"), reverse=True):
        candidates += [os.path.join(top, "lib64"), os.path.join(top, "targets", "x86_64-linux", "lib")]
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    candidates += [os.path.dirname(m) for m in re.findall(r"libcudart\.so\.13 \(.*x86-64.*\) => (\S+)", out)]
    for p in sys.path:
        candidates += glob.glob(os.path.join(p, "nvidia", "cu13", "lib")) + \
                      glob.glob(os.path.join(p, "nvidia", "cuda_runtime", "lib"))
    for d in candidates:
        if os.path.exists(os.path.join(d, "libcudart.so.13")):
            return d
    return None




# ---- children: a time limit, and a failure that always says why ----

# Process groups of the children running now, killed if we are stopped. (No PR_SET_PDEATHSIG in a
# preexec_fn: that is not safe with the e2e part's threads, and a process group outlives its leader.)
_children = set()
_children_lock = threading.RLock()  # the signal handler takes it, maybe inside a holder


def stop_children(*_):
    """SIGTERM/SIGINT handler: end every child's process group, then leave. What was written to the
    results folder stays; the part that was running has no line there."""
    with _children_lock:
        for pgid in list(_children):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
    os._exit(143)


class Outcome:
    def __init__(self, rc, timed_out, seconds, stdout_path, stderr_path, timeout):
        self.rc, self.timed_out, self.seconds, self.timeout = rc, timed_out, seconds, timeout
        self.stdout_path, self.stderr_path = stdout_path, stderr_path

    @property
    def ok(self):
        return self.rc == 0 and not self.timed_out

    def stdout(self):
        with open(self.stdout_path, errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def tail(self, lines=8):
        """The last non-empty lines of stderr, or of stdout when stderr has none."""
        for text in (self.stderr(), self.stdout()):
            kept = [l.rstrip() for l in text.splitlines() if l.strip()]
            if kept:
                return [l[:300] for l in kept[-lines:]]
        return []

    def status(self):
        if self.timed_out:
            return f"timed out after {self.timeout:.0f} s (killed)"
        if self.rc < 0:
            try:
                return f"killed by signal {signal.Signals(-self.rc).name}"
            except ValueError:
                return f"killed by signal {-self.rc}"
        return f"exit status {self.rc}"

    def describe(self, lines=8):
        """One line saying why a child failed: never empty."""
        tail = self.tail(lines)
        return self.status() + ("; last lines: " + " / ".join(tail) if tail else "; it printed nothing")


def run_child(args, env, timeout, log_base, cwd=None):
    """Runs `args` with stdout/stderr into LOG_BASE.out/.err, killing its whole process group after
    `timeout` seconds."""
    out_path, err_path = log_base + ".out", log_base + ".err"
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as e:
            err.write(f"could not start {args[0]}: {e}\n".encode())
            return Outcome(127, False, 0.0, out_path, err_path, timeout)
        with _children_lock:
            _children.add(proc.pid)
        timed_out = False
        try:
            proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        finally:
            with _children_lock:
                _children.discard(proc.pid)
    return Outcome(proc.returncode, timed_out, time.monotonic() - t0, out_path, err_path, timeout)


# ---- statistics ----

def median_iqr(values):
    """(median, first quartile, third quartile) of `values`; the quartiles are None for fewer than 2."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    if len(values) < 2:
        return values[0], None, None
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q1, q3


def fmt_spread(values, unit_fn):
    med, q1, q3 = median_iqr(values)
    if med is None:
        return "—"
    if q1 is None:
        return unit_fn(med) + " (1 run)"
    return f"{unit_fn(med)} (IQR {unit_fn(q1)}–{unit_fn(q3)})"


# ---- the results folder ----

class Results:
    """The one owner of the results folder: results.jsonl gets one JSON object a line, appended as
    soon as a result is known (a run cut off keeps every finished line), and table.md is rewritten
    whole (to a temporary file, then renamed) after each."""

    def __init__(self, out_dir, header, table_fn):
        self.dir = out_dir
        os.makedirs(out_dir, exist_ok=True)
        self.jsonl = os.path.join(out_dir, "results.jsonl")
        self.table_path = os.path.join(out_dir, "table.md")
        self.header = header            # lines above the tables (device, plan)
        self.table_fn = table_fn        # records -> markdown
        self.records = []
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        with open(self.jsonl, "w"):
            pass

    def add(self, **record):
        record.setdefault("status", "pass")
        if record["status"] != "pass" and not record.get("message"):
            record["message"] = "no reason recorded (a bug in gpu-validate)"
        record["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        line = (json.dumps(record) + "\n").encode()
        with self.lock:
            fd = os.open(self.jsonl, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, line)  # one write: a line is either whole or absent
            finally:
                os.close(fd)
            self.records.append(record)
            self.write_table()
        return record

    def write_table(self):
        tmp = self.table_path + ".tmp"
        with open(tmp, "w") as f:
            f.write("\n".join(self.header) + "\n\n" + self.table_fn(self.records) + "\n")
        os.replace(tmp, self.table_path)

    def failures(self):
        return [r for r in self.records if r["status"] in ("fail", "timeout")]


def md_row(cells):
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def md_table(head, rows):
    return "\n".join([md_row(head), "|" + "---|" * len(head)] + [md_row(r) for r in rows])
