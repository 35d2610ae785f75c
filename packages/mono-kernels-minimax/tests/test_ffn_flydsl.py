"""The FlyDSL build of the FFN monokernel on a CPU: its contract against the spec and the
Triton build, and its gfx950 / gfx942 code (compiled in child processes) checked in the
ISA: memory scopes of every mailbox store and poll, sleeping clocked waits, no spills, a
grid that is resident.

CI compiles a representative set of builds (real MiniMax-M3 sizes). Every width 1..16 for
both targets: MONO_FLYDSL_ALL_WIDTHS=1 (about 15 min on 2 cores).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from mono_kernels_minimax.config import MiniMaxM3Config
from mono_kernels_minimax.ffn import flydsl_build as fb
from mono_kernels_minimax.ffn.spec import ARGS, FfnBuild
from mono_kernels_minimax.formats import WeightFormat
from mono_runtime import protocol as proto

REAL = MiniMaxM3Config()
MX, BF = WeightFormat.MXFP4, WeightFormat.BF16

# (arch, build): both formats, both ends of the widths, TP4 and TP8, both targets; two a
# target, as the targets compile side by side (one child each)
CI_BUILDS = [
    ("gfx950", FfnBuild(REAL, 1, 4, MX)),
    ("gfx950", FfnBuild(REAL, 16, 4, MX)),
    ("gfx942", FfnBuild(REAL, 4, 8, BF)),
    ("gfx942", FfnBuild(REAL, 8, 4, MX)),
]


def test_arguments_are_the_spec_and_the_triton_kernel():
    assert fb.ARG_NAMES[: len(ARGS)] == tuple(name for name, _ in ARGS)
    triton_build = pytest.importorskip("mono_kernels_minimax.ffn.triton_build")
    runtime = tuple(p.name for p in triton_build.ffn_kernel.params if not p.is_constexpr)
    assert fb.ARG_NAMES == runtime


def test_wait_regions_are_the_triton_builds():
    triton_build = pytest.importorskip("mono_kernels_minimax.ffn.triton_build")
    ours = {name: proto.region_id(f"ffn.{name}") for name in fb.REGION_NAMES}
    assert ours == triton_build.REGIONS


def test_fp8_is_refused_before_any_compile():
    with pytest.raises(fb.FlyDslUnsupported, match="fp8-b128"):
        fb.compile_isa([FfnBuild(REAL, 1, 4, WeightFormat.FP8)])


def test_launch_refuses_a_world_other_than_the_builds_tp():
    with pytest.raises(ValueError, match="tp=4"):
        fb.launch(FfnBuild(REAL, 1, 4, MX), world=2)


def test_kernel_names_differ_by_every_key_field():
    names = {fb.kernel_name(b) for _, b in CI_BUILDS}
    assert len(names) == len(CI_BUILDS)
    assert fb.kernel_name(FfnBuild(REAL, 1, 4, MX), 128) != fb.kernel_name(FfnBuild(REAL, 1, 4, MX))


def _compile(entries):
    """Compile (arch, build) entries: one child process per target, in parallel."""
    from mono_runtime.flydsl.offline import Job, compile_jobs

    by_arch: dict[str, list[int]] = {}
    for i, (arch, _) in enumerate(entries):
        by_arch.setdefault(arch, []).append(i)

    def run(arch):
        idx = by_arch[arch]
        jobs = [Job(f"{fb.__name__}:build_job", fb.job_kwargs(entries[i][1])) for i in idx]
        return idx, compile_jobs(jobs, arch, timeout_s=900)

    out = [None] * len(entries)
    with ThreadPoolExecutor(len(by_arch)) as pool:  # the compiles run in child processes
        for idx, isas in pool.map(run, by_arch):
            for i, isa in zip(idx, isas, strict=True):
                out[i] = isa
    return out


@pytest.fixture(scope="module")
def compiled():
    from mono_runtime.flydsl.testing import require_toolchain

    require_toolchain()
    return dict(zip(range(len(CI_BUILDS)), _compile(CI_BUILDS), strict=True))


@pytest.fixture(
    params=range(len(CI_BUILDS)),
    ids=[f"{a}-s{b.rows}-tp{b.tp}-{b.weights.value}" for a, b in CI_BUILDS],
)
def case(request, compiled):
    _, b = CI_BUILDS[request.param]
    return b, compiled[request.param]


@pytest.mark.timeout(600)
def test_no_scratch_and_the_grid_is_resident(case):
    b, isa = case
    assert isa.name.startswith(fb.kernel_name(b)) and isa.arch in ("gfx950", "gfx942")
    assert not isa.resources.spills, isa.resources
    assert fb.residency_problem(isa) is None, isa.resources
    assert isa.resources.max_threads == fb.THREADS


@pytest.mark.timeout(600)
def test_kernel_arguments_are_the_argument_list(case):
    _, isa = case
    sizes = [4 if name in fb.INT32_ARGS else 8 for name in fb.ARG_NAMES]
    assert [a.size for a in isa.args] == sizes


@pytest.mark.timeout(600)
def test_peer_pushes_are_system_scope_pairs_behind_a_release(case):
    from mono_runtime.flydsl.testing import (
        DEV,
        giveup_claims,
        release_before,
        scope,
        system_stores,
        wait_loops,
    )

    _, isa = case
    body = isa.body
    pairs, loose = system_stores(isa)
    # pushes of ar1 and ar2, the handshake, the KIND words of health records
    assert len(pairs) >= 3
    # the done pairs of ticket items: device scope, behind a device release
    assert any(
        ln.startswith("global_store_dwordx2")
        and scope(ln) == DEV
        and release_before(body, k) == DEV
        for k, ln in enumerate(body)
    )
    # every other system-scope 64-bit store is a health record's field or GIVEUPS word:
    # 8 a give-up path, one path a wait site (each sleeping poll)
    claims = giveup_claims(isa)
    polls = [lp for lp in wait_loops(isa) if "s_sleep 1" in lp.body]
    assert len(claims) == len(polls) and len(loose) == 8 * len(claims)


@pytest.mark.timeout(600)
def test_every_wait_sleeps_reads_the_clock_and_watches_the_alarms(case):
    from mono_runtime.flydsl.testing import DEV, SYS, scope, wait_loops

    b, isa = case
    loops = wait_loops(isa)
    polls = [lp for lp in loops if "s_sleep 1" in lp.body]
    # item waits (device scope), the ar1 / ar2 reduces (system scope), the fault stall
    assert len(polls) >= 2 and any("s_sleep 8" in lp.body for lp in loops)
    alarm_loads = -(-b.tp // 2)
    scopes = set()
    for loop in loops:
        assert any(ln.startswith("s_memrealtime") for ln in loop.body), loop.label
        loads = loop.loads()
        # nothing but scoped atomic loads in a wait: no weight load queued behind a poll
        assert loads and all(scope(ln) for ln in loads), loads
        assert sum(scope(ln) == SYS for ln in loads) >= alarm_loads, loads
    for loop in polls:
        pairs_scope = DEV if any(scope(ln) == DEV for ln in loop.loads()) else SYS
        scopes.add(pairs_scope)
        assert f"buffer_inv {pairs_scope}" in loop.after, (loop.label, loop.after)
    assert scopes == {SYS, DEV}


@pytest.mark.skipif(
    os.environ.get("MONO_FLYDSL_ALL_WIDTHS") != "1",
    reason="every width on both targets takes ~15 min on 2 cores: set MONO_FLYDSL_ALL_WIDTHS=1",
)
@pytest.mark.timeout(3600)
def test_every_width_compiles_without_scratch_and_is_resident():
    from mono_runtime.flydsl.testing import require_toolchain

    require_toolchain()
    entries = [
        (arch, FfnBuild(REAL, s, 4, MX)) for arch in ("gfx950", "gfx942") for s in range(1, 17)
    ]
    for (_, b), isa in zip(entries, _compile(entries), strict=True):
        assert not isa.resources.spills, (b.rows, isa.arch, isa.resources)
        assert fb.residency_problem(isa) is None, (b.rows, isa.arch, isa.resources)
