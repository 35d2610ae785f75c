"""Benchmark of the FFN monokernel on one GPU, under CUDA graph replay, reading from HBM.

Shapes: a TP4 rank's (I = 768 per expert), launched at TP 1 (one GPU: the in-kernel
all-reduces reduce over this rank alone; their cross-GPU latency is the multigpu tier's).
A timed graph runs `layers` launches, each on a DIFFERENT layer's weights (own router, so
its own experts): the weights one graph reads are several times the L2 (column `l2_x`), as
in a decode step, so no launch finds its weights in the cache. Figures, all from one run:

- kernel_us: per launch, a graph of `layers` launches after one step_begin, divided;
- bytes: what a launch must read, averaged over the layers: the union of the experts its
  routing chose (the kernel's own choice, read back from an eager step), the shared
  expert, router, bias and norm weights, the step's activations;
- limit_pct: bytes / copy bandwidth (a device-to-device copy measured here, read + write)
  over kernel_us: the share of the memory limit the kernel reaches;
- opbyop_us, speedup: the op-by-op path of the same layers (graph-replayed, rotating over
  the same layers): a torch.compile'd add + Gemma norm, the fp32 router GEMM (cuBLAS), a
  torch.compile'd sigmoid/top-k/renormalize, one grouped GEMM per projection over the
  routed experts (torch._grouped_mm on bf16 copies of the expert weights: no library
  offers an MXFP4 or block-FP8 grouped GEMM here, so this path reads ~4x the expert bytes
  of MXFP4 and 2x those of FP8, which favours the kernel) and cuBLAS GEMMs for the shared
  expert;
- stock_us, stock_speedup (MXFP4, where the ``humming`` package imports): the same tail with
  the routed experts as vLLM 0.33 runs them on Hopper, HUMMING's MXFP4 GEMMs (stock.py),
  graph-replayed likewise; every baseline's time is also in `baselines_us` by label.

`bench(...)` returns a list of row dicts (`mono bench ffn` wraps it); from a shell:
`python3 -m mono_kernels_minimax.ffn.bench --rows 1,4,16 --formats mxfp4,fp8 --layers 12`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch
from mono_runtime.opbyop import bf16_copy, grouped_experts
from mono_runtime.report import layer_table
from mono_runtime.stream.layout import BF16, FP8_B128, MXFP4_K32, random_mxfp4_k32
from mono_runtime.timing import copy_bandwidth, graph_time

from ..config import MiniMaxM3Config
from ..formats import WeightFormat
from .reference import swiglu_oai
from .runner import FfnRunner
from .weights import FfnWeights

MAX_LAYERS = 64  # far below the 256 launches a step may tag apart
STOCK = "vLLM stock (HUMMING MXFP4 experts)"  # stock.STOCK_LABEL (stock.py imports this module)


def rank_config(tp: int = 4) -> MiniMaxM3Config:
    """MiniMax-M3 with one TP rank's expert width: a TP=1 launch of a TP `tp` rank's shapes."""
    cfg = MiniMaxM3Config()
    return replace(cfg, moe_intermediate_size=cfg.moe_intermediate_size // tp)


def random_layer(cfg: MiniMaxM3Config, fmt: WeightFormat, seed: int, device) -> FfnWeights:
    """One layer's random weights at TP 1, drawn on `device` directly in the stored format
    (random MXFP4 codes and e8m0 scales, random e4m3 values and block scales) instead of
    quantising fp32 weights: many full layers in seconds. Magnitudes keep activations O(1);
    the values themselves do not matter to the timing."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    spec = FfnWeights(fmt, *([None] * 11)).expected(cfg, 1)
    h = cfg.hidden_size

    def randn(shape, std, dtype=torch.float32):
        return (torch.randn(shape, generator=g, device=device, dtype=dtype) * std).to(dtype)

    made = {
        "norm": randn(spec["norm"][0], 0.1, torch.bfloat16),
        "router": randn(spec["router"][0], h**-0.5),
        "bias": randn(spec["bias"][0], 0.05),
    }
    k_of = {
        "w13": h,
        "w2": cfg.per_rank_intermediate(1),
        "shared_w13": h,
        "shared_w2": cfg.per_rank_shared_intermediate(1),
    }
    for name, k in k_of.items():
        (shape, dtype), (sshape, sdtype) = spec[name], spec[f"{name}_scale"]
        std = k**-0.5
        if dtype == torch.bfloat16:
            made[name], made[f"{name}_scale"] = randn(shape, std, torch.bfloat16), None
        elif dtype == torch.uint8:
            made[name], made[f"{name}_scale"] = random_mxfp4_k32(
                (*shape[:-1], 2 * shape[-1]), std, g, device
            )
        else:  # e4m3 values of std 1, fp32 block scales near the weight's std
            made[name] = randn(shape, 1.0, torch.bfloat16).to(dtype)
            made[f"{name}_scale"] = std * (
                0.75 + 0.5 * torch.rand(sshape, generator=g, device=device, dtype=sdtype)
            )
    w = FfnWeights(fmt, **made)
    w.validate(cfg, 1)
    return w


