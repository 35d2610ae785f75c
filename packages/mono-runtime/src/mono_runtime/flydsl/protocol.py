"""The device half of mono's protocol in FlyDSL (gfx950 / gfx942), used inside kernels.

Same words as the Triton half (``PROTOCOL.md``): a mailbox pair is one 64-bit word, the
32-bit payload low and the 32-bit tag high, stored and loaded as one atomic so a load that
sees a tag sees its payload. Scopes: ``SYSTEM`` (LLVM's system scope: ``sc0 sc1`` on gfx9,
past every cache, for peer memory, which is uncached) between GPUs, ``DEVICE`` (agent
scope: ``sc1``, past the per-XCD L2) between the programs of one launch.

Every wait is bounded: it reads ``s_memrealtime`` (100 MHz) against a deadline, watches
this rank's alarm words while it sleeps (``s_sleep``), and a program that gives up raises
its alarm word at every peer, then writes its health record, and waits for nothing more
this step (its later polls see the alarm and return at once).

A program never polls with weight loads in flight: loads retire in order, so a poll queued
behind a weight prefetch waits for the prefetch; ``Program.poll`` refuses, at trace time,
a poll issued between ``loads_issued`` and ``loads_used``.

No ``from __future__ import annotations`` here: FlyDSL reads annotations at trace time.
"""

from dataclasses import dataclass, field

import flydsl.expr as fx
from flydsl._mlir.dialects import llvm as _llvm
from flydsl.compiler.ast_rewriter import ASTRewriter
from flydsl.expr import const_expr, range_constexpr, rocdl
from flydsl.expr.typing import T

from . import layout as L

SYSTEM = None  # LLVM system scope: between GPUs (peer memory)
DEVICE = "agent"  # between the programs of one launch (this GPU's scratch)
POLL_BATCH = 12  # pairs re-loaded together in one wait (bounds live registers)


class ProtocolError(RuntimeError):
    """A kernel broke a protocol rule at trace time (before anything compiles or runs)."""


def traced(fn):
    """Let a helper's ``while`` / ``if`` over traced values lower to control flow (FlyDSL
    rewrites only a kernel's own body)."""
    return ASTRewriter.transform(fn)


# --- words -------------------------------------------------------------------------------


def word_ptr(addr, index, dtype=fx.Int64):
    """Pointer to element ``index`` (of ``dtype``: Int64 / Int32 / Float32) at ``addr``."""
    nbytes = dtype.width // 8
    ir_type = {64: T.i64, 32: T.i32}[dtype.width] if dtype is not fx.Float32 else T.f32
    at = fx.Int64(addr) + fx.Int64(index) * nbytes
    return fx.inttoptr(fx.PointerType.get(ir_type, fx.AddressSpace.Global, nbytes), at)


def store64(addr, index, word, scope):
    fx.generic_store(word_ptr(addr, index), fx.Int64(word),
                     memory_order=fx.AtomicOrdering.Monotonic, syncscope=scope)


def load64(addr, index, scope):
    return fx.generic_load(word_ptr(addr, index), dtype=fx.Int64,
                           memory_order=fx.AtomicOrdering.Monotonic, syncscope=scope)


def store32(addr, index, word, scope):
    fx.generic_store(word_ptr(addr, index, fx.Int32), fx.Int32(word),
                     memory_order=fx.AtomicOrdering.Monotonic, syncscope=scope)


def load32(addr, index, scope):
    return fx.generic_load(word_ptr(addr, index, fx.Int32), dtype=fx.Int32,
                           memory_order=fx.AtomicOrdering.Monotonic, syncscope=scope)


def clock():
    """The 100 MHz device clock (``s_memrealtime``), the deadlines' time base."""
    return fx.Int64(_llvm.call_intrinsic(T.i64, "llvm.amdgcn.s.memrealtime", [], [], []))


def release(scope):
    """Everything this lane stored before is visible at ``scope`` before what it stores
    next (gfx9 system scope: an L2 write-back, ``buffer_wbl2 sc0 sc1``)."""
    fx.memory_fence(syncscope=scope, ordering=fx.AtomicOrdering.Release)


def acquire(scope):
    """What this lane loads next is no older than the pairs it just polled (gfx9 system
    scope: an L2 invalidate, ``buffer_inv sc0 sc1``)."""
    fx.memory_fence(syncscope=scope, ordering=fx.AtomicOrdering.Acquire)


def drain():
    """Every wave of the program has its stores done, then the program meets at a barrier:
    what any of its lanes stored happens before a pair one lane publishes next."""
    rocdl.s_waitcnt(vmcnt=0)
    fx.gpu.barrier()


