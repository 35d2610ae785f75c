"""Rank bodies of the K2 kernel tests: each runs in a child process (mono_peer.testing.spawn)
whose environment sets TRITON_INTERPRET=1 on a CPU.

Every rank builds every rank's weights and inputs from the same seeds (cheap at tiny
shapes), runs the kernel on its own shard and returns what the parent compares: its
outputs and their distance to k2_reference.
"""

from __future__ import annotations

import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.k2.inputs import step_inputs
from mono_kernels_kimi.k2.reference import k2_reference
from mono_kernels_kimi.k2.runner import K2Runner
from mono_kernels_kimi.k2.weights import random_weights


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-20))


def _step(cfg, s, seed):
    """A step of s rows, row 1 padding when there is one."""
    return step_inputs(cfg, s, seed=seed, padding=(1,) if s > 1 else ())


def check_steps(rank, world, group, widths, layers, seed=0, final=True):
    """One step per (width, layer): per-step records of the distances to the reference."""
    cfg = KimiK3Config.tiny(world)
    weights = [random_weights(cfg, seed=seed, rank=r) for r in range(world)]
    runner = K2Runner(cfg, group, rank, "cpu", widths=widths)
    mine = runner.pack(random_weights(cfg, seed=seed, rank=rank))
    runner.warm()
    records = []
    try:
        for i, s in enumerate(widths):
            for layer in layers:
                step = _step(cfg, s, seed * 100 + i * 10 + layer)
                prefix = step.prefix.clone()
                runner.step_begin()
                out = runner(
                    step.cores[rank], prefix, step.blocks, mine, step.slots, layer, final=final
                )
                runner.after_step()
                ref = k2_reference(
                    cfg, step.cores, step.prefix, step.blocks, weights, layer, step.live
                )
                ids, topw = runner.routing(s)
                records.append(
                    dict(
                        s=s,
                        layer=layer,
                        out=out.clone(),
                        prefix=prefix,
                        out_err=rel_l2(out, ref.out),
                        prefix_err=rel_l2(prefix, ref.prefix),
                        pad_untouched=bool(
                            torch.equal(prefix[~step.live], step.prefix[~step.live])
                        ),
                        pad_zero=bool((out[~step.live] == 0).all()),
                        ids_equal=bool(torch.equal(ids.long(), ref.topk_ids)),
                        w_err=float((topw - ref.topk_weights).abs().max()),
                    )
                )
    finally:
        runner.close()
    return records
