#!/usr/bin/env python3
"""Writes torch_memory_summary.txt: what PyTorch's own torch.cuda.memory_summary() prints for the
statistics in torch_memory_summary.json (device 0). The figures go through PyTorch's code itself,
not a copy of it: give the path of torch/cuda/memory.py of the PyTorch to match (2.x: "KiB" units,
11 blocks); its memory_summary function is taken out of that file and run with memory_stats()
answering from the JSON, so no CUDA and no torch import is needed.

  tests/unit/data/gen_torch_memory_summary.py PATH/TO/torch/cuda/memory.py

The golden file was made from PyTorch main at commit 00b65a04a2d3 (2025); analysis's
render_torch_table must print it byte for byte (tests/unit/torch_summary_test.cpp)."""
import ast
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
source = open(sys.argv[1]).read()
func = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "memory_summary")
func.args.args[0].annotation = None  # the "Device" annotation names a type only torch defines
func.returns = None
with open(os.path.join(here, "torch_memory_summary.json")) as f:
    stats = json.load(f)
scope = {"memory_stats": lambda device=None: stats, "_get_device_index": lambda device, optional=False: device}
exec(compile(ast.Module(body=[func], type_ignores=[]), sys.argv[1], "exec"), scope)
with open(os.path.join(here, "torch_memory_summary.txt"), "w") as f:
    f.write(scope["memory_summary"](0))
