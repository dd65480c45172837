#!/usr/bin/env python3
"""PyTorch workloads of the GPU validation suite (scripts/gpu-validate runs them).

One workload per process, so that each allocator configuration starts clean:

    python3 torch_workloads.py WORKLOAD --steps 60 --warmup 10 --seed 0 --out result.json

Workloads:
    transformer   small transformer LM training, sequence length varying every step (64..1024), with
                  a one-rank NCCL all-reduce of the gradients so that NCCL's memory is in the run
    cnn           small convolutional network training on 64x64 images
    leak          MLP training with a planted leak: keep_for_later() holds a 4 MiB tensor per step
    multistream   work handed to a side stream with record_stream, freed while the side stream may
                  still read it, and new tensors allocated at once on the main stream
    graph         a training step captured once in a CUDA graph, then replayed

The result (JSON) has the per-step wall times (each step ends with a device synchronization), the
per-step losses (bitwise comparable across allocators on the same seed: deterministic algorithms,
data from a CPU generator), the device memory in use at the end (cudaMemGetInfo), and, when the
process runs under the shim, its figures (gpushim_get_device_stats).

--device cpu runs the same code on the CPU (no streams, no graphs): a check of the script itself
on a machine without a GPU.
"""
import argparse
import ctypes
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from shim_stats import shim_stats

LEAK_BYTES_PER_STEP = 4 << 20
_kept = []  # what keep_for_later() leaks


def keep_for_later(t):
    """The planted leak: looks like a debugging aid someone forgot to remove."""
    _kept.append(t.detach().clone())


def deterministic(seed):
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # warn_only: an op without a deterministic kernel warns instead of failing; the loss comparison
    # across allocators then shows whether it mattered.
    torch.use_deterministic_algorithms(True, warn_only=True)


def data_generator(args, device):
    """Random data made on the device itself (cheap, so steps time the model, not the host), from
    a seeded generator: the same data in every run."""
    return torch.Generator(device=device).manual_seed(args.seed)


class Steps:
    """Times steps: each ends with a synchronization, so a step's time is what the device took."""

    def __init__(self, device):
        self.device = device
        self.ms = []
        self.losses = []
        self.used_at_step_end = []

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self, steps, step_fn):
        self.sync()
        for i in range(steps):
            t0 = time.perf_counter()
            loss = step_fn(i)
            self.sync()
            self.ms.append((time.perf_counter() - t0) * 1000)
            self.losses.append(float(loss))
            if self.device.type == "cuda":
                free, total = torch.cuda.mem_get_info(self.device)
                self.used_at_step_end.append(total - free)


def start_nccl(device):
    """A one-rank NCCL process group, so that NCCL's own device memory exists in the run (the suite
    reports what the shim sees of it). Returns (all_reduce function or None, note)."""
    if device.type != "cuda":
        return None, "no NCCL on the CPU"
    try:
        import socket
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_nccl_available():
            return None, "this torch has no NCCL"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)

        def all_reduce(params):
            for p in params:
                if p.grad is not None:
                    dist.all_reduce(p.grad)
        return all_reduce, "NCCL all-reduce of the gradients (one rank)"
    except Exception as e:  # the run goes on without NCCL, and says why
        return None, f"NCCL unavailable: {type(e).__name__}: {e}"


