"""`mono bench k2`: Kimi-K3's K2 (o_proj, all-reduce, MLP AttnRes, the latent MoE, shared
experts, final all-reduce) at a TP8 rank's o_proj and expert widths on one GPU, through the
kernel package's own benchmark (`mono_kernels_kimi.k2.bench.bench`): the kernel and its
op-by-op path under graph replay, and the copy bandwidth of the same run."""

from __future__ import annotations

import argparse

from mono_tools.bench.results import BenchResult, of_layer_rows
from mono_tools.machine import Machine

BASELINE = "op-by-op (cuBLAS + grouped GEMM + torch.compile)"


def measure(args: argparse.Namespace, machine: Machine) -> BenchResult:
    from mono_kernels_kimi.k2 import bench

    settings = {
        "model": "Kimi-K3",
        "layer": "K2 (o_proj to the MoE output)",
        "shapes": "a TP8 rank's o_proj and experts at TP 1; router, latent and up whole",
    }
    rows = bench.bench(rows=tuple(args.rows), engine=args.engine)
    label = f"mono K2 ({rows[0]['engine']}, {rows[0]['layout']})"
    return of_layer_rows("k2", label, machine.gpu_name or "gpu", rows, BASELINE, settings)
