"""The device half of the protocol as Triton helpers (`@triton.jit`), called by kernels.

Kernels never compute tags, clocks, alarms or health records themselves: they call these.
Layouts and formulas are PROTOCOL.md's; the numbers come from `mono_runtime.protocol`.
Every helper runs on a GPU and under `TRITON_INTERPRET=1` (pass `CPU=True` there: inline
asm does not run, so the clock counts polls).
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import lang as lg
from . import protocol as P

_EPOCH = tl.constexpr(P.CTL_EPOCH)
_ERA_BASE = tl.constexpr(P.CTL_ERA_BASE)
_DEADLINE = tl.constexpr(P.CTL_DEADLINE)
_FAULT_RANK = tl.constexpr(P.CTL_FAULT_RANK)
_FAULT_DELAY = tl.constexpr(P.CTL_FAULT_DELAY)
_SLOT_BITS = tl.constexpr(P.SLOT_BITS)
_ERA_STEPS = tl.constexpr(P.ERA_STEPS)
_MAX_RANKS = tl.constexpr(P.MAX_RANKS)
_HEAD_WORDS64 = tl.constexpr(P.PEER_HEAD // 8)
_H_GIVEUPS = tl.constexpr(P.H_GIVEUPS)
_CTL_GIVEUPS = tl.constexpr(P.CTL_GIVEUPS)
_HEALTH_HEAD = tl.constexpr(P.HEALTH_HEAD)
_RECORD_WORDS = tl.constexpr(P.RECORD_WORDS)
_RECORDS = tl.constexpr(P.RECORDS)
_KIND_DEADLINE = tl.constexpr(P.KIND_DEADLINE)
_KIND_ALARM = tl.constexpr(P.KIND_ALARM)
_KIND_ERA = tl.constexpr(P.KIND_ERA)
_ALARM_FOLLOWED = tl.constexpr(P.ALARM_FOLLOWED)
_ALARM_GAVE_UP = tl.constexpr(P.ALARM_GAVE_UP)
_NAP, _SPIN = P.poll_backoff()  # read once, at import
_BACKOFF_NS = tl.constexpr(_NAP)  # constexpr globals: in the cache key
_SPIN_NS = tl.constexpr(_SPIN)
_ACQUIRE = tl.constexpr(P.acquire_way())  # an index of P.ACQUIRE_WAYS
# (the interpreter exchanges: it runs no inline assembly)
_STORE_PUBLISH = tl.constexpr(P.publish_way() == "store" and not P.cpu_interpreter())

# A wait's state, ordered so that one CTA max combines them: the alarm outranks the
# deadline, which outranks waiting, which outranks a match.
_W_MATCHED = tl.constexpr(0)
_W_WAITING = tl.constexpr(1)
_W_LATE = tl.constexpr(2)
_W_ALARM = tl.constexpr(3)


def _amd(semantic) -> bool:
    """Whether the compile's own target is AMD (an ahead-of-time gfx950 compile runs on a
    machine without a GPU)."""
    return str(semantic.builder.options.arch).startswith("gfx")


@tl.core.extern
def _device_ns(_semantic=None):
    """The device's ns clock for the target being compiled: `%globaltimer` on NVIDIA, the
    100 MHz `s_memrealtime` counter x 10 on AMD (chosen from the compile's own target, so
    an ahead-of-time gfx950 compile on a machine without a GPU gets the AMD clock)."""
    from triton.language.extra.cuda import globaltimer
    from triton.language.extra.hip import memrealtime

    if _amd(_semantic):
        return memrealtime(_semantic=_semantic).__mul__(10, _semantic=_semantic)
    return globaltimer(_semantic=_semantic)


@tl.core.extern
def _sm_id(_semantic=None):
    """The multiprocessor the program runs on: `%smid` on NVIDIA; 0 on AMD (its hardware
    id register is not one number)."""
    from triton.language.extra.cuda import smid

    if _amd(_semantic):
        return _semantic.to_tensor(0).to(tl.int32, _semantic=_semantic)
    return smid(_semantic=_semantic)


@tl.core.extern
def _acquire_asm(ptrs, mask, _semantic=None):
    """`acquire`'s load way on NVIDIA: a predicated `ld.acquire.gpu` a lane; on AMD the
    acquire add (the atomic way's)."""
    if _amd(_semantic):
        return tl.atomic_add(
            ptrs, 0, mask=mask, sem="acquire", scope="gpu", _semantic=_semantic
        ).to(tl.int32, _semantic=_semantic)
    asm = (
        "{\n\t.reg .pred p;\n\t.reg .b64 v;\n\tsetp.ne.b32 p, $2, 0;\n\t"
        "@p ld.acquire.gpu.global.b64 v, [$1];\n\tmov.u32 $0, 0;\n\t}"
    )
    lanes = [
        ptrs.to(tl.int64, bitcast=True, _semantic=_semantic),
        mask.to(tl.int32, _semantic=_semantic),
    ]
    return tl.inline_asm_elementwise(
        asm, "=r,l,r", lanes, dtype=tl.int32, is_pure=False, pack=1, _semantic=_semantic
    )


@triton.jit
def acquire(ptrs, mask, WAY: tl.constexpr):
    """Acquire the pairs at `ptrs` that this thread's polls saw carry the tag: the stores
    their publishers made before publishing become visible to this thread (the caller's
    barrier extends that to its program). WAY: an index of `protocol.ACQUIRE_WAYS`."""
    if WAY == 0:
        tl.atomic_add(ptrs, lg.zeros_like(ptrs, tl.int64), mask=mask, sem="acquire", scope="gpu")
    else:
        _acquire_asm(ptrs, mask)


@tl.core.extern
def _nap(waited, _semantic=None):
    """Sleep about _BACKOFF_NS between polls once a wait has waited `waited` >= _SPIN_NS:
    `nanosleep` on NVIDIA (with a spin, of a register that is 0 before it: no per-thread
    branch in a wait loop), `s_sleep` on AMD (64 clocks a unit, ~30 ns; an immediate, so
    no spin there)."""
    ns = _BACKOFF_NS.value
    if _amd(_semantic):
        if _SPIN_NS.value:
            raise ValueError(f"{P.POLL_BACKOFF_ENV}: NAP:SPIN is NVIDIA's only (use NAP on AMD)")
        asm = f"s_sleep {min(127, max(1, ns // 30))}\n\tv_mov_b32 $0, 0"
    elif _SPIN_NS.value:
        nap = tl.where(
            waited.__ge__(_SPIN_NS.value, _semantic=_semantic), ns, 0, _semantic=_semantic
        ).to(tl.int32, _semantic=_semantic)
        return tl.inline_asm_elementwise(
            "nanosleep.u32 $1;\n\tmov.u32 $0, 0;",
            "=r,r",
            [nap],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
            _semantic=_semantic,
        )
    else:
        asm = f"nanosleep.u32 {ns};\n\tmov.u32 $0, 0;"
    return tl.inline_asm_elementwise(
        asm, "=r", [], dtype=tl.int32, is_pure=False, pack=1, _semantic=_semantic
    )


@tl.core.extern
def _store_words(ptrs, words, mask, SCOPE, _semantic=None):
    """`publish_value`'s write (MONO_PUBLISH=store, the default): on NVIDIA a predicated
    `st.relaxed.{sys,gpu}.global.b64` a lane (its mask broadcast to the pointers' shape),
    on AMD the exchange."""
    if _amd(_semantic):
        return tl.atomic_xchg(
            ptrs, words, mask=mask, sem="relaxed", scope=SCOPE, _semantic=_semantic
        )
    asm = (
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $3, 0;\n\t"
        f"@p st.relaxed.{tl.core._unwrap_if_constexpr(SCOPE)}.global.b64 [$1], $2;\n\t"
        "mov.u32 $0, 0;\n\t}"
    )
    return tl.inline_asm_elementwise(
        asm,
        "=r,l,l,r",
        [
            ptrs.to(tl.int64, bitcast=True, _semantic=_semantic),
            words,
            mask.to(tl.int32, _semantic=_semantic),
        ],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
        _semantic=_semantic,
    )


@triton.jit
def clock(it, CPU: tl.constexpr):
    """The device clock in ns, or the poll count `it` under the interpreter."""
    if CPU:
        return tl.cast(it, tl.int64)
    else:
        return _device_ns()


@triton.jit
def sm_id(CPU: tl.constexpr):
    """The multiprocessor the program runs on (NVIDIA; 0 on AMD and under the
    interpreter): a timeline tells programs that share one apart."""
    if CPU:
        return tl.cast(0, tl.int32)
    else:
        return _sm_id()


@triton.jit
def step_tag(ctl, slot):
    """The tag of launch `slot` (0..255) in the current step; 0 (matches nothing, polls
    give up at once with KIND_ERA) when the step is outside its era."""
    rel = tl.load(ctl + _EPOCH) - tl.load(ctl + _ERA_BASE)
    valid = (rel >= 1) & (rel <= _ERA_STEPS)
    return tl.where(valid, (rel << _SLOT_BITS) | slot, 0).to(tl.int64)


@triton.jit
def make_pair(tag, payload):
    """One int64 pair word: tag (u32) high, payload (32 bits, int32) low."""
    return (tl.cast(tag, tl.int64) << 32) | (tl.cast(payload, tl.int64) & 0xFFFFFFFF)


@triton.jit
def pair_tag(pair):
    return (pair >> 32) & 0xFFFFFFFF


@triton.jit
def pair_payload(pair):
    """The low 32 bits of a pair, as int32 (bitcast to fp32 where the payload is one)."""
    return pair.to(tl.int32)


@triton.jit
def peer_data(peers, r):
    """An int64 pointer to rank r's kernel data (its peer buffer past the alarm head)."""
    return (tl.load(peers + r).to(tl.pointer_type(tl.int64))) + _HEAD_WORDS64


@triton.jit
def _alarm_words(peers, r):
    return tl.load(peers + r).to(tl.pointer_type(tl.int32))


@triton.jit
def publish(ptrs, payload, tag, mask, SCOPE: tl.constexpr):
    """Store (tag, payload) pairs at `ptrs` (int64 pointers), each one 64-bit release
    exchange: the pair also tells its reader that this thread's earlier memory operations
    are done (a handshake). SCOPE: "sys" for a peer's buffer, "gpu" for scratch read by
    other programs."""
    tl.atomic_xchg(ptrs, make_pair(tag, payload), mask=mask, sem="release", scope=SCOPE)


@triton.jit
def publish_value(ptrs, payload, tag, mask, SCOPE: tl.constexpr):
    """Store (tag, payload) pairs that carry all their reader needs: one 64-bit relaxed
    store each on NVIDIA (a relaxed exchange with MONO_PUBLISH=xchg, on AMD and in the
    interpreter), no fence. The tag in the same word is the signal, so nothing else needs
    ordering; a release at system scope would wait for every earlier store of the thread to
    reach every GPU (microseconds, on the critical path of every push). `mask` must have
    the pointers' full shape: the interpreter does not broadcast an atomic's mask (a [1, 1]
    mask over [1, 256] pointers stores one pair there)."""
    if _STORE_PUBLISH:
        _store_words(ptrs, make_pair(tag, payload), mask, SCOPE)
    else:
        tl.atomic_xchg(ptrs, make_pair(tag, payload), mask=mask, sem="relaxed", scope=SCOPE)


@triton.jit
def _give_up(kind, ctl, health, peers, rank, world, region, pair, wanted, seen, alarms, t):
    """Set this rank's alarm word at every peer (own first), then record the give-up in
    health unless it only follows an alarm this rank already raised. The record slot is
    claimed with a device atomic (ctl GIVEUPS); host memory only sees plain stores."""
    level = tl.where(kind == _KIND_ALARM, _ALARM_FOLLOWED, _ALARM_GAVE_UP)
    health = health.to(tl.pointer_type(tl.int64))
    old = tl.atomic_max(_alarm_words(peers, rank) + rank, level, sem="acq_rel", scope="sys")
    for p in range(0, world):
        if p != rank:
            tl.atomic_max(_alarm_words(peers, p) + rank, level, sem="release", scope="sys")
    if (kind != _KIND_ALARM) | (old == 0):
        k = tl.atomic_add(ctl + _CTL_GIVEUPS, 1, sem="acq_rel", scope="gpu")
        if k < _RECORDS:
            rec = health + _HEALTH_HEAD + k * _RECORD_WORDS
            tl.store(rec + 1, tl.cast(region, tl.int64))
            tl.store(rec + 2, tl.cast(pair, tl.int64))
            tl.store(rec + 3, tl.cast(wanted, tl.int64))
            tl.store(rec + 4, tl.cast(seen, tl.int64))
            tl.store(rec + 5, tl.cast(tl.program_id(0), tl.int64))
            tl.store(rec + 6, t)
            tl.store(rec + 7, alarms)
            tl.store(rec, tl.cast(kind, tl.int64))
        tl.store(health + _H_GIVEUPS, k + 1)


@triton.jit
def _wait_state(alarms, ranks, own):
    """The state of a wait, the same in every thread: `own` (this thread's view of its pairs
    and its clock) as the thread holding alarm word 0 sees it, or _W_ALARM if any alarm
    word is set, through one CTA-wide max. A loop that contains barriers (the max itself)
    must be left by every warp in the same iteration; a per-thread load or clock read
    alone would let warps leave one iteration apart and pair the wrong barriers."""
    return tl.max(tl.where(alarms != 0, _W_ALARM, tl.where(ranks == 0, own, _W_MATCHED)), 0)


@triton.jit
def _pairs_state(pairs, mask, tag, waited, deadline):
    """_W_MATCHED when every pair carries `tag`, else _W_LATE past the deadline, else
    _W_WAITING: one thread's view where the block is smaller than the CTA (every thread
    loads its own copy), which `_wait_state` turns into one view for all."""
    missing = tl.max(((pair_tag(pairs) != tag) & mask).to(tl.int32), 0)
    return tl.where(missing == 0, _W_MATCHED, tl.where(waited > deadline, _W_LATE, _W_WAITING))


@triton.jit
def poll(ptrs, mask, tag, ctl, health, peers, rank, world, region, pair0, CPU: tl.constexpr):
    """Wait until every pair at `ptrs` (1-D block of int64 pointers into this rank's own
    memory) carries `tag`, the deadline passes, or any alarm word is set.

    Returns (payload int32 block, ok). On a give-up (ok False) the alarm is set at every
    peer and the first give-up is recorded (region id, pair index `pair0` + lane, wanted,
    seen, program, time); the caller must poison what it computes from the payload and
    treat every later wait of the step as failed (they fail at once: the alarm is set).
    The exit and `ok` are the same in every thread of the program (`_wait_state`).
    """
    head = _alarm_words(peers, rank)
    ranks = lg.anchor(lg.arange(0, _MAX_RANKS))
    rmask = ranks < world
    lanes = lg.arange(0, ptrs.shape[0])
    deadline = tl.load(ctl + _DEADLINE)
    t0 = clock(0, CPU)
    it = 0
    pairs = tl.load(ptrs, mask=mask, other=0, volatile=True)
    alarms = tl.load(head + ranks, mask=rmask, other=0, volatile=True)
    waited = t0 - t0
    state = _wait_state(alarms, ranks, _pairs_state(pairs, mask, tag, waited, deadline))
    while (state == _W_WAITING) & (tag != 0):
        it += 1
        if _BACKOFF_NS > 0:
            if not CPU:
                _nap(waited)
        pairs = tl.load(ptrs, mask=mask, other=0, volatile=True)
        alarms = tl.load(head + ranks, mask=rmask, other=0, volatile=True)
        waited = clock(it, CPU) - t0
        state = _wait_state(alarms, ranks, _pairs_state(pairs, mask, tag, waited, deadline))
    ok = (state == _W_MATCHED) & (tag != 0)
    # the match was seen by the threads that decide; a thread holding a copy of a lane may
    # have read it before the pair landed: it reads again (after the barrier, so it sees it)
    stale = mask & (pair_tag(pairs) != tag) & ok
    pairs = tl.where(stale, tl.load(ptrs, mask=stale, other=0, volatile=True), pairs)
    if not ok:
        kind = tl.where(
            tag == 0, _KIND_ERA, tl.where(state == _W_ALARM, _KIND_ALARM, _KIND_DEADLINE)
        )
        bad = (pair_tag(pairs) != tag) & mask
        lane = tl.min(tl.where(bad, lanes, ptrs.shape[0]), 0) % ptrs.shape[0]
        seen = tl.sum(tl.where(lanes == lane, pair_tag(pairs), 0), 0)
        one = lg.full(ranks.shape, 1, tl.int64)
        bits = tl.sum(tl.where(alarms != 0, one << ranks.to(tl.int64), 0), 0)
        _give_up(
            kind,
            ctl,
            health,
            peers,
            rank,
            world,
            region,
            pair0 + lane,
            tag,
            seen,
            bits,
            clock(it, CPU),
        )
    return pair_payload(pairs), ok


@triton.jit
def wait_done(
    done,
    first,
    N,
    N2: tl.constexpr,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    region,
    pair0,
    CPU: tl.constexpr,
):
    """Wait (bounded: `poll`) until the done pairs first..first+N-1 of this launch's items
    (smaller tickets) carry `tag`, then acquire them: those items' stores are visible to
    this program. False: the wait gave up (recorded in health with pair index `pair0` +
    lane, the alarm set), and so does every later wait of the step. N2: N rounded up to a
    power of two (N may be a runtime count, at most N2)."""
    i = lg.anchor(lg.arange(0, N2))
    m = i < N
    _, ok = poll(done + first + i, m, tag, ctl, health, peers, rank, world, region, pair0, CPU)
    acquire(done + first + i, m, _ACQUIRE)
    tl.debug_barrier()
    return ok


@triton.jit
def bf16x2_lo(payload):
    """The fp32 value of the bf16 in bits 0..15 (column 2j) of an int32 payload."""
    return (payload << 16).to(tl.float32, bitcast=True)


@triton.jit
def bf16x2_hi(payload):
    """The fp32 value of the bf16 in bits 16..31 (column 2j + 1) of an int32 payload."""
    return (payload & -65536).to(tl.float32, bitcast=True)


@triton.jit
def bf16_bits(x):
    """fp32 -> bf16 bits (int32, low 16 bits) rounded to nearest even, in integer ops so the
    interpreter and the GPU round alike; NaN stays a quiet NaN."""
    b = x.to(tl.int32, bitcast=True)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    return tl.where(x != x, 0x7FC0, r)


@triton.jit
def bf16x2_pack(lo, hi):
    """Round two fp32 blocks to bf16 (nearest even) and pack them into int32 payloads."""
    return bf16_bits(lo) | (bf16_bits(hi) << 16)


@triton.jit
def reduce_bf16x2(
    src0, src_stride, mask, tag, ctl, health, peers, rank, world, region, pair0, CPU: tl.constexpr
):
    """Rank-ordered fp32 sum of bf16x2 rows that ranks 0..world-1 pushed here: source r's
    pairs sit at `src0 + r * src_stride` (pair index `pair0 + r * src_stride`).

    Returns (sum of the low halves, sum of the high halves, ok); every rank adds in the
    same order, so every rank gets bit-identical sums."""
    lo = lg.zeros_like(src0, tl.float32)
    hi = lg.zeros_like(src0, tl.float32)
    ok = tag == tag
    for r in range(0, world):
        v, got = poll(
            src0 + r * src_stride,
            mask,
            tag,
            ctl,
            health,
            peers,
            rank,
            world,
            region,
            pair0 + r * src_stride,
            CPU,
        )
        lo += bf16x2_lo(v)
        hi += bf16x2_hi(v)
        ok = ok & got
    return lo, hi, ok


@triton.jit
def reduce_f32(
    src0, src_stride, mask, tag, ctl, health, peers, rank, world, region, pair0, CPU: tl.constexpr
):
    """Rank-ordered fp32 sum of fp32 payloads (layout as `reduce_bf16x2`); (sum, ok)."""
    acc = lg.zeros_like(src0, tl.float32)
    ok = tag == tag
    for r in range(0, world):
        v, got = poll(
            src0 + r * src_stride,
            mask,
            tag,
            ctl,
            health,
            peers,
            rank,
            world,
            region,
            pair0 + r * src_stride,
            CPU,
        )
        acc += v.to(tl.float32, bitcast=True)
        ok = ok & got
    return acc, ok


@triton.jit
def fault_stall(ctl, peers, rank, world, CPU: tl.constexpr):
    """Fault injection: on the rank named by ctl (rank + 1), spin for the injected delay or
    until an alarm is set (left by every warp together, as `poll`). Call once per program
    before the first peer store."""
    if tl.load(ctl + _FAULT_RANK) == rank + 1:
        delay = tl.load(ctl + _FAULT_DELAY)
        head = _alarm_words(peers, rank)
        ranks = lg.anchor(lg.arange(0, _MAX_RANKS))
        t0 = clock(0, CPU)
        it = 0
        state = tl.where(delay > 0, _W_WAITING, _W_LATE)
        while state == _W_WAITING:
            it += 1
            alarms = tl.load(head + ranks, mask=ranks < world, other=0, volatile=True)
            waited = clock(it, CPU) - t0
            state = _wait_state(alarms, ranks, tl.where(waited < delay, _W_WAITING, _W_LATE))


@triton.jit
def ticket_take(counter, n_items):
    """Draw the next ticket from `counter` (int64, 0 at launch start). Draw until a ticket
    >= n_items comes back; the last taker of a 1-D grid resets the counter to 0."""
    t = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if t == n_items + tl.num_programs(0) - 1:
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
    return t


@triton.jit
def ticket_finish(done, t, tag):
    """Mark item t done: pair (tag, 1) at done[t], after the whole program's prior stores."""
    tl.debug_barrier()
    tl.atomic_xchg(done + t, make_pair(tag, 1), sem="release", scope="gpu")


@triton.jit
def ticket_wait(done, t, tag, ctl, health, peers, rank, world, region, CPU: tl.constexpr):
    """Wait (bounded) for item t < this program's own ticket; then its stores are visible."""
    one = lg.anchor(lg.arange(0, 1))
    _, ok = poll(done + t + one, one == 0, tag, ctl, health, peers, rank, world, region, t, CPU)
    acquire(done + t + one, one == 0, _ACQUIRE)
    tl.debug_barrier()
    return ok
