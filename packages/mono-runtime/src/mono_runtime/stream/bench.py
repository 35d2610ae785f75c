"""Benchmark of the streaming engine's GEMV on one GPU, beside cuBLAS's bf16 GEMV.

Each timed graph runs one GEMV per layer over `layers` distinct weights of one layer's
shape (N x K), so the graph reads several times the L2, as a decode step does. Figures,
all from one run: us per GEMV, TB/s of weight bytes (values + scales) read, and that as %
of the copy bandwidth measured in the same run. Kernels only: the K parts' sum (a torch
op here; the fused kernels sum in-kernel) is not timed. `--variants` times every tile variant in
`VARIANTS` (a tuning table, not a guess); the default times the chosen tiles only.

    python3 -m mono_runtime.stream.bench --rows 1,4,16 [--variants] [--json FILE]
        [--formats mxfp4,...] [--shapes 1536x6144,...]
"""

from __future__ import annotations

import argparse
import json

import torch

from ..timing import copy_bandwidth, graph_time
from .frag import pack_mxfp4_frag
from .frag8 import pack_fp8_frag
from .gemv import GemvTiles, gemv
from .layout import (
    BF16,
    FP8_B128,
    FP8_FRAG,
    MXFP4_FRAG,
    MXFP4_K32,
    MXFP4_ROT,
    StreamFormat,
    dequantize,
    pack_mxfp4_rot,
)

CHOSEN = {
    BF16: GemvTiles(bn=64, bk=128, split=4, stages=4, warps=4),
    FP8_B128: GemvTiles(bn=64, bk=128, split=4, stages=5, warps=4),
    # bn 64, 3 stages: H200 12.38 / 7.88 us on 6144 x 6144 / 1536 x 6144 at S = 1 against
    # 14.92 / 9.68 with bn 128, 4 stages (stop 34), 30.92 against 31.18 on 16384 x 8192
    MXFP4_ROT: GemvTiles(bn=64, bk=256, split=4, stages=3, warps=4),
    MXFP4_K32: GemvTiles(bn=64, bk=256, split=4, stages=4, warps=4),
    # H200 stop 35, kernel only: 22.45 / 8.33 us on 16384 x 8192 / 6144 x 6144 at S = 1
    # (77% / 59% of copy) against 23.97 / 8.63 with 3 stages, 25.33 / 10.80 with split 2
    MXFP4_FRAG: GemvTiles(bn=64, bk=256, split=4, stages=2, warps=4),
    # the same bytes a step as mxfp4-frag's (not yet timed on a GPU)
    FP8_FRAG: GemvTiles(bn=64, bk=128, split=4, stages=3, warps=4),
}


def _grid(items):
    return [
        GemvTiles(bn=bn, bk=bk, split=sp, stages=st, warps=wp, asm=asm)
        for bn, bk, sp, st, wp, asm in items
    ]


VARIANTS = {  # (bn, bk, split, stages, warps, asm); the H200 runs in docs/PERFORMANCE.md
    BF16: _grid(
        (
            (128, 128, 4, 4, 4, True),
            (64, 128, 4, 4, 4, True),
            (64, 128, 8, 4, 4, True),
            (32, 128, 8, 4, 4, True),
            (64, 256, 4, 3, 4, True),
            (128, 128, 4, 4, 8, True),
        )
    ),
    FP8_B128: _grid(
        (
            (128, 128, 4, 4, 4, True),
            (64, 128, 4, 5, 4, True),
            (64, 128, 8, 5, 4, True),
            (32, 128, 8, 5, 4, True),
        )
    ),
    MXFP4_ROT: _grid(
        (
            (128, 256, 4, 4, 4, True),
            (128, 256, 4, 4, 4, False),
            (128, 128, 4, 6, 4, True),
            (64, 256, 4, 4, 4, True),
            (64, 256, 4, 3, 4, True),  # the FFN's routed up tile
            (64, 512, 4, 3, 4, True),
            (128, 512, 4, 3, 4, True),
            (128, 256, 4, 4, 8, True),
        )
    ),
    MXFP4_K32: _grid(((64, 256, 4, 4, 4, True), (128, 256, 4, 4, 4, True))),
    MXFP4_FRAG: _grid(
        (
            (64, 256, 4, 2, 4, True),
            (64, 256, 4, 3, 4, True),
            (64, 256, 8, 2, 4, True),
            (64, 512, 2, 2, 4, True),
            (128, 256, 4, 2, 8, True),
            (128, 256, 4, 4, 4, True),
        )
    ),
    FP8_FRAG: _grid(
        (
            (64, 128, 4, 3, 4, True),
            (64, 128, 4, 4, 4, True),
            (64, 256, 4, 2, 4, True),
            (64, 256, 4, 3, 4, True),
            (128, 128, 4, 3, 4, True),
            (128, 128, 4, 3, 8, True),
        )
    ),
}


