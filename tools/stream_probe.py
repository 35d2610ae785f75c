"""How fast one persistent program streams weights: the engine's `stream_rows` in a grid of
P programs that take items (BN weight rows x KI columns) in turn, as a fused decode kernel
does, against the same items in a grid of one program an item. A fused kernel runs one or
two programs an SM, so its stages stream at P x (one program's rate): this table says
which tile, depth, warp count and item length give a program the most bytes a second.

    PYTHONPATH=... python3 tools/stream_probe.py [--formats bf16,mxfp4] [--quick]

Each variant compiles in a pool of processes first (Triton's cache), then all are timed one
after another in this process (graph replay, 4 weights of 16384 x 8192 a replay, more than
the L2), each checked against the one-program-an-item result.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl
from mono_runtime.stream.bench import random_weight
from mono_runtime.stream.device import prefetch_l2, stream_row_pair, stream_rows
from mono_runtime.stream.layout import StreamFormat
from mono_runtime.timing import graph_time

N, K = 16384, 8192


@triton.jit
def probe_kernel(
    w,
    ws,
    x,
    y,
    P,
    N: tl.constexpr,
    KROW: tl.constexpr,
    S: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    KI: tl.constexpr,
    FMT: tl.constexpr,
    STAGES: tl.constexpr,
    PREFETCH: tl.constexpr,
    PAIR: tl.constexpr,
):
    """Items (row block, K part) taken round-robin by P programs; an item's partial sum goes
    to y[part]. PREFETCH asks L2 for the program's next item before streaming this one;
    PAIR streams two row blocks an item in one loop (`stream_row_pair`)."""
    PARTS: tl.constexpr = KROW // KI
    NITEMS: tl.constexpr = N // BN // (2 if PAIR else 1) * PARTS
    pid = tl.program_id(0)
    for it in range(pid, NITEMS, P):
        rb = it // PARTS
        part = it % PARTS
        if PREFETCH:
            nx = it + P
            if nx < NITEMS:
                nrb = nx // PARTS
                npart = nx % PARTS
                if FMT == 1:
                    base = (
                        w.to(tl.pointer_type(tl.int8))
                        + ((nrb * (BN // 16)).to(tl.int64) * (KROW // 32) + npart * (KI // 32))
                        * 256
                    )
                    prefetch_l2(base, (KROW // 32) * 256, (KI // 32) * 256, BN // 16, False)
                else:
                    base = (
                        w.to(tl.pointer_type(tl.int8))
                        + ((nrb * BN).to(tl.int64) * KROW + npart * KI) * 2
                    )
                    prefetch_l2(base, KROW * 2, KI * 2, BN, False)
        t = tl.arange(0, 16)
        if PAIR:
            a, b = stream_row_pair(
                w, ws, x, 2 * rb * BN, (2 * rb + 1) * BN, part * KI, KI // BK, KROW, BN, BK,
                S, FMT, STAGES, False, True,
            )  # fmt: skip
            n = 2 * rb * BN + tl.arange(0, BN)
            tl.store(y + part * (16 * N) + t[None, :] * N + n[:, None], a, mask=t[None, :] < S)
            n += BN
            tl.store(y + part * (16 * N) + t[None, :] * N + n[:, None], b, mask=t[None, :] < S)
        else:
            acc = stream_rows(
                w, ws, x, rb * BN, part * KI, KI // BK, KROW, BN, BK, S, FMT, STAGES, False, True
            )
            n = rb * BN + tl.arange(0, BN)
            tl.store(y + part * (16 * N) + t[None, :] * N + n[:, None], acc, mask=t[None, :] < S)


@dataclass(frozen=True)
class Variant:
    fmt: str
    bn: int
    bk: int
    stages: int
    warps: int
    ki: int
    programs: int  # 0: one program an item
    prefetch: bool = False
    pair: bool = False

    @property
    def items(self) -> int:
        return N // self.bn // (2 if self.pair else 1) * (K // self.ki)

    @property
    def grid(self) -> int:
        return self.items if self.programs == 0 else min(self.programs, self.items)


TILES = {  # format: (bn, bk, stages) a tile
    "bf16": [(64, 128, 4), (128, 128, 3), (64, 256, 3), (128, 64, 6)],
    "mxfp4": [(64, 256, 3), (128, 256, 3), (64, 512, 2), (128, 128, 6)],
}


def variants(
    formats, quick: bool, tiles: str = "", grids=(0, 132, 264, 528), pair: bool = False
) -> list[Variant]:
    """Every tile x warps x item length x grid; `tiles` ("bf16:16x512x3,mxfp4:32x256x4")
    replaces the default tiles; `pair` adds each tile streamed two row blocks an item."""
    table = {f: list(t) for f, t in TILES.items()}
    if tiles:
        table = {f: [] for f in table}
        for spec in tiles.split(","):
            fmt, dims = spec.split(":")
            table[fmt].append(tuple(int(d) for d in dims.split("x")))
    out = []
    for fmt in formats:
        for (bn, bk, st), warps, ki, p in itertools.product(
            table[fmt][: 2 if quick else None], (4, 8), (2048, 8192), grids
        ):
            if ki % bk or (bn < 128 and warps == 8):
                continue
            out.append(Variant(fmt, bn, bk, st, warps, ki, p))
            if pair:
                out.append(Variant(fmt, bn, bk, st, warps, ki, p, pair=True))
            if p and ki == 2048 and not tiles:
                out.append(Variant(fmt, bn, bk, st, warps, ki, p, True))
    return out


def _launch(v: Variant, w, ws, x, y):
    probe_kernel[(v.grid,)](
        w,
        w if ws is None else ws,
        x,
        y,
        v.grid,
        N=N,
        KROW=K,
        S=x.shape[0],
        BN=v.bn,
        BK=v.bk,
        KI=v.ki,
        FMT=int(StreamFormat[v.fmt.upper()]),
        STAGES=v.stages,
        PREFETCH=v.prefetch,
        PAIR=v.pair,
        num_warps=v.warps,
    )


def _data(fmt: str, rows: int, copies: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    f = StreamFormat[fmt.upper()]
    ws = [random_weight(f, N, K, g) for _ in range(copies)]
    x = torch.randn(rows, K, generator=g, device="cuda").to(torch.bfloat16)
    return ws, x


def _compile(job: tuple[Variant, int]) -> str:
    v, rows = job
    weights, x = _data(v.fmt, rows, 1)
    w, s = weights[0]
    y = torch.empty(K // v.ki, 16, N, device="cuda")
    try:
        _launch(v, w, s, x, y)
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # noqa: BLE001 - a variant that does not compile is a row, not a crash
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", default="bf16,mxfp4")
    p.add_argument("--rows", default="1,16")
    p.add_argument("--quick", action="store_true", help="two tiles a format")
    p.add_argument("--tiles", default="", help="e.g. bf16:16x512x3,mxfp4:32x256x4")
    p.add_argument("--pair", action="store_true", help="also two row blocks an item")
    p.add_argument("--grids", default="0,132,264,528", help="programs (0: one an item)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1))
    a = p.parse_args(argv)
    grids = tuple(int(g) for g in a.grids.split(","))
    vs = variants(a.formats.split(","), a.quick, a.tiles, grids, a.pair)
    jobs = [(v, int(r)) for r in a.rows.split(",") for v in vs]
    ctx = torch.multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(a.jobs, mp_context=ctx) as pool:
        errors = dict(zip(jobs, pool.map(_compile, jobs), strict=True))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows_out = []
    for rows in (int(r) for r in a.rows.split(",")):
        for fmt in a.formats.split(","):
            weights, x = _data(fmt, rows, 4)
            nbytes = sum(t.numel() * t.element_size() for w in weights for t in w if t is not None)
            ref = None
            for v in (v for v in vs if v.fmt == fmt):
                if errors[v, rows]:
                    print(f"{v}: {errors[v, rows]}", flush=True)
                    continue
                y = torch.empty(K // v.ki, 16, N, device="cuda")

                def run(v=v, y=y, weights=weights, x=x):
                    for w, s in weights:
                        _launch(v, w, s, x, y)

                run()
                out = y[:, :rows].sum(0)
                if ref is None:
                    ref = out.clone()
                err = ((out - ref).norm() / ref.norm()).item()
                us = graph_time(run, reps=10, warmup=2) * 1e6
                row = dict(
                    asdict(v),
                    rows=rows,
                    us=round(us / 4, 2),
                    tbs=round(nbytes / us / 1e6, 3),
                    gbs_program=round(nbytes / us / 1e3 / min(v.grid, sms * 8), 2),
                    err=err,
                )
                rows_out.append(row)
                flags = (" pf" if v.prefetch else "   ") + (" pair" if v.pair else "     ")
                print(
                    f"S={rows} {fmt:5} bn{v.bn:3} bk{v.bk:3} st{v.stages} w{v.warps} ki{v.ki:4} "
                    f"P={v.grid:5}{flags}: "
                    f"{row['us']:8.2f} us {row['tbs']:.2f} TB/s "
                    f"{row['gbs_program']:6.2f} GB/s a program  err {err:.1e}",
                    flush=True,
                )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows_out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
