"""The tagged all-reduce under the interpreter, 2 and 4 ranks as processes (host peers):
against a plain sum and the torch reference, bit-identical across ranks, and with one rank
stalled past the deadline (every rank raises MonoFault; after reset the next step is right).
"""

from __future__ import annotations

import pytest
from mono_peer.testing import spawn

ENV = {"TRITON_INTERPRET": "1"}
POLLS = 1_000_000  # ns per poll on a CPU runner
ROWS, HIDDEN, BLOCK = 2, 24, 8  # 12 pairs a row: 2 blocks, the second one partial


def _inputs(world, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    parts = [torch.randn(ROWS, HIDDEN, generator=g).bfloat16() for _ in range(world)]
    residual = torch.randn(ROWS, HIDDEN, generator=g).bfloat16()
    weight = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).bfloat16()
    return parts, residual, weight


def _runner(rank, world, group, deadline_polls=3000):
    from mono_runtime.allreduce import AllreduceBuild
    from mono_runtime.runner import MonoRunner

    build = AllreduceBuild(ROWS, HIDDEN, world, True, True, BLOCK)
    return MonoRunner(
        "cpu",
        group,
        rank,
        world,
        build.scratch_bytes + 64,
        build.peer_bytes,
        deadline_ns=deadline_polls * POLLS,
    )


def sums_child(rank, world, group):
    from mono_runtime.allreduce import allreduce

    runner = _runner(rank, world, group)
    parts, residual, weight = _inputs(world, 1)
    runner.step_begin()
    plain, _ = allreduce(runner, parts[rank], 0, block=BLOCK)
    normed, rout = allreduce(runner, parts[rank], 1, residual, weight, block=BLOCK)
    runner.after_step()
    runner.step_begin()  # the next step reuses both parities: tags keep it apart
    again, _ = allreduce(runner, parts[rank], 0, block=BLOCK)
    runner.after_step()
    runner.close()
    return plain, normed, rout, again


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 4])
def test_allreduce_matches_sum_and_reference(world):
    import torch
    from mono_runtime.allreduce import allreduce_reference

    results = spawn(sums_child, world, 220, env=ENV)
    parts, residual, weight = _inputs(world, 1)
    plain_sum = torch.stack([p.float() for p in parts]).sum(0).bfloat16()
    ref_out, ref_res = allreduce_reference(parts, residual, weight)
    for plain, normed, rout, again in results:
        assert torch.equal(plain, plain_sum)
        assert torch.equal(again, plain_sum)
        assert torch.equal(rout, ref_res)
        torch.testing.assert_close(normed, ref_out, atol=1e-2, rtol=1e-2)
    for other in results[1:]:  # bit-identical across ranks
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def fault_child(rank, world, group, late):
    import torch
    from mono_runtime import MonoFault
    from mono_runtime.allreduce import allreduce

    runner = _runner(rank, world, group)
    parts, residual, weight = _inputs(world, 2)
    log = {}
    runner.step_begin()  # ranks start seconds apart: one generous step lines them up
    log["first"], _ = allreduce(runner, parts[rank], 0, block=BLOCK)
    runner.after_step()
    runner.set_deadline(300 * POLLS)
    # a stall under the deadline: right answer
    runner.inject(late, 5 * POLLS)
    runner.step_begin()
    log["slow_ok"], _ = allreduce(runner, parts[rank], 1, block=BLOCK)
    runner.after_step()
    # a stall past the deadline (it ends when someone's alarm is set): MonoFault everywhere
    runner.inject(late, 10**9 * POLLS)
    fault = None
    for step in range(3):
        runner.step_begin()
        out, _ = allreduce(runner, parts[rank], step % 2, residual, weight, block=BLOCK)
        if step == 0:
            log["poisoned"] = bool(torch.isnan(out.float()).all())
        try:
            runner.after_step()
        except MonoFault as e:
            fault = str(e)
            break
    log["fault"] = fault
    runner.inject(None)
    runner.reset()
    runner.set_deadline(3000 * POLLS)
    runner.step_begin()
    log["after"], _ = allreduce(runner, parts[rank], 0, block=BLOCK)
    runner.after_step()
    runner.close()
    return log


@pytest.mark.timeout(280)
@pytest.mark.parametrize("world, late", [(2, 1), (4, 2)])
def test_fault_injection_raises_everywhere_then_reset(world, late):
    import torch

    logs = spawn(fault_child, world, 260, late, env=ENV)
    parts, _, _ = _inputs(world, 2)
    plain_sum = torch.stack([p.float() for p in parts]).sum(0).bfloat16()
    for rank, log in enumerate(logs):
        assert torch.equal(log["first"], plain_sum), f"rank {rank}: first step"
        assert torch.equal(log["slow_ok"], plain_sum), f"rank {rank}: stall under deadline"
        assert log["fault"] is not None, f"rank {rank} never raised MonoFault"
        assert log["poisoned"], f"rank {rank}: the faulted step's output is not all NaN"
        assert f"rank {late} " in log["fault"], log["fault"]
        assert torch.equal(log["after"], plain_sum), f"rank {rank}: wrong after reset"
    # the ranks that waited for the late one blame it by name
    blamed = [log["fault"] for r, log in enumerate(logs) if r != late]
    assert any(f"rank {late} never arrived" in f for f in blamed), blamed
