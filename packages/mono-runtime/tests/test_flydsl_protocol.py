"""The FlyDSL device half of the protocol, compiled for gfx950 and gfx942 on this CPU (in
child processes) and checked in the ISA the GPU would run: the scope of every mailbox store,
poll and alarm, their cache write-backs and invalidates, sleeping and clocked waits, the
give-up order, no spills, a resident grid.

Execution on an AMD GPU (values, tags, health) is the ``rocm``-marked test at the end.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from mono_runtime.flydsl.offline import FlyCompileError, Job, compile_jobs
from mono_runtime.flydsl.residency import residency_problem
from mono_runtime.flydsl.testing import (
    DEV,
    SYS,
    giveup_claims,
    require_toolchain,
    scope,
    system_stores,
    wait_loops,
)

WORLD = 4
ARCHES = ("gfx950", "gfx942")
PROBE = "mono_runtime.flydsl.probes:build_protocol_probe"
MEM_OP = re.compile(r"^(global|buffer|flat)_(store|atomic|load)")


@pytest.fixture(scope="module")
def probes():
    """The protocol probe compiled once per target, both targets in parallel."""
    require_toolchain()
    job = Job(PROBE, {"world": WORLD})
    with ThreadPoolExecutor(len(ARCHES)) as pool:  # compiles run in child processes
        got = pool.map(lambda arch: compile_jobs([job], arch, timeout_s=240)[0], ARCHES)
        return dict(zip(ARCHES, got, strict=True))


@pytest.fixture(params=ARCHES)
def isa(request, probes):
    return probes[request.param]


def _next_mem_op(lines, i):
    return next(ln for ln in lines[i + 1 :] if MEM_OP.match(ln))


@pytest.mark.timeout(300)
def test_every_release_is_followed_by_a_store_of_itsscope(isa):
    body = isa.body
    releases = [i for i, ln in enumerate(body) if ln.startswith("buffer_wbl2")]
    assert releases
    for i in releases:
        released = scope(body[i])
        op = _next_mem_op(body, i)
        assert body[i + 1].startswith("s_waitcnt vmcnt(0)"), body[i : i + 3]
        if op.startswith("global_atomic_add_x2") and released == DEV:
            continue  # a device acq_rel add (ticket, record claim): "sc0" returns the value
        assert scope(op) == released, (body[i], op)


@pytest.mark.timeout(300)
def test_pairs_are_one_64_bit_store_behind_a_release(isa):
    """Every 64-bit system-scope store is a pair behind a system release, but for a health
    record's fields and its GIVEUPS word (8 a give-up path; KIND goes behind a release)."""
    claims = giveup_claims(isa)
    assert len(claims) == 2  # one give-up path a wait site
    pairs, loose = system_stores(isa)
    assert len(loose) == 8 * len(claims), [isa.body[k] for k in loose]
    assert all(any(c < k for c in claims) for k in loose)
    # the KIND words, and the pushes (the compiler may merge the peers' stores into one
    # block, each path keeping its own release)
    assert len(pairs) > len(claims)
    assert sum(ln == "buffer_wbl2 sc0 sc1" for ln in isa.body) >= WORLD


