"""The device half of mono's protocol in FlyDSL (AMD gfx950 / gfx942), used inside kernels.

The twin of ``mono_runtime.protocol_triton``: the same words, tags, alarms, health records
and ticket counters (PROTOCOL.md), with the numbers imported from ``mono_runtime.protocol``
so the two halves cannot drift. Helpers work per lane: a lane polls its own pairs.

Scopes. ``SYSTEM`` (LLVM's system scope; on gfx9 ``sc0 sc1``, past every cache) for pairs
between GPUs: peer buffers are uncached memory, so a system-scope store reaches the peer
and a system-scope load sees it. ``DEVICE`` (agent scope, ``sc1``, past the per-XCD L2)
between the programs of one launch. A publish is a release fence then one 64-bit atomic
store of the pair (the fence writes back the L2 at system scope, ``buffer_wbl2 sc0 sc1``); a
poll re-loads pairs with atomic loads of the same scope, sleeping (``s_sleep``) between
rounds, then acquires (``buffer_inv``) before the payloads' data are read.

Clock. ``s_memrealtime`` counts at 100 MHz; ``clock_ns`` scales it to ns, the unit of
ctl[DEADLINE] on a GPU.

The weight-load rule. Loads retire in order, so a poll queued behind a weight prefetch
waits for the prefetch and spins blind; a program marks a prefetch with ``loads_issued``
and its use with ``loads_used``, and ``poll`` refuses, at trace time, to wait in between.

No ``from __future__ import annotations`` here: FlyDSL reads annotations at trace time.
"""

from dataclasses import dataclass, field

import flydsl.expr as fx
from flydsl._mlir.dialects import llvm as _llvm
from flydsl.compiler.ast_rewriter import ASTRewriter
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from .. import protocol as P

SYSTEM = None  # LLVM system scope: pairs between GPUs (peer memory)
DEVICE = "agent"  # pairs between the programs of one launch (this GPU's scratch)
POLL_BATCH = 12  # pairs one wait re-loads together (bounds live registers)
NS_PER_TICK = 10  # s_memrealtime runs at 100 MHz


class ProtocolError(RuntimeError):
    """A kernel broke a protocol rule at trace time (before anything compiles or runs)."""


def traced(fn):
    """Let a helper's ``while`` / ``if`` over traced values lower to control flow (FlyDSL
    rewrites only a kernel's own body)."""
    return ASTRewriter.transform(fn)


# --- words ---------------------------------------------------------------------------------


def word_ptr(addr, index, dtype=fx.Int64):
    """Global pointer to element ``index`` (of Int64 / Int32) at byte address ``addr``."""
    nbytes = dtype.width // 8
    at = fx.Int64(addr) + fx.Int64(index) * nbytes
    ir_type = T.i64 if nbytes == 8 else T.i32
    return fx.inttoptr(fx.PointerType.get(ir_type, fx.AddressSpace.Global, nbytes), at)


def load64(addr, index, scope):
    return fx.generic_load(
        word_ptr(addr, index),
        dtype=fx.Int64,
        memory_order=fx.AtomicOrdering.Monotonic,
        syncscope=scope,
    )


def store64(addr, index, word, scope):
    fx.generic_store(
        word_ptr(addr, index),
        fx.Int64(word),
        memory_order=fx.AtomicOrdering.Monotonic,
        syncscope=scope,
    )


def plain64(addr, index):
    """A plain load (no atomic): for words written before the launch (ctl, peer table)."""
    return fx.generic_load(word_ptr(addr, index), dtype=fx.Int64)


def clock_ns():
    """The device clock in ns (``s_memrealtime``, 100 MHz)."""
    ticks = fx.Int64(_llvm.call_intrinsic(T.i64, "llvm.amdgcn.s.memrealtime", [], [], []))
    return ticks * NS_PER_TICK


def release(scope):
    """What this lane stored before is visible at ``scope`` before what it stores next."""
    fx.memory_fence(syncscope=scope, ordering=fx.AtomicOrdering.Release)


def acquire(scope):
    """What this lane loads next is no older than the pairs it just polled."""
    fx.memory_fence(syncscope=scope, ordering=fx.AtomicOrdering.Acquire)


def drain():
    """Every wave's stores are done, then the program meets at a barrier: a pair that one
    lane publishes next announces what any lane of the program stored. Call from every
    thread of the program."""
    rocdl.s_waitcnt(vmcnt=0)
    fx.gpu.barrier()


