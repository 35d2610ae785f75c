"""`mono bench ffn`: MiniMax-M3's FFN tail (seam, router, routed and shared experts, the
in-kernel all-reduces) at a TP4 rank's shapes on one GPU, through the kernel package's own
benchmark (`mono_kernels_minimax.ffn.bench.bench`): the kernel and its op-by-op path under
graph replay, and the copy bandwidth of the same run."""

from __future__ import annotations

import argparse

from mono_tools.bench.results import BenchResult, of_layer_rows
from mono_tools.machine import Machine

BASELINE = "op-by-op (cuBLAS + grouped GEMM + torch.compile)"


def measure(args: argparse.Namespace, machine: Machine) -> BenchResult:
    from mono_kernels_minimax.ffn import bench

    formats = args.format or ("mxfp4",)
    rows = bench.bench(rows=tuple(args.rows), formats=formats, engine=args.engine)
    for r in rows:  # a format's build: the engine its runner took and the packed layout
        r["build"] = f"{r['engine']} {r['layout']}"
    settings = {
        "model": "MiniMax-M3",
        "layer": "FFN tail",
        "shapes": "one TP4 rank's, launched at TP 1",
    }
    device = machine.gpu_name or "gpu"
    return of_layer_rows(
        "ffn", "mono FFN", device, rows, BASELINE, settings, case=("format", "build")
    )