def bytes_read(cfg: MiniMaxM3Config, w: FfnWeights, ids: torch.Tensor, rows: int) -> int:
    """What one launch must read from memory for this step's routing."""
    experts = ids[ids >= 0].unique().numel()

    def per_expert(t):
        return 0 if t is None else t[0].numel() * t.element_size()

    n = experts * sum(per_expert(t) for t in (w.w13, w.w13_scale, w.w2, w.w2_scale))
    for t in (
        w.shared_w13,
        w.shared_w13_scale,
        w.shared_w2,
        w.shared_w2_scale,
        w.router,
        w.bias,
        w.norm,
    ):
        n += 0 if t is None else t.numel() * t.element_size()
    return n + 3 * rows * cfg.hidden_size * 2  # part, residual in; plus the output


_STREAMED = {WeightFormat.BF16: BF16, WeightFormat.MXFP4: MXFP4_K32, WeightFormat.FP8: FP8_B128}


def _bf16(w: FfnWeights, name: str) -> torch.Tensor:
    """bf16 copy of a weight of `w` (in the checkpoint layout: the copies are made before
    the runner packs the experts)."""
    fmt = w.fmt.shared_format if name.startswith("shared") else w.fmt
    return bf16_copy(getattr(w, name), getattr(w, f"{name}_scale"), _STREAMED[fmt])


class OpByOp:
    """The FFN tail of each of `layers` from library ops (see the module docstring),
    graph-capturable; `self(part, residual, layer)` runs one layer. Its routed experts are
    `_experts` and `routed` (stock.Stock replaces them)."""

    label = "op-by-op (cuBLAS + grouped GEMM + torch.compile)"

    def __init__(self, cfg: MiniMaxM3Config, layers: list[FfnWeights]):
        self.cfg = cfg
        self.layers = [
            dict(
                self._experts(w),
                sw13=_bf16(w, "shared_w13"),
                sw2=_bf16(w, "shared_w2"),
                norm=w.norm,
                router=w.router,
                bias=w.bias,
            )
            for w in layers
        ]
        self.seam = torch.compile(self._seam)
        self.route = torch.compile(self._route)
        self.act = torch.compile(lambda x: swiglu_oai(cfg, x.float()).to(torch.bfloat16))

    def _seam(self, part, residual, norm):
        x = part.float() + residual.float()
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)
        return (x * rstd * (norm.float() + 1.0)).to(torch.bfloat16), x.to(torch.bfloat16)

    def _route(self, logits, bias):
        scores = torch.sigmoid(logits)
        ids = torch.topk(scores + bias, self.cfg.top_k, dim=-1).indices
        wt = scores.gather(1, ids)
        return ids, wt / wt.sum(-1, keepdim=True) * self.cfg.routed_scaling_factor

    def _experts(self, w: FfnWeights) -> dict:
        """One layer's routed experts as `routed` reads them: bf16 copies."""
        return dict(w13=_bf16(w, "w13"), w2=_bf16(w, "w2"))  # [E, 2I, H], [E, H, I]

    def routed(self, x, ids, wt, w) -> torch.Tensor:
        """[S, H] routed output of the normed `x` for the routing (`ids`, `wt`)."""
        return grouped_experts(x, ids, wt, w["w13"], w["w2"], self.act)

    def routing(self, part, residual, layer: int = 0):
        """(normed, new residual, topk ids, topk weights) of one layer's step."""
        w = self.layers[layer]
        x, res = self.seam(part, residual, w["norm"])
        logits = torch.nn.functional.linear(x.float(), w["router"])
        return x, res, *self.route(logits, w["bias"])

    def __call__(self, part, residual, layer: int = 0):
        w = self.layers[layer]
        x, res, ids, wt = self.routing(part, residual, layer)
        routed = self.routed(x, ids, wt, w)
        shared = torch.nn.functional.linear(
            self.act(torch.nn.functional.linear(x, w["sw13"])), w["sw2"]
        )
        return (routed + shared.float()).to(torch.bfloat16), res


