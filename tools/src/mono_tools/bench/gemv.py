"""`mono bench gemv`: the weight-streaming engine's GEMV (`mono_runtime.stream.gemv`) per
weight format, beside cuBLAS's bf16 GEMV (torch.matmul) on the same shapes, through the
runtime's own benchmark (`mono_runtime.stream.bench.measure`): each timed graph rotates
over several times the L2 of weights, at a projection's shape and at a layer-size one, and
the copy bandwidth is measured in the same run."""

from __future__ import annotations

import argparse

from mono_tools.bench.results import BenchResult, Point
from mono_tools.errors import CommandFailed
from mono_tools.machine import Machine

CUBLAS = "cuBLAS bf16"
BASELINE_ROWS = "cublas-bf16"  # stream.bench's name of cuBLAS's rows


def measure(args: argparse.Namespace, machine: Machine) -> BenchResult:
    from mono_runtime.stream import bench

    return result_of(bench.measure(rows=tuple(args.rows)), args.format, machine)


def result_of(out: dict, formats: tuple[str, ...] | None, machine: Machine) -> BenchResult:
    """The BenchResult of `stream.bench.measure`'s figures (its rows name formats as
    StreamFormat does, lower case): a point per (shape, format, rows) of `formats` (every
    format measured when None), cuBLAS's time at that shape and rows beside it."""
    cublas = {_at(r): r["us"] for r in out["rows"] if r["format"] == BASELINE_ROWS}
    points, failed, errors, layers = [], {}, {}, {}
    for r in out["rows"]:
        name = r["format"]
        if name == BASELINE_ROWS or formats is not None and name not in formats:
            continue
        shape = f"{r['n']}x{r['k']}"
        where = f"{shape} {name}"
        if "error" in r:
            failed[f"{where} S={r['rows']}"] = r["error"]
            continue
        baseline = {CUBLAS: cublas[_at(r)]} if _at(r) in cublas else {}
        points.append(Point(r["rows"], r["us"], baseline, r["bytes"], (shape, name)))
        errors[where] = max(errors.get(where, 0.0), r["rel_err"])
        layers[where] = r["layers"]
    if not points:
        raise CommandFailed(f"bench gemv: no format ran; {failed}")
    return BenchResult(
        kernel="gemv",
        kernel_label="mono GEMV",
        device=machine.gpu_name or "gpu",
        copy_gbps=out["copy_bytes_per_s"] / 1e9,
        points=points,
        settings={
            "what": "y[S, N] = x[S, K] @ W[N, K]^T, weights streamed in the format's layout",
            "bytes": "the weight's values and scales (x and y are noise beside them)",
            "layers a timed graph": layers,
            "relative error vs float64 (largest)": errors,
            **({"failures": failed} if failed else {}),
        },
        case_names=("N x K", "format"),
    )


def _at(row: dict) -> tuple[int, int, int]:
    return row["n"], row["k"], row["rows"]