@pytest.mark.timeout(300)
def test_every_wait_sleeps_reads_the_clock_and_watches_the_alarms(isa):
    loops = wait_loops(isa)
    stalls = [lp for lp in loops if "s_sleep 8" in lp.body]
    polls = [lp for lp in loops if "s_sleep 1" in lp.body]
    assert len(stalls) == 1 and len(polls) == 2, [lp.label for lp in loops]
    alarm_loads = -(-WORLD // 2)  # the alarm words, two a load, at system scope
    scopes = []
    for loop in loops:
        assert any(ln.startswith("s_memrealtime") for ln in loop.body), loop.label
        loads = loop.loads()
        # nothing but atomic, scoped loads in a wait: never a weight load behind a poll
        assert all(scope(ln) for ln in loads), loads
        assert sum(scope(ln) == SYS for ln in loads) >= alarm_loads, loads
    for loop in polls:
        pair_scope = DEV if any(scope(ln) == DEV for ln in loop.loads()) else SYS
        scopes.append(pair_scope)
        # the acquire after the wait: an invalidate at the pairs' scope
        assert f"buffer_inv {pair_scope}" in loop.after, loop.after
    assert sorted(scopes) == [SYS, DEV]  # the hand-off between programs; the peer reduce
    system_poll = polls[scopes.index(SYS)]
    assert len(system_poll.loads()) >= WORLD + alarm_loads


@pytest.mark.timeout(300)
def test_give_up_raises_alarms_everywhere_before_recording(isa):
    body = isa.body
    claims = giveup_claims(isa)
    assert len(claims) == 2
    start = 0
    for c in claims:
        cas = [ln for ln in body[start:c] if ln.startswith("global_atomic_cmpswap")]
        # atomic max of this rank's alarm word: its own head first, then every peer's
        assert len(cas) == WORLD + 1 and all(ln.endswith(SYS) for ln in cas), cas
        start = c


@pytest.mark.timeout(300)
def test_tickets_are_device_scope_acq_rel(isa):
    claims = set(giveup_claims(isa))
    takes = [
        i
        for i, ln in enumerate(isa.body)
        if ln.startswith("global_atomic_add_x2") and scope(ln) != SYS and i not in claims
    ]
    assert len(takes) == 2  # before the loop and at its end
    for i in takes:
        assert isa.body[i - 2] == "buffer_wbl2 sc1" and "buffer_inv sc1" in isa.body[i : i + 3]


@pytest.mark.timeout(300)
def test_no_spills_and_the_grid_is_resident(isa):
    r = isa.resources
    assert not r.spills, r
    assert residency_problem(r, grid=256, threads=256, arch=isa.arch) is None


@pytest.mark.timeout(300)
def test_kernel_arguments_are_the_probe_signature(isa):
    assert [(a.offset, a.size) for a in isa.args] == [
        (0, 8),
        (8, 8),
        (16, 8),
        (24, 4),
        (32, 8),
        (40, 8),
    ]


@pytest.mark.timeout(120)
def test_poll_with_weight_loads_in_flight_is_refused_at_trace_time():
    require_toolchain()
    with pytest.raises(FlyCompileError, match="loads in flight"):
        compile_jobs([Job(PROBE, {"world": 2, "poll_with_prefetch": True})], "gfx950")


@pytest.mark.rocm
@pytest.mark.timeout(120)
def test_probe_runs_on_an_amd_gpu():
    """One rank (its own peer), two steps: the hand-off pairs carry the spec's tag, the
    reduce gives 1.5, no wait gives up, the ticket counter is back to 0; then a step past
    the era (TAG_INVALID) gives up with KIND_ERA and raises this rank's alarm."""
    import torch
    from mono_runtime import protocol as proto
    from mono_runtime.flydsl.probes import build_protocol_probe

    dev = torch.device("cuda")
    programs, slot = 64, 3
    launch, _ = build_protocol_probe(world=1, programs=programs, threads=64)
    ctl = torch.zeros(proto.CTL_WORDS, dtype=torch.int64, device=dev)
    ctl[proto.CTL_DEADLINE] = 100_000_000  # 100 ms
    health = torch.zeros(proto.HEALTH_WORDS, dtype=torch.int64, device=dev)
    peer = torch.zeros(proto.PEER_HEAD + (1 << 16), dtype=torch.uint8, device=dev)
    peers = torch.tensor([peer.data_ptr()], dtype=torch.int64, device=dev)
    scratch = torch.zeros(1 << 16, dtype=torch.uint8, device=dev)
    items = 2 * programs
    out = torch.zeros(2 * items + programs, dtype=torch.int32, device=dev)

    def run():
        launch(
            ctl.data_ptr(),
            health.data_ptr(),
            peers.data_ptr(),
            0,
            scratch.data_ptr(),
            out.data_ptr(),
        )
        torch.cuda.synchronize()

    for epoch in (1, 2):
        ctl[proto.CTL_EPOCH] = epoch
        run()
        want = proto.pack_pair(proto.tag_of(epoch, 0, slot), 1)
        words = out[: 2 * items].view(torch.int64)
        assert words[1:items].eq(want).all()
        assert out[2 * items :].view(torch.float32).eq(1.5).all()
        assert int(health[proto.H_GIVEUPS]) == 0
        assert int(scratch[:8].view(torch.int64)) == 0
    ctl[proto.CTL_EPOCH] = proto.ERA_STEPS + 1  # past the era: every poll gives up
    run()
    assert int(health[proto.H_GIVEUPS]) >= 1
    assert int(health[proto.HEALTH_HEAD + proto.R_KIND]) == proto.KIND_ERA
    assert int(peer[:4].view(torch.int32)) == proto.ALARM_GAVE_UP
    assert out[2 * items :].view(torch.float32).isnan().all()
