"""The Triton protocol helpers under the interpreter, on ranks as processes (host peers).

Each test runs its ranks with TRITON_INTERPRET=1 through mono_peer.testing.spawn; the
pytest process itself never imports Triton's helpers (it must not fix Triton's mode for
other packages' tests)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from mono_peer.testing import spawn

ENV = {"TRITON_INTERPRET": "1"}
POLLS = 1_000_000  # ns per poll on a CPU runner (CPU_NS_PER_POLL)


def _kernels():
    spec = importlib.util.spec_from_file_location(
        "mono_runtime_device_kernels", Path(__file__).with_name("device_kernels.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runner(rank, world, group, deadline_polls=2000, peer_bytes=4096):
    from mono_runtime.runner import MonoRunner

    return MonoRunner(
        "cpu", group, rank, world, 4096, peer_bytes, deadline_ns=deadline_polls * POLLS
    )


def _exchange(K, runner, slot=0, skew=0, block=8):
    import torch

    out = torch.zeros(runner.world * block + 1, dtype=torch.int32)
    a = runner.launch_args()
    K.exchange_kernel[(1,)](
        a["ctl"],
        a["health"],
        runner.peer.addresses,
        runner.rank,
        runner.world,
        out,
        slot,
        skew,
        12345,
        BLOCK=block,
        CPU=True,
    )
    return out


def _expected(world, block=8):
    return [r * 1000 + i for r in range(world) for i in range(block)] + [1]


def tags_child(rank, world, group):
    import torch
    from mono_runtime import protocol as P

    K = _kernels()
    cases = [
        (5, 2, 7),
        (1, 0, 0),
        (P.ERA_STEPS, 0, 255),
        (P.ERA_STEPS + 1, 0, 3),
        (0, 0, 1),
        (2**31 + 3, 2**31 - 2, 9),
        (2**32 + 7, 2**32 - 1, 200),
        (3, 9, 1),
    ]
    got = []
    for epoch, base, slot in cases:
        ctl = torch.zeros(P.CTL_WORDS, dtype=torch.int64)
        ctl[P.CTL_EPOCH], ctl[P.CTL_ERA_BASE] = epoch, base
        out = torch.zeros(1, dtype=torch.int64)
        K.tag_kernel[(1,)](ctl, torch.tensor([slot]), out, N=1)
        got.append((int(out[0]), P.tag_of(epoch, base, slot)))
    return got, ticket_runs(rank, world, group)


@pytest.mark.timeout(120)
def test_device_tags_match_host_and_ticket_loop():
    tags, tickets = spawn(tags_child, 1, 100, env=ENV)[0]
    for device, host in tags:
        assert device == host
    # item t waits for t - 1; the counter is back at 0 after every launch
    for (order, counter), n in zip(tickets, (7, 5, 2), strict=True):
        assert order == list(range(1, n + 1)) and counter == 0


def push_child(rank, world, group):
    """bench_protocol's push kernel at 1 and 16 rows: publish_value at both scopes (the
    interpreter exchanges) and the explicit exchange."""
    import torch
    from mono_runtime import bench_protocol as B
    from mono_runtime import protocol as P

    programs, landed = 2, []
    runner = _runner(rank, world, group, peer_bytes=P.PEER_HEAD + 16 * 256 * programs * 8)
    a = runner.launch_args()
    data = runner.peer.bytes[P.PEER_HEAD :].view(torch.int64)
    for rows in (1, 16):
        for way in (0, 1, 2):
            words = data[: rows * 256 * programs]
            words.zero_()
            runner.step_begin()
            B._push[(programs,)](a["ctl"], runner.peer.addresses, rows, way)
            landed.append(B.pushed(words, rows, programs))
            runner.after_step()
    return landed


@pytest.mark.timeout(120)
def test_push_lands_every_pair():
    """A mask narrower than the pointers once left most pairs unwritten (stop 44)."""
    assert spawn(push_child, 1, 100, env=ENV)[0] == [True] * 6


def exchange_child(rank, world, group):
    from mono_runtime import MonoFault

    K = _kernels()
    runner = _runner(rank, world, group)
    log = []
    runner.step_begin()
    log.append(_exchange(K, runner).tolist() == _expected(world))
    runner.after_step()
    # rank 0 waits for a tag nobody writes: it gives up (deadline), rank 1 follows
    runner.set_deadline(30 * POLLS)
    runner.step_begin()
    out = _exchange(K, runner, slot=1, skew=1 if rank == 0 else 0)
    raised = None
    for _ in range(3):
        try:
            runner.after_step()
        except MonoFault as e:
            raised = str(e)
            break
        runner.step_begin()
        _exchange(K, runner, slot=0)
    log.append(raised)
    log.append(out[-1].item())
    runner.reset()
    runner.set_deadline(2000 * POLLS)
    for slot in (0, 1, 0):
        runner.step_begin()
        log.append(_exchange(K, runner, slot=slot).tolist() == _expected(world))
        runner.after_step()
    runner.close()
    return log


@pytest.mark.timeout(200)
def test_exchange_deadline_alarm_reset():
    logs = spawn(exchange_child, 2, 180, env=ENV)
    for rank, log in enumerate(logs):
        assert log[0], f"rank {rank}: first exchange wrong"
        assert log[1] is not None, f"rank {rank} never raised MonoFault"
        assert all(log[3:]), f"rank {rank}: exchange after reset wrong: {log}"
    assert logs[0][2] == 0  # rank 0's wait failed, whichever way it ended
    # What the protocol promises: every rank raises, and some rank carries the deadline
    # record of the wait that gave up. Which rank gives up first is a race (under load
    # rank 1 can time out before rank 0 does, and rank 0 then reports the alarm).
    assert any("deadline at" in log[1] for log in logs), [log[1] for log in logs]
    for log in logs:
        assert "deadline at" in log[1] or "had raised an alarm" in log[1], log[1]


def killed_child(rank, world, group, stage):
    """Rank 1 is SIGKILLed during `stage`; rank 0 reports what it raised, how long it took to
    raise, and every rank's pid (to look for their segments)."""
    import os
    import signal
    import threading
    import time

    import torch.distributed as dist
    from mono_peer.backends.host import HostBackend

    pids = [None] * world
    dist.all_gather_object(pids, os.getpid(), group=group)
    doomed = rank == 1

    def die(*_):
        os.kill(os.getpid(), signal.SIGKILL)

    if doomed and stage == "construction":
        allocate = HostBackend.allocate
        HostBackend.allocate = lambda self: (allocate(self), die())[0]
    began = time.monotonic()
    try:
        runner = _runner(rank, world, group, deadline_polls=200)
        if stage == "kernel wait":
            K = _kernels()
            runner.inject(1, 10**12)  # rank 1 stalls in the kernel, waiting for an alarm
            if doomed:
                threading.Timer(0.5, die).start()
            began = time.monotonic()
            runner.step_begin()
            _exchange(K, runner)
            runner.after_step()
        elif stage == "reset":
            if doomed:  # reset() syncs before each of its two barriers: die at the second
                first = [None]
                runner._sync = lambda: first.pop() if first else die()
            began = time.monotonic()
            runner.reset()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}", time.monotonic() - began, pids
    return None, time.monotonic() - began, pids


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stage", ["construction", "kernel wait", "reset"])
def test_a_killed_rank_leaves_survivors_raising_and_no_segment(stage):
    import glob

    survivor, lost = spawn(killed_child, 2, 60, stage, env=ENV, may_die=(1,))
    assert lost is None
    error, seconds, pids = survivor
    assert error is not None and seconds < 20, (error, seconds)
    if stage == "kernel wait":
        assert "MonoFault" in error and "deadline at" in error
    assert [glob.glob(f"/dev/shm/mono-peer-{pid}-*") for pid in pids] == [[], []]


