"""The kernel builds: on a CPU every present build compiles ahead of time for the GPU it
serves (Triton builds for NVIDIA sm_90, FlyDSL builds for AMD gfx950); on a GPU each rank
runs the Triton builds at tiny shapes against their plain-torch references.

Compiles run in child processes: a backend abort must fail the check, not kill the rank,
and the ranks run with TRITON_INTERPRET=1, under which nothing compiles for a GPU. The
compiles are shared out over the ranks, so a 2-rank run keeps both cores of a small
machine busy.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from mono_tools.qualify.context import CheckFailed, RankContext, Skipped

COMPILE_TIMEOUT_S = 400
FFN_TP = (1, 2, 4, 8)  # the TP sizes the FFN kernel is built for

K1_TRITON = r"""
import json, sys
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.kda.spec import K1Build
from mono_kernels_kimi.kda.triton_build import compile_for
kernel = compile_for(K1Build.for_step(KimiK3Config(), 8, 1, write_block=True), sys.argv[1])
print(json.dumps({"shared": kernel.metadata.shared}))
"""

FFN_TRITON = r"""
import json, sys
from mono_kernels_minimax.config import MiniMaxM3Config
from mono_kernels_minimax.ffn.spec import FfnBuild
from mono_kernels_minimax.ffn.triton_build import compile_for
from mono_kernels_minimax.formats import WeightFormat
kernel = compile_for(FfnBuild(MiniMaxM3Config(), 4, 4, WeightFormat.MXFP4), sys.argv[1])
print(json.dumps({"shared": kernel.metadata.shared}))
"""

FFN_FLYDSL = r"""
import json, sys
from mono_kernels_minimax.config import MiniMaxM3Config
from mono_kernels_minimax.ffn import flydsl_build as fb
from mono_kernels_minimax.ffn.spec import FfnBuild
from mono_kernels_minimax.formats import WeightFormat
(isa,) = fb.compile_isa([FfnBuild(MiniMaxM3Config(), 4, 4, WeightFormat.MXFP4)], sys.argv[1],
                        processes=1)
problem = fb.residency_problem(isa)
if problem:
    raise SystemExit(problem)
print(json.dumps({"shared": isa.resources.lds_bytes, "spills": isa.resources.vgpr_spills}))
"""


def _has(module: str, name: str) -> str | None:
    """None when `module` imports and has `name`, else why not."""
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        return f"{module} does not import ({exc})"
    return None if hasattr(found, name) else f"{module} has no {name}()"


def _flydsl_missing() -> str | None:
    from mono_runtime.flydsl.testing import toolchain_missing

    return _has("mono_kernels_minimax.ffn.flydsl_build", "compile_isa") or toolchain_missing()


@dataclass(frozen=True)
class Compile:
    label: str  # what the table calls it
    script: str  # prints one JSON line of facts; argv[1] is the target
    target: str
    missing: Callable[[], str | None]  # why this build is absent here, or None
    cost: int  # relative compile time, to share the jobs out evenly


COMPILES = (
    Compile(
        "K1 triton sm90",
        K1_TRITON,
        "sm90",
        lambda: _has("mono_kernels_kimi.kda.triton_build", "compile_for"),
        1,
    ),
    Compile(
        "FFN triton sm90",
        FFN_TRITON,
        "sm90",
        lambda: _has("mono_kernels_minimax.ffn.triton_build", "compile_for"),
        1,
    ),
    Compile("FFN flydsl gfx950", FFN_FLYDSL, "gfx950", _flydsl_missing, 4),
)


def share(jobs: list[Compile], world: int) -> list[list[Compile]]:
    """The jobs of each rank: longest first, each to the least loaded rank."""
    loads = [0] * world
    mine: list[list[Compile]] = [[] for _ in range(world)]
    for job in sorted(jobs, key=lambda j: -j.cost):
        r = loads.index(min(loads))
        mine[r].append(job)
        loads[r] += job.cost
    return mine


class Running:
    """One compile child, started when the ranks start so that it overlaps the protocol
    checks (on a small machine the compiles are most of qualify's time)."""

    def __init__(self, job: Compile) -> None:
        self.job = job
        self.started = time.monotonic()
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", job.script, job.target],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=_die_with_parent,
        )

    def result(self) -> str:
        left = COMPILE_TIMEOUT_S - (time.monotonic() - self.started)
        try:
            out, err = self.proc.communicate(timeout=max(1.0, left))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise CheckFailed(f"{self.job.label}: compile ran past {COMPILE_TIMEOUT_S} s") from None
        seconds = time.monotonic() - self.started
        if self.proc.returncode != 0:
            last = (err.strip().splitlines() or ["(no output)"])[-1]
            raise CheckFailed(f"{self.job.label} does not compile: {last}")
        facts = json.loads(out.strip().splitlines()[-1])
        return f"{self.job.label} ok ({facts['shared'] // 1024} KiB shared, {seconds:.0f} s)"


def _die_with_parent() -> None:
    """Linux: the compile child is killed if its rank dies (a rank can be ended mid-run)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _present() -> tuple[list[Compile], list[tuple[Compile, str]]]:
    present, absent = [], []
    for job in COMPILES:
        reason = job.missing()
        if reason:
            absent.append((job, reason))
        else:
            present.append(job)
    return present, absent


def start_compiles(ctx: RankContext) -> None:
    """At start-up, on a CPU: launch this rank's share of the compiles in the background."""
    if ctx.gpu:
        return
    present, absent = _present()
    mine = share(present, ctx.world)[ctx.rank] if present else []
    ctx.background["builds"] = ([Running(job) for job in mine], present, absent)


