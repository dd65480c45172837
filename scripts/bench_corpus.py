"""The trace-corpus section of docs/benchmarks.md (scripts/bench --corpus): every bench/traces
trace replayed by gpushim-analyze under PyTorch's allocator rules and the shim's pools."""
import gzip
import json
import os
import shutil
import subprocess

from bench_common import ROOT, tree_version

CORPUS_BEGIN = "<!-- corpus:begin (scripts/bench --corpus rewrites this section) -->"
CORPUS_END = "<!-- corpus:end -->"


GPU_RECORDED = {"h200_transformer_caching", "h200_transformer_vmm", "h100_transformer_caching", "h100_transformer_vmm",
                "h200_steptime_caching", "h200_steptime_vmm", "h200_steptime_vmm_run7"}  # bench/traces/README.md


def corpus_replays(bench, policies):
    """Replays every bench/traces/*.trace.gz under PyTorch's allocator (both settings) and the
    shim's pools, with the device's GPU time modelled (replay --gpu-time model) and, beside it,
    instant. Returns (columns, rows): columns are (label, policy, --set overrides); rows are
    (trace, steps, {label: model device dict}, {label: instant device dict}, backlog source)."""
    tool = os.path.join(bench.bin, "gpushim-analyze")
    folder = os.path.join(ROOT, "bench", "traces")
    traces = sorted(f for f in os.listdir(folder) if f.endswith(".trace.gz"))
    if bench.args.quick and traces:  # a smoke run: the smallest trace shows every column works
        traces = [min(traces, key=lambda f: os.path.getsize(os.path.join(folder, f)))]
    columns = [("pytorch", "pytorch", []), ("pytorch-expandable", "pytorch-expandable", [])]
    if "caching" in policies:
        columns.append(("caching", "caching", []))
        if "GPUSHIM_QUARANTINE" in bench.variables():
            columns.append(("caching, GPUSHIM_QUARANTINE=0", "caching", ["--set", "GPUSHIM_QUARANTINE=0"]))
    # Today's vmm on every trace: one recorded before GPUSHIM_VMM_REUSE existed would otherwise replay
    # as the pool that ran it (its calibration and the model's check against the GPU still do).
    vmm_today = ["--set", "GPUSHIM_VMM_REUSE=stream-order"] if "GPUSHIM_VMM_REUSE" in bench.variables() else []
    if "vmm" in policies:
        columns.append(("vmm", "vmm", vmm_today))
    # What `gpushim run` makes of a PyTorch job (its cudaMallocAsync backend): every free stream-ordered.
    for p in ("caching", "vmm"):
        if p in policies:
            columns.append((f"{p}, stream-ordered", p, ["--stream-ordered"] + (vmm_today if p == "vmm" else [])))
    rows = []
    for name in traces:
        path = os.path.join(bench.tmp, name[:-3])
        with gzip.open(os.path.join(ROOT, "bench", "traces", name)) as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        steps = None
        summary = subprocess.run([tool, "summary", path, "--json"], capture_output=True, text=True)
        if summary.returncode == 0:
            try:
                steps = int(json.loads(summary.stdout).get("iterations"))
            except (ValueError, TypeError):
                steps = None
        results = {"model": {}, "instant": {}}
        backlog = ""
        # One replay command per distinct --set and GPU time: the policies without overrides share one run.
        groups = {}
        for label, policy, sets in columns:
            groups.setdefault(tuple(sets), []).append((label, policy))
        for gpu_time in ("model", "instant"):
            for sets, members in groups.items():
                args = [tool, "replay", path, "--json", "--gpu-time", gpu_time, *sets]
                for _, policy in members:
                    args += ["--policy", policy]
                doc = json.loads(bench.run(args, bench.env()))
                for (label, _), pol in zip(members, doc["policies"]):
                    d = pol["devices"][0] if pol.get("available", True) and pol["devices"] else None
                    results[gpu_time][label] = d
                    if d and gpu_time == "model" and not backlog:
                        backlog = d.get("backlog_source", "")
        os.unlink(path)
        rows.append((name[:-len(".trace.gz")], steps, results["model"], results["instant"], backlog))
    return columns, rows