def tag_of(epoch, slot):
    """The tag of slot ``slot`` in step ``epoch`` (``layout.tag_of`` on the host)."""
    return L.device_tag(fx.Int32(epoch), fx.Int32(slot))


def pair(value_bits, tag):
    """One mailbox word: 32 payload bits low, the tag high."""
    return (fx.Int64(fx.Int32(tag)) << 32) | fx.Int64(fx.Uint32(fx.Int32(value_bits)))


def bits_of(value):
    """A payload's 32 bits: a Float32 bit-cast, an integer as is."""
    return value.bitcast(fx.Int32) if isinstance(value, fx.Float32) else fx.Int32(value)


def store_pair(addr, index, value, tag, scope):
    """Pair ``index`` at ``addr`` := (value, tag), no fence: a value no other data hangs on."""
    store64(addr, index, pair(bits_of(value), tag), scope)


def publish(addr, index, value, tag, scope):
    """Pair ``index`` := (value, tag) after a release at ``scope``: what this lane stored
    before (after ``drain``: what its program stored) is visible to whoever acquires it."""
    release(scope)
    store_pair(addr, index, value, tag, scope)


# --- bounded waits -------------------------------------------------------------------------


@traced
def _spin(load_all, pending, alarmed, deadline):
    t0 = clock()
    v = load_all()
    alarm = alarmed()
    late = fx.Int64(0)
    while pending(v) & (alarm == 0) & (late < deadline):
        rocdl.s_sleep(1)
        v = load_all()
        alarm = alarmed()
        late = clock() - t0
    return v, pending(v)


@traced
def _if_gave_up(failed, record):
    if failed:
        record()


@dataclass
class Program:
    """What one program of a launch knows of the protocol, built once at kernel entry
    (``program(...)``) and handed to the helpers below.

    FlyDSL carries a local object through ``if`` / ``while`` when a method is called on it,
    and cannot carry this one, so kernels call module functions (``poll(prog, ...)``).
    """

    bases: list  # every rank's peer-buffer base (Int64), rank order
    own: object  # this rank's peer-buffer base
    peers: object  # address of the int64 table of bases
    health: object  # this rank's health words
    rank: object  # Int32
    world: int
    epoch: object  # Int32, this launch's step counter
    deadline: object  # Int64 clock ticks
    program: object  # Int32, this program's id in the grid
    in_flight: list = field(default_factory=list)


def program(peers, health, rank, world, epoch, deadline):
    """The protocol state of the calling program: loads every rank's peer base once."""
    bases = [load64(peers, r, DEVICE) for r in range_constexpr(world)]
    return Program(bases, load64(peers, rank, DEVICE), peers, health, fx.Int32(rank), world,
                   fx.Int32(epoch), fx.Int64(deadline), fx.Int32(fx.block_idx.x))


def peer(prog, r):
    """Rank ``r``'s buffer past its head (``r`` a Python int; the head holds the alarms)."""
    return prog.bases[r] + fx.Int64(L.PEER_HEAD_BYTES)


def own_peer(prog):
    """This rank's buffer past its head: where peers push to this rank."""
    return prog.own + fx.Int64(L.PEER_HEAD_BYTES)


def alarmed(prog):
    """Non-zero once any rank raised its alarm word in this rank's head."""
    seen = load32(prog.own, L.ALARM_WORD0, SYSTEM)
    for r in range_constexpr(1, prog.world):
        seen = seen | load32(prog.own, L.ALARM_WORD0 + r * L.ALARM_STRIDE, SYSTEM)
    return seen


def loads_issued(prog, what="weight"):
    """Mark the start of loads whose values arrive later (a prefetch): no poll until
    ``loads_used``."""
    prog.in_flight.append(what)


def loads_used(prog):
    if not prog.in_flight:
        raise ProtocolError("loads_used without loads_issued")
    prog.in_flight.pop()


