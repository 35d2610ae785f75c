"""Build keys, the compile cache, the residency check, and sm_90 compiles of the kernels
(no GPU: Triton's compiler and ptxas run on the CPU, in a child process so this process
never fixes Triton's mode for other tests)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from mono_peer.testing import spawn
from mono_runtime import protocol as P
from mono_runtime.builds import (
    CompileCache,
    DeviceLimits,
    Resources,
    build_hash,
    residency_problem,
)


@dataclass(frozen=True)
class Key:
    width: int
    tp: int = 2


def fake_kernel():  # a stand-in "kernel": source_hash reads its module's source
    return None


def test_build_hash_separates_key_source_target():
    a = build_hash(Key(1), fake_kernel, "cuda:90:32")
    assert a == build_hash(Key(1), fake_kernel, "cuda:90:32")
    assert a != build_hash(Key(2), fake_kernel, "cuda:90:32")
    assert a != build_hash(Key(1, tp=4), fake_kernel, "cuda:90:32")
    assert a != build_hash(Key(1), fake_kernel, "hip:gfx950:64")


def test_compile_cache_compiles_once_and_warms_every_width():
    cache, calls = CompileCache(), []
    compiled = cache.warm(
        [Key(w) for w in (1, 2, 4)], fake_kernel, "t", lambda k: calls.append(k) or f"bin{k.width}"
    )
    assert compiled[Key(4)] == "bin4" and len(cache) == 3
    assert cache.get(Key(2), fake_kernel, "t", lambda: "other") == "bin2"
    assert len(calls) == 3


def test_residency_reasons():
    h200 = DeviceLimits()
    light = Resources(registers=56, shared=32, threads=128)
    assert residency_problem(light, 132, h200) is None
    assert residency_problem(light, 132 * 8, h200) is None  # 8 x 128 x 56 regs fits
    heavy_regs = Resources(registers=128, shared=0, threads=512)
    why = residency_problem(heavy_regs, 133, h200, "ffn")
    assert why is not None and "ffn" in why and "registers binds" in why and "= 132" in why
    heavy_smem = Resources(registers=32, shared=200_000, threads=128)
    assert "shared memory binds" in residency_problem(heavy_smem, 200, h200)
    assert "threads binds" in residency_problem(Resources(16, 0, 1024), 300, h200)


def compile_child(rank, world, group):
    from mono_runtime.allreduce import ARG_TYPES, AllreduceBuild, constexprs
    from mono_runtime.allreduce.kernel import allreduce_kernel
    from mono_runtime.compile_check import compile_for, resources_of
    from mono_runtime.sass import sass_of, split_broadcasts

    out = {}
    for norm in (False, True):
        build = AllreduceBuild(16, 6144, 8, residual=norm, norm=norm)
        k = compile_for(allreduce_kernel, ARG_TYPES, constexprs(build))
        out[norm] = (k.asm["ptx"], resources_of(k), split_broadcasts(sass_of(k)))
    return out


def other_kernels_child(rank, world, group):
    """The guard and the benchmark kernels compile for sm_90 (the GPU run must not be the
    first to find a compile error), the push table's exchange way among them."""
    from mono_runtime import bench_protocol as B
    from mono_runtime.compile_check import compile_for
    from mono_runtime.guard import _guard_kernel

    mailbox = {"ctl": "*i64", "health": "i64", "peers": "*i64", "region": "i32"}
    compile_for(
        _guard_kernel,
        {"x": "*bf16", "n": "i32", "peers": "*i64", "rank": "i32", "world": "i32"},
        {"BLOCK": 1024},
    )
    ping = compile_for(B._ping_pong, {**mailbox, "rounds": "i32"}, {"CPU": False})
    tickets = compile_for(
        B._tickets,
        {**mailbox, "tickets": "*i64", "done": "*i64", "n_items": "i32", "lag": "i32"},
        {"CPU": False},
    )
    push = compile_for(B._push, {"ctl": "*i64", "peers": "*i64"}, {"ROWS": 16, "WAY": 2})
    fan = {"stamps": "*i64", "count": "*i32", "rounds": "i32"}
    fanout = [
        compile_for(B._fanout, {**mailbox, **fan}, {"WORDS": 32, "WAY": way}).asm["ptx"]
        for way in range(len(P.ACQUIRE_WAYS) + 1)
    ]
    return {
        "ping_pong": ping.asm["ptx"],
        "tickets": tickets.asm["ptx"],
        "push": push.asm["ptx"],
        "fanout": fanout,
    }


