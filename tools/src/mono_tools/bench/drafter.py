"""`mono bench drafter`: the Kimi-K3 DSpark drafter (5 draft layers and the final norm, one
launch a step) at a TP8 rank's shapes on one GPU, through the kernel package's own
benchmark (`mono_kernels_kimi.drafter.bench.bench`): the kernel and its op-by-op path
under graph replay, and the copy bandwidth of the same run. `--rows` are requests (1..8,
one launch); each is measured at every context length of CONTEXTS, a point's case."""

from __future__ import annotations

import argparse

from mono_tools.bench.results import BenchResult, of_layer_rows
from mono_tools.machine import Machine

BASELINE = "op-by-op (reference, cuBLAS bf16 + torch.compile)"
CONTEXTS = (1024, 8192, 32768)  # cached tokens a request: short, typical, long


def measure(args: argparse.Namespace, machine: Machine) -> BenchResult:
    from mono_kernels_kimi.drafter import bench

    rows = bench.bench(requests=tuple(args.rows), contexts=CONTEXTS)
    settings = {
        "model": "Kimi-K3 DSpark drafter",
        "layer": "5 draft layers (MLA + MLP) and the final norm, one launch",
        "shapes": "a TP8 rank's heads and MLP columns at TP 1; 7 query tokens a request",
        "rows": "requests; the case is the context length (cached tokens a request)",
    }
    device = machine.gpu_name or "gpu"
    return of_layer_rows(
        "drafter", "mono drafter (triton)", device, rows, BASELINE, settings, case=("context",)
    )