FORMATS = (BF16, FP8_B128, FP8_FRAG, MXFP4_ROT, MXFP4_FRAG, MXFP4_K32)


def weight_bytes(fmt: StreamFormat, n: int, k: int) -> int:
    if fmt == BF16:
        return 2 * n * k
    if fmt in (FP8_B128, FP8_FRAG):
        return n * k + 4 * -(-n // 128) * -(-k // 128)
    return n * k // 2 + n * k // 32


def random_weight(fmt: StreamFormat, n: int, k: int, g: torch.Generator):
    """(values, scales) of one N x K weight in `fmt`'s streamed layout, O(1/sqrt(K)) values."""
    dev = g.device
    if fmt == BF16:
        return (torch.randn(n, k, generator=g, device=dev) * k**-0.5).to(torch.bfloat16), None
    if fmt in (FP8_B128, FP8_FRAG):
        v = torch.randn(n, k, generator=g, device=dev).to(torch.float8_e4m3fn)
        s = torch.full((-(-n // 128), -(-k // 128)), k**-0.5, device=dev)
        return (pack_fp8_frag(v), s) if fmt == FP8_FRAG else (v, s)
    codes = torch.randint(0, 256, (n, k // 2), generator=g, device=dev, dtype=torch.uint8)
    scales = torch.randint(118, 123, (n, k // 32), generator=g, device=dev, dtype=torch.uint8)
    if fmt == MXFP4_K32:
        return codes, scales
    if fmt == MXFP4_FRAG:
        return pack_mxfp4_frag(codes, scales)
    return pack_mxfp4_rot(codes, scales, inplace=True)


def check(fmt, w, ws, x, tiles) -> float:
    """Relative error of the engine's GEMV against float64 on the dequantized weight."""
    ref = x.double() @ dequantize(w, ws, fmt).double().T
    y = gemv(w, ws, x, fmt, tiles)
    return ((y.double() - ref).norm() / ref.norm()).item()


def measure(
    rows=(1, 4, 16),
    shapes=((4096, 6144), (16384, 8192)),
    total_bytes=400 << 20,
    variants=False,
    device="cuda",
    formats=None,
) -> dict:
    """Rows of figures: every format of `formats` (default all; cuBLAS bf16 beside them) at
    each (N, K) of `shapes`; with `variants`, every tile variant at the first shape only."""
    formats = formats or FORMATS
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(0)
    copy = copy_bandwidth(device)
    out = {"copy_bytes_per_s": copy, "rows": []}
    for si, (n, k) in enumerate(shapes):
        _shape(out, rows, n, k, total_bytes, variants and si == 0, copy, g, device, formats)
    return out


def _shape(out, rows, n, k, total_bytes, variants, copy, g, device, formats) -> None:
    for fmt in formats:
        per = weight_bytes(fmt, n, k)
        layers = max(2, total_bytes // per)
        tiles_list = VARIANTS[fmt] if variants else [CHOSEN[fmt]]
        for tiles in tiles_list:
            ws_list = [random_weight(fmt, n, k, g) for _ in range(layers)]
            for s in rows:
                x = torch.randn(s, k, generator=g, device=device).to(torch.bfloat16)
                parts = torch.empty(tiles.split, 16, n, dtype=torch.float32, device=device)
                row = {
                    "format": fmt.name.lower(),
                    "tiles": tiles.__dict__,
                    "rows": s,
                    "n": n,
                    "k": k,
                    "layers": layers,
                    "bytes": per,
                }
                try:
                    row["rel_err"] = check(fmt, *ws_list[0], x, tiles)

                    def run(ws_list=ws_list, x=x, parts=parts, tiles=tiles, fmt=fmt):
                        for w, sc in ws_list:
                            gemv(w, sc, x, fmt, tiles, parts, sum_parts=False)

                    t = graph_time(run, reps=10, warmup=2) / layers
                    row.update(us=t * 1e6, tbps=per / t / 1e12, pct_copy=100 * per / t / copy)
                except Exception as e:  # a variant that fails to compile is a row, not a stop
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                out["rows"].append(row)
                print(_line(row), flush=True)
            del ws_list
    for s in rows:  # cuBLAS bf16 GEMV on the same shape, rotating over layers likewise
        layers = max(2, total_bytes // weight_bytes(BF16, n, k))
        ws_list = [random_weight(BF16, n, k, g)[0] for _ in range(layers)]
        x = torch.randn(s, k, generator=g, device=device).to(torch.bfloat16)
        t = graph_time(
            lambda x=x, ws_list=ws_list: [torch.matmul(x, w.T) for w in ws_list], reps=10, warmup=2
        )
        t /= layers
        per = weight_bytes(BF16, n, k)
        row = {
            "format": "cublas-bf16",
            "rows": s,
            "n": n,
            "k": k,
            "layers": layers,
            "bytes": per,
            "us": t * 1e6,
            "tbps": per / t / 1e12,
            "pct_copy": 100 * per / t / copy,
        }
        out["rows"].append(row)
        print(_line(row), flush=True)
        del ws_list


def _line(row: dict) -> str:
    t = row.get("tiles")
    tiles = (
        "bn{bn} bk{bk} sp{split} st{stages} w{warps}{a}".format(
            **t, a=" asm" if t["asm"] and row["format"].startswith("mxfp4") else ""
        )
        if t
        else ""
    )
    tiles = f"{row['n']}x{row['k']} {tiles}"
    if "error" in row:
        return f"{row['format']:12s} S={row['rows']:2d} {tiles:42s} ERROR {row['error']}"
    err = f" err {row['rel_err']:.1e}" if "rel_err" in row else ""
    return (
        f"{row['format']:12s} S={row['rows']:2d} {tiles:42s} {row['us']:8.2f} us "
        f"{row['tbps']:5.2f} TB/s {row['pct_copy']:5.1f}% of copy{err}"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,4,16")
    p.add_argument("--variants", action="store_true")
    p.add_argument("--json")
    p.add_argument("--formats", help="comma-separated names, e.g. mxfp4,mxfp4_k32")
    p.add_argument(
        "--shapes",
        default="4096x6144,16384x8192",
        help="comma-separated NxK weights; --variants times every tile at the first",
    )
    a = p.parse_args(argv)
    formats = a.formats and tuple(StreamFormat[n.upper()] for n in a.formats.split(","))
    rows = tuple(int(r) for r in a.rows.split(","))
    try:
        shapes = tuple(tuple(int(d) for d in x.split("x", 1)) for x in a.shapes.split(","))
    except ValueError:
        p.error(f"--shapes {a.shapes!r}: expected NxK[,NxK...], e.g. 1536x6144")
    if any(len(x) != 2 or min(x) < 1 for x in shapes):
        p.error(f"--shapes {a.shapes!r}: expected NxK[,NxK...] of positive sizes")
    out = measure(rows, shapes=shapes, variants=a.variants, formats=formats)
    print(f"copy bandwidth {out['copy_bytes_per_s'] / 1e12:.2f} TB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
