"""The drafter kernel's Triton build under the CPU interpreter: ranks as processes over the
host backend, against drafter_reference (tiny shapes: the interpreter takes seconds a
launch). One case per axis here; MONO_DRAFTER_EXHAUSTIVE=1 adds every request count 1..8
(narrow and wide), several context lengths, TP 4 wide and the fp8 cache. The bounds tests
run launches with every load, store and atomic checked (mono_runtime.interp_bounds)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from mono_peer.testing import spawn

ENV = {"TRITON_INTERPRET": "1"}
EXHAUSTIVE = os.environ.get("MONO_DRAFTER_EXHAUSTIVE", "0") not in ("", "0")
exhaustive = pytest.mark.skipif(not EXHAUSTIVE, reason="set MONO_DRAFTER_EXHAUSTIVE=1")


def _load(name):
    """A helper module of this folder, loaded by path (children re-load it the same way)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ranks = _load("drafter_ranks")


# (requests, padding requests, context lengths or None: 2 to 4 KV blocks of 16)
NARROW_ONE = (1, (), (37,))
WIDE_LONG = (3, (1,), (5, 0, 150))  # a padding request; a context over 10 KV blocks


def _check(records):
    for r in records:
        where = f"{r['reqs']} requests"
        assert r["err"] < 1e-2, f"{where}: out rel-L2 {r['err']}"
        assert r["cache_err"] < 1e-2, f"{where}: cache rel-L2 {r['cache_err']}"
        assert r["pad_zero"], f"{where}: a padding request's rows are not 0"
        assert r["caches_same"], f"{where}: a slot outside the block's was written"


def _identical(results):
    for i in range(len(results[0])):
        outs = [records[i]["out"].view(torch.int16) for records in results]
        assert all(o.equal(outs[0]) for o in outs), f"step {i}: ranks' outputs differ"


@pytest.mark.timeout(150)
def test_tp1_narrow_and_wide():
    """Two steps on one runner: a narrow launch, then a wide one with a padding request
    and a context spanning many KV blocks (its attention split over programs)."""
    (records,) = spawn(ranks.check_steps, 1, 140, [NARROW_ONE, WIDE_LONG], 0, env=ENV)
    _check(records)


@pytest.mark.timeout(150)
def test_tp1_hidden_not_a_power_of_two():
    """A hidden size of 48 in row chunks of 32: the last chunk masks its last 16 columns, as
    the real model's 7168 in chunks of 2048 does, in a row item that walks both chunks
    (narrow) and in the wide build's chunk items (one a chunk, the last normalizing);
    gate_up in 3 K parts; a q_lora_rank of 48 in qkvn's 64-column block (the real 1536 in
    2048); an intermediate of 48: down in 3 K parts (the real default), each waiting for
    its one gate_up row tile."""
    steps = [NARROW_ONE, WIDE_LONG]
    (records,) = spawn(ranks.check_steps, 1, 140, steps, 0, "auto", "cpu", 48, env=ENV)
    _check(records)


@pytest.mark.timeout(300)
def test_tp1_rows_past_one_stream():
    """9 query tokens: the wide build's 8 requests are 72 rows, padded to 128 and streamed
    in two 64-row passes (spec `pass_rows`); the narrow build's 18 rows, one 32-row pass.
    Short contexts (WIDE_LONG covers long ones): the interpreter's time is the rows'."""
    steps = [(2, (), (20, 3)), (8, (5,), tuple(i + 2 for i in range(8)))]
    (records,) = spawn(ranks.check_steps, 1, 280, steps, 2, "auto", "cpu", None, 9, env=ENV)
    _check(records)


@pytest.mark.timeout(150)
def test_tp4_ranks_bit_identical():
    """TP 4 of the tiny model: one local head, 16 intermediate columns a rank."""
    results = spawn(ranks.check_steps, 4, 140, [NARROW_ONE], 1, env=ENV)
    for records in results:
        _check(records)
    _identical(results)


@pytest.mark.timeout(150)
def test_tp2_late_rank_faults_every_rank_then_reset_bit_identical():
    """A late rank: MonoFault on every rank; after reset() a wide step (a padding request,
    a context over many KV blocks) matches the reference on both ranks, bit for bit."""
    results = spawn(ranks.fault_then_reset, 2, 140, 1, WIDE_LONG, env=ENV)
    for rank, r in enumerate(results):
        assert r["fault"] is not None, f"rank {rank}: no MonoFault after a late rank"
        assert r["poisoned"], f"rank {rank}: the faulted step returned finite outputs"
        assert r["after_reset_err"] < 1e-2, f"rank {rank}: wrong step after reset()"
        assert r["pad_zero"], f"rank {rank}: a padding request's rows are not 0"
    outs = [r["out"].view(torch.int16) for r in results]
    assert outs[0].equal(outs[1]), "ranks' outputs differ"


@pytest.mark.timeout(150)
def test_tp1_every_access_in_bounds():
    """A narrow then a wide launch touch only the memory they are given (interp_bounds):
    under the interpreter an access outside it reads or writes a neighbour silently, on a
    GPU it is an illegal address."""
    ((records, outside),) = spawn(
        ranks.bounded, 1, 140, "check_steps", [NARROW_ONE, WIDE_LONG], 0, env=ENV
    )
    assert outside == [], "\n".join(outside)
    _check(records)


