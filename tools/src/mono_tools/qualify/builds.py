"""The kernel builds: on a CPU every present build compiles ahead of time for the GPU it
serves (Triton builds for NVIDIA sm_90, FlyDSL builds for AMD gfx950); on a GPU each rank
runs the Triton builds at tiny shapes against their plain-torch references.

Compiles run in child processes: a backend abort must fail the check, not kill the rank,
and the ranks run with TRITON_INTERPRET=1, under which nothing compiles for a GPU. The
compiles are shared out over the ranks, so a 2-rank run keeps both cores of a small
machine busy.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from mono_tools.qualify.context import CheckFailed, RankContext, Skipped

COMPILE_TIMEOUT_S = 400

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


def _compile(job: Compile) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", job.script, job.target],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"{job.label}: compile ran past {COMPILE_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CheckFailed(f"{job.label} does not compile: {last}")
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    return f"{job.label} ok ({facts['shared'] // 1024} KiB shared)"


def kernel_builds(ctx: RankContext) -> str:
    if ctx.gpu:
        return _run_on_gpu(ctx)
    present, absent = [], []
    for job in COMPILES:
        reason = job.missing()
        (absent if reason else present).append((job, reason))
    if not present:
        raise Skipped("no kernel build present: " + "; ".join(r for _, r in absent))
    mine = share([job for job, _ in present], ctx.world)[ctx.rank]
    done = [_compile(job) for job in mine]
    ctx.info["absent"] = {job.label: reason for job, reason in absent}
    if ctx.rank == 0:
        done += [f"{job.label} absent ({reason})" for job, reason in absent]
    if not done:
        raise Skipped("no build left for this rank")
    return "; ".join(done)


def _run_on_gpu(ctx: RankContext) -> str:
    """Every Triton build present, on this rank's GPU, against its reference."""
    done = []
    if _has("mono_kernels_kimi.kda.runner", "KdaRunner") is None:
        done.append(_k1_matches_reference(ctx))
    if not done:
        raise Skipped("no kernel build present")
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
        runner = KdaRunner(cfg, ctx.device, L)
        runner.warm()
        runner(
            got.R,
            prefix=got.prefix,
            delta=got.delta,
            blocks=got.blocks,
            num_blocks=got.num_blocks,
            write_idx=got.write_idx,
            weights=got.weights,
            conv_state=got.conv_state,
            state=got.state,
            state_indices=got.state_indices,
            num_accepted=got.num_accepted,
            out=got.out,
        )
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


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
