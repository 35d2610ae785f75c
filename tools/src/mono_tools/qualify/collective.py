"""The checks of the in-kernel protocol: the runtime's tagged all-reduce (+ residual +
RMSNorm) through a `MonoRunner`, right and bit-identical on every rank, across the tag era's
end, under graph replay, and with a rank stalled under and over the deadline."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from mono_tools.qualify.context import CheckFailed, RankContext, Skipped

NS_PER_POLL = 1_000_000  # the runtime's CPU clock: a deadline in ns counts polls ns // this
GENEROUS_NS = 60_000_000_000  # first launches (compiles, ranks a few seconds apart)
# Interpreter deadlines, in polls: a rank of a loaded 2-core machine can be descheduled for
# a while, so the bound that must not trip is wide; the one that must trip is shorter.
UNDER_POLLS = 2000
OVER_POLLS = 300


def sizes(ctx: RankContext) -> list[tuple[int, int]]:
    """(rows, hidden) to reduce: the served width on a GPU, interpreter-sized on a CPU;
    an odd row count and a hidden size that leaves a partial block in both."""
    if ctx.gpu:
        return [(1, 6144), (4, 6144), (16, 6144), (3, 1030)]
    return [(1, 64), (3, 1030), (8, 256)]


@contextmanager
def runner_for(ctx: RankContext, rows: int, hidden: int, deadline_ns: int = GENEROUS_NS):
    """A runner sized for the largest all-reduce of (rows, hidden) with residual and norm,
    closed only once every rank is done with every peer's buffer."""
    from mono_runtime.allreduce import AllreduceBuild
    from mono_runtime.runner import MonoRunner

    build = AllreduceBuild(rows, hidden, ctx.world, residual=True, norm=True)
    runner = MonoRunner(
        ctx.device,
        ctx.group,
        ctx.rank,
        ctx.world,
        build.scratch_bytes + 64,
        build.peer_bytes,
        deadline_ns=deadline_ns,
    )
    try:
        yield runner
    finally:
        if ctx.gpu:
            torch.cuda.synchronize(ctx.device)
        ctx.barrier()
        runner.close()


class Inputs:
    """Every rank's partial, a residual and a norm weight from one seed: each rank can
    compute the reference of the whole reduction by itself."""

    def __init__(self, ctx: RankContext, rows: int, hidden: int, seed: int) -> None:
        from mono_runtime.allreduce import allreduce_reference

        g = torch.Generator().manual_seed(seed)
        self.parts = [torch.randn(rows, hidden, generator=g).bfloat16() for _ in range(ctx.world)]
        self.residual = torch.randn(rows, hidden, generator=g).bfloat16()
        self.weight = (1 + 0.1 * torch.randn(hidden, generator=g)).bfloat16()
        self.plain, _ = allreduce_reference(self.parts)
        self.normed, self.residual_out = allreduce_reference(self.parts, self.residual, self.weight)
        self.mine = self.parts[ctx.rank].to(ctx.device)
        self.residual_dev = self.residual.to(ctx.device)
        self.weight_dev = self.weight.to(ctx.device)


def launch(runner, inputs: Inputs, norm: bool = True):
    """A step of two launches (slots 0 and 1): the plain sum, then residual + norm."""
    from mono_runtime.allreduce import allreduce

    runner.step_begin()
    plain, _ = allreduce(runner, inputs.mine, 0)
    normed = residual_out = None
    if norm:
        normed, residual_out = allreduce(
            runner, inputs.mine, 1, inputs.residual_dev, inputs.weight_dev
        )
    return plain, normed, residual_out


def one_step(runner, inputs: Inputs, norm: bool = True):
    """`launch`, then the after-step check every step gets (raises MonoFault). On a GPU it
    waits for the step first: qualify wants this step's verdict, not the next one's."""
    outs = launch(runner, inputs, norm)
    finish(runner)
    return outs


def finish(runner) -> None:
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    runner.after_step()


