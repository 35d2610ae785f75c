"""Rank bodies of the K2 kernel tests: each runs in a child process (mono_peer.testing.spawn)
whose environment sets TRITON_INTERPRET=1 on a CPU.

Every rank builds every rank's weights and inputs from the same seeds (cheap at tiny
shapes), runs the kernel on its own shard and returns what the parent compares: its
outputs and their distance to k2_reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.k2.inputs import step_inputs
from mono_kernels_kimi.k2.reference import k2_reference
from mono_kernels_kimi.k2.runner import K2Runner
from mono_kernels_kimi.k2.weights import random_weights
from mono_runtime.topk_triton import sigmoid_topk_row


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-20))


def _step(cfg, s, seed):
    """A step of s rows, row 1 padding when there is one."""
    return step_inputs(cfg, s, seed=seed, padding=(1,) if s > 1 else ())


def check_steps(rank, world, group, widths, layers, seed=0, pack=True, timeline=False):
    """One step per width: a launch per layer of `layers`, in order, each on the prefix
    the one before left (the last launch final); per-launch records of the distances to
    the reference. `pack` False streams the checkpoint's mxfp4-k32 experts as loaded;
    `timeline`: timeline builds, the step's last launch's items in its last record."""
    cfg = KimiK3Config.tiny(world)
    weights = [random_weights(cfg, seed=seed, rank=r) for r in range(world)]
    runner = K2Runner(cfg, group, rank, "cpu", widths=widths, pack=pack, timeline=timeline)
    mine = runner.pack(random_weights(cfg, seed=seed, rank=rank))
    runner.warm()
    records = []
    try:
        for i, s in enumerate(widths):
            step = _step(cfg, s, seed * 100 + i)
            prefix, ref_prefix = step.prefix.clone(), step.prefix
            runner.step_begin()
            outs = []
            for n, layer in enumerate(layers):
                before = prefix.clone()
                out = runner(
                    step.cores[rank],
                    prefix,
                    step.blocks,
                    mine,
                    step.slots,
                    layer,
                    final=n == len(layers) - 1,
                )
                outs.append((layer, out, before, prefix.clone()))
            runner.after_step()
            ids, topw = runner.routing(s)  # the last launch's
            for layer, out, before, after in outs:
                ref = k2_reference(
                    cfg, step.cores, ref_prefix, step.blocks, weights, layer, step.live
                )
                ref_prefix = ref.prefix
                pad = ~step.live
                records.append(
                    dict(
                        s=s,
                        layer=layer,
                        out=out,
                        prefix=after,
                        out_err=rel_l2(out, ref.out),
                        prefix_err=rel_l2(after, ref.prefix),
                        pad_untouched=bool(torch.equal(after[pad], before[pad])),
                        pad_zero=bool((out[pad] == 0).all()),
                    )
                )
            records[-1].update(
                ids_equal=bool(torch.equal(ids.long(), ref.topk_ids)),
                w_err=float((topw - ref.topk_weights).abs().max()),
            )
            if timeline:
                records[-1]["timeline"] = runner.timeline(s, final=True)
    finally:
        runner.close()
    return records


def fault_then_reset(rank, world, group, late_rank):
    """A rank stalls past the deadline: MonoFault on every rank, a poisoned output; after
    reset() a right step."""
    from mono_runtime.errors import MonoFault

    cfg = KimiK3Config.tiny(world)
    weights = [random_weights(cfg, seed=3, rank=r) for r in range(world)]
    runner = K2Runner(cfg, group, rank, "cpu", widths=[2], deadline_ns=200_000_000)
    mine = runner.pack(random_weights(cfg, seed=3, rank=rank))  # 200 polls: the interpreter
    step = _step(cfg, 2, 11)
    outcome = {}
    try:
        runner.inject(late_rank, 2_000_000_000)
        runner.step_begin()
        prefix = step.prefix.clone()
        out = runner(step.cores[rank], prefix, step.blocks, mine, step.slots, 3, final=True)
        try:
            runner.after_step()
            outcome["fault"] = None
        except MonoFault as err:
            outcome["fault"] = str(err)
        outcome["poisoned"] = bool(torch.isnan(out.float()).any())
        runner.inject(None)
        runner.reset()
        # the step after reset must not fault: a rank the interpreter runs slowly (a loaded
        # CI machine) can be many polls behind, so the deadline goes back to 5 s
        runner.mono.set_deadline(5_000_000_000)
        runner.step_begin()
        prefix = step.prefix.clone()
        out = runner(step.cores[rank], prefix, step.blocks, mine, step.slots, 3, final=True)
        runner.after_step()
        ref = k2_reference(cfg, step.cores, step.prefix, step.blocks, weights, 3, step.live)
        outcome["after_reset_err"] = max(rel_l2(out, ref.out), rel_l2(prefix, ref.prefix))
    finally:
        runner.close()
    return outcome


def bad_inputs(rank, world, group):
    """Every bad argument of K2Runner.__call__ -> its ValueError message (None: accepted)."""
    from dataclasses import replace

    cfg = KimiK3Config.tiny(1)
    runner = K2Runner(cfg, group, rank, "cpu", widths=[1, 2])
    w = runner.pack(random_weights(cfg))
    step = _step(cfg, 2, 1)
    core, prefix, blocks, slots = step.cores[0], step.prefix, step.blocks, step.slots
    h = cfg.hidden_size
    other = random_weights(replace(cfg, hidden_size=128))  # another model's shapes
    bank = torch.zeros(4 * h, dtype=torch.bfloat16)  # a prefix over a block it reads
    cases = [
        ("core", dict(core=core.float())),
        ("core", dict(core=torch.zeros(3, cfg.o_proj_in, dtype=torch.bfloat16))),  # width
        ("prefix", dict(prefix=prefix[:, : h // 2])),
        ("prefix", dict(prefix=torch.zeros(h, 2, dtype=torch.bfloat16).t())),
        ("blocks", dict(blocks=blocks[:, :1])),  # fewer blocks than the layer's sources
        ("blocks", dict(blocks=blocks.float())),
        ("slots", dict(slots=slots.to(torch.int32))),
        ("layer_idx", dict(layer_idx=cfg.num_hidden_layers)),
        ("layer_idx", dict(layer_idx=True)),
        ("weights.o_proj", dict(weights=other)),
        ("weights", dict(weights=random_weights(cfg))),  # not packed
        ("weights", dict(weights=None)),
        ("out", dict(out=prefix)),
        ("prefix", dict(prefix=bank[: 2 * h].view(2, h), blocks=bank.view(2, 2, h))),
        ("out", dict(out=torch.zeros(2, h, dtype=torch.float32))),
        ("final", dict(final=1)),
    ]
    errors = []
    for arg, change in cases:
        kw = (
            dict(core=core, prefix=prefix, blocks=blocks, weights=w, slots=slots, layer_idx=3)
            | change
        )
        try:
            runner(**kw)
            errors.append((arg, None))
        except ValueError as err:
            errors.append((arg, str(err)))
    runner.close()
    return errors


def compile_checks(rank, world, group, rows, tp):
    """Compile for sm_90 on rank 0 (PTX + ptxas resources, a real launch's specialization)
    and for gfx950 on rank 1, without a GPU (two processes: the compiles run in parallel);
    the facts the parent asserts."""
    from mono_kernels_kimi.k2 import triton_build
    from mono_kernels_kimi.k2.spec import K2Build
    from mono_runtime.builds import DeviceLimits, residency_problem
    from mono_runtime.compile_check import gpu_acquires, resources_of
    from mono_runtime.sass import narrow_stream_loads, sass_of, split_broadcasts

    b = K2Build(KimiK3Config.tiny(tp), rows)
    if rank == 1:
        amdgcn = triton_build.compile_for(b, "gfx950").asm["amdgcn"]
        return {
            "hip_atomics": "global_atomic" in amdgcn or "flat_atomic" in amdgcn,
            "hip_clock": "s_memrealtime" in amdgcn,
        }
    k = triton_build.compile_for(b, "sm90")
    ptx = k.asm["ptx"]
    res = resources_of(k)
    return {
        "sys_release_xchg": "atom.global.sys.release.exch.b64" in ptx,
        "sys_value_store": "st.relaxed.sys.global.b64" in ptx,
        "gpu_acquire": gpu_acquires(ptx) > 0,
        "globaltimer": "%globaltimer" in ptx,
        "spills": res.spill_bytes,
        "registers": res.registers,
        "residency": residency_problem(res, 132, DeviceLimits(), "k2"),
        "split_draws": split_broadcasts(sass_of(k)),
        "narrow_stream_loads": narrow_stream_loads(sass_of(k)),
    }


@triton.jit
def _topk_kernel(logits, bias, ids, w, E: tl.constexpr, E2: tl.constexpr, K: tl.constexpr):
    """Row r's sigmoid_topk_row (scale 2.5, renormalized) -> ids[r], w[r]."""
    r = tl.program_id(0)
    e = tl.arange(0, E2)
    lg = tl.load(logits + r * E + e, mask=e < E, other=0.0)
    b = tl.load(bias + e, mask=e < E, other=0.0)
    i, v = sigmoid_topk_row(lg, b, logits + r * E, 1, E, K, K, 2.5, True)
    k = tl.arange(0, K)
    tl.store(ids + r * K + k, i)
    tl.store(w + r * K + k, v)


def topk_cases(rank, world, group):
    """mono_runtime.topk_triton.sigmoid_topk_row against mono_runtime.routing.sigmoid_topk
    on rows made to test its rule: ties (-> lower id), NaN logits (last), -inf, and an
    expert count that is not a power of two. Returns (ids equal, max weight error) a row."""
    from mono_runtime.routing import sigmoid_topk

    e, k = 12, 4
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, e, generator=g)
    logits[0] = 0.5  # every key ties: ids 0..3
    logits[1, 3:9] = float("nan")  # NaN keys rank last
    logits[2] = float("-inf")  # every score 0: ties again (weights NaN in both)
    logits[3, ::2] = logits[3, 1::2]  # pairwise ties
    logits[4, :10] = float("nan")  # fewer finite keys than picks
    bias = torch.zeros(e)
    bias[7] = 0.01
    bias[9:] = torch.tensor([-3.0, -0.75, -1.5])  # negative keys, ordered as floats
    ids = torch.empty(6, k, dtype=torch.int32)
    w = torch.empty(6, k)
    _topk_kernel[(6,)](logits, bias, ids, w, e, 16, k)
    ref_ids, ref_w = sigmoid_topk(logits, bias, k, 2.5, True)
    out = []
    for r in range(6):
        same = bool(torch.equal(ids[r].long(), ref_ids[r]))
        err = (w[r] - ref_w[r]).abs().nan_to_num(0.0).max().item()
        nan_alike = bool(torch.equal(w[r].isnan(), ref_w[r].isnan()))
        out.append((same, err, nan_alike))
    return out


def kernel_waits(rank, world, group, s, layer):
    """One tiny launch of width s with every item's waits recorded: (ticket -> the done
    pairs its item waited for, spec.waits for the launch's slot count). The interpreter
    runs the tickets in order, so a wait that misses an item still finds it done and the
    output still matches: only the recorded waits show it (on a GPU the item may be late)."""
    from mono_kernels_kimi.k2.spec import waits
    from mono_runtime.interp_waits import recording

    cfg = KimiK3Config.tiny(world)
    runner = K2Runner(cfg, group, rank, "cpu", widths=[s])
    mine = runner.pack(random_weights(cfg, seed=4, rank=rank))
    step = _step(cfg, s, 12)
    try:
        with recording() as seen:
            runner.step_begin()
            runner(
                step.cores[rank], step.prefix.clone(), step.blocks, mine, step.slots, layer,
                final=True,
            )  # fmt: skip
            runner.after_step()
        nslots = int(runner.region(s, "table")[:4].view(torch.int32))
    finally:
        runner.close()
    want = waits(runner.builds[s], nslots)
    return {t: sorted(v) for t, v in seen.items()}, {t: sorted(v) for t, v in want.items()}
