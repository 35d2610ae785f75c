"""Device helpers (`@triton.jit`) of the fused decode kernels: the pieces every ticket-loop
kernel that streams weights against <= 16 token rows and trades bf16 pairs with every rank
is built from (MiniMax-M3's FFN, Kimi-K3's K2).

Why here: the kernels must agree bit for bit with their references and with each other's
conventions (bf16 rounding, the split-K order, the [16 tokens, H / 2] pair rows a rank
pushes), so each convention is written once. Every helper inlines into its caller (Triton
inlines `@triton.jit` calls): no extra memory traffic or registers over writing it in place.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import lang as lg
from . import protocol_triton as pt
from .stream import device as st
from .stream import frag_gluon as fg
from .timeline import NO_MARK as _NO_MARK
from .timeline import STAMP_WORDS

_STAMP_WORDS = tl.constexpr(STAMP_WORDS)
NO_MARK = tl.constexpr(_NO_MARK)  # `stamp_item`'s mark where a stage stamps none

# -- values -------------------------------------------------------------------------------


@triton.jit
def popc(x):
    """The set bits of each uint32 of `x`, as int32 (shifts and masks: the same in the
    interpreter, Triton and Gluon, which share no population-count builtin)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def bf16_round(x):
    """x rounded to bf16 (nearest even, as the pair packing rounds), as fp32: what a bf16
    tensor of the reference would hold."""
    return (pt.bf16_bits(x) << 16).to(tl.float32, bitcast=True)


