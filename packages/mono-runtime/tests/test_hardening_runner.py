"""MonoRunner against hostile and careless inputs (issue 18): every construction all or
nothing on every rank, bounded deadlines, a clear error after close() instead of a crash."""

from __future__ import annotations

import time

import pytest
from mono_peer.testing import spawn
from mono_runtime import MonoRunner, MonoUnsupported


def _mapped_segments() -> list[str]:
    """Lines of this process's memory map that reference a host peer segment."""
    with open("/proc/self/maps") as maps:
        return [line for line in maps if "/dev/shm/mono-peer-" in line]


@pytest.mark.parametrize("deadline", [0, -1, 1.5e9, 1 << 70, True, "5"])
def test_a_bad_deadline_is_refused_before_anything_is_mapped(deadline):
    with pytest.raises(MonoUnsupported, match="deadline_ns must be"):
        MonoRunner("cpu", None, 0, 1, 64, 64, deadline_ns=deadline)
    assert _mapped_segments() == []


def test_set_deadline_has_the_same_bound():
    with MonoRunner("cpu", None, 0, 1, 64, 64) as runner:
        with pytest.raises(ValueError, match="deadline_ns must be in 1..60000000000"):
            runner.set_deadline(1 << 70)


def _construct(rank, world, group, deadline_ns, fail_alloc_on):
    """Build a runner (rank `fail_alloc_on` cannot allocate its scratch); report the error
    and how long this rank took to see it."""
    import torch

    scratch = 4096
    if rank == fail_alloc_on:
        zeros = torch.zeros

        def out_of_memory(*size, **kw):
            if size == (scratch,):
                raise RuntimeError("out of memory (injected)\nmore lines")
            return zeros(*size, **kw)

        torch.zeros = out_of_memory
    began = time.monotonic()
    try:
        MonoRunner("cpu", group, rank, world, scratch, 64, deadline_ns=deadline_ns[rank]).close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}", time.monotonic() - began, _mapped_segments()
    return None, time.monotonic() - began, _mapped_segments()


@pytest.mark.timeout(60)
def test_an_allocation_failing_on_one_rank_raises_on_every_rank():
    results = spawn(_construct, 2, 40, (10**9, 10**9), 0)
    (e0, s0, m0), (e1, s1, m1) = results
    assert e0 and "rank 0 could not allocate 4096 scratch bytes" in e0 and "more lines" not in e0
    assert e1 and "MonoUnsupported" in e1 and "another rank refused" in e1
    assert max(s0, s1) < 10 and m0 == m1 == []


@pytest.mark.timeout(60)
def test_a_deadline_that_differs_between_ranks_is_refused_on_every_rank():
    for error, _, mapped in spawn(_construct, 2, 40, (10**9, 2 * 10**9), -1):
        assert error and "deadline_ns differs between ranks (1000000000 to 2000000000)" in error
        assert mapped == []


def _use_after_close(rank, world, group):
    runner = MonoRunner("cpu", group, rank, world, 64, 64, deadline_ns=10**9)
    runner.close()
    runner.close()
    calls = {
        "alarms": lambda: runner.alarms.tolist(),
        "alarm": lambda: runner.alarm,
        "after_step": runner.after_step,
        "reset": runner.reset,
        "step_begin": runner.step_begin,
        "launch_args": runner.launch_args,
        "peer_args": runner.peer_args,
        "set_deadline": lambda: runner.set_deadline(10**9),
        "inject": lambda: runner.inject(None),
        "tag": lambda: runner.tag(0),
        "peer.bytes": lambda: runner.peer.bytes.tolist(),
    }
    seen = {}
    for name, call in calls.items():
        try:
            call()
            seen[name] = "no error"
        except RuntimeError as exc:
            seen[name] = str(exc)
    return seen, runner.closed


@pytest.mark.timeout(60)
def test_every_method_raises_after_close():
    ((seen, closed),) = spawn(_use_after_close, 1, 40)  # a crash would be a dead rank here
    assert closed
    for name, text in seen.items():
        assert "is closed" in text, (name, text)