def _no_work(b, nreq, t):
    """Whether ticket t has no work in a launch of nreq requests: a row item (norm, qkvn,
    post, final) of a row group past the launch's rows, or an attn / comb item of a request
    past nreq (drafter/triton_build.py `_deps`: count 0)."""
    from mono_kernels_kimi.drafter.spec import stage_of

    _, stage, i = stage_of(b, t)
    p = b.plan
    groups = -(-nreq * b.cfg.query_len // p.rb)
    if stage in ("norm", "post", "final"):  # a row group's p.ri items
        return i // p.ri >= groups
    if stage == "qkvn":
        return i >= groups
    if stage == "attn":
        return i // (p.nhg * p.nsplit) >= nreq
    if stage == "comb":
        return i // (p.nhg * p.nlc) >= nreq
    return False


@pytest.mark.timeout(90)
def test_tp1_every_item_waits_for_what_the_spec_says():
    """A narrow and a wide launch with every item's waits recorded (mono_runtime.interp_waits,
    the kernel's own `_wait` hooked): each item with work waits for exactly spec.waits. The
    interpreter runs tickets in order, so a missing wait passes every output comparison
    and fails only on a GPU (K2's shdown waited for 48 of 192 shup items). An item without
    work (a row group or request past the launch's) skips its wait by design: nothing it
    computes reads the items spec.waits names, so it is checked to wait for nothing."""
    from mono_kernels_kimi.drafter.config import DrafterConfig
    from mono_kernels_kimi.drafter.spec import NARROW, DrafterBuild, stage_of, tickets, waits

    (launches,) = spawn(ranks.kernel_waits, 1, 80, [NARROW_ONE, WIDE_LONG], 0, env=ENV)
    assert [n for n, _ in launches] == [NARROW_ONE[0], WIDE_LONG[0]]
    for nreq, got in launches:
        b = DrafterBuild(DrafterConfig.tiny(1), nreq > NARROW)
        want = waits(b)
        idle = [t for t in range(tickets(b)) if _no_work(b, nreq, t)]
        assert idle, f"{nreq} requests: no item without work (the exclusion is untested)"
        for t in range(tickets(b)):
            expect = [] if t in idle else want.get(t, [])
            assert got.get(t, []) == expect, (
                f"{nreq} requests: ticket {t} ({stage_of(b, t)}) waits for {got.get(t, [])}, "
                f"expected {expect} (spec: {want.get(t, [])})"
            )
        assert set(got) <= set(range(tickets(b))), sorted(set(got) - set(range(tickets(b))))


@exhaustive
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "tp,body,args",
    [
        (4, "check_steps", ([NARROW_ONE, WIDE_LONG], 1)),
        (1, "check_steps", ([NARROW_ONE, WIDE_LONG], 3, "fp8")),
        (2, "check_steps", ([(11, (4,), None), (2, (), (300, 1))], 7)),
        (2, "fault_then_reset", (1, WIDE_LONG)),
    ],
)
def test_every_access_in_bounds(tp, body, args):
    """TP 4, the fp8 cache, two launches in a step and a give-up with its reset: every
    rank's accesses stay in bounds."""
    for _, outside in spawn(ranks.bounded, tp, 800, body, *args, env=ENV):
        assert outside == [], "\n".join(outside)


@exhaustive
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("tp", [1, 2])
def test_every_request_count_and_context(tp):
    """1..8 requests (narrow for 1-2, wide for 3-8), padding, contexts from under one KV
    block to many, then 11 requests (two launches in one step)."""
    cases = [
        (n, (n - 1,) if n > 2 else (), tuple(16 * (i % 5) + 3 * i + 1 for i in range(n)))
        for n in range(1, 9)
    ] + [(11, (4,), None), (2, (), (300, 1))]
    results = spawn(ranks.check_steps, tp, 1700, cases, 7, env=ENV)
    for records in results:
        _check(records)
    _identical(results)


@exhaustive
@pytest.mark.timeout(900)
@pytest.mark.parametrize("tp,cases", [(4, [WIDE_LONG]), (1, [NARROW_ONE, WIDE_LONG])])
def test_fp8_cache_and_tp4_wide(tp, cases):
    results = spawn(ranks.check_steps, tp, 800, cases, 3, "fp8" if tp == 1 else "auto", env=ENV)
    for records in results:
        _check(records)
    _identical(results)


@pytest.mark.timeout(60)
def test_runner_host_side(monkeypatch):
    """stale() after a re-bind, close(), the refusals as MonoUnsupported and bad input as
    ValueError naming the argument; warm() runs one program a CU where a build does not fit
    the plan's two, unless the grid was asked for (no kernel runs: in this process)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    stale = ranks.stale_and_close(0, 1, None)
    assert stale == dict(
        same=False, as_engine=False, fewer=False, rebound=True, closed=True, closed_raises=True
    ), stale
    for arg, message in ranks.bad_inputs(0, 1, None):
        assert message is not None, f"{arg}: accepted"
        assert message.startswith(arg), f"{arg}: the error does not name it: {message}"
    for what, message in ranks.refused(0, 1, None):
        assert message is not None and what in message, (what, message)


@pytest.mark.timeout(150)
def test_a_timeline_launch_stamps_every_ticket_once_in_its_stage():
    """A wide launch (a padding request) on a timeline runner: every ticket stamped once
    (none left at -1), each in its spec stage, by one of the grid's programs, ending after
    it started; outputs and caches bit for bit a plain runner's; a plain runner has none."""
    (m,) = spawn(ranks.timeline_launch, 1, 140, WIDE_LONG, 0, env=ENV)
    rows = m["rows"]
    assert [r["ticket"] for r in rows] == list(range(len(m["stages"])))
    assert [r["stage"] for r in rows] == m["stages"]
    assert all(r["program"] in (0, 1) for r in rows)  # the CPU runner's 2 programs
    assert all(r["end_us"] >= r["ready_us"] >= r["start_us"] >= 0 for r in rows)
    assert m["same_as_plain"]
    assert "timeline=True" in m["plain_refused"]
