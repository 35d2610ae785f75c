"""The tagged all-reduce (+ residual + RMSNorm) as one Triton ticket-loop kernel.

Items 0 .. rows*NB-1 ("sum items", row r, block b): push this rank's block to every peer,
sum the blocks of ranks 0..world-1 in order in fp32, add the residual, store. With the
norm, each sum item also publishes its block's sum of squares to scratch, and items
rows*NB .. 2*rows*NB-1 ("norm items") wait for their row's partials (smaller tickets),
re-read the same peer blocks (already there), and store the normalised row. Outputs of a
launch that gave up a wait are NaN.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import protocol_triton as T

_NAN2 = tl.constexpr(0x7FC07FC0)  # two bf16 NaNs in one int32 payload


@triton.jit
def _sum_block(
    x32,
    res32,
    rows,
    pairs,
    row,
    cols,
    m,
    tag,
    par,
    peer_off,
    ctl,
    health,
    peers,
    rank,
    world,
    region,
    pair0,
    RESIDUAL: tl.constexpr,
    CPU: tl.constexpr,
):
    lo, hi, ok = T.reduce_bf16x2(
        T.peer_data(peers, rank) + peer_off + (par * world * rows + row) * pairs + cols,
        rows * pairs,
        m,
        tag,
        ctl,
        health,
        peers,
        rank,
        world,
        region,
        pair0,
        CPU,
    )
    if RESIDUAL:
        r = tl.load(res32 + row * pairs + cols, mask=m, other=0)
        lo += T.bf16x2_lo(r)
        hi += T.bf16x2_hi(r)
    return tl.where(ok, T.bf16x2_pack(lo, hi), _NAN2), ok


@triton.jit(
    do_not_specialize=[
        "rows",
        "slot",
        "peer_off",
        "sumsq_off",
        "region",
        "sq_region",
        "rank",
        "world",
    ]
)
def allreduce_kernel(
    x32,
    res32,
    w32,
    out32,
    rout32,
    rows,
    pairs,
    eps,
    slot,
    peer_off,
    sumsq_off,
    region,
    sq_region,
    ctl,
    health,
    scratch,
    tickets,
    peers,
    rank,
    world,
    RESIDUAL: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK: tl.constexpr,
    NB: tl.constexpr,
    NB_P2: tl.constexpr,
    CPU: tl.constexpr,
):
    tag = T.step_tag(ctl, slot)
    par = slot & 1
    sum_items = rows * NB
    n_items = sum_items * 2 if NORM else sum_items
    sq = (scratch + sumsq_off).to(tl.pointer_type(tl.int64))
    lanes = tl.arange(0, BLOCK)
    T.fault_stall(ctl, peers, rank, world, CPU)
    t = T.ticket_take(tickets + slot, n_items)
    while t < n_items:
        item = t % sum_items
        row = item // NB
        blk = item % NB
        cols = blk * BLOCK + lanes
        m = cols < pairs
        pair0 = (par * world * rows + row) * pairs + blk * BLOCK
        if t < sum_items:
            x = tl.load(x32 + row * pairs + cols, mask=m, other=0)
            mine = ((par * world + rank) * rows + row) * pairs + cols
            for p in range(0, world):
                T.publish_value(T.peer_data(peers, p) + peer_off + mine, x, tag, m, "sys")
            z, ok = _sum_block(
                x32,
                res32,
                rows,
                pairs,
                row,
                cols,
                m,
                tag,
                par,
                peer_off,
                ctl,
                health,
                peers,
                rank,
                world,
                region,
                pair0,
                RESIDUAL,
                CPU,
            )
            if RESIDUAL:
                tl.store(rout32 + row * pairs + cols, z, mask=m)
            if NORM:
                zl = T.bf16x2_lo(z)
                zh = T.bf16x2_hi(z)
                ss = tl.sum(tl.where(m, zl * zl + zh * zh, 0.0), 0)
                T.publish_value(sq + item, ss.to(tl.int32, bitcast=True), tag, ok == ok, "gpu")
            else:
                tl.store(out32 + row * pairs + cols, z, mask=m)
        else:
            nb = tl.arange(0, NB_P2)
            parts, got = T.poll(
                sq + row * NB + nb,
                nb < NB,
                tag,
                ctl,
                health,
                peers,
                rank,
                world,
                sq_region,
                row * NB,
                CPU,
            )
            ss = tl.sum(tl.where(nb < NB, parts.to(tl.float32, bitcast=True), 0.0), 0)
            width = tl.cast(pairs * 2, tl.float32)
            rstd = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(ss, width) + eps))
            z, ok = _sum_block(
                x32,
                res32,
                rows,
                pairs,
                row,
                cols,
                m,
                tag,
                par,
                peer_off,
                ctl,
                health,
                peers,
                rank,
                world,
                region,
                pair0,
                RESIDUAL,
                CPU,
            )
            w = tl.load(w32 + cols, mask=m, other=0)
            o = T.bf16x2_pack(
                T.bf16x2_lo(z) * rstd * T.bf16x2_lo(w), T.bf16x2_hi(z) * rstd * T.bf16x2_hi(w)
            )
            tl.store(out32 + row * pairs + cols, tl.where(ok & got, o, _NAN2), mask=m)
        t = T.ticket_take(tickets + slot, n_items)
