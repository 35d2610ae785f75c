"""Benchmark of the FFN monokernel on one GPU, under CUDA graph replay.

Shapes: a TP4 rank's (I = 768 per expert), launched at TP 1 (one GPU: the in-kernel
all-reduces reduce over this rank alone; their cross-GPU latency is the multigpu tier's).
Figures, all from the same run:

- kernel_us: per launch, a graph of `layers` launches after one step_begin, divided;
- bytes: what a launch must read: the union of the chosen experts' weights and scales, the
  shared expert, router, bias and norm weights, the step's activations;
- limit_pct: bytes / copy bandwidth (a device-to-device copy measured here, read + write)
  over kernel_us: the share of the memory limit the kernel reaches;
- opbyop_us, speedup: the op-by-op path of the same layer (graph-replayed): a
  torch.compile'd add + Gemma norm, the fp32 router GEMM (cuBLAS), a torch.compile'd
  sigmoid/top-k/renormalize, one grouped GEMM per projection over the routed experts
  (torch._grouped_mm on bf16 copies of the expert weights: no library offers an MXFP4 or
  block-FP8 grouped GEMM here) and cuBLAS GEMMs for the shared expert.

Call `bench(...)` for a list of row dicts (`mono bench ffn` wraps it).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..config import MiniMaxM3Config
from ..formats import WeightFormat
from .reference import swiglu_oai
from .runner import FfnRunner
from .weights import FfnWeights, random_weights


def rank_config(tp: int = 4) -> MiniMaxM3Config:
    """MiniMax-M3 with one TP rank's expert width: a TP=1 launch of a TP `tp` rank's shapes."""
    cfg = MiniMaxM3Config()
    return replace(cfg, moe_intermediate_size=cfg.moe_intermediate_size // tp)


def copy_bandwidth(device, nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Bytes moved (read + written) per second by a device-to-device copy."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        b.copy_(a)
    end.record()
    end.synchronize()
    return 2 * nbytes * iters / (start.elapsed_time(end) * 1e-3)


def bytes_read(cfg: MiniMaxM3Config, w: FfnWeights, ids: torch.Tensor, rows: int) -> int:
    """What one launch must read from memory for this step's routing."""
    experts = ids[ids >= 0].unique().numel()

    def per_expert(t):
        return 0 if t is None else t[0].numel() * t.element_size()

    n = experts * sum(per_expert(t) for t in (w.w13, w.w13_scale, w.w2, w.w2_scale))
    for t in (w.shared_w13, w.shared_w13_scale, w.shared_w2, w.shared_w2_scale, w.router,
              w.bias, w.norm):
        n += 0 if t is None else t.numel() * t.element_size()
    return n + 3 * rows * cfg.hidden_size * 2  # part, residual in; plus the output


def _graph_time(fn, reps: int = 50) -> float:
    """Seconds per call of `fn` captured in a CUDA graph and replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / reps


class OpByOp:
    """The layer's FFN tail from library ops (see the module docstring), graph-capturable."""

    def __init__(self, cfg: MiniMaxM3Config, w: FfnWeights):
        self.cfg = cfg
        self.w13 = w.dense("w13").to(torch.bfloat16)  # [E, 2I, H]
        self.w2 = w.dense("w2").to(torch.bfloat16)  # [E, H, I]
        self.sw13 = w.dense("shared_w13").to(torch.bfloat16)
        self.sw2 = w.dense("shared_w2").to(torch.bfloat16)
        self.w = w
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

    def __call__(self, part, residual):
        cfg, w = self.cfg, self.w
        x, res = self.seam(part, residual, w.norm)
        logits = torch.nn.functional.linear(x.float(), w.router)
        ids, wt = self.route(logits, w.bias)
        flat = ids.reshape(-1)
        order = torch.sort(flat, stable=True).indices
        counts = torch.zeros(cfg.num_experts, dtype=torch.int32, device=x.device)
        counts.scatter_add_(0, flat.to(torch.int64), torch.ones_like(flat, dtype=torch.int32))
        offs = counts.cumsum(0, dtype=torch.int32)
        xa = x.repeat_interleave(cfg.top_k, 0)[order]
        gu = torch._grouped_mm(xa, self.w13.transpose(-1, -2), offs=offs)
        y = torch._grouped_mm(self.act(gu), self.w2.transpose(-1, -2), offs=offs)
        back = torch.empty_like(y)
        back[order] = y
        routed = (back.view(-1, cfg.top_k, cfg.hidden_size).float() * wt[..., None]).sum(1)
        shared = torch.nn.functional.linear(self.act(torch.nn.functional.linear(x, self.sw13)),
                                            self.sw2)
        return (routed + shared.float()).to(torch.bfloat16), res


def _row(cfg, fmt, runner, base, w, s, layers, copy, g) -> dict:
    device = runner.device
    part = torch.randn(s, cfg.hidden_size, generator=g, device=device).to(torch.bfloat16)
    residual = torch.randn(s, cfg.hidden_size, generator=g, device=device).to(torch.bfloat16)
    slots = torch.arange(s, dtype=torch.int64, device=device)
    o, r = torch.empty_like(part), torch.empty_like(residual)

    def step():
        runner.step_begin()
        for _ in range(layers):
            runner(part, residual, w, slots, out=o, residual_out=r)

    t_kernel = _graph_time(step) / layers
    runner.after_step()
    ids, _ = runner.routing(s)
    nbytes = bytes_read(cfg, w, ids.long(), s)
    t_base, note = None, None
    try:
        t_base = _graph_time(lambda: base(part, residual))
    except Exception as err:  # noqa: BLE001 (reported in the row, not fatal)
        note = f"op-by-op path failed: {type(err).__name__}: {err}"[:300]
    return dict(
        format=fmt.value, layout=fmt.layout, rows=s, kernel_us=t_kernel * 1e6, bytes=nbytes,
        copy_tbps=copy / 1e12, limit_pct=100.0 * nbytes / copy / t_kernel,
        opbyop_us=None if t_base is None else t_base * 1e6,
        speedup=None if t_base is None else t_base / t_kernel,
        experts_read=int(ids[ids >= 0].unique().numel()) + 1, note=note,
    )


def bench(rows=(1, 2, 4, 8, 16), formats=("mxfp4", "fp8"), layers: int = 8,
          device: str = "cuda", seed: int = 0) -> list[dict]:
    """One row per (format, S): kernel_us, bytes, copy_tbps, limit_pct, opbyop_us, speedup,
    experts_read (routed union + shared), note (why the op-by-op path has no figure)."""
    device = torch.device(device)
    cfg = rank_config()
    copy = copy_bandwidth(device)
    out = []
    for name in formats:
        fmt = WeightFormat(name)
        w = random_weights(cfg, 1, fmt, seed=seed, device=device)
        runner = FfnRunner(cfg, fmt, None, 0, 1, device, widths=rows)
        runner.warm()
        base = OpByOp(cfg, w)
        g = torch.Generator(device=device).manual_seed(seed)
        try:
            out.extend(_row(cfg, fmt, runner, base, w, s, layers, copy, g) for s in rows)
        finally:
            runner.close()
        del w, base
        torch.cuda.empty_cache()
    return out


def main() -> None:
    for row in bench():
        print(row)


if __name__ == "__main__":
    main()