def era_child(rank, world, group):
    from mono_runtime import MonoFault
    from mono_runtime import protocol as P

    K = _kernels()
    runner = _runner(rank, world, group)
    log = []
    # the raw epoch far past 2^32, the era at its last steps: tags reach 2^32 - 1
    runner.ctl[P.CTL_ERA_BASE] = 2**32 - 3
    runner.ctl[P.CTL_EPOCH] = 2**32 - 3 + P.ERA_STEPS - 2
    for slot in (254, 255):
        runner.step_begin()
        log.append((runner.tag(slot), _exchange(K, runner, slot=slot).tolist() == _expected(world)))
    runner.step_begin()  # past the era without the rezero: every wait refuses (KIND_ERA)
    _exchange(K, runner, slot=0)
    try:
        runner.after_step()
        log.append(None)
    except MonoFault as e:
        log.append(str(e))
    runner.reset()
    # the host's rezero: start two steps before it, cross it, tags restart at step 1
    runner.skip_steps(P.REZERO_EVERY - 3)
    for slot in (0, 1, 0, 1):
        runner.step_begin()
        log.append((runner.tag(slot), _exchange(K, runner, slot=slot).tolist() == _expected(world)))
        runner.after_step()
    runner.close()
    return log


@pytest.mark.timeout(200)
def test_era_end_and_rezero():
    from mono_runtime import protocol as P

    for log in spawn(era_child, 2, 180, env=ENV):
        assert log[0] == (((P.ERA_STEPS - 1) << 8) | 254, True)
        assert log[1] == ((P.ERA_STEPS << 8) | 255, True) and log[1][0] == 2**32 - 1
        assert log[2] is not None and "outside its tag era" in log[2]
        near = [t for t, ok in log[3:]]
        assert all(ok for _, ok in log[3:])
        # the rezero runs in the after_step of the step that reaches REZERO_EVERY
        assert near == [
            ((P.REZERO_EVERY - 2) << 8) | 0,
            ((P.REZERO_EVERY - 1) << 8) | 1,
            (P.REZERO_EVERY << 8) | 0,
            (1 << 8) | 1,
        ]


