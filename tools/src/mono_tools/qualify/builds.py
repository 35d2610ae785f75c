"""The kernel builds of mono_runtime's registry (mono_tools.kernels registers them): on
a CPU each build compiles ahead of time for every target it compiles for (the Triton
builds for sm_90, the FlyDSL build for gfx950, with its residency check); on a GPU each
family's runner runs at tiny shapes against its plain-torch reference. A build that is
not checked here (its package absent, a target it refuses, no toolchain, or not the build
the runner takes on this GPU) is a SKIP row of its own, with the reason.

Compiles run in child processes (`python -m mono_runtime.kernel.compile`): a backend abort
must fail the check, not kill the rank, and the ranks run with TRITON_INTERPRET=1, under
which nothing compiles for a GPU. The compiles are shared out over the ranks, so a 2-rank
run keeps both cores of a small machine busy.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from mono_tools import kernels
from mono_tools.qualify.context import CheckFailed, RankContext, Skipped

if TYPE_CHECKING:  # imported where used: the command's parent process stays light
    from mono_runtime.kernel import Build

COMPILE_TIMEOUT_S = 400
FFN_TP = (1, 2, 4, 8)  # the TP sizes the FFN kernel is built for
COST = {"flydsl": 4}  # compile time against a Triton build's (FlyDSL: its import, ld.lld)


@dataclass(frozen=True)
class Compile:
    build: type[Build]
    target: str

    @property
    def label(self) -> str:  # what the table calls it
        return f"{self.build.name()} {self.target}"

    @property
    def cost(self) -> int:  # relative compile time, to share the jobs out evenly
        return COST.get(self.build.backend, 1)


def _plan() -> tuple[list[Compile], dict[str, str]]:
    """Every (registered build, target it compiles for) this machine can compile, and why
    each of the others is not checked here."""
    from mono_runtime.kernel import registry

    absent = {module: f"absent: {why}" for module, why in kernels.load().items()}
    jobs = []
    for cls in registry.builds():
        build = cls.example()
        for target in cls.targets:
            reason = build.supports(target) or build.compiler_missing()
            if reason:
                absent[f"{cls.name()} {target}"] = f"not checked: {reason}"
            else:
                jobs.append(Compile(cls, target))
    return jobs, absent


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
        build = job.build
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mono_runtime.kernel.compile",
                build.__module__,
                build.name(),
                job.target,
            ],
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
        if facts["problem"]:
            raise CheckFailed(f"{self.job.label} compiles but cannot run: {facts['problem']}")
        return f"{self.job.label} ok ({facts['shared'] // 1024} KiB shared, {seconds:.0f} s)"


def _die_with_parent() -> None:
    """Linux: the compile child is killed if its rank dies (a rank can be ended mid-run)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start_compiles(ctx: RankContext) -> None:
    """At start-up, on a CPU: launch this rank's share of the compiles in the background."""
    if ctx.gpu:
        return
    present, absent = _plan()
    mine = share(present, ctx.world)[ctx.rank] if present else []
    ctx.background["builds"] = ([Running(job) for job in mine], present, absent)


def kernel_builds(ctx: RankContext) -> str:
    if ctx.gpu:
        return _run_on_gpu(ctx)
    if "builds" not in ctx.background:
        start_compiles(ctx)
    running, present, absent = ctx.background.pop("builds")
    ctx.info["absent"] = absent
    if not present:
        raise Skipped("no kernel build compiles here: " + "; ".join(absent.values()))
    done = [job.result() for job in running]
    if not done:
        raise Skipped("no build left for this rank")
    return "; ".join(done)


class NotRun(Exception):
    """A family's reference check does not apply to this run (say why)."""