def expect_right(ctx: RankContext, inputs: Inputs, plain, normed, residual_out, what: str):
    """Exact rank-ordered sums, the norm within bf16 rounding, the same bits on every rank."""
    if not torch.equal(plain.cpu(), inputs.plain):
        bad = (plain.cpu().float() - inputs.plain.float()).abs().max().item()
        raise CheckFailed(f"{what}: sum differs from the rank-ordered sum (max |err| {bad:.3g})")
    if normed is not None:
        if not torch.equal(residual_out.cpu(), inputs.residual_out):
            raise CheckFailed(f"{what}: residual output differs from the reference")
        err = (normed.cpu().float() - inputs.normed.float()).abs().max().item()
        if not err <= 2e-2:  # also false for NaN
            raise CheckFailed(f"{what}: RMSNorm output off by {err:.3g} (bf16 allows 2e-2)")
    outs = [t for t in (plain, normed, residual_out) if t is not None]
    if not ctx.same_on_every_rank(torch.cat([t.reshape(-1) for t in outs])):
        raise CheckFailed(f"{what}: ranks got different bits")


def tagged_allreduce(ctx: RankContext) -> str:
    from mono_runtime import MonoFault

    shapes = sizes(ctx)
    done = []
    for rows, hidden in shapes:
        with runner_for(ctx, rows, hidden) as runner:
            inputs = Inputs(ctx, rows, hidden, seed=rows * 7919 + hidden)
            if ctx.force_fault:  # testing only: the last rank misses the deadline
                one_step(runner, inputs)  # lines the ranks up before the fault
                runner.set_deadline(_units(ctx, 500_000_000, 500))
                runner.inject(ctx.world - 1, 10**6 * _units(ctx, 500_000_000, 500))
            try:
                for _ in range(2):  # the second step reuses both parities
                    expect_right(ctx, inputs, *one_step(runner, inputs), f"{rows}x{hidden}")
            except MonoFault as fault:
                ctx.info["timeline"] = str(fault)
                raise
        done.append(f"{rows}x{hidden}")
    return f"bf16 {', '.join(done)}: exact sums, norm within 2e-2, bit-identical on every rank"


def _units(ctx: RankContext, gpu_ns: int, cpu_polls: int) -> int:
    """A wait bound in the runner's ns: real ns on a GPU, a poll count on a CPU."""
    return gpu_ns if ctx.gpu else cpu_polls * NS_PER_POLL


def epoch_wrap(ctx: RankContext) -> str:
    """Past 2^31 steps and across the end of a tag era: the runner rezeroes collectively,
    tags restart, and every step's sums stay right (no stale pair can match)."""
    from mono_runtime import protocol as P

    rows, hidden = (4, 6144) if ctx.gpu else (2, 64)
    with runner_for(ctx, rows, hidden) as runner:
        inputs = Inputs(ctx, rows, hidden, seed=11)
        expect_right(ctx, inputs, *one_step(runner, inputs), "first step")
        runner.skip_steps(1 << 31)  # the int64 epoch passes 2^31 ...
        runner.reset()  # ... and a collective reset starts an era there
        expect_right(ctx, inputs, *one_step(runner, inputs), "step 2^31 + 2")
        runner.skip_steps(P.REZERO_EVERY - 3)  # the era's rezero is two steps away
        tags = []
        for step in range(4):
            tags.append(runner.tag(0))
            expect_right(ctx, inputs, *one_step(runner, inputs, norm=False), f"era step {step}")
        epoch = int(runner.ctl[P.CTL_EPOCH])
    if tags[-1] >= tags[0]:
        raise CheckFailed(f"tags did not restart after the era's rezero: {tags}")
    return f"epoch {epoch} (> 2^31), rezero at the era's end, tags {tags[0]:#x} -> {tags[-1]:#x}"


def graph_replay(ctx: RankContext) -> str:
    """step_begin + both launches captured once in a CUDA/HIP graph; each replay with new
    inputs gives that input's right answer, and after_step runs eagerly after each."""
    from mono_runtime.allreduce import allreduce

    rows, hidden, replays = 4, 6144, 5
    with runner_for(ctx, rows, hidden) as runner:
        inputs = Inputs(ctx, rows, hidden, seed=3)
        x, res, w = inputs.mine.clone(), inputs.residual_dev.clone(), inputs.weight_dev.clone()

        def step():
            runner.step_begin()
            plain, _ = allreduce(runner, x, 0)
            normed, rout = allreduce(runner, x, 1, res, w)
            return plain, normed, rout

        stream = torch.cuda.Stream(ctx.device)
        stream.wait_stream(torch.cuda.current_stream(ctx.device))
        with torch.cuda.stream(stream):
            step()  # compile and warm outside the capture
        torch.cuda.current_stream(ctx.device).wait_stream(stream)
        torch.cuda.synchronize(ctx.device)
        runner.after_step()
        ctx.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = step()
        for replay in range(replays):
            inputs = Inputs(ctx, rows, hidden, seed=100 + replay)
            x.copy_(inputs.mine)
            res.copy_(inputs.residual_dev)
            w.copy_(inputs.weight_dev)
            graph.replay()
            finish(runner)
            expect_right(ctx, inputs, *outs, f"replay {replay}")
        epoch = runner.ctl[0].item()
    return f"{replays} replays of {rows}x{hidden}, right and bit-identical; epoch {epoch}"


