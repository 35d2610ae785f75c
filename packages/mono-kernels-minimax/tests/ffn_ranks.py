"""Rank bodies of the FFN kernel tests: each runs in a child process (mono_peer.testing.spawn)
whose environment sets TRITON_INTERPRET=1 on a CPU; the GPU tests run them with it unset.

Every rank builds every rank's weights from the same seeds (cheap at tiny shapes), runs the
kernel on its own shard and returns what the parent compares: its outputs and the reference.
"""

from __future__ import annotations

from dataclasses import replace

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


def check_steps(
    rank,
    world,
    group,
    fmt,
    widths,
    seed,
    device="cpu",
    tiny=True,
    experts="all",
    finals=(False,),
    engine=None,
    ties=False,
):
    """Run one step per width (and per `finals` flag) on build `engine` (None: the
    device's); return per-step records. `ties`: experts 0, 5 and 9 get one router row and
    a bias that puts them first in every row (equal keys: picked in id order), expert 7 a
    large router row and a NaN bias (its key ranks last)."""
    cfg = MiniMaxM3Config.tiny() if tiny else MiniMaxM3Config()
    if tiny == "wide":  # two 64-column K steps a rank at TP 2 (Gluon streams >= 2 steps)
        cfg = replace(cfg, moe_intermediate_size=256)
    fmt = WeightFormat(fmt)
    weights = [
        random_weights(cfg, world, fmt, seed=seed, rank_seed=r, device=device) for r in range(world)
    ]
    if ties:  # (router and bias are replicated: the same edit on every rank)
        for w in weights:
            w.router[5] = w.router[9] = w.router[0]
            w.router[7] *= 8.0
            w.bias[[0, 5, 9]] = 1.0
            w.bias[7] = float("nan")
    runner = FfnRunner(
        cfg, fmt, group, rank, world, device, widths=widths, experts=Experts(experts), engine=engine
    )
    weights[rank] = runner.pack(weights[rank])
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
                records.append(
                    dict(
                        s=s,
                        final=final,
                        out=out.cpu(),
                        residual=res.cpu(),
                        out_err=rel_l2(out, ref.out),
                        res_err=rel_l2(res, ref.residual),
                        ids_equal=bool(torch.equal(ids.long().cpu(), ref.topk_ids.cpu())),
                        w_err=float((topw.cpu() - ref.topk_weights.cpu()).abs().max()),
                        pad_zero=bool((out[1] == 0).all()) if s > 1 else True,
                    )
                )
    finally:
        runner.close()
    return records


def fault_then_reset(rank, world, group, fmt, late_rank):
    """A rank stalls past the deadline: MonoFault on every rank; after reset() a correct step."""
    from mono_runtime.errors import MonoFault

    cfg = MiniMaxM3Config.tiny()
    fmt = WeightFormat(fmt)
    weights = [random_weights(cfg, world, fmt, seed=3, rank_seed=r) for r in range(world)]
    runner = FfnRunner(
        cfg, fmt, group, rank, world, "cpu", widths=[2], deadline_ns=200_000_000
    )  # 200 polls under the interpreter
    weights[rank] = runner.pack(weights[rank])
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
        # The step after reset must not fault: a rank the interpreter runs slowly (a loaded
        # CI machine) can be many polls behind, so the short deadline goes back to 5 s.
        runner.mono.set_deadline(5_000_000_000)
        runner.step_begin()
        out, _ = runner(parts[rank], residual, weights[rank], slots, final=True)
        runner.after_step()
        ref = ffn_reference(cfg, parts, residual, weights, slots)
        outcome["after_reset_err"] = rel_l2(out, ref.out)
    finally:
        runner.close()
    return outcome


def kernel_types(fmt: str) -> dict[str, str]:
    """Triton types of the kernel's runtime arguments for an expert format."""
    from mono_kernels_minimax.ffn.triton_build import kernel_types as types_of

    return types_of(WeightFormat(fmt))


def compile_checks(rank, world, group, fmt, rows, tiny):
    """Compile for sm_90 (PTX + ptxas resources; the 16-byte pointer alignment a launch
    gets, so the resources are the running binary's) and gfx950 without a GPU."""
    import triton
    from mono_kernels_minimax.ffn import triton_build
    from mono_kernels_minimax.ffn.spec import FfnBuild
    from mono_runtime.builds import DeviceLimits, residency_problem
    from mono_runtime.compile_check import gpu_acquires, resources_of
    from mono_runtime.sass import sass_of, split_broadcasts
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cfg = MiniMaxM3Config.tiny() if tiny else MiniMaxM3Config()
    b = FfnBuild(cfg, rows, 4 if not tiny else 2, WeightFormat(fmt))
    fn = triton_build.ffn_kernel
    types = kernel_types(fmt)
    facts = {}
    k = triton_build.compile_for(b, "sm90")
    ptx = k.asm["ptx"]
    res = resources_of(k)
    facts["sys_release_xchg"] = "atom.global.sys.release.exch.b64" in ptx
    facts["sys_value_store"] = "st.relaxed.sys.global.b64" in ptx
    facts["gpu_acquire"] = gpu_acquires(ptx) > 0
    facts["globaltimer"] = "%globaltimer" in ptx
    facts["spills"] = res.spill_bytes
    facts["residency"] = residency_problem(res, 132, DeviceLimits(), "ffn")
    facts["registers"] = res.registers
    facts["split_draws"] = split_broadcasts(sass_of(k))
    signature = {n: types.get(n, "constexpr") for n in fn.arg_names}
    consts = triton_build.constexprs(b, True)  # the poll-count clock: no PTX asm
    source = ASTSource(
        fn=fn,
        signature=signature,
        constexprs={(fn.arg_names.index(n),): v for n, v in consts.items()},
    )
    hip = triton.compile(source, target=GPUTarget("hip", "gfx950", 64), options={"num_warps": 4})
    amdgcn = hip.asm["amdgcn"]
    facts["hip_atomics"] = "global_atomic" in amdgcn or "flat_atomic" in amdgcn
    return facts


