"""The FlyDSL device half of the protocol, compiled for gfx950 and gfx942 on this CPU (in
child processes) and checked in the ISA the GPU would run: scopes of mailbox stores and
polls, their cache write-backs and invalidates, sleeping and clocked waits, no spills.

Execution on an AMD GPU is in the ``rocm``-marked test at the end.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from mono_runtime.flydsl.offline import FlyCompileError, Job, compile_jobs
from mono_runtime.flydsl.residency import residency_problem
from mono_runtime.flydsl.testing import require_toolchain, wait_loops

WORLD = 4
ARCHES = ("gfx950", "gfx942")
PROBE = "mono_runtime.flydsl.probes:build_protocol_probe"


@pytest.fixture(scope="module")
def probes():
    """The protocol probe compiled once per target, both targets in parallel."""
    require_toolchain()
    job = Job(PROBE, {"world": WORLD})
    with ThreadPoolExecutor(len(ARCHES)) as pool:
        got = pool.map(lambda arch: compile_jobs([job], arch, timeout_s=240)[0], ARCHES)
        return dict(zip(ARCHES, got, strict=True))


@pytest.fixture(params=ARCHES)
def isa(request, probes):
    return probes[request.param]


def _releases(isa, scope_bits):
    """Indices of release write-backs at a scope (``sc0 sc1`` system, ``sc1`` device)."""
    return [i for i, ln in enumerate(isa.body) if re.fullmatch(rf"buffer_wbl2 {scope_bits}", ln)]


@pytest.mark.timeout(300)
def test_system_publishes_write_back_then_store_with_system_scope(isa):
    body = isa.body
    releases = _releases(isa, "sc0 sc1")
    assert releases
    for i in releases:
        nxt = body[i + 1: i + 4]
        assert nxt[0].startswith("s_waitcnt vmcnt(0)"), nxt
        store = next(ln for ln in nxt if ln.startswith("global_store"))
        assert store.startswith("global_store_dwordx2") and store.endswith("sc0 sc1"), nxt
    # every 64-bit system-scope store is a pair behind a release, but for the health
    # record's clock word (written after the record's compare-and-swap)
    in_record = set()
    for r in (i for i, ln in enumerate(body) if ln.startswith("global_atomic_cmpswap")):
        skip = next(re.search(r"(\.LBB\w+)", ln).group(1) for ln in body[r: r + 6]
                    if ln.startswith("s_cbranch_execz"))
        in_record.update(range(r, body.index(f"{skip}:")))
    pairs = [i for i, ln in enumerate(body)
             if ln.startswith("global_store_dwordx2") and ln.endswith("sc0 sc1")
             and i not in in_record]
    assert pairs and all(any(0 < i - r <= 3 for r in releases) for i in pairs), pairs


@pytest.mark.timeout(300)
def test_device_publishes_stay_on_device_scope(isa):
    releases = _releases(isa, "sc1")
    assert releases
    stores = [next((ln for ln in isa.body[i + 1: i + 4] if ln.startswith("global_store")), None)
              for i in releases]
    # the publish of the device hand-off (the others release the ticket atomic)
    assert any(st is not None for st in stores)
    for st in filter(None, stores):
        assert st.startswith("global_store_dwordx2") and st.endswith(" sc1"), st
        assert "sc0" not in st, st


@pytest.mark.timeout(300)
def test_every_wait_sleeps_reads_the_clock_and_watches_the_alarms(isa):
    loops = wait_loops(isa)
    assert len(loops) == 2  # the device hand-off and the system reduce
    scopes = set()
    for loop in loops:
        assert any(ln.startswith("s_memrealtime") for ln in loop.body), loop.label
        loads = loop.loads()
        # only mailbox and alarm loads in a poll (never a weight load): all atomic, scoped
        assert loads and all(ln.endswith((" sc1", "sc0 sc1")) for ln in loads), loads
        # the alarm words are read at system scope on every iteration
        assert any(ln.startswith("global_load_dword ") and ln.endswith("sc0 sc1")
                   for ln in loads), loads
        pairs = [ln for ln in loads if ln.startswith("global_load_dwordx2")]
        scope = "sc0 sc1" if all(ln.endswith("sc0 sc1") for ln in pairs) else "sc1"
        scopes.add(scope)
        # after the wait: the acquire's invalidate at the pairs' scope
        assert f"buffer_inv {scope}" in loop.after, loop.after
    assert scopes == {"sc0 sc1", "sc1"}


@pytest.mark.timeout(300)
def test_give_up_raises_alarms_at_every_peer_then_records(isa):
    text = "\n".join(isa.body)
    cas = isa.lines(r"^global_atomic_cmpswap .*sc0 sc1$")
    assert len(cas) == 2  # one health record per wait site
    # WORLD alarm stores (system scope) come right before each record's clock read + CAS
    block = re.findall(r"((?:global_store_dword v\[\d+:\d+\], v\d+, off sc0 sc1\n)+)"
                       r"s_memrealtime s\[\d+:\d+\]\nglobal_atomic_cmpswap", text)
    assert [b.count("\n") for b in block] == [WORLD, WORLD], block


@pytest.mark.timeout(300)
def test_no_spills_and_the_grid_is_resident(isa):
    r = isa.resources
    assert not r.spills, r
    assert residency_problem(r, grid=256, threads=256, arch=isa.arch) is None


@pytest.mark.timeout(300)
def test_kernel_arguments_are_the_probe_signature(isa):
    assert [a.size for a in isa.args] == [8, 8, 8, 4, 8, 8, 8]


@pytest.mark.timeout(120)
def test_poll_with_weight_loads_in_flight_is_refused_at_trace_time():
    require_toolchain()
    with pytest.raises(FlyCompileError, match="loads in flight"):
        compile_jobs([Job(PROBE, {"world": 2, "poll_with_prefetch": True})], "gfx950")


@pytest.mark.rocm
@pytest.mark.timeout(120)
def test_probe_runs_on_an_amd_gpu():
    """One rank (its own peer): the ticket hand-off and the reduce give the known values,
    no wait gives up, and the ticket counter is reset for the next launch."""
    import torch
    from mono_runtime.flydsl import layout as L
    from mono_runtime.flydsl.probes import build_protocol_probe

    dev = torch.device("cuda")
    programs = 64
    launch, _ = build_protocol_probe(world=1, programs=programs, threads=64)
    scratch = torch.zeros(1 << 16, dtype=torch.uint8, device=dev)
    peer = torch.zeros(1 << 16, dtype=torch.uint8, device=dev)
    peers = torch.tensor([peer.data_ptr()], dtype=torch.int64, device=dev)
    health = torch.zeros(16, dtype=torch.int32, device=dev)
    epoch = torch.zeros(1, dtype=torch.int32, device=dev)
    out = torch.zeros(4 * programs, dtype=torch.int32, device=dev)
    for step in range(2):
        epoch.fill_(step)
        launch(scratch.data_ptr(), peers.data_ptr(), health.data_ptr(), 0, epoch.data_ptr(),
               100_000_000, out.data_ptr())
        torch.cuda.synchronize()
        items = 2 * programs
        assert out[1:items].tolist() == list(range(items - 1))
        assert out[items: items + programs].view(torch.float32).eq(1.5).all()
        assert int(health[L.HEALTH_FLAG]) == 0
        assert int(scratch[:4].view(torch.int32)) == 0