def ticket_runs(rank, world, group):
    import torch

    K = _kernels()
    runner = _runner(rank, world, group)
    a = runner.launch_args()
    done = torch.zeros(16, dtype=torch.int64)
    results = []
    for n_items, programs in ((7, 3), (5, 5), (2, 4)):
        runner.step_begin()
        order = torch.zeros(16, dtype=torch.int64)
        K.ticket_kernel[(programs,)](
            a["ctl"],
            a["health"],
            runner.peer.addresses,
            rank,
            world,
            runner.tickets,
            done,
            order,
            n_items,
            3,
            777,
            CPU=True,
        )
        results.append((order[:n_items].tolist(), int(runner.tickets[3])))
        runner.after_step()
    runner.close()
    return results


def reduce_child(rank, world, group):
    import torch

    K = _kernels()
    runner = _runner(rank, world, group)
    torch.manual_seed(0)
    x = (torch.randn(world, 16) * 3).bfloat16()
    lo = torch.zeros(8)
    hi = torch.zeros(8)
    runner.step_begin()
    K.reduce_kernel[(1,)](
        runner.ctl,
        runner.health.data_ptr(),
        runner.peer.addresses,
        rank,
        world,
        x.view(torch.int32),
        lo,
        hi,
        0,
        99,
        BLOCK=8,
        CPU=True,
    )
    runner.after_step()
    runner.close()
    acc = torch.zeros(16)
    for r in range(world):
        acc += x[r].float()
    return torch.stack([lo, hi], -1).flatten().tolist(), acc.tolist()


@pytest.mark.timeout(200)
def test_rank_ordered_reduce():  # 4 ranks: test_allreduce
    results = spawn(reduce_child, 2, 180, env=ENV)
    for got, want in results:
        assert got == want
    assert all(r[0] == results[0][0] for r in results)  # bit-identical ranks