def publish_child(rank, world, group):
    """The push kernel's `publish_value` way (WAY 0), sm_90 PTX, compiled in a process whose
    environment chose MONO_PUBLISH (read when protocol_triton is imported)."""
    from mono_runtime import bench_protocol as B
    from mono_runtime.compile_check import compile_for

    types = {"ctl": "*i64", "peers": "*i64"}
    return compile_for(B._push, types, {"ROWS": 16, "WAY": 0}).asm["ptx"]


def backoff_child(rank, world, group):
    """The ping-pong's sm_90 PTX, compiled in a process whose environment set the poll
    backoff (it is read when protocol_triton is imported)."""
    from mono_runtime import bench_protocol as B
    from mono_runtime.compile_check import compile_for

    types = {"ctl": "*i64", "health": "i64", "peers": "*i64", "region": "i32", "rounds": "i32"}
    return compile_for(B._ping_pong, types, {"CPU": False}).asm["ptx"]


_REG = re.compile(r"%[a-z]+\d+")
_NO_DEST = ("st.", "bar.", "bra", "red.", "fence", "membar", "ret", "prefetch", "cp.")


def branch_sources(ptx: str) -> list[tuple[str, bool, bool]]:
    """For each conditional branch of `ptx`: (branch, direct, reduced). direct: its predicate
    depends on a per-thread poll value (a volatile load or %globaltimer) other than through
    shared memory; reduced: it depends on one through shared memory (any ld.shared stands
    for every st.shared value: a CTA reduction or broadcast). A direct branch around a
    barrier lets warps leave a wait one iteration apart (PTX registers are virtual, so the
    defining instructions of a register are few and the walk is precise enough)."""
    defs: dict[str, list[tuple[str, str]]] = {}
    shared_values: list[str] = []
    branches: list[tuple[str, str]] = []
    for raw in ptx.splitlines():
        line = raw.split("//")[0].strip().rstrip(";").strip()
        m = re.match(r"(?:@!?(%\w+)\s+)?([a-z][\w.:]*)\s*(.*)", line)
        if not m or line.endswith(":"):
            continue
        guard, op, rest = m.groups()
        operands = [o for o in re.split(r",(?![^{]*})", rest) if o.strip()]
        if op.startswith("bra"):
            if guard:
                branches.append((line, guard))
        elif op.startswith("st.shared"):
            shared_values += [r for o in operands[1:] for r in _REG.findall(o)]
        elif not op.startswith(_NO_DEST) and operands:
            for reg in _REG.findall(operands[0]):
                defs.setdefault(reg, []).append((op, line))
    out = []
    for line, pred in branches:
        found: set[bool] = set()
        seen: set[tuple[str, bool]] = set()
        todo = [(pred, False)]
        while todo:
            reg, crossed = todo.pop()
            if (reg, crossed) in seen:
                continue
            seen.add((reg, crossed))
            for op, text in defs.get(reg, []):
                if op.startswith("ld.shared"):
                    todo += [(r, True) for r in shared_values]
                elif ".volatile" in op or "%globaltimer" in text:
                    found.add(crossed)
                else:
                    todo += [(r, crossed) for r in _REG.findall(text)]
        out.append((line, False in found, True in found))
    return out


def assert_waits_leave_together(ptx: str) -> None:
    """Every branch that depends on what a wait read does so through a CTA reduction, and
    there is such a branch (the wait loop's exit)."""
    found = branch_sources(ptx)
    assert not [b for b, direct, _ in found if direct], found
    assert any(reduced for _, _, reduced in found), found


# The wait loop as `poll` compiled before its exit was made CTA-uniform (sm_90, 1-lane
# block): the exit reads the thread's own volatile load and clock, the alarm max its
# barrier-reduced value.
_PER_THREAD_EXIT = """
$L__BB0_11:
	ld.volatile.global.b64 { %rd24 }, [ %rd25 + 0 ];
	@%p4 ld.volatile.global.b32 { %r104 }, [ %rd26 + 0 ];
	bar.sync 	0;
	redux.sync.max.s32 	%r27, %r104, %r28;
	st.shared::cta.b32 [ %r19 + 0 ], %r27;
	bar.sync 	0;
	ld.shared.b32 	%r29, [%r3];
	shfl.sync.bfly.b32 	%r30, %r29, 1, 31, -1;
	max.s32 	%r31, %r29, %r30;
	mov.u64 %rd27, %globaltimer;
	sub.s64 	%rd28, %rd27, %rd22;
	shr.u64 	%rd153, %rd24, 32;
	setp.ne.b64 	%p51, %rd153, %rd68;
	setp.eq.b32 	%p52, %r31, 0;
	setp.le.s64 	%p10, %rd28, %rd20;
	and.pred 	%p11, %p10, %p52;
	and.pred 	%p12, %p51, %p11;
	@%p12 bra 	$L__BB0_11;
"""