def _run_on_gpu(ctx: RankContext) -> str:
    """Each registered family's runner on this rank's GPU, against its reference; every
    build it did not take here is a SKIP row."""
    from mono_runtime.kernel import registry, target_name

    absent = ctx.info.setdefault("absent", {})
    absent.update({module: f"absent: {why}" for module, why in kernels.load().items()})
    target, done = target_name(ctx.device), []
    for family in registry.families():
        builds = [cls.name() for cls in registry.builds(family)]
        check = REFERENCE_CHECKS.get(family)
        try:
            if check is None:
                raise NotRun("no reference check on a GPU for it yet")
            detail, took = check(ctx)
        except NotRun as exc:
            absent.update({f"{name} {target}": f"not run: {exc}" for name in builds})
            continue
        done.append(detail)
        absent.update(
            {f"{n} {target}": f"not run: the runner takes {took} here" for n in builds if n != took}
        )
    if not done:
        raise Skipped("no kernel build checked: " + "; ".join(absent.values()))
    return "; ".join(done)


def _k1_matches_reference(ctx: RankContext) -> tuple[str, str]:
    import torch
    from mono_kernels_kimi.config import KimiK3Config
    from mono_kernels_kimi.kda.build import K1Triton
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
    return f"K1 (tiny) matches its reference ({', '.join(checked)})", K1Triton.name()


def _ffn_matches_reference(ctx: RankContext) -> tuple[str, str]:
    """MiniMax-M3's FFN tail at tiny shapes with TP = every rank (its in-kernel all-reduces
    across the GPUs): a plain and a padded step, against the reference, the same bits on
    every rank."""
    if ctx.world not in FFN_TP:
        raise NotRun(f"it shards over {FFN_TP} ranks, not {ctx.world}")
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
        # the layout the build streams, converted in place: the reference reads it too
        mine = weights[ctx.rank] = runner.pack(weights[ctx.rank])
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
            out, res = runner(parts[ctx.rank], residual, mine, slots)
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
    took = f"ffn {runner.build_name}"
    return f"FFN (tiny, TP{ctx.world}, {took}) matches its reference ({', '.join(checked)})", took


def _k2_matches_reference(ctx: RankContext) -> tuple[str, str]:
    """Kimi-K3's K2 at tiny shapes with TP = every rank (its in-kernel all-reduces and
    all-gathers across the GPUs): a block-write and a plain layer, a padded row, against
    the reference, the same bits on every rank."""
    if ctx.world not in FFN_TP:
        raise NotRun(f"it shards over {FFN_TP} ranks, not {ctx.world}")
    import torch
    from mono_kernels_kimi.config import KimiK3Config
    from mono_kernels_kimi.k2.build import K2Triton
    from mono_kernels_kimi.k2.inputs import step_inputs
    from mono_kernels_kimi.k2.reference import k2_reference
    from mono_kernels_kimi.k2.runner import K2Runner
    from mono_kernels_kimi.k2.weights import random_weights

    cfg, rows = KimiK3Config.tiny(ctx.world), 4
    weights = [random_weights(cfg, seed=5, rank=r, device=ctx.device) for r in range(ctx.world)]
    runner = K2Runner(
        cfg, ctx.group, ctx.rank, ctx.device, widths=(rows,), deadline_ns=60_000_000_000
    )  # the first launch meets ranks a few seconds apart
    checked = []
    try:
        # the layout the build streams, converted in place: the reference reads it too
        mine = weights[ctx.rank] = runner.pack(weights[ctx.rank])
        runner.warm()
        for layer_idx in (2, 3):  # a block-write layer, then a plain one
            step = step_inputs(cfg, rows, seed=60 + layer_idx, device=ctx.device, padding=(1,))
            ref = k2_reference(
                cfg, step.cores, step.prefix, step.blocks, weights, layer_idx, step.live
            )
            prefix = step.prefix.clone()
            runner.step_begin()
            out = runner(step.cores[ctx.rank], prefix, step.blocks, mine, step.slots, layer_idx)
            torch.cuda.synchronize(ctx.device)
            runner.after_step()
            err_out, err_prefix = _rel(out, ref.out), _rel(prefix, ref.prefix)
            if not (err_out < 1e-2 and err_prefix < 1e-2):
                raise CheckFailed(
                    f"K2 layer {layer_idx} TP{ctx.world} off its reference: out rel "
                    f"{err_out:.2e}, prefix rel {err_prefix:.2e} (limits 1e-2)"
                )
            if not ctx.same_on_every_rank(out):
                raise CheckFailed(f"K2 layer {layer_idx}: ranks got different bits")
            checked.append(f"layer {layer_idx} rel {err_out:.0e}")
    finally:
        torch.cuda.synchronize(ctx.device)
        ctx.barrier()
        runner.close()
    took = K2Triton.name()
    return f"K2 (tiny, TP{ctx.world}) matches its reference ({', '.join(checked)})", took


