"""K1 benchmark on one GPU at full per-rank shapes: `rows()` returns one dict per step
shape, for `mono bench kda` (helper "tools" wraps it) or `python -m mono_kernels_kimi.kda.bench`.

Each row: K1's time under CUDA graph replay; the bytes K1 must move (weights, AttnRes
sources, caches read and every per-token state written, outputs) over the device copy
bandwidth measured in the same run (the memory floor); the op-by-op path's time under
graph replay and the ratio. The op-by-op path is the fastest stock-like path buildable
without vLLM: cuBLAS GEMMs (in_proj, f_b) and torch.compile'd elementwise stages (AttnRes,
conv update, recurrence, gated norm) from `reference` -- not eager torch.
"""

from __future__ import annotations

import argparse
import json

import torch

from ..config import KimiK3Config
from . import reference
from .inputs import make_inputs
from .runner import KdaRunner

SHAPES = ((1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (1, 4), (1, 8))


def _graph_time_us(fn, iters: int, warmup: int = 3) -> float:
    """Mean time of one `fn()` replayed from a CUDA graph of `fn` (captured once)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(warmup):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read + written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = _graph_time_us(lambda: dst.copy_(src), iters)
    return 2 * nbytes / (us * 1e-6)


def k1_bytes(cfg: KimiK3Config, R: int, L: int, num_blocks: int) -> int:
    """Bytes K1 must read and write at least once."""
    S, H, P, D, NH = R * L, cfg.hidden_size, cfg.local_proj, cfg.kda_head_dim, cfg.local_heads
    weights = 2 * (3 * H + cfg.in_proj_rows * H + P * cfg.f_a_dim + D) + 4 * (3 * P * 4 + NH + P)
    attn_res = 2 * S * H * (2 + num_blocks) + 2 * S * H  # prefix, delta, blocks; prefix out
    state = 4 * NH * D * D * (R + S)  # one state read a request, one written a token
    conv = 2 * 3 * P * (R * 3 + R * (2 + L))  # window read, new entries written
    return weights + attn_res + state + conv + 2 * S * P


def _op_by_op(cfg: KimiK3Config, inp):
    """The stock chain for `inp`'s shape as one torch.compile'd function: inductor keeps
    the GEMMs on cuBLAS (extern mm) and fuses the elementwise stages around them."""
    num_blocks, write_idx, L = inp.num_blocks, inp.write_idx, inp.L

    def chain(prefix, delta, blocks, weights, conv_state, state, state_indices, num_accepted, out):
        out.copy_(
            reference.kda_layer(
                cfg,
                prefix=prefix,
                delta=delta,
                blocks=blocks,
                num_blocks=num_blocks,
                write_idx=write_idx,
                w=weights,
                conv_state=conv_state,
                state=state,
                state_indices=state_indices,
                num_accepted=num_accepted,
                L=L,
                exact=False,
            )
        )

    compiled = torch.compile(chain, dynamic=False)
    return lambda: compiled(
        inp.prefix,
        inp.delta,
        inp.blocks,
        inp.weights,
        inp.conv_state,
        inp.state,
        inp.state_indices,
        inp.num_accepted,
        inp.out,
    )


def _launch(runner: KdaRunner, inp) -> None:
    runner(
        inp.R,
        prefix=inp.prefix,
        delta=inp.delta,
        blocks=inp.blocks,
        num_blocks=inp.num_blocks,
        write_idx=inp.write_idx,
        weights=inp.weights,
        conv_state=inp.conv_state,
        state=inp.state,
        state_indices=inp.state_indices,
        num_accepted=inp.num_accepted,
        out=inp.out,
    )


def rows(shapes=SHAPES, iters: int = 200, layer_idx: int = 13, baseline: bool = True) -> list[dict]:
    """One dict per (R, L): k1_us, bytes, floor_us, pct_of_floor (floor / k1), and, with
    `baseline`, op_by_op_us and speedup (op_by_op / k1)."""
    cfg = KimiK3Config()
    bw = copy_bandwidth()
    weights = make_inputs(cfg, 1, 1, device="cuda").weights
    out = []
    for R, L in shapes:
        inp = make_inputs(
            cfg, R, L, layer_idx=layer_idx, device="cuda", weights=weights, spare_slots=64
        )
        runner = KdaRunner(cfg, "cuda", L)  # compiles the one build at the first call

        def k1(inp=inp, runner=runner):
            _launch(runner, inp)

        k1_us = _graph_time_us(k1, iters)
        runner.check()
        plain = KdaRunner(cfg, "cuda", L, prefetch_items=0)
        k1_plain_us = _graph_time_us(lambda inp=inp, plain=plain: _launch(plain, inp), iters)
        plain.check()
        nbytes = k1_bytes(cfg, R, L, inp.num_blocks)
        floor_us = nbytes / bw * 1e6
        row = dict(
            R=R,
            L=L,
            S=R * L,
            k1_us=round(k1_us, 2),
            bytes=nbytes,
            copy_GBps=round(bw / 1e9, 1),
            floor_us=round(floor_us, 2),
            pct_of_floor=round(100 * floor_us / k1_us, 1),
            k1_no_prefetch_us=round(k1_plain_us, 2),
        )
        if baseline:
            try:
                base_us = _graph_time_us(_op_by_op(cfg, inp.clone()), iters)
                row.update(op_by_op_us=round(base_us, 2), speedup=round(base_us / k1_us, 2))
            except Exception as err:  # a compiler failure must not hide the K1 figures
                row["op_by_op_error"] = f"{type(err).__name__}: {str(err)[:300]}"
        out.append(row)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument(
        "--shapes",
        default=",".join(f"{r}x{n}" for r, n in SHAPES),
        help="comma-separated RxL step shapes",
    )
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    for row in rows(shapes, iters=args.iters, baseline=not args.no_baseline):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
