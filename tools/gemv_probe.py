"""One engine GEMV shape and tile on a GPU, for Nsight Compute or a quick timing: 4 random
16384 x 8192 weights (more than the L2) in the layout of FORMAT, one launch each, then,
with --time, us a GEMV under graph replay. `tools/gpu_session.sh gemvprof` runs it under
`ncu` to read whether the loop is bound by issue or by memory (docs/PERFORMANCE.md).

    PYTHONPATH=... python3 tools/gemv_probe.py mxfp4 --bn 64 --bk 256 --stages 3 [--time]
"""

from __future__ import annotations

import argparse

import torch
from mono_runtime.stream.bench import random_weight
from mono_runtime.stream.gemv import GemvTiles, gemv
from mono_runtime.stream.layout import StreamFormat
from mono_runtime.timing import graph_time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("format", choices=[f.name.lower() for f in StreamFormat])
    p.add_argument("--shape", default="16384x8192", help="NxK")
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--bn", type=int, default=64)
    p.add_argument("--bk", type=int, default=256)
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--split", type=int, default=4)
    p.add_argument("--time", action="store_true", help="also print us a GEMV (graph replay)")
    a = p.parse_args(argv)
    fmt = StreamFormat[a.format.upper()]
    n, k = (int(d) for d in a.shape.split("x", 1))
    tiles = GemvTiles(bn=a.bn, bk=a.bk, split=a.split, stages=a.stages, warps=4)
    g = torch.Generator(device="cuda").manual_seed(0)
    weights = [random_weight(fmt, n, k, g) for _ in range(4)]
    x = torch.randn(a.rows, k, generator=g, device="cuda").to(torch.bfloat16)
    parts = torch.empty(a.split, 16, n, dtype=torch.float32, device="cuda")

    def run():
        for w, s in weights:
            gemv(w, s, x, fmt, tiles, parts)

    run()
    torch.cuda.synchronize()
    if a.time:
        us = graph_time(run, reps=10, warmup=2) / len(weights) * 1e6
        print(f"{a.format} {n}x{k} S={a.rows} {tiles}: {us:.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