def step_tag(ctl, slot):
    """This launch's tag (u32 bits in an Int32): (rel << SLOT_BITS) | slot with rel = EPOCH -
    ERA_BASE, or TAG_INVALID (0) when rel is outside 1 .. ERA_STEPS."""
    rel = plain64(ctl, P.CTL_EPOCH) - plain64(ctl, P.CTL_ERA_BASE)
    valid = (rel >= 1) & (rel <= P.ERA_STEPS)
    tag = fx.Int32((rel << P.SLOT_BITS) | fx.Int64(slot))
    return valid.select(tag, fx.Int32(P.TAG_INVALID))


def make_pair(tag, payload):
    """One int64 pair word: the tag (u32) high, the payload's 32 bits low."""
    return (fx.Int64(fx.Int32(tag)) << 32) | fx.Int64(fx.Uint32(bits_of(payload)))


def pair_tag(word):
    return fx.Int32(word >> 32)


def pair_payload(word):
    return fx.Int32(word)


def bits_of(value):
    """A payload's 32 bits: a Float32 bit-cast, an integer as is."""
    return value.bitcast(fx.Int32) if isinstance(value, fx.Float32) else fx.Int32(value)


def publish(addr, index, payload, tag, scope):
    """Pair ``index`` (int64 words from ``addr``) := (tag, payload), after a release at
    ``scope``: what this lane stored before (after ``drain``, its program) is visible to a
    reader that polled the pair."""
    release(scope)
    store64(addr, index, make_pair(tag, payload), scope)


def bf16x2_lo(payload):
    """fp32 of the bf16 in bits 0..15 (column 2j) of a payload."""
    return (fx.Int32(payload) << 16).bitcast(fx.Float32)


def bf16x2_hi(payload):
    """fp32 of the bf16 in bits 16..31 (column 2j + 1) of a payload."""
    return (fx.Int32(payload) & -65536).bitcast(fx.Float32)


