"""`mono bench k2`: Kimi-K3's K2 (o_proj, all-reduce, MLP AttnRes, the latent MoE, shared
experts, final all-reduce) at a TP8 rank's o_proj and expert widths on one GPU, through the
kernel package's own benchmark (`mono_kernels_kimi.k2.bench.bench`): the kernel and its
op-by-op path under graph replay, and the copy bandwidth of the same run."""

from __future__ import annotations

import argparse

from mono_tools.bench.results import BenchResult, Point, rotation
from mono_tools.machine import Machine

BASELINE = "op-by-op (cuBLAS + grouped GEMM + torch.compile)"


def measure(args: argparse.Namespace, machine: Machine) -> BenchResult:
    from mono_kernels_kimi.k2 import bench

    rows = bench.bench(rows=tuple(args.rows))
    notes = {f"rows {r['rows']}": r["note"] for r in rows if r.get("note")}
    return BenchResult(
        kernel="k2",
        kernel_label="mono K2 (triton, mxfp4-rot)",
        device=machine.gpu_name or "gpu",
        copy_gbps=float(rows[0]["copy_tbps"]) * 1e3,
        points=[
            Point(
                rows=r["rows"],
                kernel_us=float(r["kernel_us"]),
                baselines_us={} if r["opbyop_us"] is None else {BASELINE: float(r["opbyop_us"])},
                bytes_moved=int(r["bytes"]),
            )
            for r in rows
        ],
        settings={
            "model": "Kimi-K3",
            "layer": "K2 (o_proj to the MoE output)",
            "shapes": "a TP8 rank's o_proj and experts at TP 1; router, latent and up whole",
            **rotation(rows),
            **({"baseline failures": notes} if notes else {}),
        },
    )
