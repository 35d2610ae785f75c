"""K2 benchmark on one GPU, under CUDA graph replay, reading from HBM.

Shapes: a TP8 rank's o_proj (1536 inputs), routed experts (384 of intermediate each) and
shared experts (768), launched at TP 1 on one GPU: the in-kernel all-reduces and
all-gathers run over this rank alone (their cross-GPU latency is the multi-GPU tier's),
and the router, the latent down- and the up-projection are computed whole, where a TP8
rank computes an eighth of each; the bytes below count what this launch reads. A timed
graph runs `layers` launches, each on a DIFFERENT layer's weights, so no launch finds its
weights in the L2. Figures, all from one run:

- kernel_us: per launch, a graph of `layers` launches after one step_begin, divided;
- bytes: what a launch must read, averaged over the layers: the union of the experts its
  routing chose (read back from an eager step), every dense weight, the activations;
- limit_pct: bytes / copy bandwidth (measured in the same run) over kernel_us;
- opbyop_us, speedup: the op-by-op path of the same layers: cuBLAS GEMMs (o_proj, router,
  latent down, up, shared), torch.compile'd AttnRes, routing, SiTU and RMSNorm, and one
  grouped GEMM per expert projection over bf16 copies of the experts (no library offers
  an MXFP4 grouped GEMM here: this path reads 4x the expert bytes, which favours K2).

`bench(...)` returns one row dict per S (`mono bench k2` wraps it); from a shell:
`python3 -m mono_kernels_kimi.k2.bench --rows 1,4,16 --layers 8`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch
from mono_runtime.opbyop import bf16_copy, grouped_experts
from mono_runtime.report import layer_table
from mono_runtime.stream.layout import MXFP4_K32, random_mxfp4_k32
from mono_runtime.timing import copy_bandwidth, graph_time

from ..config import KimiK3Config
from ..kda.reference import attn_res
from .inputs import step_inputs
from .reference import k3_situ, rms_norm
from .runner import K2Runner
from .spec import INPUTS
from .weights import K2Weights

MAX_LAYERS = 32  # each layer's bf16 expert copies for the op-by-op path are 7.4 GB
MAX_ROWS = 16
LAYER_IDX = 49  # a layer mid-model: not a block write, five AttnRes block sources


def rank_config(tp: int = 8) -> KimiK3Config:
    """Kimi-K3 with one TP `tp` rank's o_proj, routed and shared widths, at TP 1."""
    cfg = KimiK3Config()
    return replace(
        cfg,
        tp=1,
        kda_num_heads=cfg.kda_num_heads // tp,
        moe_intermediate_size=cfg.moe_intermediate_size // tp,
    )


def random_layer(cfg: KimiK3Config, seed: int, device) -> K2Weights:
    """One layer's random weights at `cfg`, drawn on `device` directly in the stored
    formats (random MXFP4 codes and e8m0 scales): many full layers in seconds. Magnitudes
    keep activations O(1); the values themselves do not matter to the timing."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    shapes = K2Weights.expected(cfg)

    def bf16(name, std, mean=0.0):
        shape = shapes[name][0]
        return (mean + std * torch.randn(shape, generator=g, device=device)).to(torch.bfloat16)

    h, lat = cfg.hidden_size, cfg.latent_size
    w13, w13_scale = random_mxfp4_k32(
        (cfg.num_experts, 2 * cfg.routed_intermediate, lat), lat**-0.5, g, device
    )
    w2, w2_scale = random_mxfp4_k32(
        (cfg.num_experts, lat, cfg.routed_intermediate), cfg.routed_intermediate**-0.5, g, device
    )
    w = K2Weights(
        o_proj=bf16("o_proj", cfg.o_proj_in**-0.5),
        mlp_res_norm=bf16("mlp_res_norm", 0.1, 1.0),
        mlp_res_proj=bf16("mlp_res_proj", h**-0.5),
        post_norm=bf16("post_norm", 0.1, 1.0),
        router=bf16("router", h**-0.5),
        bias=0.05 * torch.randn(cfg.num_experts, generator=g, device=device),
        latent_down=bf16("latent_down", h**-0.5),
        latent_norm=bf16("latent_norm", 0.1, 1.0),
        up_proj=bf16("up_proj", lat**-0.5),
        shared_w13=bf16("shared_w13", h**-0.5),
        shared_w2=bf16("shared_w2", cfg.shared_intermediate**-0.5),
        w13=w13,
        w13_scale=w13_scale,
        w2=w2,
        w2_scale=w2_scale,
    )
    w.validate(cfg, device)
    return w


def bytes_read(
    cfg: KimiK3Config, w: K2Weights, ids: torch.Tensor, rows: int, layer_idx: int = LAYER_IDX
) -> int:
    """What one launch of layer `layer_idx` must read from memory for this step's routing."""
    experts = ids[ids >= 0].unique().numel()
    per_expert = sum(
        t[0].numel() * t.element_size() for t in (w.w13, w.w13_scale, w.w2, w.w2_scale)
    )
    dense = sum(
        t.numel() * t.element_size()
        for name, t in w.tensors().items()
        if name not in ("w13", "w13_scale", "w2", "w2_scale")
    )
    sources, _ = cfg.mlp_attn_res(layer_idx)
    h = cfg.hidden_size
    # core in; prefix in and out; the block sources; the output
    activations = 2 * rows * (cfg.o_proj_in + 3 * h + sources * h)
    return experts * per_expert + dense + activations