def transformer(args, device, steps):
    vocab, d_model, heads, layers, batch = 1000, 256, 8, 4, 16
    layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True)
    model = nn.ModuleDict({"emb": nn.Embedding(vocab, d_model), "enc": nn.TransformerEncoder(layer, layers),
                           "head": nn.Linear(d_model, vocab)}).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    lengths_gen = torch.Generator().manual_seed(args.seed)
    top = max(1, args.max_seq // 64)
    lengths = [64 * int(torch.randint(1, top + 1, (1,), generator=lengths_gen)) for _ in range(args.steps)]
    gen = data_generator(args, device)
    all_reduce, nccl_note = start_nccl(device) if args.nccl else (None, "NCCL off (--no-nccl)")

    def step(i):
        tokens = torch.randint(0, vocab, (batch, lengths[i] + 1), generator=gen, device=device)
        x = model["enc"](model["emb"](tokens[:, :-1]))
        logits = model["head"](x)
        loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if all_reduce:
            all_reduce(model.parameters())
        opt.step()
        return loss.item()

    steps.run(args.steps, step)
    return {"sequence_lengths": lengths, "nccl": nccl_note}


def cnn(args, device, steps):
    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.MaxPool2d(2))

    model = nn.Sequential(block(3, 32), block(32, 64), block(64, 128), nn.Flatten(), nn.Linear(128 * 8 * 8, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
    gen = data_generator(args, device)

    def step(i):
        images = torch.randn(64, 3, 64, 64, generator=gen, device=device)
        labels = torch.randint(0, 10, (64,), generator=gen, device=device)
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    steps.run(args.steps, step)
    return {}


def leak(args, device, steps):
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    gen = data_generator(args, device)

    def step(i):
        x = torch.randn(256, 1024, generator=gen, device=device)
        h = model[1](model[0](x))          # 256 x 4096 floats: 4 MiB
        keep_for_later(h)
        loss = model[2](h).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    steps.run(args.steps, step)
    return {"leaked_bytes": len(_kept) * LEAK_BYTES_PER_STEP, "leaked_count": len(_kept),
            "leak_function": "keep_for_later"}


def multistream(args, device, steps):
    if device.type != "cuda":
        return {"skipped": "needs CUDA streams"}
    side = torch.cuda.Stream(device)
    main = torch.cuda.current_stream(device)
    gen = data_generator(args, device)
    w = torch.randn(2048, 2048, generator=gen, device=device) / 45.0

    def step(i):
        a = torch.randn(2048, 2048, generator=gen, device=device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            y = (a @ w).relu() @ w    # reads `a` on the side stream
        a.record_stream(side)
        del a                          # freed while the side stream may still be reading it
        # New memory on the main stream at once: an allocator that reused `a` too early would
        # let this fill overwrite what the side stream reads, and the checksum would change.
        junk = [torch.full((2048, 2048), float(i + k), device=device) for k in range(4)]
        main.wait_stream(side)
        y.record_stream(main)
        checksum = y.double().sum().item()
        del junk
        return checksum

    steps.run(args.steps, step)
    return {}


def graph(args, device, steps):
    if device.type != "cuda":
        return {"skipped": "needs CUDA graphs"}
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    gen = data_generator(args, device)
    static_x = torch.zeros(128, 512, device=device)
    static_y = torch.zeros(128, 512, device=device)
    # Warm up on a side stream before capture, as the CUDA graphs documentation asks.
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(static_x), static_y).backward()
    torch.cuda.current_stream(device).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = F.mse_loss(model(static_x), static_y)
        static_loss.backward()
        opt.step()

    def step(i):
        static_x.copy_(torch.randn(128, 512, generator=gen, device=device))
        static_y.copy_(torch.randn(128, 512, generator=gen, device=device))
        g.replay()
        return static_loss.item()

    steps.run(args.steps, step)
    return {}


WORKLOADS = {"transformer": transformer, "cnn": cnn, "leak": leak, "multistream": multistream, "graph": graph}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-seq", type=int, default=1024, help="transformer: longest sequence (multiple of 64)")
    ap.add_argument("--no-nccl", dest="nccl", action="store_false",
                    help="transformer: no one-rank NCCL all-reduce of the gradients")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        # "cuda" names no device, and set_device refuses that (PyTorch 2.11: "Expected a
        # torch.device with a specified index"): it means the current one.
        if device.index is not None:
            torch.cuda.set_device(device.index)
        device = torch.device("cuda", torch.cuda.current_device())
    deterministic(args.seed)
    steps = Steps(device)
    extra = WORKLOADS[args.workload](args, device, steps)
    result = {"workload": args.workload, "steps": args.steps, "warmup": args.warmup, "seed": args.seed,
              "device": str(device), "torch": torch.__version__, "step_ms": steps.ms, "losses": steps.losses,
              "used_at_step_end": steps.used_at_step_end, **extra}
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        result["device_used_end"] = total - free
        result["device_total"] = total
        result["torch_max_reserved"] = torch.cuda.max_memory_reserved(device)
        result["torch_max_allocated"] = torch.cuda.max_memory_allocated(device)
        result["shim"] = shim_stats(device.index)
    with open(args.out, "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    sys.stderr.flush()
    if args.workload == "leak":
        # Leave through C's exit(): the shim writes its report from an atexit handler, and Python's
        # own finalization (which would free the leaked tensors first) is skipped, as when a job
        # holding a leak ends.
        ctypes.CDLL(None).exit(0)


if __name__ == "__main__":
    main()