def _drafter_matches_reference(ctx: RankContext) -> tuple[str, str]:
    """Kimi-K3's DSpark drafter at tiny shapes with TP = every rank (its in-kernel
    all-reduces across the GPUs): one narrow launch of two requests, one of them padding,
    against the reference (the hidden states and every layer's cache), the same bits on
    every rank. The tiny config gets a head and 16 MLP columns a rank at least, so that
    every TP the kernel serves is checked."""
    import torch
    from mono_kernels_kimi.drafter.build import DrafterTriton
    from mono_kernels_kimi.drafter.config import DrafterConfig
    from mono_kernels_kimi.drafter.inputs import step_inputs
    from mono_kernels_kimi.drafter.reference import cos_sin_cache, drafter_reference
    from mono_kernels_kimi.drafter.runner import DrafterRunner
    from mono_kernels_kimi.drafter.spec import TPS
    from mono_kernels_kimi.drafter.weights import random_weights

    if ctx.world not in TPS:
        raise NotRun(f"it shards over {TPS} ranks, not {ctx.world}")
    tiny = DrafterConfig.tiny()
    cfg = replace(
        tiny,
        tp=ctx.world,
        num_attention_heads=max(tiny.num_attention_heads, ctx.world),
        intermediate_size=max(tiny.intermediate_size, 16 * ctx.world),
    )
    on_cpu = random_weights(cfg, seed=5)  # the context precompute of the inputs runs on a CPU
    step = step_inputs(cfg, on_cpu, 2, seed=70, padding=(1,), device=ctx.device)
    weights = [random_weights(cfg, seed=5, rank=r, device=ctx.device) for r in range(ctx.world)]
    # before the launch: the runner writes step.caches in place
    ref = drafter_reference(
        cfg, step.embeds, step.positions, step.caches, step.block_table, step.seq_lens,
        step.slot_mapping, weights, step.live,
    )  # fmt: skip
    runner = DrafterRunner(
        cfg,
        ctx.group,
        ctx.rank,
        ctx.device,
        weights[ctx.rank],
        step.caches,
        cos_sin_cache(cfg).to(ctx.device),
        deadline_ns=60_000_000_000,  # the first launch meets ranks a few seconds apart
    )
    try:
        runner.warm()
        runner.step_begin()
        out = runner(
            step.embeds, step.positions, step.slot_mapping, step.block_table, step.seq_lens
        )
        torch.cuda.synchronize(ctx.device)
        runner.after_step()
        rows = step.live.repeat_interleave(cfg.query_len)
        err_out = _rel(out[rows], ref.hidden[rows])
        written = step.slot_mapping[step.slot_mapping >= 0]  # the rest is garbage, left alone
        err_cache = max(
            _rel(mine.view(-1, cfg.kv_entry)[written], theirs.view(-1, cfg.kv_entry)[written])
            for mine, theirs in zip(step.caches, ref.caches, strict=True)
        )
        if not (err_out < 1e-2 and err_cache < 1e-2 and bool((out[~rows] == 0).all())):
            raise CheckFailed(
                f"drafter TP{ctx.world} off its reference: out rel {err_out:.2e}, caches rel "
                f"{err_cache:.2e} (limits 1e-2), padding rows zero: {bool((out[~rows] == 0).all())}"
            )
        if not ctx.same_on_every_rank(out):
            raise CheckFailed("drafter: ranks got different bits")
    finally:
        torch.cuda.synchronize(ctx.device)
        ctx.barrier()
        runner.close()
    took = DrafterTriton.name()
    return f"drafter (tiny, TP{ctx.world}) matches its reference (rel {err_out:.0e})", took


REFERENCE_CHECKS = {
    "ffn": _ffn_matches_reference,
    "kda": _k1_matches_reference,
    "k2": _k2_matches_reference,
    "drafter": _drafter_matches_reference,
}
"""A family's check on a GPU: (detail, the registry name of the build its runner took)."""


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