def render_corpus(columns, rows, started):
    L = [CORPUS_BEGIN, "## Trace corpus: PyTorch's allocator and gpushim's pools on real models (issues 16, 27)", ""]
    add = L.append
    add(f"Written by `scripts/bench --corpus` on {started:%Y-%m-%d %H:%M} UTC, tree {tree_version()}. Every "
        "trace of bench/traces (seven real models recorded on the CPU, see *The trace corpus* below, and six "
        "traces of PyTorch transformer jobs recorded under gpushim on H200s and an H100, "
        "bench/traces/README.md) replayed by "
        "`gpushim-analyze replay` on an unbounded simulated device, with the device's GPU time modelled "
        "(`--gpu-time model`: freed memory becomes idle when the device has run the work queued before the "
        "free, after the backlog named under the table; docs/trace-format.md) and, after the arrow, with an "
        "infinitely fast device (`--gpu-time instant`, what this table measured before issue 27). Each cell: "
        "peak reserved, then utilization = peak requested / peak reserved, then the device synchronizations "
        "the policy paid in all and, in parentheses, in the steady state (from the second step mark on; "
        "PyTorch's: cudaFree and the stream syncs before unmapping, on OOM or empty_cache only), then the "
        "fence waits (the host waited for the work before one fence; model only). "
        "`pytorch` and `pytorch-expandable` are the replay's own implementation of PyTorch's CUDA caching "
        "allocator rules (default settings; `expandable_segments:True`), analysis/pytorch_policy.h; they "
        "reuse a block on its stream at once (stream order), record no event, and so are the same under "
        "every GPU time. The corpus's plain cudaMalloc/cudaFree pairs reach the shim's pools as plain frees "
        "(a fence per epoch), as a program calling cudaFree would; under `gpushim run` PyTorch's tensors are "
        "stream-ordered instead (the H200 traces), which the `, stream-ordered` columns replay "
        "(`replay --stream-ordered`: every free a cudaFreeAsync on its recorded stream).")
    add("")
    labels = [c[0] for c in columns]
    add("| trace | peak requested | " + " | ".join(labels) + " |")
    add("|---|---|" + "---|" * len(labels))
    util = {l: [] for l in labels}
    vs_pytorch = {l: [] for l in labels}
    bars = []
    for name, steps, results, instant, backlog in rows:
        requested = next((d["peak_requested"] for d in results.values() if d), 0)
        cells = []
        for l in labels:
            d = results.get(l)
            if d is None:
                cells.append("n/a")
                continue
            u = requested / d["peak_reserved"] if d["peak_reserved"] else 1.0
            util[l].append(u)
            base = results.get("pytorch")
            if base and base["peak_reserved"]:
                vs_pytorch[l].append(d["peak_reserved"] / base["peak_reserved"])
            oom = ", **OOM**" if d.get("oom") else ""
            steady = d.get("steady_state_synchronizes")
            syncs = f"{d['synchronizes']}" + (f" ({steady})" if steady is not None else "")
            i = instant.get(l)
            after = ""
            if i:
                iu = requested / i["peak_reserved"] if i["peak_reserved"] else 1.0
                after = f" → {i['peak_reserved'] / 2**20:.0f} MiB · {iu:.3f}"
            cells.append(f"{d['peak_reserved'] / 2**20:.0f} MiB · {u:.3f} · {syncs} · {d.get('fence_waits', 0)}{oom}{after}")
        label = f"{name} ({steps} steps)" if steps else name
        if name in GPU_RECORDED:
            label += ", recorded on a GPU"
        add(f"| {label} | {requested / 2**20:.1f} MiB | " + " | ".join(cells) + " |")
        p, e = results.get("pytorch"), results.get("pytorch-expandable")
        for suffix in ("", ", stream-ordered"):
            c, v = results.get("caching" + suffix), results.get("vmm" + suffix)
            if c and p and v and e:
                vu = requested / v["peak_reserved"] if v["peak_reserved"] else 1.0
                remaps = "n/a (no step marks)"
                if v.get("steady_state_maps") is not None:
                    remaps = (f"{v['steady_state_maps']} / {v['steady_state_unmaps']} "
                              f"({e.get('steady_state_maps', 0)} / {e.get('steady_state_unmaps', 0)})")
                bars.append((label + (" (stream-ordered)" if suffix else ""), c["peak_reserved"] <= p["peak_reserved"],
                             c["peak_reserved"] / p["peak_reserved"], v["peak_reserved"] <= e["peak_reserved"],
                             v["peak_reserved"] / e["peak_reserved"], vu,
                             all((d.get("steady_state_synchronizes") or 0) == 0 for d in (c, v)), remaps))
    add("| utilization (model), range | | " + " | ".join(
        f"{min(util[l]):.3f} – {max(util[l]):.3f}" if util[l] else "n/a" for l in labels) + " |")
    add("| reserved ÷ pytorch's (model), range | | " + " | ".join(
        f"{min(vs_pytorch[l]):.2f} – {max(vs_pytorch[l]):.2f}" if vs_pytorch[l] else "n/a" for l in labels) + " |")
    add("")
    add("Device backlog the model used, per trace:")
    add("")
    for name, _, _, _, backlog in rows:
        add(f"- {name}: {backlog or 'n/a'}")
    add("")
    if bars:
        add("Issue 27's bars under the model (caching ≤ pytorch; vmm ≤ pytorch-expandable; vmm utilization ≥ "
            "0.95; no device synchronization in the steady state, caching and vmm). The last column is not a bar: "
            "vmm's `cuMemMap` / `cuMemUnmap` calls in the steady state (from the second step mark on), "
            "pytorch-expandable's in parentheses. The replay does not count an unmap as a synchronization "
            "(CUDA does not say whether `cuMemUnmap` waits for the device; the simulated driver counts one): "
            "what they cost in step time is for a GPU to measure.")
        add("")
        add("| trace | caching ÷ pytorch | vmm ÷ pytorch-expandable | vmm utilization | steady syncs 0 | "
            "vmm steady maps / unmaps (pytorch-expandable's) |")
        add("|---|---|---|---|---|---|")
        for label, cok, cr, vok, vr, vu, sok, remaps in bars:
            mark = lambda ok: "yes" if ok else "**no**"
            add(f"| {label} | {cr:.3f} {mark(cok)} | {vr:.3f} {mark(vok)} | {vu:.3f} {mark(vu >= 0.95)} | {mark(sok)} | "
                f"{remaps} |")
        add("")
    add(CORPUS_END)
    return "\n".join(L) + "\n"