def test_branch_sources_flags_a_per_thread_wait_exit():
    [(_, direct, reduced)] = branch_sources(_PER_THREAD_EXIT)
    assert direct and reduced
    uniform = _PER_THREAD_EXIT.replace("and.pred \t%p12, %p51, %p11", "mov.pred \t%p12, %p52")
    assert branch_sources(uniform)[0][1:] == (False, True)
    with pytest.raises(AssertionError):
        assert_waits_leave_together(_PER_THREAD_EXIT)


@pytest.mark.timeout(240)
def test_guard_and_bench_kernels_compile_for_sm90_with_uniform_wait_exits():
    """Ping-pong and ticket waits poll a 1-lane block: every thread loads the pair itself,
    so only a CTA reduction may decide when the wait ends."""
    out = spawn(other_kernels_child, 1, 220, env={"TRITON_INTERPRET": "0"})[0]
    for name in ("ping_pong", "tickets"):
        assert_waits_leave_together(out[name])
    # the push table's exchange way: 16 rows x 256 pairs over 128 threads, one a pair
    assert out["push"].count("atom.global.sys.relaxed.exch.b64") == 32
    # the fan-out's acquire ways (protocol.ACQUIRE_WAYS): an add, a load; then pairs that
    # carry the data: relaxed stores, no acquire at all
    add, load, value = out["fanout"]
    assert "st.relaxed.gpu.global.b64" in value and "acquire" not in value
    assert "release" not in value
    for ptx in out["fanout"]:
        assert_waits_leave_together(ptx)
    assert re.search(r"atom\.global\.gpu\.acquire\.add", add) and "ld.acquire" not in add
    assert "ld.acquire.gpu.global.b64" in load and "acquire.add" not in load


@pytest.mark.timeout(240)
def test_poll_backoff_sleeps_between_polls_only_when_asked():
    """MONO_POLL_BACKOFF_NS puts a `nanosleep` in every wait's poll loop (NAP:SPIN, one of a
    register's length); unset, none."""
    asked = spawn(
        backoff_child, 1, 220, env={"TRITON_INTERPRET": "0", "MONO_POLL_BACKOFF_NS": "250"}
    )[0]
    assert "nanosleep.u32 250" in asked
    # NAP:SPIN: the sleep's length in a register, 0 until the spin is over; still no
    # per-thread branch in the loop
    spun = spawn(
        backoff_child, 1, 220, env={"TRITON_INTERPRET": "0", "MONO_POLL_BACKOFF_NS": "200:2000"}
    )[0]
    assert re.search(r"nanosleep\.u32 \t?%r\d+", spun), spun[-2000:]
    assert_waits_leave_together(spun)
    plain = spawn(
        backoff_child, 1, 220, env={"TRITON_INTERPRET": "0", "MONO_POLL_BACKOFF_NS": "0"}
    )[0]
    assert "nanosleep" not in plain


