"""`mono bench kda`: Kimi-K3's K1 (one KDA layer, one TP rank of 8) at full per-rank shapes,
through the kernel package's own benchmark (`mono_kernels_kimi.kda.bench.rows`): K1 and
the torch.compile'd op-by-op chain under graph replay, copy bandwidth of the same run."""

from __future__ import annotations

import argparse

from mono_tools.bench.results import BenchResult, Point, rotation
from mono_tools.errors import UsageError
from mono_tools.machine import Machine

MAX_ROWS = 8  # K1 serves S <= 8 rows (its x rows live in one program's shared memory)
BASELINE = "op-by-op (cuBLAS + torch.compile)"


def measure(args: argparse.Namespace, machine: Machine) -> BenchResult:
    if args.format is not None:
        raise UsageError("--format: K1 reads bf16 weights only; leave it out for kda")
    too_many = [r for r in args.rows if r > MAX_ROWS]
    if too_many:
        raise UsageError(f"--rows {too_many}: K1 serves at most {MAX_ROWS} rows a step")
    from mono_kernels_kimi.kda import bench

    # r requests, one token each; the no-prefetch variant is not reported here: no compile
    rows = bench.rows(shapes=[(r, 1) for r in args.rows], no_prefetch=False)
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
