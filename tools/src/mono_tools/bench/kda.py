"""`mono bench kda`: Kimi-K3's K1 (one KDA layer, one TP rank of 8) at full per-rank shapes,
through the kernel package's own benchmark (`mono_kernels_kimi.kda.bench.rows`): K1 and
the torch.compile'd op-by-op chain under graph replay, copy bandwidth of the same run."""

from __future__ import annotations

import argparse

from mono_tools.bench.results import BenchResult, Point, rotation
from mono_tools.machine import Machine

BASELINE = "op-by-op (cuBLAS + torch.compile)"


def measure(args: argparse.Namespace, machine: Machine) -> BenchResult:
    from mono_kernels_kimi.kda import bench

    rows = bench.rows(shapes=[(r, 1) for r in args.rows])  # r requests, one token each
    return BenchResult(
        kernel="kda",
        kernel_label="mono K1 (triton)",
        device=machine.gpu_name or "gpu",
        copy_gbps=float(rows[0]["copy_GBps"]),
        points=[
            Point(
                rows=row["S"],
                kernel_us=float(row["k1_us"]),
                baselines_us={BASELINE: float(row["op_by_op_us"])} if "op_by_op_us" in row else {},
                bytes_moved=int(row["bytes"]),
            )
            for row in rows
        ],
        settings={
            "model": "Kimi-K3",
            "layer": "KDA (K1)",
            "tp": 8,
            "shape": "rows requests x 1 token",
            **rotation(rows),
            **{
                f"baseline failed at S={r['S']}": r["op_by_op_error"]
                for r in rows
                if "op_by_op_error" in r
            },
        },
    )