def bf16_bits(x):
    """The bf16 of fp32 ``x``, round to nearest even (NaN kept NaN), in the low 16 bits."""
    u = x.bitcast(fx.Int32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = x != x
    return nan.select(fx.Int32(0x7FC0), rounded & 0xFFFF)


def bf16x2_pack(lo, hi):
    """Two fp32 values rounded to bf16 in one payload (lo in bits 0..15)."""
    return bf16_bits(lo) | (bf16_bits(hi) << 16)


# --- a program's view of the protocol ------------------------------------------------------


@dataclass
class Program:
    """What one program of a launch knows of the protocol, built at kernel entry by
    ``program(...)`` and handed to the helpers below.

    FlyDSL carries a local object through ``if`` / ``while`` when a method is called on it,
    and cannot carry this one: kernels call module functions (``poll(prog, ...)``).
    """

    ctl: object  # Int64 address of the runner's ctl words
    health: object  # Int64 address of this rank's health words
    peers: object  # Int64 address of the int64 table of peer-buffer bases
    bases: list  # every rank's peer-buffer base, rank order
    own: object  # this rank's peer-buffer base (its alarm head)
    rank: object  # Int32
    world: int
    deadline: object  # Int64 ns
    in_flight: list = field(default_factory=list)


def program(ctl, health, peers, rank, world):
    """The protocol state of the calling program (``world`` a Python int, up to MAX_RANKS)."""
    if not 1 <= world <= P.MAX_RANKS:
        raise ProtocolError(f"world {world} outside 1..{P.MAX_RANKS}")
    bases = [plain64(peers, r) for r in range_constexpr(world)]
    return Program(
        fx.Int64(ctl),
        fx.Int64(health),
        fx.Int64(peers),
        bases,
        plain64(peers, rank),
        fx.Int32(rank),
        world,
        plain64(ctl, P.CTL_DEADLINE),
    )


def peer_data(prog, r):
    """Rank ``r``'s kernel data: its peer buffer past the alarm head (``r`` a Python int)."""
    return prog.bases[r] + fx.Int64(P.PEER_HEAD)


def own_data(prog):
    """This rank's kernel data, where peers push pairs for this rank to poll."""
    return prog.own + fx.Int64(P.PEER_HEAD)


def alarm_bits(prog):
    """Bit r set: rank r's alarm word in this rank's head is non-zero (read at system
    scope, two words a load)."""
    head = prog.own
    bits = fx.Int64(0)
    for w in range_constexpr(0, prog.world, 2):
        word = load64(head, w // 2, SYSTEM)
        bits = bits | (fx.Int32(word) != 0).select(fx.Int64(1 << w), fx.Int64(0))
        if w + 1 < prog.world:
            hi = fx.Int32(word >> 32)
            bits = bits | (hi != 0).select(fx.Int64(1 << (w + 1)), fx.Int64(0))
    return bits


def loads_issued(prog, what="weight"):
    """A prefetch whose values arrive later: no poll until ``loads_used``."""
    prog.in_flight.append(what)


def loads_used(prog):
    if not prog.in_flight:
        raise ProtocolError("loads_used without loads_issued")
    prog.in_flight.pop()


@traced
def _spin(load_all, missing, alarms, tag, deadline):
    t0 = clock_ns()
    v = load_all()
    raised = alarms()
    waited = fx.Int64(0)
    while missing(v) & (raised == 0) & (waited <= deadline) & (tag != 0):
        rocdl.s_sleep(1)
        v = load_all()
        raised = alarms()
        waited = clock_ns() - t0
    return v, raised


@traced
def _give_up_if(failed, give_up):
    if failed:
        give_up()


def poll(prog, specs, tag, scope, region, pair0=0):
    """Wait until every pair of ``specs`` = [(addr, index)] carries ``tag``, the deadline
    passes, or any alarm word is set; returns (payloads as Int32, ok).

    ``scope``: SYSTEM for pairs peers push into this rank's buffer, DEVICE for pairs other
    programs store into scratch. ``region``: the region id (``protocol.region_id``);
    ``pair0``: the pair index a record names for the first spec. On a give-up (ok false)
    this rank's alarm is set at every peer and the give-up recorded; the caller poisons what
    it computes from the payloads.
    """
    if prog.in_flight:
        raise ProtocolError(
            f"poll of region {P.region_name(region)} with {', '.join(prog.in_flight)} loads "
            "in flight: loads retire in order, so the poll would wait for them; use them first"
        )
    if len(specs) > POLL_BATCH:
        head, ok = poll(prog, specs[:POLL_BATCH], tag, scope, region, pair0)
        tail, ok2 = poll(prog, specs[POLL_BATCH:], tag, scope, region, pair0 + POLL_BATCH)
        return head + tail, ok & ok2
    tag = fx.Int32(tag)
    n = len(specs)

    def load_all():
        words = []
        for a, i in specs:
            w = load64(a, i, scope)
            words += [pair_payload(w), pair_tag(w)]
        return fx.Vector.from_elements(words, fx.Int32)

    def missing(v):
        bad = v[1] != tag
        for e in range_constexpr(3, 2 * n, 2):
            bad = bad | (v[e] != tag)
        return bad

    v, raised = _spin(load_all, missing, lambda: alarm_bits(prog), tag, prog.deadline)
    acquire(scope)
    ok = (missing(v) == 0) & (raised == 0) & (tag != 0)
    # the first pair still missing, for the record
    seen, at = v[2 * n - 1], fx.Int32(pair0 + n - 1)
    for k in range_constexpr(n - 2, -1, -1):
        bad = v[2 * k + 1] != tag
        seen, at = bad.select(v[2 * k + 1], seen), bad.select(fx.Int32(pair0 + k), at)
    kind = (tag == 0).select(
        fx.Int32(P.KIND_ERA),
        (raised != 0).select(fx.Int32(P.KIND_ALARM), fx.Int32(P.KIND_DEADLINE)),
    )
    _give_up_if(ok == 0, lambda: give_up(prog, kind, region, at, tag, seen, raised))
    return [v[2 * k] for k in range_constexpr(n)], ok


@traced
def give_up(prog, kind, region, pair, wanted, seen, alarms):
    """Set this rank's alarm word at every peer (its own first), then record the give-up
    unless it only follows an alarm this rank already raised (PROTOCOL.md section 4)."""
    level = (kind == P.KIND_ALARM).select(fx.Int32(P.ALARM_FOLLOWED), fx.Int32(P.ALARM_GAVE_UP))
    own = word_ptr(prog.own, prog.rank, fx.Int32)
    old = fx.atomic_max(own, level, syncscope=SYSTEM, ordering=fx.AtomicOrdering.AcqRel)
    for p in range_constexpr(prog.world):
        fx.atomic_max(
            word_ptr(prog.bases[p], prog.rank, fx.Int32),
            level,
            syncscope=SYSTEM,
            ordering=fx.AtomicOrdering.Release,
        )
    if (kind != P.KIND_ALARM) | (old == 0):
        # the record is claimed on the device (ctl GIVEUPS): host memory sees only stores
        k = fx.atomic_add(
            word_ptr(prog.ctl, P.CTL_GIVEUPS),
            fx.Int64(1),
            syncscope=DEVICE,
            ordering=fx.AtomicOrdering.AcqRel,
        )
        if k < P.RECORDS:
            rec = prog.health + (fx.Int64(P.HEALTH_HEAD) + k * P.RECORD_WORDS) * 8
            store64(rec, P.R_REGION, fx.Int64(region), SYSTEM)
            store64(rec, P.R_PAIR, fx.Int64(pair), SYSTEM)
            store64(rec, P.R_WANTED, fx.Int64(fx.Uint32(wanted)), SYSTEM)
            store64(rec, P.R_SEEN, fx.Int64(fx.Uint32(seen)), SYSTEM)
            store64(rec, P.R_PROGRAM, fx.Int64(fx.block_idx.x), SYSTEM)
            store64(rec, P.R_TIME, clock_ns(), SYSTEM)
            store64(rec, P.R_ALARMS, alarms, SYSTEM)
            release(SYSTEM)
            store64(rec, P.R_KIND, fx.Int64(kind), SYSTEM)
        store64(prog.health, P.H_GIVEUPS, k + 1, SYSTEM)


@traced
def fault_stall(prog):
    """Fault injection: on the rank ctl names (rank + 1), spin for ctl[FAULT_DELAY] ns or
    until an alarm is set. Once per program, before its first peer store."""
    if plain64(prog.ctl, P.CTL_FAULT_RANK) == fx.Int64(prog.rank) + 1:
        delay = plain64(prog.ctl, P.CTL_FAULT_DELAY)
        t0 = clock_ns()
        waited = fx.Int64(0)
        raised = fx.Int64(0)
        while (waited < delay) & (raised == 0):
            rocdl.s_sleep(8)
            raised = alarm_bits(prog)
            waited = clock_ns() - t0


# --- ticket loops --------------------------------------------------------------------------


@traced
def ticket_take(counter, n_items, programs):
    """Draw the next ticket (int64 counter, device scope, acq_rel). Draw until a ticket >=
    ``n_items`` comes back; the program that draws ``n_items + programs - 1`` is the last
    taker and resets the counter for the next launch."""
    t = fx.atomic_add(
        word_ptr(counter, 0), fx.Int64(1), syncscope=DEVICE, ordering=fx.AtomicOrdering.AcqRel
    )
    if t == fx.Int64(n_items) + fx.Int64(programs) - 1:
        store64(counter, 0, 0, DEVICE)
    return t


def ticket_finish(done, t, tag):
    """Item ``t`` is done: pair (tag, 1) at ``done[t]``, device scope, after a release. An
    item whose work spanned several waves calls ``drain()`` (every thread) first."""
    publish(done, t, fx.Int32(1), tag, DEVICE)


def ticket_wait(prog, done, t, tag, region):
    """Wait (bounded) for item ``t``, a smaller ticket than this program's own; then its
    stores are visible to this lane. Returns ok."""
    _, ok = poll(prog, [(done, t)], tag, DEVICE, region, t)
    return ok


# --- rank-ordered sums ---------------------------------------------------------------------


def _ranked(prog, src0, src_stride, index, tag, region):
    specs = [(src0, fx.Int64(index) + r * src_stride) for r in range_constexpr(prog.world)]
    return poll(prog, specs, tag, SYSTEM, region, index)


def reduce_f32(prog, src0, src_stride, index, tag, region):
    """Rank-ordered fp32 sum of the fp32 payloads ranks 0..world-1 pushed here: source r's
    pair sits at index ``index + r * src_stride`` of ``src0``. Returns (sum, ok); every
    rank adds in the same order, so every rank gets the same bits."""
    got, ok = _ranked(prog, src0, src_stride, index, tag, region)
    acc = got[0].bitcast(fx.Float32)
    for v in got[1:]:
        acc = acc + v.bitcast(fx.Float32)
    return acc, ok


def reduce_bf16x2(prog, src0, src_stride, index, tag, region):
    """As ``reduce_f32`` for bf16x2 payloads: (sum of low halves, sum of high halves, ok)."""
    got, ok = _ranked(prog, src0, src_stride, index, tag, region)
    lo, hi = bf16x2_lo(got[0]), bf16x2_hi(got[0])
    for v in got[1:]:
        lo, hi = lo + bf16x2_lo(v), hi + bf16x2_hi(v)
    return lo, hi, ok
