#!/usr/bin/env python3
"""A small PyTorch training job as users write them (scripts/gpu-validate runs it on a GPU).

    python3 train.py --steps 60 [--warmup 5] [--leak] --out result.json

A 4-layer transformer language model (d_model 512, 8 heads, FFN 2048, vocabulary 8,000, batch 16,
AdamW): the job of the real-GPU traces in bench/traces, whose sequence length cycles through eight
values every step (128, 384, 256, 512, 64, 320, 448, 192). With --leak every step also keeps a slice
of its hidden state in a list that is never cleared (0.5-4 MiB a step): the planted leak that
gpushim must name at its line (the line marked "planted leak" below) within 60 steps.

It is started the way users start jobs: plain `python3 train.py` (native PyTorch, or with
PYTORCH_CUDA_ALLOC_CONF set), `LD_PRELOAD=.../libgpushim.so python3 train.py`, or through the
launcher `gpushim run -- python3 train.py`. The result (JSON): each step's wall time (each step ends
with a device synchronization), the losses, torch.cuda's own peaks, and the shim's figures when it
is loaded (gpushim_get_device_stats).
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from shim_stats import shim_stats

SEQUENCE_CYCLE = (128, 384, 256, 512, 64, 320, 448, 192)
VOCAB, D_MODEL, HEADS, LAYERS, BATCH = 8000, 512, 8, 4, 16

kept = []  # the planted leak: hidden-state slices nobody frees


class LanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens):
        hidden = self.enc(self.emb(tokens))
        return hidden, self.head(hidden)


def train_step(model, opt, tokens, leak):
    hidden, logits = model(tokens[:, :-1])
    if leak:
        kept.append(hidden[:4].detach().clone())  # planted leak
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the median step time")
    ap.add_argument("--leak", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(args.seed)
    model = LanguageModel().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    step_ms, losses = [], []
    torch.cuda.synchronize(device)
    for i in range(args.steps):
        t0 = time.perf_counter()
        tokens = torch.randint(0, VOCAB, (BATCH, SEQUENCE_CYCLE[i % len(SEQUENCE_CYCLE)] + 1), generator=gen,
                               device=device)
        loss = train_step(model, opt, tokens, args.leak)
        losses.append(loss.item())  # synchronizes: the step's time is what the device took
        step_ms.append((time.perf_counter() - t0) * 1000)
    free, total = torch.cuda.mem_get_info(device)
    measured = sorted(step_ms[args.warmup:]) or sorted(step_ms)
    result = {"steps": args.steps, "warmup": args.warmup, "leak": args.leak, "torch": torch.__version__,
              "step_ms": step_ms, "median_step_ms": measured[len(measured) // 2], "losses": losses,
              "leaked_bytes": sum(t.numel() * t.element_size() for t in kept), "leaked_count": len(kept),
              "device_used_end": total - free, "device_total": total,
              "torch_max_reserved": torch.cuda.max_memory_reserved(device),
              "torch_max_allocated": torch.cuda.max_memory_allocated(device),
              "shim": shim_stats(device.index)}
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