class OpByOp:
    """The layer from library ops (see the module docstring) for each of `layers`,
    graph-capturable; `self(core, prefix, blocks, layer)` runs one layer (and updates
    `prefix` in place, as the kernel does)."""

    def __init__(self, cfg: KimiK3Config, layers: list[K2Weights], layer_idx: int = LAYER_IDX):
        self.cfg = cfg
        self.layers = [
            dict(
                bf16_w13=bf16_copy(w.w13, w.w13_scale, MXFP4_K32),
                bf16_w2=bf16_copy(w.w2, w.w2_scale, MXFP4_K32),
                **{n: t for n, t in w.tensors().items() if not n.startswith(("w13", "w2"))},
            )
            for w in layers
        ]
        self.sources, self.reset = cfg.mlp_attn_res(layer_idx)
        self.mix = torch.compile(self._mix)
        self.route = torch.compile(self._route)
        self.act = torch.compile(lambda gu: k3_situ(cfg, gu.float()).to(torch.bfloat16))
        self.norm = torch.compile(
            lambda x, w: rms_norm(x.to(torch.bfloat16), w, cfg.rms_norm_eps, torch.float32)
        )

    def _mix(self, prefix, o, blocks, w):
        eps = self.cfg.rms_norm_eps
        if self.reset:  # a block-write layer: the prefix restarts at the o_proj output
            prefix.copy_(o)
        return attn_res(
            prefix,
            None if self.reset else o,
            blocks,
            w["mlp_res_norm"],
            w["mlp_res_proj"],
            w["post_norm"],
            self.sources,
            -1,
            eps,
            eps,
        )

    def _route(self, logits, bias):
        cfg = self.cfg
        scores = torch.sigmoid(logits.float())
        ids = torch.topk(scores + bias, cfg.num_experts_per_token, dim=-1).indices
        wt = scores.gather(1, ids)
        return ids, wt / wt.sum(-1, keepdim=True) * cfg.routed_scaling_factor

    def __call__(self, core, prefix, blocks, layer: int = 0):
        w, linear = self.layers[layer], torch.nn.functional.linear
        o = linear(core, w["o_proj"])
        x = self.mix(prefix, o, blocks, w)
        ids, wt = self.route(linear(x, w["router"]), w["bias"])
        latent = linear(x, w["latent_down"])
        routed = grouped_experts(latent, ids, wt, w["bf16_w13"], w["bf16_w2"], self.act)
        up = linear(self.norm(routed, w["latent_norm"]), w["up_proj"])
        shared = linear(self.act(linear(x, w["shared_w13"])), w["shared_w2"])
        return up + shared


def _row(cfg, runner, base, layers, s, copy, l2, seed) -> dict:
    device = runner.device
    step = step_inputs(cfg, s, seed=seed, device=device)
    core, prefix, blocks, slots = step.cores[0], step.prefix, step.blocks, step.slots
    out = torch.empty_like(prefix)

    def launches(keep=None):
        runner.step_begin()
        for w in layers:
            runner(core, prefix, blocks, w, slots, LAYER_IDX, out=out)
            if keep is not None:
                keep.append(runner.routing(s)[0].long().clone())

    ids: list[torch.Tensor] = []
    launches(ids)  # eager: each layer's routing, as the kernel chose it
    runner.after_step()
    t_kernel = graph_time(launches) / len(layers)
    runner.after_step()  # raises MonoFault if any wait of the replays gave up
    nbytes = [bytes_read(cfg, w, i, s) for w, i in zip(layers, ids, strict=True)]
    t_base, note = None, None
    if base is not None:
        try:
            t_base = graph_time(lambda: [base(core, prefix, blocks, n) for n in range(len(layers))])
            t_base /= len(layers)
        except Exception as err:  # noqa: BLE001 (reported in the row, not fatal)
            note = f"op-by-op path failed: {type(err).__name__}: {err}"[:300]
    return dict(
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
        experts_read=sum(int(i[i >= 0].unique().numel()) for i in ids) / len(ids),
        note=note,
    )


