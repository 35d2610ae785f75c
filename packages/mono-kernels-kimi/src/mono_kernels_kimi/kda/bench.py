"""K1 benchmark on one GPU at full per-rank shapes, reading from HBM: `rows()` returns one
dict per step shape, for `mono bench kda` (helper "tools" wraps it) or
`python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,8x1,1x8 --layers 8` (prints a table).

A timed graph is one step, as in serving (one epoch bump, as the FFN's and K2's benches
do), of `layers` launches, each on a DIFFERENT layer's weights, caches and
AttnRes sources (one layer's in_proj alone is 90 MB, about the L2 size): the weights one
graph reads are several times the L2 (column `l2_x`), as in a decode step, so no launch
finds its weights left in the cache by the previous replay. Each row: K1's time a launch
under CUDA graph replay; the bytes K1 must move (weights, AttnRes sources, caches read
and every per-token state written, outputs) over the device copy bandwidth measured in
the same run (the memory floor); the op-by-op path's time over the same layers and the
ratio. The op-by-op path is the fastest stock-like path buildable without vLLM: cuBLAS
GEMMs (in_proj, f_b) and torch.compile'd elementwise stages (AttnRes, conv update,
recurrence, gated norm) from `reference` -- not eager torch.

`--timeline DIR` instead shows where a launch's time goes: per shape, each item's program,
start and end (a timeline build of the same plan), as a per-stage table and a picture.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch
from mono_runtime.report import fixed_width
from mono_runtime.runner import MonoRunner
from mono_runtime.timing import copy_bandwidth, graph_time

from ..config import KimiK3Config
from . import reference
from .inputs import LayerInputs, make_inputs, make_weights
from .runner import KdaRunner, runner_bytes
from .spec import MAX_ROWS

SHAPES = ((1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (1, 2), (1, 4), (1, 8), (2, 8))
MAX_LAYERS = 64


def layer_weights(cfg: KimiK3Config, layers: int, device, seed: int = 0) -> list[dict]:
    """`layers` distinct weight sets: the small weights from `make_weights` (copied per
    layer, so each layer reads its own), in_proj drawn on the device (fast at full size)."""
    device = torch.device(device)
    small = make_weights(cfg, device, torch.Generator().manual_seed(seed))
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(layers):
        w = {k: v.clone() for k, v in small.items()}
        w["in_proj"] = (
            torch.randn(
                cfg.in_proj_rows, cfg.hidden_size, generator=g, device=device, dtype=torch.bfloat16
            )
            * cfg.hidden_size**-0.5
        )
        w["in_proj"][cfg.in_proj_rows_unpadded :] = 0
        out.append(w)
    return out


def per_layer(inp: LayerInputs, weights: list[dict]) -> list[LayerInputs]:
    """One copy of `inp`'s activations and caches for each weight set: every layer reads
    and writes its own state, as each KDA layer of the model does."""
    bare = replace(inp, weights={})
    return [replace(bare.clone(), weights=w) for w in weights]


def k1_bytes(cfg: KimiK3Config, R: int, L: int, num_blocks: int) -> int:
    """Bytes K1 must read and write at least once."""
    S, H, P, D, NH = R * L, cfg.hidden_size, cfg.local_proj, cfg.kda_head_dim, cfg.local_heads
    weights = 2 * (3 * H + cfg.in_proj_rows * H + P * cfg.f_a_dim + D) + 4 * (3 * P * 4 + NH + P)
    attn_res = 2 * S * H * (2 + num_blocks) + 2 * S * H  # prefix, delta, blocks; prefix out
    state = 4 * NH * D * D * (R + S)  # one state read a request, one written a token
    conv = 2 * 3 * P * (R * 3 + R * (2 + L))  # window read, new entries written
    return weights + attn_res + state + conv + 2 * S * P


def _op_by_op(cfg: KimiK3Config, inp):
    """The stock chain for `inp`'s shape as one torch.compile'd function, run on any
    layer's inputs of that shape (one compile): inductor keeps the GEMMs on cuBLAS (extern
    mm) and fuses the elementwise stages around them."""
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

    def run(x: LayerInputs):
        compiled(
            x.prefix,
            x.delta,
            x.blocks,
            x.weights,
            x.conv_state,
            x.state,
            x.state_indices,
            x.num_accepted,
            x.out,
        )

    return run


def _per_launch_us(launch, layers: list[LayerInputs], iters: int, begin=None) -> float:
    """Microseconds a launch: a graph of one `launch` per layer (after one `begin`: a
    step's epoch bump), over the layer count."""

    def graph():
        if begin is not None:
            begin()
        for x in layers:
            launch(x)

    return graph_time(graph, reps=iters) * 1e6 / len(layers)


def check_shapes(shapes, layers: int) -> list[tuple[int, int]]:
    """Bad arguments fail here, before anything is allocated or compiled."""
    shapes = [tuple(s) for s in shapes]
    if not shapes:
        raise ValueError("shapes: none given")
    for s in shapes:
        if len(s) != 2 or not all(isinstance(v, int) and v >= 1 for v in s):
            raise ValueError(f"shape {s}: expected (requests, L), both integers >= 1")
        if s[0] * s[1] > MAX_ROWS:
            raise ValueError(f"shape {s[0]}x{s[1]}: K1 serves at most {MAX_ROWS} rows a step")
    if not isinstance(layers, int) or not 1 <= layers <= MAX_LAYERS:
        raise ValueError(f"layers {layers!r}: must be 1..{MAX_LAYERS}")
    return shapes


def rows(
    shapes=SHAPES,
    iters: int = 50,
    layer_idx: int = 13,
    baseline: bool = True,
    layers: int = 8,
) -> list[dict]:
    """One dict per (R, L): k1_us, bytes, floor_us, pct_of_floor (floor / k1), l2_x (bytes
    one graph reads over the L2 size; under ~4 the cache flatters K1), and with `baseline`
    op_by_op_us and speedup (op_by_op / k1). Times are medians over `iters` replays."""
    shapes = check_shapes(shapes, layers)
    cfg = KimiK3Config()
    bw = copy_bandwidth("cuda")
    l2 = getattr(torch.cuda.get_device_properties("cuda"), "L2_cache_size", 0)
    weights = layer_weights(cfg, layers, "cuda")
    out = []
    for R, L in shapes:
        inp = make_inputs(
            cfg, R, L, layer_idx=layer_idx, device="cuda", weights=weights[0], spare_slots=64
        )
        each = per_layer(inp, weights)
        del inp
        # the graph's launches are one step's, as a forward's K1 layers are: one epoch bump
        # a graph (a runner of its own would bump it at every launch, a kernel of its own)
        mono = MonoRunner(torch.device("cuda"), None, 0, 1, *runner_bytes(cfg, "cuda", L, 1))
        runner = KdaRunner(cfg, "cuda", L, runner=mono)  # compiles its build at the first call
        try:
            k1_us = _per_launch_us(
                lambda x, runner=runner: runner(x.R, **x.k1_kwargs()),
                each,
                iters,
                begin=runner.step_begin,
            )
            runner.check()
        finally:
            runner.close()
            mono.close()
        nbytes = k1_bytes(cfg, R, L, each[0].num_blocks)
        floor_us = nbytes / bw * 1e6
        row = dict(
            R=R,
            L=L,
            S=R * L,
            layers=layers,
            k1_us=round(k1_us, 2),
            bytes=nbytes,
            copy_GBps=round(bw / 1e9, 1),
            floor_us=round(floor_us, 2),
            pct_of_floor=round(100 * floor_us / k1_us, 1),
            l2_x=round(layers * nbytes / l2, 1) if l2 else None,
        )
        if baseline:
            try:
                base_us = _per_launch_us(_op_by_op(cfg, each[0]), each, iters)
                row.update(op_by_op_us=round(base_us, 2), speedup=round(base_us / k1_us, 2))
            except Exception as err:  # a compiler failure must not hide the K1 figures
                row["op_by_op_error"] = f"{type(err).__name__}: {str(err)[:300]}"
        out.append(row)
        del each
        torch.cuda.empty_cache()
    return out


def timelines(
    shapes=SHAPES,
    layers: int = 8,
    layer_idx: int = 13,
    out=None,
    cfg: KimiK3Config | None = None,
    device: str = "cuda",
    **tiling,
) -> dict[tuple[int, int], list[dict]]:
    """Per (R, L), the item timeline of the launch on the last of `layers` layers, in the
    second round over them (a warm clock and caches), eager: printed per stage, and a
    picture in `out` (a folder) when given. Returns the rows by shape. `cfg`, `device`
    and `tiling` exist for a CPU check at tiny shapes."""
    from mono_runtime.timeline import show

    shapes = check_shapes(shapes, layers)
    cfg = cfg or KimiK3Config()
    weights = layer_weights(cfg, layers, device)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
    got = {}
    for R, L in shapes:
        inp = make_inputs(
            cfg, R, L, layer_idx=layer_idx, device=device, weights=weights[0], spare_slots=64
        )
        each = per_layer(inp, weights)
        del inp
        runner = KdaRunner(cfg, device, L, timeline=True, **tiling)
        try:
            for _ in range(2):
                for x in each:
                    runner(R, **x.k1_kwargs())
            runner.check()
            got[R, L] = runner.timeline()
        finally:
            runner.close()
        show(
            got[R, L],
            f"K1 timeline {R}x{L} (S={R * L}; the last launch; us from its first item)",
            None if out is None else f"{out}/timeline-k1-{R}x{L}.png",
            f"K1, {R}x{L} (S = {R * L})",
        )
    return got


COLUMNS = (
    ("R", "{}"),
    ("L", "{}"),
    ("k1_us", "{:.1f}"),
    ("bytes", "{:.3g}"),
    ("floor_us", "{:.1f}"),
    ("pct_of_floor", "{:.1f}"),
    ("l2_x", "{:.1f}"),
    ("op_by_op_us", "{:.1f}"),
    ("speedup", "{:.2f}"),
)


def table(rows: list[dict]) -> str:
    """The rows as fixed-width text, one line each; baseline failures after the table."""
    notes = []
    if rows:
        notes.append(
            f"copy bandwidth {rows[0]['copy_GBps']} GB/s; {rows[0]['layers']} layers a graph"
        )
    notes += [
        f"{r['R']}x{r['L']}: op-by-op failed: {r['op_by_op_error']}"
        for r in rows
        if "op_by_op_error" in r
    ]
    return fixed_width(rows, COLUMNS, notes)


def _parse_shapes(text: str) -> list[tuple[int, ...]]:
    try:
        return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"--shapes {text!r}: expected RxL pairs such as 1x1,8x1,1x8") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50, help="timed replays (median)")
    parser.add_argument(
        "--layers",
        type=int,
        default=8,
        help="distinct layers' weights and caches a timed graph rotates over",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the op-by-op path")
    parser.add_argument("--json", action="store_true", help="one JSON row a line")
    parser.add_argument(
        "--timeline", metavar="DIR", help="instead: each shape's item timeline, pictures in DIR"
    )
    parser.add_argument(
        "--shapes",
        default=",".join(f"{r}x{n}" for r, n in SHAPES),
        help=f"comma-separated RxL step shapes (R requests of L rows, R*L <= {MAX_ROWS})",
    )
    args = parser.parse_args(argv)
    try:
        shapes = check_shapes(_parse_shapes(args.shapes), args.layers)
        if args.iters < 1:
            raise ValueError(f"--iters {args.iters}: must be >= 1")
    except ValueError as err:
        parser.error(str(err))
    if args.timeline:
        timelines(shapes, args.layers, out=args.timeline)
        return 0
    got = rows(
        shapes,
        iters=args.iters,
        baseline=not args.no_baseline,
        layers=args.layers,
    )
    print("\n".join(json.dumps(r) for r in got) if args.json else table(got))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