def kernel_builds(ctx: RankContext) -> str:
    if ctx.gpu:
        return _run_on_gpu(ctx)
    if "builds" not in ctx.background:
        start_compiles(ctx)
    running, present, absent = ctx.background.pop("builds")
    ctx.info["absent"] = {job.label: f"absent: {reason}" for job, reason in absent}
    if not present:
        raise Skipped("no kernel build present: " + "; ".join(r for _, r in absent))
    done = [job.result() for job in running]
    if not done:
        raise Skipped("no build left for this rank")
    return "; ".join(done)


def _run_on_gpu(ctx: RankContext) -> str:
    """Every Triton build present, on this rank's GPU, against its reference."""
    done, absent = [], ctx.info.setdefault("absent", {})
    k1 = _has("mono_kernels_kimi.kda.runner", "KdaRunner")
    if k1 is None:
        done.append(_k1_matches_reference(ctx))
    else:
        absent["K1 triton"] = f"absent: {k1}"
    ffn = _has("mono_kernels_minimax.ffn.runner", "FfnRunner")
    if ffn is not None:
        absent["FFN triton"] = f"absent: {ffn}"
    elif ctx.world in FFN_TP:
        done.append(_ffn_matches_reference(ctx))
    else:
        absent["FFN triton"] = f"not run: it shards over {FFN_TP} ranks, not {ctx.world}"
    if not done:
        raise Skipped("no kernel build checked: " + "; ".join(absent.values()))
    return "; ".join(done)


def _k1_matches_reference(ctx: RankContext) -> str:
    import torch
    from mono_kernels_kimi.config import KimiK3Config
    from mono_kernels_kimi.kda.inputs import make_inputs
    from mono_kernels_kimi.kda.runner import KdaRunner

    cfg = KimiK3Config.tiny()
    checked = []
    for requests, L in ((1, 1), (2, 4)):
        inputs = make_inputs(cfg, requests, L, device=ctx.device, seed=17)
        ref = inputs.clone()
        want = ref.reference()
        got = inputs.clone()
        runner = KdaRunner(cfg, ctx.device, L, max_rows=requests * L)  # compiles this width
        runner(got.R, **got.k1_kwargs())
        torch.cuda.synchronize(ctx.device)
        runner.check()
        err_out, err_state = _rel(got.out, want), _rel(got.state, ref.state)
        if not (err_out < 1e-2 and err_state < 1e-3):
            raise CheckFailed(
                f"K1 {requests}x{L} off its reference: out rel {err_out:.2e} (limit 1e-2), "
                f"state rel {err_state:.2e} (limit 1e-3)"
            )
        checked.append(f"{requests}x{L} rel {err_out:.0e}")
    return f"K1 (tiny) matches its reference ({', '.join(checked)})"


def _ffn_matches_reference(ctx: RankContext) -> str:
    """MiniMax-M3's FFN tail at tiny shapes with TP = every rank (its in-kernel all-reduces
    across the GPUs): a plain and a padded step, against the reference, the same bits on
    every rank."""
    import torch
    from mono_kernels_minimax.config import MiniMaxM3Config
    from mono_kernels_minimax.ffn.reference import ffn_reference
    from mono_kernels_minimax.ffn.runner import FfnRunner
    from mono_kernels_minimax.ffn.weights import random_weights
    from mono_kernels_minimax.formats import WeightFormat

    tiny = MiniMaxM3Config.tiny()  # one 32-column block per rank at least
    cfg = replace(tiny, moe_intermediate_size=max(tiny.moe_intermediate_size, 32 * ctx.world))
    fmt, widths = WeightFormat.MXFP4, (1, 4)
    weights = [
        random_weights(cfg, ctx.world, fmt, seed=5, rank_seed=r, device=ctx.device)
        for r in range(ctx.world)
    ]
    runner = FfnRunner(
        cfg,
        fmt,
        ctx.group,
        ctx.rank,
        ctx.world,
        ctx.device,
        widths=widths,
        deadline_ns=60_000_000_000,  # the first launch meets ranks a few seconds apart
    )
    checked = []
    try:
        runner.warm()
        for s in widths:
            g = torch.Generator().manual_seed(50 + s)
            parts = [
                torch.randn(s, cfg.hidden_size, generator=g).bfloat16().to(ctx.device)
                for _ in range(ctx.world)
            ]
            residual = torch.randn(s, cfg.hidden_size, generator=g).bfloat16().to(ctx.device)
            slots = torch.arange(s, dtype=torch.int64)
            if s > 1:
                slots[1] = -1  # a graph-padding row: seam only, zero MoE output
            slots = slots.to(ctx.device)
            runner.step_begin()
            out, res = runner(parts[ctx.rank], residual, weights[ctx.rank], slots)
            torch.cuda.synchronize(ctx.device)
            runner.after_step()
            ref = ffn_reference(cfg, parts, residual, weights, slots)
            err_out, err_res = _rel(out, ref.out), _rel(res, ref.residual)
            if not (err_out < 1e-2 and err_res < 1e-6):
                raise CheckFailed(
                    f"FFN S={s} TP{ctx.world} off its reference: out rel {err_out:.2e} "
                    f"(limit 1e-2), residual rel {err_res:.2e} (limit 1e-6)"
                )
            if not ctx.same_on_every_rank(out):
                raise CheckFailed(f"FFN S={s}: ranks got different bits")
            checked.append(f"S={s} rel {err_out:.0e}")
    finally:
        torch.cuda.synchronize(ctx.device)
        ctx.barrier()
        runner.close()
    return f"FFN (tiny, TP{ctx.world}) matches its reference ({', '.join(checked)})"


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