def poll(prog, specs, tag, scope, region):
    """Wait until pairs ``specs`` = [(addr, index)] all carry ``tag``; returns their
    payloads (Int32 bits) and a flag set when this wait gave up (deadline or alarm).

    On a timeout the program gives up: alarm at every peer, then its health record.
    ``region`` (a Python int) names the wait in that record.
    """
    if prog.in_flight:
        raise ProtocolError(
            f"poll of region {region} with {', '.join(prog.in_flight)} loads in flight: "
            "loads retire in order, so the poll would wait for them; use them first")
    if len(specs) > POLL_BATCH:
        head, gave_up = poll(prog, specs[:POLL_BATCH], tag, scope, region)
        tail, gave_up2 = poll(prog, specs[POLL_BATCH:], tag, scope, region)
        return head + tail, gave_up | gave_up2
    tag = fx.Int32(tag)

    def load_all():
        words = []
        for a, i in specs:
            w = load64(a, i, scope)
            words += [fx.Int32(w), fx.Int32(w >> 32)]
        return fx.Vector.from_elements(words, fx.Int32)

    def pending(v):
        bad = v[1] != tag
        for e in range_constexpr(3, 2 * len(specs), 2):
            bad = bad | (v[e] != tag)
        return bad

    v, failed = _spin(load_all, pending, lambda: alarmed(prog), prog.deadline)
    acquire(scope)
    seen = v[1]
    index = fx.Int32(specs[0][1])
    for k in range_constexpr(len(specs) - 1, 0, -1):
        bad_k = v[2 * k + 1] != tag
        seen = bad_k.select(v[2 * k + 1], seen)
        index = bad_k.select(fx.Int32(specs[k][1]), index)
    timed_out = failed & (alarmed(prog) == 0)
    _if_gave_up(timed_out, lambda: give_up(prog, region, index, tag, seen))
    return [v[2 * k] for k in range_constexpr(len(specs))], failed


def give_up(prog, region, index, want, seen):
    """Raise this rank's alarm word at every peer (before anything else it stores), then
    record the wait in this rank's health words."""
    for r in range_constexpr(prog.world):
        store32(prog.bases[r], L.ALARM_WORD0 + prog.rank * L.ALARM_STRIDE, 1, SYSTEM)
    record(prog.health, region, index, want, seen, prog.program, clock())


@traced
def record(health, region, index, want, seen, program, when):
    """The first give-up of this rank wins the health record (a compare-and-swap on its flag
    word); later ones only count."""
    flag = word_ptr(health, L.HEALTH_FLAG, fx.Int32)
    _, won = fx.atomic_cas(flag, fx.Int32(0), fx.Int32(1), syncscope=SYSTEM)
    if won:
        store32(health, L.HEALTH_REGION, region, SYSTEM)
        store32(health, L.HEALTH_PAIR, index, SYSTEM)
        store32(health, L.HEALTH_WANT, want, SYSTEM)
        store32(health, L.HEALTH_SEEN, seen, SYSTEM)
        store32(health, L.HEALTH_PROGRAM, program, SYSTEM)
        store64(health, L.HEALTH_TIME64, when, SYSTEM)
    fx.atomic_add(word_ptr(health, L.HEALTH_COUNT, fx.Int32), fx.Int32(1), syncscope=SYSTEM)


# --- ticket loops --------------------------------------------------------------------------


def ticket_take(counter):
    """The next work item of this launch (device scope; one lane per program calls it)."""
    return fx.atomic_add(word_ptr(counter, 0, fx.Int32), fx.Int32(1), syncscope=DEVICE,
                         ordering=fx.AtomicOrdering.AcqRel)


@traced
def ticket_finish(counter, ticket, items, programs):
    """Every program takes exactly one ticket past ``items`` (the one that ends its loop):
    the taker of the last of those, ``items + programs - 1``, resets the counter for the
    next launch (the kernel boundary orders it before that launch's takes)."""
    if ticket == fx.Int32(items) + fx.Int32(programs) - 1:
        store32(counter, 0, 0, DEVICE)


# --- rank-ordered reduce -------------------------------------------------------------------


def reduce_ranked(values):
    """Sum fp32 ``values`` (one a rank, rank 0 first) in rank order: every rank that sums
    the same payloads gets the same bits."""
    acc = values[0].bitcast(fx.Float32) if not isinstance(values[0], fx.Float32) else values[0]
    for v in values[1:]:
        acc = acc + (v.bitcast(fx.Float32) if not isinstance(v, fx.Float32) else v)
    return acc


def poll_reduce(prog, region_offset, index, tag, region):
    """Poll pair ``index`` of a peer region in every rank's buffer *at this rank* (each rank
    pushed its partial into its own slot ``index * world + r``), then sum the fp32 payloads
    in rank order. Returns (sum, gave_up)."""
    at = own_peer(prog) + fx.Int64(region_offset)
    specs = [(at, fx.Int32(index) * prog.world + r) for r in range_constexpr(prog.world)]
    got, gave_up = poll(prog, specs, tag, SYSTEM, region)
    if const_expr(len(got) == 1):
        return got[0].bitcast(fx.Float32), gave_up
    return reduce_ranked(got), gave_up
