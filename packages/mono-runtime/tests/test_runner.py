"""MonoRunner's host half: argument refusals on every rank, agree over ranks, the guard,
fault injection settings, and the after_step fast path (no give-up, no raise)."""

from __future__ import annotations

import pytest
from mono_peer.testing import spawn

ENV = {"TRITON_INTERPRET": "1"}


def refuse_child(rank, world, group):
    from mono_runtime import MonoRunner, MonoUnsupported, agree

    out = []
    try:  # only rank 1 passes a bad size: every rank must refuse together
        MonoRunner("cpu", group, rank, world, 4096 if rank == 0 else 0, 4096)
    except MonoUnsupported as e:
        out.append(str(e))
    try:
        agree(["weights: bad scale"] if rank == 0 else [], group, "the weights")
    except MonoUnsupported as e:
        out.append(str(e))
    return out


@pytest.mark.timeout(120)
def test_refusals_reach_every_rank():
    r0, r1 = spawn(refuse_child, 2, 100)
    assert "scratch_bytes must be an int >= 8" in r1[0] and "another rank refused" in r0[0]
    assert "weights: bad scale" in r0[1] and "another rank refused" in r1[1]


def guard_child(rank, world, group):
    import torch
    from mono_runtime import MonoRunner

    with MonoRunner("cpu", group, rank, world, 64, 64, deadline_ns=10**9) as runner:
        x = torch.ones(3000, dtype=torch.bfloat16)
        runner.guard(x)
        clean = bool(torch.isfinite(x.float()).all())
        runner.alarms[1 - rank] = 2  # as if the other rank gave up
        runner.guard(x)
        poisoned = bool(torch.isnan(x.float()).all())
        runner.alarms.zero_()
        args, peers = runner.launch_args(), runner.peer_args()
        runner.step_begin()
        runner.step_begin()
        runner.after_step()  # no give-up: returns without a sync
        runner.inject(1, 3_000_000)
        return (
            clean,
            poisoned,
            sorted(args),
            sorted(peers),
            runner.tag(5),
            runner.ctl[:5].tolist(),
            runner.deadline_ns,
        )


@pytest.mark.timeout(120)
def test_guard_args_and_settings():
    for clean, poisoned, args, peers, tag, ctl, deadline in spawn(guard_child, 2, 100, env=ENV):
        assert clean and poisoned
        assert args == ["CPU", "ctl", "health", "scratch", "tickets"]
        assert peers == ["peers", "rank", "world"]
        assert tag == (2 << 8) | 5
        assert ctl == [2, 0, 1000, 2, 3] and deadline == 10**9  # polls on a CPU


def test_runner_bad_arguments_single_rank():
    from mono_runtime import MonoRunner, MonoUnsupported

    with pytest.raises(MonoUnsupported, match="world 65 exceeds"):
        MonoRunner("cpu", None, 0, 65, 64, 64)
    with MonoRunner("cpu", None, 0, 1, 64, 64) as runner:
        with pytest.raises(ValueError, match="deadline_ns"):
            runner.set_deadline(0)
        with pytest.raises(ValueError, match="inject: rank 1"):
            runner.inject(1, 5)


def test_kernels_sharing_a_runner_draw_slots_from_one_count():
    """K1 and K2 launch into one step on one runner: each launch takes the next slot."""
    from mono_runtime import MonoRunner
    from mono_runtime import protocol as P

    with MonoRunner("cpu", None, 0, 1, 64, 64) as runner:
        runner.step_begin()
        assert [runner.take_slot() for _ in range(P.SLOTS)] == list(range(P.SLOTS))
        with pytest.raises(ValueError, match=f"more than {P.SLOTS} launches in one step"):
            runner.take_slot()
        runner.step_begin()
        assert runner.take_slot() == 0
        runner.reset()
        assert runner.take_slot() == 0