def _baselines(cfg: MiniMaxM3Config, fmt: WeightFormat, ws: list[FfnWeights]) -> list:
    """(label, path or None, why none) of each baseline of `fmt`, built from the layers `ws`
    in the checkpoint layout: the op-by-op path, then for MXFP4 the stock path (stock.py),
    which records why it is missing instead of failing the benchmark."""
    out = [(OpByOp.label, OpByOp(cfg, ws), None)]
    if fmt is not WeightFormat.MXFP4:
        return out
    label, why = STOCK, None
    try:
        from .stock import Stock, humming_missing

        why = humming_missing()
        if why is None:
            return [*out, (label, Stock(cfg, ws), None)]
    except Exception as err:  # noqa: BLE001 (recorded in the rows, not fatal)
        why = f"{type(err).__name__}: {err}"
    torch.cuda.empty_cache()  # what a failed conversion left
    return [*out, (label, None, f"stock path not built: {why}"[:300])]


def _eager_time(fn, reps: int = 20, warmup: int = 3) -> float:
    """Seconds per call of `fn` launched eagerly (median of `reps`), for a path that a CUDA
    graph cannot capture."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return sorted(times)[reps // 2]


def _time_baselines(bases, part, residual, layers: int) -> tuple[dict, list[str]]:
    """({label: seconds per layer}, notes) of each baseline, each over every layer under
    graph replay; a path that cannot be captured is timed eagerly, its label saying so."""
    times, notes = {}, []
    for label, base, why in bases:
        if base is None:
            notes.append(why)
            continue

        def run(b=base):
            return [b(part, residual, n) for n in range(layers)]

        try:
            times[label] = graph_time(run) / layers
            continue
        except Exception as err:  # noqa: BLE001 (reported in the row, not fatal)
            notes.append(f"{label}: graph capture failed: {type(err).__name__}: {err}"[:300])
        try:
            times[f"{label}, eager"] = _eager_time(run) / layers
        except Exception as err:  # noqa: BLE001
            notes.append(f"{label} failed: {type(err).__name__}: {err}"[:300])
    return times, notes


def _row(cfg, fmt, runner, bases, layers, s, copy, l2, g) -> dict:
    device = runner.device
    part = torch.randn(s, cfg.hidden_size, generator=g, device=device).to(torch.bfloat16)
    residual = torch.randn(s, cfg.hidden_size, generator=g, device=device).to(torch.bfloat16)
    slots = torch.arange(s, dtype=torch.int64, device=device)
    o, r = torch.empty_like(part), torch.empty_like(residual)

    def step(keep=None):
        runner.step_begin()
        for w in layers:
            runner(part, residual, w, slots, out=o, residual_out=r)
            if keep is not None:
                keep.append(runner.routing(s)[0].long().clone())

    ids: list[torch.Tensor] = []
    step(ids)  # eager: each layer's routing, as the kernel chose it
    runner.after_step()
    t_kernel = graph_time(step) / len(layers)
    runner.after_step()  # raises MonoFault if any wait of the replays gave up
    nbytes = [bytes_read(cfg, w, i, s) for w, i in zip(layers, ids, strict=True)]
    experts = [int(i[i >= 0].unique().numel()) + 1 for i in ids]
    times, notes = _time_baselines(bases, part, residual, len(layers))
    t_base = next((t for label, t in times.items() if label.startswith(OpByOp.label)), None)
    t_stock = next((t for label, t in times.items() if label.startswith(STOCK)), None)
    return dict(
        format=fmt.value,
        engine=runner.build_name,
        layout=runner.builds[s].layout,
        rows=s,
        layers=len(layers),
        kernel_us=t_kernel * 1e6,
        bytes=sum(nbytes) // len(layers),
        copy_tbps=copy / 1e12,
        limit_pct=100.0 * sum(nbytes) / copy / (t_kernel * len(layers)),
        l2_x=sum(nbytes) / l2 if l2 else None,
        opbyop_us=None if t_base is None else t_base * 1e6,
        speedup=None if t_base is None else t_base / t_kernel,
        stock_us=None if t_stock is None else t_stock * 1e6,
        stock_speedup=None if t_stock is None else t_stock / t_kernel,
        baselines_us={label: t * 1e6 for label, t in times.items()},
        experts_read=sum(experts) / len(experts),
        note="; ".join(notes) or None,
    )


def _check(rows, formats, layers) -> tuple[tuple[int, ...], list[WeightFormat]]:
    """Bad arguments fail here, before anything is allocated or compiled."""
    rows = tuple(rows)
    if not rows or any(
        not isinstance(s, int) or not 1 <= s <= MiniMaxM3Config.max_rows for s in rows
    ):
        raise ValueError(f"rows {rows}: each must be 1..{MiniMaxM3Config.max_rows}")
    if len(set(rows)) != len(rows):
        raise ValueError(f"rows {rows}: a row count appears twice")
    known = [f.value for f in WeightFormat]
    bad = [f for f in formats if f not in known]
    if bad or not formats:
        raise ValueError(f"formats {list(formats)}: each must be one of {known}")
    if not isinstance(layers, int) or not 1 <= layers <= MAX_LAYERS:
        raise ValueError(f"layers {layers!r}: must be 1..{MAX_LAYERS}")
    return rows, [WeightFormat(f) for f in formats]


def bench(
    rows=(1, 2, 4, 8, 16),
    formats=("mxfp4", "fp8"),
    layers: int = 12,
    device: str = "cuda",
    seed: int = 0,
    baseline: bool = True,
    engine: str | None = None,
) -> list[dict]:
    """One row per (format, S): kernel_us, bytes, copy_tbps, limit_pct, l2_x (bytes one
    graph reads over the L2 size; under ~4 the cache flatters the kernel), opbyop_us,
    speedup, stock_us, stock_speedup, baselines_us ({label: us}), experts_read (routed
    union + shared, mean over layers), note (why a baseline has no figure). `engine`: the
    build (FfnRunner's; None: the device's)."""
    rows, fmts = _check(rows, formats, layers)
    device = torch.device(device)
    copy = copy_bandwidth(device)  # first: without a GPU, its error says so
    if device.type == "cuda" and device.index is None:  # tensors say cuda:N; so must the runner
        device = torch.device("cuda", torch.cuda.current_device())
    cfg = rank_config()
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    out = []
    for fmt in fmts:
        ws = [random_layer(cfg, fmt, seed + n, device) for n in range(layers)]
        runner = FfnRunner(cfg, fmt, None, 0, 1, device, widths=rows, engine=engine)
        bases = []
        try:
            bases = _baselines(cfg, fmt, ws) if baseline else []  # from the checkpoint layout
            ws = [runner.pack(w) for w in ws]  # in place, as at load
            runner.warm()
            g = torch.Generator(device=device).manual_seed(seed)
            out.extend(_row(cfg, fmt, runner, bases, ws, s, copy, l2, g) for s in rows)
        finally:
            runner.close()
            for _, base, _ in bases:
                if base is not None:
                    base.layers.clear()  # torch.compile's caches may keep `base` itself alive
        del ws, bases
        torch.cuda.empty_cache()
    return out


COLUMNS = (
    ("format", "{}"),
    ("rows", "{}"),
    ("kernel_us", "{:.1f}"),
    ("bytes", "{:.3g}"),
    ("limit_pct", "{:.1f}"),
    ("l2_x", "{:.1f}"),
    ("opbyop_us", "{:.1f}"),
    ("speedup", "{:.2f}"),
    ("experts_read", "{:.1f}"),
)


STOCK_COLUMNS = (("stock_us", "{:.1f}"), ("stock_speedup", "{:.2f}"))


def table(rows: list[dict]) -> str:
    """The rows as fixed-width text, one line each (the stock path's columns where any row
    has it); notes after the table."""
    columns = COLUMNS
    if any(r.get("stock_us") is not None for r in rows):
        at = [name for name, _ in COLUMNS].index("speedup") + 1
        columns = COLUMNS[:at] + STOCK_COLUMNS + COLUMNS[at:]
    return layer_table(rows, columns, lambda r: f"{r['format']} S={r['rows']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8,16", help="comma-separated S (1..16)")
    parser.add_argument("--formats", default="mxfp4,fp8", help="comma-separated formats")
    parser.add_argument(
        "--layers", type=int, default=12, help="distinct layers' weights a timed graph rotates over"
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the op-by-op and stock paths"
    )
    parser.add_argument("--json", action="store_true", help="one JSON row a line")
    parser.add_argument(
        "--engine",
        default=None,
        help="the build: triton, gluon (MXFP4, FP8), flydsl; default: the device's",
    )
    args = parser.parse_args(argv)
    try:
        rows = [int(v) for v in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows {args.rows!r}: not a comma-separated list of integers")
    formats = args.formats.split(",")
    try:
        _check(rows, formats, args.layers)
    except ValueError as err:
        parser.error(str(err))
    got = bench(rows, formats, args.layers, baseline=not args.no_baseline, engine=args.engine)
    print("\n".join(json.dumps(r) for r in got) if args.json else table(got))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