@triton.jit
def tile_pairs(acc, BN: tl.constexpr):
    """fp32 [BN weight rows, NT tokens] (a `stream_rows` result: NT 16) -> int32 [NT
    tokens, BN / 2] bf16 pairs (rounded): the payload of `push_pairs`."""
    NT: tl.constexpr = acc.shape[1]
    lo, hi = tl.split(tl.reshape(tl.trans(lg.row_pairs(acc)), (NT, BN // 2, 2)))
    return pt.bf16x2_pack(lo, hi)


# -- weights ------------------------------------------------------------------------------


@triton.jit
def stacked_expert(e, w, ws, N: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr):
    """(values, scales) of expert e's [N, K] matrix in a stacked [E, N, K] tensor of
    `stream_rows` format FMT (1, 3: MXFP4, 32-value scale groups; 2: FP8, 128 x 128 scale
    blocks; else bf16, no scales)."""
    eo = e.to(tl.int64)
    if FMT == 1 or FMT == 3:
        return w + eo * (N * K // 2), ws + eo * (N * K // 32)
    elif FMT == 2:
        return w + eo * (N * K), ws + eo * (((N + 127) // 128) * ((K + 127) // 128))
    else:
        return w + eo * (N * K), ws


@triton.jit
def prefetch_rows(
    w,
    row0,
    NROWS: tl.constexpr,
    K: tl.constexpr,
    k0,
    KLEN: tl.constexpr,
    FMT: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr = True,
):
    """L2 prefetch of columns k0 .. k0 + KLEN of rows row0.. of a [*, K] weight of format
    FMT: exactly what an item streams (values only: scales are small). A program asks for
    an item's weights before it waits for the item's inputs. Nothing under the interpreter
    or without ASM (the bulk prefetch is NVIDIA PTX). In a Gluon kernel FMT 1 and 2 are
    the frag layouts (`gl_stream_rows`)."""
    if ASM:
        if FMT == 1:  # mxfp4-rot / -frag are tile-major: a 16-row block's K range is one run
            st.prefetch_l2(w + (row0 * K) // 2 + k0 * 8, 8 * K, 8 * KLEN, NROWS // 16, CPU)
        elif FMT == 2 and lg.gluon():  # fp8-frag, tile-major too
            st.prefetch_l2(w + row0 * K + k0 * 16, 16 * K, 16 * KLEN, NROWS // 16, CPU)
        elif FMT == 3:
            st.prefetch_l2(w + (row0 * K + k0) // 2, K // 2, KLEN // 2, NROWS, CPU)
        elif FMT == 2:
            st.prefetch_l2(w + row0 * K + k0, K, KLEN, NROWS, CPU)
        else:
            st.prefetch_l2(w + row0 * K + k0, 2 * K, 2 * KLEN, NROWS, CPU)


@triton.jit
def gl_stream_rows(
    w,
    ws,
    x,
    S: tl.constexpr,
    row0,
    k0,
    NSTEP: tl.constexpr,
    K: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    FMT: tl.constexpr,
    STAGES: tl.constexpr,
):
    """`stream_rows` for kernels compiled by Gluon (the engine of `stream.frag_gluon`, 4
    warps): ``mxfp4-frag`` (FMT 1; `stacked_expert` offsets as for mxfp4-rot), ``fp8-frag``
    (FMT 2, offsets as for fp8-b128) or bf16 (FMT 0) weight rows row0.. times the 16 token
    rows of x, fp32 [BN, 16] in the mma.sync layout."""
    if FMT == 1:
        return fg.frag_stream_rows(
            w.to(tl.pointer_type(tl.int32)),
            ws.to(tl.pointer_type(tl.int32)),
            x, S, row0, k0, NSTEP, K, BN, BK, STAGES, 4, 16,
        )  # fmt: skip
    elif FMT == 2:
        return fg.fp8_stream_rows(
            w.to(tl.pointer_type(tl.int32)), ws, x, S, row0, k0, NSTEP, K, BN, BK, STAGES, 4, 16
        )
    else:
        return fg.bf16_stream_rows(w, x, S, row0, k0, NSTEP, K, BN, BK, STAGES, 4, 16)


@triton.jit
def gl_stream_experts(
    w,
    ws,
    x,
    S: tl.constexpr,
    eids,
    wr,
    nj,
    row0,
    NSTEP: tl.constexpr,
    K: tl.constexpr,
    N: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    STAGES: tl.constexpr,
):
    """`frag_stream_experts` (a grouped GEMV over nj stacked ``mxfp4-frag`` experts, their
    ids at eids, their activations x + j S K, their per-token weights wr [nj, S], in one
    ring) for kernels compiled by Gluon: fp32 [BN, 16] in the mma.sync layout."""
    return fg.frag_stream_experts(
        w.to(tl.pointer_type(tl.int32)),
        ws.to(tl.pointer_type(tl.int32)),
        x, S, eids, wr, nj, row0, NSTEP, K, N, BN, BK, STAGES, 4, 16,
    )  # fmt: skip


@triton.jit
def rows_ask(w, row0, k0, NSTEP: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """`frag_gluon.bf16_rows_ask` (4 warps) in a Gluon kernel: every step of a small item's
    bf16 rows asked into shared memory before its wait; `asked_stream_rows` streams them."""
    return fg.bf16_rows_ask(w, row0, k0, NSTEP, K, BN, BK, 4)


@triton.jit
def asked_stream_rows(
    wpre,
    x,
    S: tl.constexpr,
    k0,
    NSTEP: tl.constexpr,
    K: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    STAGES: tl.constexpr,
):
    """`frag_gluon.bf16_stream_asked` in a Gluon kernel: `gl_stream_rows`' result of the
    rows `rows_ask` put in `wpre`, the activations through a STAGES-deep ring."""
    return fg.bf16_stream_asked(wpre, x, S, k0, NSTEP, K, BN, BK, STAGES, 4, 16)


@triton.jit
def any_stream_rows(
    w,
    ws,
    x,
    row0,
    k0,
    NSTEP: tl.constexpr,
    K: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    S: tl.constexpr,
    FMT: tl.constexpr,
    STAGES: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
):
    """`stream.device.stream_rows` (same arguments) in a Triton kernel, `gl_stream_rows` in
    a Gluon one: a kernel body compiled by both streams its weights through this."""
    if lg.gluon():
        return gl_stream_rows(w, ws, x, S, row0, k0, NSTEP, K, BN, BK, FMT, STAGES)
    else:
        return st.stream_rows(w, ws, x, row0, k0, NSTEP, K, BN, BK, S, FMT, STAGES, CPU, ASM)


@triton.jit
def any_stream_row_pair(
    w,
    ws,
    x,
    row_a,
    row_b,
    k0,
    NSTEP: tl.constexpr,
    K: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    S: tl.constexpr,
    FMT: tl.constexpr,
    STAGES: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
    ONE_TILE: tl.constexpr,
    RING: tl.constexpr = False,
):
    """`stream.device.stream_row_pair` (same arguments) in a Triton kernel; in a Gluon one
    the two row blocks in one ring with RING (`frag_gluon.frag_stream_row_pair` and its
    fp8 and bf16 twins), else one after the other (`gl_stream_rows`)."""
    if lg.gluon():
        if RING and FMT == 1:
            return fg.frag_stream_row_pair(
                w.to(tl.pointer_type(tl.int32)),
                ws.to(tl.pointer_type(tl.int32)),
                x, S, row_a, row_b, k0, NSTEP, K, BN, BK, STAGES, 4, 16,
            )  # fmt: skip
        elif RING and FMT == 2:
            return fg.fp8_stream_row_pair(
                w.to(tl.pointer_type(tl.int32)),
                ws, x, S, row_a, row_b, k0, NSTEP, K, BN, BK, STAGES, 4, 16,
            )  # fmt: skip
        elif RING:
            return fg.bf16_stream_row_pair(
                w, x, S, row_a, row_b, k0, NSTEP, K, BN, BK, STAGES, 4, 16
            )  # fmt: skip
        else:
            a = gl_stream_rows(w, ws, x, S, row_a, k0, NSTEP, K, BN, BK, FMT, STAGES)
            b = gl_stream_rows(w, ws, x, S, row_b, k0, NSTEP, K, BN, BK, FMT, STAGES)
            return a, b
    else:
        return st.stream_row_pair(
            w, ws, x, row_a, row_b, k0, NSTEP, K, BN, BK, S, FMT, STAGES, CPU, ASM, ONE_TILE
        )


@triton.jit
def stream_zeros(BN: tl.constexpr):
    """fp32 zeros [BN, 16] in the layout `any_stream_rows` returns: a sum of its results
    that a loop carries starts here."""
    if lg.gluon():
        return fg.mma_zeros(BN, 16, 4)
    else:
        return lg.zeros((BN, 16), tl.float32)


@triton.jit
def store_mid(mid, j, c, h, S: tl.constexpr, COLS: tl.constexpr, BN: tl.constexpr):
    """Activated rows [c BN, (c + 1) BN) of slot j, fp32 [BN, 16 tokens] -> mid[j] (bf16
    [S tokens, COLS], rounded): the down items' `stream_rows` input."""
    n = lg.arange(0, BN)
    t = lg.arange(0, 16)
    tl.store(
        mid + (j * S + t[None, :]) * COLS + (c * BN + n)[:, None],
        bf16_round(h).to(tl.bfloat16),
        mask=t[None, :] < S,
    )


# -- items and counters -------------------------------------------------------------------


@triton.jit
def wait_items(
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
    CPU: tl.constexpr,
):
    """Wait (bounded) until items first..first+N-1 (smaller tickets) are done; then their
    stores are visible to this program. False: the wait gave up. N2: N rounded up to a
    power of two (N may be a runtime count, at most N2)."""
    return pt.wait_done(
        done, first, N, N2, tag, ctl, health, peers, rank, world, region, first, CPU
    )


@triton.jit
def done_already(done, first, N, N2: tl.constexpr, tag):
    """1 if items first..first+N-1 already carry `tag` (one look, no wait, no acquire: a
    `wait_items` must still follow before their stores are read), else 0. An item that
    asks L2 for its weights before its wait skips asking when its inputs are in: the
    requests then only queue ahead of its own stream's (the drafter's gate_up and down
    items spent 4-5 us before their first load that way, stop 57)."""
    i = lg.anchor(lg.arange(0, N2))
    m = i < N
    pairs = tl.load(done + first + i, mask=m, other=0, volatile=True)
    return tl.min(tl.where(m & (pt.pair_tag(pairs) != tag), 0, 1), 0)


@triton.jit
def last_arrival(cnt, N: tl.constexpr):
    """Count this program in at `cnt` (int32, 0 at launch start) after all its prior
    stores; True in the N-th to arrive, which also resets the counter for the next launch
    and (acquire) sees every earlier arrival's stores."""
    tl.debug_barrier()
    last = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu") == N - 1
    if last:
        tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
    return last


@triton.jit
def ticket_reset_if_last(counter, t, n_items):
    """`pt.ticket_take`'s last-taker reset for a ticket drawn against an upper bound of the
    item count: a launch draws n_items + programs tickets in all, the last one resets."""
    if t == n_items + tl.num_programs(0) - 1:
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@triton.jit
def sum_parts(base, PARTS: tl.constexpr, STRIDE: tl.constexpr, live):
    """The fp32 blocks at base + q STRIDE (q < PARTS, other programs' stores; `base` a
    block of pointers of any shape), summed in q order: results do not depend on which
    program finished when. The loads are unrolled, so they fly together."""
    total = lg.zeros_like(base, tl.float32)
    for q in tl.static_range(PARTS):
        total += tl.load(base + q * STRIDE, mask=live, other=0.0, volatile=True)
    return total


@triton.jit
def split_k(acc, buf, cnt, kp, PARTS: tl.constexpr, BN: tl.constexpr, S: tl.constexpr):
    """Split K: store this item's K part kp of a [BN, NT] fp32 sum (its first S columns)
    in buf ([PARTS, BN, S]); (last, total): `last` in the item that finished the last part,
    which gets the parts summed in part order (`sum_parts`). One part: (True, acc)."""
    n = lg.arange(0, BN)
    t = lg.arange(0, acc.shape[1])
    live = t[None, :] < S
    base = lg.like(buf + n[:, None] * S + t[None, :], acc)
    total = acc
    last = kp == kp
    if PARTS > 1:
        tl.store(base + kp * (BN * S), acc, mask=live)
        last = last_arrival(cnt, PARTS)
        total = lg.zeros_like(acc, tl.float32)
        if last:
            total = sum_parts(base, PARTS, BN * S, live)
    return last, total


@triton.jit
def split_k_pair(g, u, buf, cnt, kp, PARTS: tl.constexpr, BN: tl.constexpr, S: tl.constexpr):
    """`split_k` of a gate and an up block (fp32 [BN, NT] each) as one [2 BN, NT] part:
    (last, gate total, up total). One part: (True, g, u)."""
    last = kp == kp
    NT: tl.constexpr = g.shape[1]
    if PARTS > 1:
        gu = tl.reshape(tl.permute(tl.join(g, u), (2, 0, 1)), (2 * BN, NT))  # gate, up rows
        last, gu = split_k(gu, buf, cnt, kp, PARTS, 2 * BN, S)
        g, u = tl.split(tl.permute(tl.reshape(gu, (2, BN, NT)), (1, 2, 0)))
    return last, g, u


@triton.jit
def ready_clock(TL: tl.constexpr, CPU: tl.constexpr):
    """What a stage helper that waits for its own inputs returns for the timeline: the
    clock once they are in (`stamp_item`'s ready) in a timeline build, 0 in others (no
    clock read: timeline-off builds compile as before)."""
    if TL:
        return pt.clock(0, CPU)
    else:
        return tl.cast(0, tl.int64)


@triton.jit
def ready_after(x, TL: tl.constexpr, CPU: tl.constexpr):
    """`ready_clock` once the 1-D or 2-D block `x` is in every thread's registers: its
    CTA-wide sum (a barrier no thread passes before its loads landed) comes before the
    clock read, so an item that loads its inputs after its waits is stamped when they
    arrived, not when they were asked for. Timeline builds only (the sum costs a
    barrier)."""
    if TL:
        if len(x.shape) == 2:
            s = tl.sum(tl.sum(x, 1), 0)
        else:
            s = tl.sum(x, 0)
        return pt.clock(0, CPU) + (s != s).to(tl.int64)
    else:
        return tl.cast(0, tl.int64)


@triton.jit
def stamp_item(stamps, t, t_begin, t_ready, t_mark, CPU: tl.constexpr):
    """Timeline builds: item t's (program + 2^32 SM, ticket, start, ready, end, mark) ->
    stamps[t] (`timeline.STAMP_WORDS` int64; device ns, poll counts under the interpreter).
    `t_ready`: when the item's done-pair waits returned (its start if it waited for
    none); `t_mark`: a point its stage marks inside its work (`timeline.NO_MARK`: none)."""
    stamp = stamps + t * _STAMP_WORDS
    tl.store(stamp, tl.program_id(0).to(tl.int64) + (pt.sm_id(CPU).to(tl.int64) << 32))
    tl.store(stamp + 1, t.to(tl.int64))
    tl.store(stamp + 2, t_begin)
    tl.store(stamp + 3, t_ready)
    tl.store(stamp + 4, pt.clock(0, CPU))
    tl.store(stamp + 5, t_mark)


# -- ranks --------------------------------------------------------------------------------


@triton.jit
def push_pairs(peers, world, off, row_pairs, q, payload, keep, tag, S: tl.constexpr):
    """Publish `payload` [NT tokens, Q] (NT 16, or fewer where S allows) at pair `off +
    token * row_pairs + q` of every rank's peer data (tokens < S, lanes where `keep`: a
    block that broadcasts against [NT, Q], or True)."""
    t = lg.arange(0, payload.shape[0])[:, None]
    mask = lg.like((t < S) & keep & (q[None, :] >= 0), payload)  # full shape: Gluon wants it
    for dst in range(world):
        pt.publish_value(
            lg.like(pt.peer_data(peers, dst) + off + t * row_pairs + q[None, :], payload),
            payload,
            tag,
            mask,
            "sys",
        )


@triton.jit
def reduce_row(
    me,
    off,
    s,
    p,
    p0,
    mask,
    ROWP: tl.constexpr,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    region,
    CPU: tl.constexpr,
):
    """Pairs p (p0: the first) of token row s of what every rank pushed to this rank's
    [ranks, 16 tokens, ROWP pairs] area at `off` (`push_pairs`), summed in rank order:
    (lo, hi, ok) as `pt.reduce_bf16x2`, bit-identical on every rank."""
    return pt.reduce_bf16x2(
        me + off + s * ROWP + p,
        16 * ROWP,
        mask,
        tag,
        ctl,
        health,
        peers,
        rank,
        world,
        region,
        s * ROWP + p0,
        CPU,
    )


@triton.jit
def handshake(
    me, peers, rank, world, off, W: tl.constexpr, tag, ctl, health, region, CPU: tl.constexpr
):
    """The TP fault handshake that closes a final launch: tell every rank this one is done
    (pair `off + rank`), hear from every rank (a rank that gave up has set its alarm, so
    the poll gives up rather than waits). W: the world rounded up to a power of two."""
    i = lg.anchor(lg.arange(0, W))
    for dst in range(world):
        pt.publish(pt.peer_data(peers, dst) + off + rank + i, i, tag, i == 0, "sys")
    pt.poll(me + off + i, i < world, tag, ctl, health, peers, rank, world, region, 0, CPU)