def test_acquire_way_knob_is_checked(monkeypatch):
    """MONO_ACQUIRE names one of the ways, load unless set; the interpreter always adds
    (way 0)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv(P.ACQUIRE_ENV, "atomic")
    assert P.acquire_way() == 0
    monkeypatch.setenv(P.ACQUIRE_ENV, "")
    assert P.acquire_way() == 1
    monkeypatch.setenv(P.ACQUIRE_ENV, "fence")
    with pytest.raises(ValueError, match="MONO_ACQUIRE"):
        P.acquire_way()
    monkeypatch.setenv(P.ACQUIRE_ENV, "load")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert P.acquire_way() == 0


@pytest.mark.timeout(240)
def test_publish_stores_by_default_and_exchanges_where_asked():
    """By default one predicated relaxed store a pair and no exchange; MONO_PUBLISH=xchg:
    exchanges only."""
    ptx = spawn(publish_child, 1, 220, env={"TRITON_INTERPRET": "0", "MONO_PUBLISH": ""})[0]
    assert ptx.count("@p st.relaxed.sys.global.b64") == 32 and "atom." not in ptx
    xchg = spawn(publish_child, 1, 220, env={"TRITON_INTERPRET": "0", "MONO_PUBLISH": "xchg"})
    assert xchg[0].count("atom.global.sys.relaxed.exch.b64") == 32
    assert "st.relaxed" not in xchg[0]


@pytest.mark.timeout(240)
def test_allreduce_compiles_for_sm90_with_system_scope_mailboxes():
    out = spawn(compile_child, 1, 220, env={"TRITON_INTERPRET": "0"})[0]
    for ptx, res, split in out.values():
        assert split == [], f"ticket broadcasts reach their barrier with warp 0 split: {split}"
        atoms = set(re.findall(r"atom\.global\.[\w.]+", ptx))
        assert "st.relaxed.sys.global.b64" in ptx  # peer publishes: relaxed stores, no fence
        assert "atom.global.sys.release.max.s32" in atoms  # alarm words at peers
        assert "atom.global.gpu.acq_rel.add.u64" in atoms  # ticket counter
        assert "ld.volatile.global" in ptx and "%globaltimer" in ptx
        assert residency_problem(res, 132, DeviceLimits()) is None
        # ptxas saves a few registers around the ticket atomic (once per item: 20 bytes
        # in the binary a launch runs, with 16-byte aligned pointers); any real spilling
        # of the row blocks would show as far more
        assert res.spill_bytes <= 32, res
        # fault stall, 256-lane row waits and the small partial-sum wait of the norm
        assert_waits_leave_together(ptx)


# A scalar atomic's broadcast as ptxas left it in the drafter's first ticket draw (sm_90,
# 4 warps): lane 0 branches around the atomic and nothing reconverges warp 0 before the
# barrier that hands the value over; then the same draw wrapped as K2's is (BSSY/BSYNC).
_SPLIT_DRAW = """
        /*0630*/                   ISETP.NE.AND P0, PT, R0, RZ, PT ;
        /*0640*/               @!P0 BRA `(.L_x_2) ;
        /*0790*/                   ATOMG.E.ADD.64.STRONG.GPU PT, R2, desc[UR6][R4.64], R6 ;
        /*08b0*/               @P0 STS.64 [UR5], R2 ;
        /*0950*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*09a0*/                   LDS.64 R90, [R179] ;
"""
_JOINED_DRAW = _SPLIT_DRAW.replace(
    "/*0640*/               @!P0 BRA",
    "/*0638*/                   BSSY B0, `(.L_x_2) ;\n        /*0640*/               @!P0 BRA",
).replace("/*08b0*/", "/*08a0*/                   BSYNC B0 ;\n        /*08b0*/")


def test_split_broadcasts_flags_a_draw_warp_0_reaches_split():
    from mono_runtime.sass import split_broadcasts

    assert split_broadcasts(_SPLIT_DRAW) == ["0790"]
    assert split_broadcasts(_JOINED_DRAW) == []
    dropped = _SPLIT_DRAW.replace("PT, R2,", "PT, RZ,")  # its value unused: no broadcast
    assert split_broadcasts(dropped) == []


_DOT_LOOP = """
        /*0100*/                   LDG.E.U16 R4, desc[UR4][R2.64] ;
        /*0110*/                   LDG.E.U16 R5, desc[UR4][R2.64+0x2] ;
        /*0120*/                   HGMMA.64x16x16.F32.BF16 R24, R4, gdesc[UR8], R24 ;
        /*0130*/                   LDG.E.U8 R6, desc[UR4][R8.64] ;
        /*0140*/              @P0  BRA 0x100 ;
        /*0150*/                   LDG.E.U16 R7, desc[UR4][R2.64] ;
        /*0160*/                   FFMA R9, R7, R7, R9 ;
        /*0170*/              @P1  BRA 0x150 ;
        /*0180*/                   LDGSTS.E.BYPASS.128 [R10], desc[UR4][R2.64] ;
        /*0190*/                   HMMA.16816.F32.BF16 R12, R4, R6, R12 ;
        /*01a0*/              @P2  BRA 0x180 ;
"""


def test_narrow_stream_loads_counts_byte_loads_in_dot_loops_only():
    """The two dot loops (HGMMA, HMMA) in size order: three 1-2 byte loads, then none (16-
    byte async copies); the FFMA loop's 2-byte load is not a stream's."""
    from mono_runtime.sass import narrow_stream_loads

    assert narrow_stream_loads(_DOT_LOOP) == [3, 0]