def fault_under_deadline(ctx: RankContext) -> str:
    """The last rank stalls before its first peer store, well under the deadline: the step
    waits for it and gives the right answer, with no fault raised anywhere."""
    rows, hidden = (4, 6144) if ctx.gpu else (2, 64)
    deadline = _units(ctx, 2_000_000_000, UNDER_POLLS)
    delay = _units(ctx, 50_000_000, UNDER_POLLS // 50)
    late = ctx.world - 1
    with runner_for(ctx, rows, hidden) as runner:
        inputs = Inputs(ctx, rows, hidden, seed=5)
        expect_right(ctx, inputs, *one_step(runner, inputs), "aligning step")
        runner.set_deadline(deadline)
        runner.inject(late, delay)
        began = time.monotonic()
        result = one_step(runner, inputs)
        if ctx.gpu:
            torch.cuda.synchronize(ctx.device)
        took = time.monotonic() - began
        runner.inject(None)
        expect_right(ctx, inputs, *result, "stalled step")
    if ctx.gpu and took * 1e9 < delay:
        raise CheckFailed(f"the injected stall did not happen ({took * 1e3:.1f} ms)")
    stall = f"{delay / 1e6:.0f} ms" if ctx.gpu else f"{delay // NS_PER_POLL} polls"
    bound = f"{deadline / 1e9:.0f} s" if ctx.gpu else f"{deadline // NS_PER_POLL} polls"
    return f"rank {late} stalled {stall} (deadline {bound}): right answer, no fault"


def fault_over_deadline(ctx: RankContext) -> str:
    """The last rank stalls past the deadline: every rank raises MonoFault with a timeline
    (the waiting ranks name the late one), the faulted outputs are NaN, and after a
    collective reset the next step is right."""
    from mono_runtime import MonoFault

    if ctx.world < 2:
        raise Skipped("needs 2+ ranks (a lone rank waits for nobody)")
    rows, hidden = (4, 6144) if ctx.gpu else (2, 64)
    deadline = _units(ctx, 500_000_000, OVER_POLLS)
    late = ctx.world - 1
    with runner_for(ctx, rows, hidden) as runner:
        inputs = Inputs(ctx, rows, hidden, seed=9)
        expect_right(ctx, inputs, *one_step(runner, inputs), "aligning step")
        runner.set_deadline(deadline)
        runner.inject(late, 10**6 * deadline)  # the stall ends when someone's alarm is set
        fault = None
        began = time.monotonic()
        for step in range(3):  # ranks may raise one step apart (PROTOCOL.md section 5)
            plain, normed, _ = launch(runner, inputs)
            if step == 0:  # no token from a step in which a rank gave up
                poisoned = bool(torch.isnan(normed.float()).all())
            try:
                finish(runner)
            except MonoFault as exc:
                fault = exc
                break
        took = time.monotonic() - began
        runner.inject(None)
        runner.reset()
        runner.set_deadline(GENEROUS_NS)
        expect_right(ctx, inputs, *one_step(runner, inputs), "clean step after reset")
    if fault is not None:
        ctx.info["timeline"] = str(fault)
    took = max(ctx.gather(took))  # one figure for the step, the same line on every rank
    faults = ctx.gather(None if fault is None else str(fault))
    silent = [r for r, f in enumerate(faults) if f is None]
    if silent:
        raise CheckFailed(f"rank(s) {silent} never raised MonoFault for the stalled rank {late}")
    if ctx.rank != late and f"rank {late}" not in str(fault):
        raise CheckFailed(f"the timeline does not name the late rank {late}: {fault}")
    if not poisoned:
        raise CheckFailed("the faulted step's normed output is not all NaN")
    return (
        f"rank {late} stalled past the deadline: every rank raised MonoFault with its "
        f"timeline in {took:.1f} s; clean step after reset"
    )