def bad_inputs(rank, world, group):
    """Every bad argument of FfnRunner.__call__ -> the ValueError message (None: accepted)."""
    from dataclasses import replace

    cfg = MiniMaxM3Config.tiny()
    w = random_weights(cfg, 1, WeightFormat.BF16)
    runner = FfnRunner(cfg, WeightFormat.BF16, group, rank, world, "cpu", widths=[1, 2])
    part, residual, slots = step_inputs(cfg, 1, 2, 1, "cpu")
    part = part[0]
    other = random_weights(replace(cfg, hidden_size=512), 1, WeightFormat.BF16)
    cases = [
        ("part", dict(part=part.float())),
        ("residual", dict(residual=residual[:, :128])),
        ("slots", dict(slots=slots.to(torch.int32))),
        ("weights.norm", dict(weights=other)),  # another layer shape (hidden 512)
        ("weights", dict(weights=random_weights(cfg, 1, WeightFormat.MXFP4))),
        (
            "part",
            dict(
                part=torch.zeros(3, cfg.hidden_size, dtype=torch.bfloat16),
                residual=torch.zeros(3, cfg.hidden_size, dtype=torch.bfloat16),
                slots=torch.zeros(3, dtype=torch.int64),
            ),
        ),  # a width beyond the build
        ("residual_out", dict(residual_out=torch.zeros_like(residual).t().contiguous().t())),
        ("out", dict(out=(same := torch.empty_like(part)), residual_out=same)),
        ("out", dict(out=part)),
    ]
    errors = []
    for arg, change in cases:
        kw = dict(part=part, residual=residual, weights=w, slots=slots) | change
        try:
            runner(**kw)
            errors.append((arg, None))
        except ValueError as err:
            errors.append((arg, str(err)))
    runner.close()
    return errors


def timeline_rows(rank, world, group):
    """One final launch of a timeline build at TP 1: its slot count and item rows."""
    cfg = MiniMaxM3Config.tiny()
    runner = FfnRunner(
        cfg, WeightFormat.MXFP4, group, rank, world, "cpu", widths=[2], timeline=True
    )
    try:
        w = runner.pack(random_weights(cfg, world, WeightFormat.MXFP4, seed=8))
        parts, residual, slots = step_inputs(cfg, world, 2, 9, "cpu")
        runner.step_begin()
        runner(parts[rank], residual, w, slots, final=True)
        runner.after_step()
        nslots = int(runner.region(2, "table")[:4].view(torch.int32)[0])
        return {"nslots": nslots, "items": runner.timeline(2, final=True)}
    finally:
        runner.close()


def kernel_waits(rank, world, group, s):
    """One final launch of width s at TP 1 with every item's waits recorded: the recorded
    {ticket: done pairs} of the launch's tickets, spec.waits for its slot count, the
    route's pair and the first ticket past the static tasks."""
    from mono_kernels_minimax.ffn.spec import route_done, stage_bounds, waits
    from mono_runtime.interp_waits import recording

    cfg = MiniMaxM3Config.tiny()
    runner = FfnRunner(cfg, WeightFormat.MXFP4, group, rank, world, "cpu", widths=[s])
    try:
        w = runner.pack(random_weights(cfg, world, WeightFormat.MXFP4, seed=5))
        parts, residual, slots = step_inputs(cfg, world, s, 6, "cpu")
        with recording() as seen:
            runner.step_begin()
            runner(parts[rank], residual, w, slots, final=True)
            runner.after_step()
        nslots = int(runner.region(s, "table")[:4].view(torch.int32)[0])
        b = runner.builds[s]
    finally:
        runner.close()
    bounds = {name: (lo, hi) for name, lo, hi in stage_bounds(b, nslots, final=True)}
    end = bounds["handshake"][1]
    return {
        "seen": {t: sorted(v) for t, v in seen.items() if t < end},
        "want": {t: sorted(v) for t, v in waits(b, nslots, final=True).items()},
        "route": route_done(b),
        "first_routed": bounds["up"][0],
    }
