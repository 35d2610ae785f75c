"""Rank bodies of the FFN kernel tests: each runs in a child process (mono_peer.testing.spawn)
whose environment sets TRITON_INTERPRET=1 on a CPU; the GPU tests run them with it unset.

Every rank builds every rank's weights from the same seeds (cheap at tiny shapes), runs the
kernel on its own shard and returns what the parent compares: its outputs and the reference.
"""

from __future__ import annotations

import torch

from mono_kernels_minimax.config import MiniMaxM3Config
from mono_kernels_minimax.ffn.reference import ffn_reference
from mono_kernels_minimax.ffn.runner import FfnRunner
from mono_kernels_minimax.ffn.spec import Experts
from mono_kernels_minimax.ffn.weights import random_weights
from mono_kernels_minimax.formats import WeightFormat


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-20))


def step_inputs(cfg, world, s, seed, device, pad=True):
    """The ranks' partials, the residual and slots of one step (row 1 padded when pad)."""
    g = torch.Generator().manual_seed(seed)
    h = cfg.hidden_size
    parts = [torch.randn(s, h, generator=g).to(torch.bfloat16).to(device) for _ in range(world)]
    residual = torch.randn(s, h, generator=g).to(torch.bfloat16).to(device)
    slots = torch.arange(s, dtype=torch.int64)
    if pad and s > 1:
        slots[1] = -1
    return parts, residual, slots.to(device)


def check_steps(rank, world, group, fmt, widths, seed, device="cpu", tiny=True,
                experts="all", finals=(False,)):
    """Run one step per width (and per `finals` flag); return per-step records."""
    cfg = MiniMaxM3Config.tiny() if tiny else MiniMaxM3Config()
    fmt = WeightFormat(fmt)
    weights = [random_weights(cfg, world, fmt, seed=seed, rank_seed=r, device=device)
               for r in range(world)]
    runner = FfnRunner(cfg, fmt, group, rank, world, device, widths=widths,
                       experts=Experts(experts))
    runner.warm()
    records = []
    try:
        for i, s in enumerate(widths):
            for final in finals:
                parts, residual, slots = step_inputs(cfg, world, s, seed * 100 + i, device)
                runner.step_begin()
                out, res = runner(parts[rank], residual, weights[rank], slots, final=final)
                runner.after_step()
                ref = ffn_reference(cfg, parts, residual, weights, slots, Experts(experts))
                ids, topw = runner.routing(s)
                records.append(dict(
                    s=s, final=final, out=out.cpu(), residual=res.cpu(),
                    out_err=rel_l2(out, ref.out), res_err=rel_l2(res, ref.residual),
                    ids_equal=bool(torch.equal(ids.long().cpu(), ref.topk_ids.cpu())),
                    w_err=float((topw.cpu() - ref.topk_weights.cpu()).abs().max()),
                    pad_zero=bool((out[1] == 0).all()) if s > 1 else True,
                ))
    finally:
        runner.close()
    return records


def fault_then_reset(rank, world, group, fmt, late_rank):
    """A rank stalls past the deadline: MonoFault on every rank; after reset() a correct step."""
    from mono_runtime.errors import MonoFault

    cfg = MiniMaxM3Config.tiny()
    fmt = WeightFormat(fmt)
    weights = [random_weights(cfg, world, fmt, seed=3, rank_seed=r) for r in range(world)]
    runner = FfnRunner(cfg, fmt, group, rank, world, "cpu", widths=[2],
                       deadline_ns=200_000_000)  # 200 polls under the interpreter
    parts, residual, slots = step_inputs(cfg, world, 2, 11, "cpu")
    outcome = {}
    try:
        runner.inject(late_rank, 2_000_000_000)
        runner.step_begin()
        out, _ = runner(parts[rank], residual, weights[rank], slots, final=True)
        try:
            runner.after_step()
            outcome["fault"] = None
        except MonoFault as err:
            outcome["fault"] = str(err)
        outcome["poisoned"] = bool(torch.isnan(out.float()).any())
        runner.inject(None)
        runner.reset()
        runner.step_begin()
        out, _ = runner(parts[rank], residual, weights[rank], slots, final=True)
        runner.after_step()
        ref = ffn_reference(cfg, parts, residual, weights, slots)
        outcome["after_reset_err"] = rel_l2(out, ref.out)
    finally:
        runner.close()
    return outcome
