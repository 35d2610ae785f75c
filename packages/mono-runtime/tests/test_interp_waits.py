"""mono_runtime.interp_waits on a hand-written two-item ticket loop: item 1 waits for item 0
through each runtime wait helper, and through a kernel's own helper over `pt.poll` (added
as a hook). The kernel runs in a child with TRITON_INTERPRET=1: the pytest process never
imports Triton's helpers (it must not fix Triton's mode for other packages' tests), so the
kernel is only defined where the interpreter is on."""

from __future__ import annotations

import os

import pytest
from mono_peer.testing import spawn

ENV = {"TRITON_INTERPRET": "1"}
HOW = {"ticket_wait": 0, "wait_done": 1, "wait_items": 2, "own": 3}

if os.environ.get("TRITON_INTERPRET") == "1":
    import triton
    import triton.language as tl
    from mono_runtime import decode_triton as dt
    from mono_runtime import protocol_triton as pt

    @triton.jit
    def own_wait(done, first, n, tag, ctl, health, peers, rank, world, CPU: tl.constexpr):
        """A kernel's own wait helper (not a runtime one): polls the done pairs itself."""
        i = tl.arange(0, 2)
        _, ok = pt.poll(done + first + i, i < n, tag, ctl, health, peers, rank, world, 7, 0, CPU)
        return ok

    @triton.jit
    def two_items(
        ctl, health, peers, rank, world, counter, done, out, HOW: tl.constexpr, CPU: tl.constexpr
    ):
        """Item 0 stores 41; item 1 waits for item 0 and stores its value + 1."""
        tag = pt.step_tag(ctl, 0)
        t = pt.ticket_take(counter, 2)
        while t < 2:
            if t == 0:
                tl.store(out, 41)
            else:
                if HOW == 0:
                    ok = pt.ticket_wait(done, 0, tag, ctl, health, peers, rank, world, 7, CPU)
                elif HOW == 1:
                    ok = pt.wait_done(
                        done, 0, 1, 1, tag, ctl, health, peers, rank, world, 7, 0, CPU
                    )
                elif HOW == 2:
                    ok = dt.wait_items(done, 0, 1, 1, tag, ctl, health, peers, rank, world, 7, CPU)
                else:
                    ok = own_wait(done, 0, 1, tag, ctl, health, peers, rank, world, CPU)
                tl.store(out + 1, tl.where(ok, tl.load(out) + 1, -1))
                # a look without a wait: item 0 is done (programs run in ticket order
                # here), this item itself not yet
                tl.store(out + 2, dt.done_already(done, 0, 1, 1, tag))
                tl.store(out + 3, dt.done_already(done, 0, 2, 2, tag))
            pt.ticket_finish(done, t, tag)
            t = pt.ticket_take(counter, 2)


def recorded(rank, world, group, how):
    """(recorded waits, the kernel's output) of one launch of two_items with helper `how`."""
    import sys

    import torch
    from mono_runtime.interp_waits import recording
    from mono_runtime.runner import MonoRunner

    runner = MonoRunner("cpu", group, rank, world, 4096, 4096, deadline_ns=10**9)
    a = runner.launch_args()
    done = torch.zeros(2, dtype=torch.int64)
    out = torch.full((4,), -1, dtype=torch.int32)
    try:
        runner.step_begin()
        with recording((sys.modules[__name__], "own_wait")) as seen:
            two_items[(1,)](
                a["ctl"], a["health"], runner.peer.addresses, rank, world, runner.tickets,
                done, out, HOW=HOW[how], CPU=True,
            )  # fmt: skip
        runner.after_step()
    finally:
        runner.close()
    return {t: sorted(v) for t, v in seen.items()}, out.tolist()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", list(HOW))
def test_the_second_item_waits_for_the_first(how):
    (seen, out) = spawn(recorded, 1, 50, how, env=ENV)[0]
    assert out == [41, 42, 1, 0], out  # and decode_triton.done_already's two looks
    assert seen == {1: [0]}, seen


@pytest.mark.timeout(60)
def test_recording_restores_the_helpers():
    (same,) = spawn(_restored, 1, 50, env=ENV)
    assert same


def _restored(rank, world, group):
    from mono_runtime import decode_triton as dt
    from mono_runtime import protocol_triton as pt
    from mono_runtime.interp_waits import recording

    names = [(pt, "ticket_take"), (pt, "ticket_wait"), (pt, "wait_done"), (dt, "wait_items")]
    before = [getattr(m, n) for m, n in names]
    with recording():
        patched = [getattr(m, n) for m, n in names]
    after = [getattr(m, n) for m, n in names]
    return after == before and all(p is not b for p, b in zip(patched, before, strict=True))