def check(rows, layers) -> tuple[int, ...]:
    """Bad arguments fail here, before anything is allocated or compiled."""
    rows = tuple(rows)
    if not rows or any(isinstance(s, bool) or not isinstance(s, int) for s in rows):
        raise ValueError(f"rows {rows}: expected integers 1..{MAX_ROWS}")
    if any(not 1 <= s <= MAX_ROWS for s in rows):
        raise ValueError(f"rows {rows}: each must be 1..{MAX_ROWS}")
    if len(set(rows)) != len(rows):
        raise ValueError(f"rows {rows}: a row count appears twice")
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= MAX_LAYERS:
        raise ValueError(f"layers {layers!r}: must be 1..{MAX_LAYERS}")
    return rows


def bench(
    rows=(1, 2, 4, 8, 16),
    layers: int = 8,
    device: str = "cuda",
    seed: int = 0,
    baseline=True,
    engine: str | None = None,
) -> list[dict]:
    """One row per S (`engine`: K2Runner's): engine, kernel_us, bytes, copy_tbps,
    limit_pct, l2_x (bytes one graph reads over the L2 size), opbyop_us, speedup,
    experts_read (the routed union, mean over the layers), note (why the op-by-op path has
    no figure)."""
    rows = check(rows, layers)
    device = torch.device(device)
    copy = copy_bandwidth(device)  # first: without a GPU, its error says so
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    cfg = rank_config()
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    ws = [random_layer(cfg, seed + n, device) for n in range(layers)]
    runner, base = K2Runner(cfg, None, 0, device, widths=rows, engine=engine), None
    try:
        base = OpByOp(cfg, ws) if baseline else None  # its bf16 copies: checkpoint layout
        ws = [runner.pack(w) for w in ws]  # in place, as at load
        runner.warm()
        return [_row(cfg, runner, base, ws, s, copy, l2, seed + s) for s in rows]
    finally:
        runner.close()
        if base is not None:
            base.layers.clear()  # torch.compile's caches may keep `base` itself alive


def timelines(
    rows=(1, 16), layers: int = 8, device: str = "cuda", seed: int = 0, out=None, engine=None
):
    """Per S, the item timeline of the last launch of an eager step over `layers` layers
    (timeline builds: the same plan, every ticket stamped): printed per stage, and a
    picture in `out` (a folder) when given."""
    from mono_runtime.timeline import show, stage_deps

    rows = check(rows, layers)
    cfg = rank_config()
    ws = [random_layer(cfg, seed + n, device) for n in range(layers)]
    runner = K2Runner(cfg, None, 0, device, widths=rows, timeline=True, engine=engine)
    try:
        ws = [runner.pack(w) for w in ws]
        runner.warm()
        for s in rows:
            step = step_inputs(cfg, s, seed=seed + s, device=runner.device)
            for _ in range(2):  # the second step runs on a warm clock and caches
                runner.step_begin()
                for w in ws:
                    runner(step.cores[0], step.prefix, step.blocks, w, step.slots, LAYER_IDX)
                runner.after_step()
            rows = runner.timeline(s)
            show(
                rows,
                f"K2 timeline S={s} (the step's last launch; us from its first item)",
                None if out is None else f"{out}/timeline-k2-s{s}.png",
                f"K2, S = {s}",
                stage_deps(rows, INPUTS),
            )
    finally:
        runner.close()


COLUMNS = (
    ("rows", "{}"),
    ("kernel_us", "{:.1f}"),
    ("bytes", "{:.3g}"),
    ("limit_pct", "{:.1f}"),
    ("l2_x", "{:.1f}"),
    ("opbyop_us", "{:.1f}"),
    ("speedup", "{:.2f}"),
    ("experts_read", "{:.1f}"),
)


def table(rows: list[dict]) -> str:
    """The rows as fixed-width text, one line each; notes after the table."""
    return layer_table(rows, COLUMNS, lambda r: f"S={r['rows']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8,16", help="comma-separated S (1..16)")
    parser.add_argument(
        "--layers", type=int, default=8, help="distinct layers' weights a timed graph rotates over"
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the op-by-op path")
    parser.add_argument("--json", action="store_true", help="one JSON row a line")
    parser.add_argument(
        "--timeline", metavar="DIR", help="instead: each S's item timeline, pictures in DIR"
    )
    parser.add_argument(
        "--engine", default=None, help="the build: triton or gluon (default: the runner's)"
    )
    args = parser.parse_args(argv)
    try:
        rows = [int(v) for v in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows {args.rows!r}: not a comma-separated list of integers")
    try:
        check(rows, args.layers)
    except ValueError as err:
        parser.error(str(err))
    if args.timeline:
        timelines(rows, args.layers, out=args.timeline, engine=args.engine)
        return 0
    got = bench(rows, args.layers, baseline=not args.no_baseline, engine=args.engine)
    print("\n".join(json.dumps(r) for r in got) if args.json else table(got))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
