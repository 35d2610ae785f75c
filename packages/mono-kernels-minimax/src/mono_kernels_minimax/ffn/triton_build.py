"""Triton build of the FFN monokernel (spec.py): one persistent launch per sparse layer.

A grid of P programs takes tickets from a scratch counter; the task of ticket t is fixed by
spec.TaskPlan (the up stage is sized by the route task's slot count, which every program
past the static tasks reads). Weights are streamed once: an up task reads IC gate + IC up
rows of one slot's w13, a down task DC rows of every slot's w2; all rows of the step share
them through one tl.dot of 16 (masked) rows. bf16 activations travel as int32 pairs
(element 2i in the low half), which is exactly a mailbox payload.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from mono_runtime import decode_triton as dt
from mono_runtime import lang as lg
from mono_runtime import protocol_triton as pt
from mono_runtime.protocol import region_id
from mono_runtime.stream import device as st
from triton.experimental import gluon

from ..formats import WeightFormat
from .spec import (
    Experts,
    FfnBuild,
    max_tickets,
    peer_layout,
    route_items,
    scratch_layout,
    table_offsets,
)

# -- the expert stages ----------------------------------------------------------------


@triton.jit
def _up_item(
    xn,
    w,
    ws,
    c,
    kp,
    NSTEP: tl.constexpr,
    BK: tl.constexpr,
    S: tl.constexpr,
    H: tl.constexpr,
    I: tl.constexpr,
    BN: tl.constexpr,
    FMT: tl.constexpr,
    STAGES: tl.constexpr,
    PAIR: tl.constexpr,
    CPU: tl.constexpr,
):
    """fp32 [BN, 16] gate and up of rows c*BN.. over K part kp (NSTEP steps of BK); with
    PAIR both in one pipelined loop (`stream_row_pair`; 2, 3: as one tile), else one loop
    after the other. Gluon: in one ring at PAIR 3, else one ring after the other."""
    k0 = kp * (NSTEP * BK)
    if PAIR:
        g, u = dt.any_stream_row_pair(
            w, ws, xn, c * BN, I + c * BN, k0, NSTEP, H, BN, BK, S, FMT, STAGES, CPU, True,
            PAIR >= 2, PAIR == 3,
        )  # fmt: skip
    else:
        g = dt.any_stream_rows(w, ws, xn, c * BN, k0, NSTEP, H, BN, BK, S, FMT, STAGES, CPU, True)
        u = dt.any_stream_rows(
            w, ws, xn, I + c * BN, k0, NSTEP, H, BN, BK, S, FMT, STAGES, CPU, True
        )  # fmt: skip
    return g, u


@triton.jit
def _swiglu(g, u, ALPHA: tl.constexpr, BETA: tl.constexpr, LIMIT: tl.constexpr):
    """vLLM's SwiGLU-OAI on un-interleaved gate|up, both halves clamped."""
    g = tl.minimum(g, LIMIT)
    u = tl.minimum(tl.maximum(u, -LIMIT), LIMIT)
    return g * tl.sigmoid(ALPHA * g) * (u + BETA)


@triton.jit
def _finish_up(
    g,
    u,
    j,
    c,
    kp,
    upart,
    ucount,
    scount,
    mid,
    done,
    slotdone,
    tag,
    PARTS: tl.constexpr,
    S: tl.constexpr,
    I: tl.constexpr,
    BN: tl.constexpr,
    NC: tl.constexpr,
    ALPHA: tl.constexpr,
    BETA: tl.constexpr,
    LIMIT: tl.constexpr,
):
    """Hand an up item's K part on (`split_k_pair`: with several parts the last to finish
    sums them in part order); the item that completes the row block applies SwiGLU-OAI and
    writes mid."""
    last, g, u = dt.split_k_pair(g, u, upart, ucount, kp, PARTS, BN, S)
    if last:
        _up_block_done(
            g, u, j, c, scount, mid, done, slotdone, tag, S, I, BN, NC, ALPHA, BETA, LIMIT
        )


@triton.jit
def _up_block_done(
    g,
    u,
    j,
    c,
    scount,
    mid,
    done,
    slotdone,
    tag,
    S: tl.constexpr,
    I: tl.constexpr,
    BN: tl.constexpr,
    NC: tl.constexpr,
    ALPHA: tl.constexpr,
    BETA: tl.constexpr,
    LIMIT: tl.constexpr,
):
    """SwiGLU-OAI of a whole row block -> mid; the slot's last block marks it done
    (`slotdone + j`), which is all a down item waits for."""
    dt.store_mid(mid, j, c, _swiglu(g, u, ALPHA, BETA, LIMIT), S, I, BN)
    if dt.last_arrival(scount + j, NC):
        pt.ticket_finish(done, slotdone + j, tag)


# -- the kernel ---------------------------------------------------------------------------


def _ffn_body(
    part,
    residual,
    out,
    residual_out,
    slots,
    norm,
    router,
    bias,
    w13,
    w13_scale,
    w2,
    w2_scale,
    sw13,
    sw13_scale,
    sw2,
    sw2_scale,
    scratch,
    slot,
    final,
    ctl,
    health,
    tickets,
    peers,
    rank,
    world,
    S: tl.constexpr,
    H: tl.constexpr,
    E: tl.constexpr,
    K: tl.constexpr,
    I: tl.constexpr,
    FMT: tl.constexpr,
    SFMT: tl.constexpr,
    SUBSET: tl.constexpr,
    MAXSLOTS: tl.constexpr,
    NPUSH: tl.constexpr,
    PUSHC: tl.constexpr,
    SC: tl.constexpr,
    NCH: tl.constexpr,
    NCH2: tl.constexpr,
    NSN2: tl.constexpr,
    O_SSQ: tl.constexpr,
    RG: tl.constexpr,
    RP: tl.constexpr,
    RK: tl.constexpr,
    BN: tl.constexpr,
    NC: tl.constexpr,
    UBK: tl.constexpr,
    UKS: tl.constexpr,
    UBK0: tl.constexpr,
    UKS0: tl.constexpr,
    DC: tl.constexpr,
    ND: tl.constexpr,
    DBK: tl.constexpr,
    DBK0: tl.constexpr,
    NG: tl.constexpr,
    GJ2: tl.constexpr,
    DRING: tl.constexpr,
    STAGES: tl.constexpr,
    USTAGES: tl.constexpr,
    DSTAGES: tl.constexpr,
    PAIR: tl.constexpr,
    RROWS: tl.constexpr,
    UPF: tl.constexpr,
    SPF: tl.constexpr,
    DPF: tl.constexpr,
    SFIRST: tl.constexpr,
    RR: tl.constexpr,
    NRQ: tl.constexpr,
    NRG2: tl.constexpr,
    NF: tl.constexpr,
    NF2: tl.constexpr,
    FC: tl.constexpr,
    W2P: tl.constexpr,
    O_DONE: tl.constexpr,
    O_COUNT: tl.constexpr,
    MAXTICKETS: tl.constexpr,
    O_XS: tl.constexpr,
    O_XN: tl.constexpr,
    O_LOGIT: tl.constexpr,
    O_TABLE: tl.constexpr,
    O_MID: tl.constexpr,
    O_UPART: tl.constexpr,
    O_DPART: tl.constexpr,
    T_WTAB: tl.constexpr,
    T_IDS: tl.constexpr,
    T_TOPW: tl.constexpr,
    P_AR1: tl.constexpr,
    P_AR2: tl.constexpr,
    P_HS: tl.constexpr,
    R_AR1: tl.constexpr,
    R_AR2: tl.constexpr,
    R_ITEMS: tl.constexpr,
    R_HS: tl.constexpr,
    ALPHA: tl.constexpr,
    BETA: tl.constexpr,
    LIMIT: tl.constexpr,
    EPS: tl.constexpr,
    RSF: tl.constexpr,
    CPU: tl.constexpr,
    TL: tl.constexpr,
    O_TL: tl.constexpr,
    RT: tl.constexpr,
    GL: tl.constexpr,
):
    """The kernel (spec.py's plan), one body for two languages: Triton (`ffn_kernel`, also
    the interpreter's) and Gluon (`ffn_gluon`, GL: the expert stages on the mma.sync
    engine of mono_runtime.stream.frag_gluon, MXFP4 experts in ``mxfp4-frag``)."""
    tag = pt.step_tag(ctl, slot)
    counter = tickets + slot
    done = (scratch + O_DONE).to(tl.pointer_type(tl.int64))
    SLOTDONE: tl.constexpr = MAXTICKETS  # done item SLOTDONE + j: every up item of slot j
    ucount = (scratch + O_COUNT).to(tl.pointer_type(tl.int32))
    scount = ucount + MAXSLOTS * NC
    dcount = scount + MAXSLOTS
    rcount = dcount + ND  # router (or route) items finished: the last builds the table
    upart = (scratch + O_UPART).to(tl.pointer_type(tl.float32))
    dpart = (scratch + O_DPART).to(tl.pointer_type(tl.float32))
    xs = (scratch + O_XS).to(tl.pointer_type(tl.float32))
    ssq = (scratch + O_SSQ).to(tl.pointer_type(tl.float32))
    xn = (scratch + O_XN).to(tl.pointer_type(tl.bfloat16))
    xn32 = (scratch + O_XN).to(tl.pointer_type(tl.int32))
    logit = (scratch + O_LOGIT).to(tl.pointer_type(tl.float32))
    nslots_p = (scratch + O_TABLE).to(tl.pointer_type(tl.int32))
    slot_e = (scratch + O_TABLE + 4).to(tl.pointer_type(tl.int32))
    wtab = (scratch + O_TABLE + T_WTAB).to(tl.pointer_type(tl.float32))
    mid = (scratch + O_MID).to(tl.pointer_type(tl.bfloat16))
    me = pt.peer_data(peers, rank)
    HAS_SHARED: tl.constexpr = SUBSET != 1  # slot 0 is the shared expert
    NORM0: tl.constexpr = NPUSH + S * NCH  # seam items, then norm items, S x NCH each
    ROUTER0: tl.constexpr = NORM0 + S * NCH
    ROUTE0: tl.constexpr = ROUTER0 + RG * RP  # route items (NRQ of them: tile rr)
    SHUP: tl.constexpr = ROUTE0 + NRQ  # the route's items end here (shared up, if first)
    NSH: tl.constexpr = HAS_SHARED * NC * UKS0  # the shared expert's up items
    NSHD: tl.constexpr = NSH + HAS_SHARED * ND  # ... then its down items (sdown)
    # routed up items start here (after the shared expert's items, or before them)
    STATIC: tl.constexpr = SHUP + SFIRST * NSHD
    NSH_LATE: tl.constexpr = (1 - SFIRST) * NSHD  # shared items after the routed up ones
    ROUTED: tl.constexpr = MAXTICKETS + MAXSLOTS  # done item of the route (no ticket of its own)
    tail = NSH_LATE + ND * NG + S * NF + final  # the handshake task closes final launches

    pt.fault_stall(ctl, peers, rank, world, CPU)
    NROUTED: tl.constexpr = NC * UKS  # up items of one routed slot
    total = STATIC + (MAXSLOTS - HAS_SHARED) * NROUTED + tail  # a bound until nslots is known
    t = pt.ticket_take(counter, total)
    total = t * 0 + total
    nslots = t * 0 + MAXSLOTS
    routed = t * 0
    while t < total:
        if TL:
            t_begin = pt.clock(0, CPU)
            t_ready = t_begin
        if (t >= STATIC) & (routed == 0):
            nslots = _slot_count(
                done, nslots_p, ROUTED, MAXSLOTS, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
            )
            if TL:  # the route (a program's first routed item waits for it)
                t_ready = pt.clock(0, CPU)
            total = STATIC + (nslots - HAS_SHARED) * NROUTED + tail
            routed = t * 0 + 1
            dt.ticket_reset_if_last(counter, t, total)
        # a shared expert's item: ush, its index (spec.stages: its up items, then its down
        # items, before or after the routed up items, which the slot count places)
        if SFIRST:
            ush = t - SHUP
        else:
            ush = t - STATIC - (nslots - HAS_SHARED) * NROUTED
        if t >= total:
            pass  # drawn before this program knew the slot count: no task, no more draws
        elif t < NPUSH:
            # push: pairs of columns [t*PUSHC, (t+1)*PUSHC) of every row to every rank, all
            # rows in one block (a loop over rows would wait out one load latency per row)
            p = t * (PUSHC // 2) + lg.arange(0, PUSHC // 2)
            rows = lg.arange(0, 16)[:, None]
            payload = lg.anchor(
                tl.load(part + rows * (H // 2) + p[None, :], mask=rows < S, other=0)
            )
            off = P_AR1 // 8 + rank * 16 * (H // 2)
            dt.push_pairs(peers, world, off, H // 2, p, payload, True, tag, S)
        elif t < NORM0:
            # seam item (row s, columns [ch*SC, (ch+1)*SC)): rank-ordered sum + residual
            s = (t - NPUSH) // NCH
            ch = (t - NPUSH) % NCH
            p = lg.anchor(ch * (SC // 2) + lg.arange(0, SC // 2))
            # the residual asked for before the poll (only this item writes its chunk): a
            # load after the poll's barriers would be issued only once it returned
            r = tl.load(residual + s * (H // 2) + p)
            lo, hi, ok = dt.reduce_row(
                me, P_AR1 // 8, s, p, ch * (SC // 2), p >= 0, H // 2,
                tag, ctl, health, peers, rank, world, R_AR1, CPU,
            )  # fmt: skip
            xl = tl.where(ok, dt.bf16_round(lo) + pt.bf16x2_lo(r), float("nan"))
            xh = tl.where(ok, dt.bf16_round(hi) + pt.bf16x2_hi(r), float("nan"))
            tl.store(residual_out + s * (H // 2) + p, pt.bf16x2_pack(xl, xh))
            tl.store(xs + s * H + 2 * p, xl)
            tl.store(xs + s * H + 2 * p + 1, xh)
            tl.store(ssq + s * NCH + ch, tl.sum(xl * xl, 0) + tl.sum(xh * xh, 0))
            pt.ticket_finish(done, t, tag)
        elif t < ROUTER0:
            # norm item (row s, same columns): Gemma RMSNorm over the row's chunks' sums
            s = (t - NORM0) // NCH
            ch = (t - NORM0) % NCH
            dt.wait_items(
                done, NPUSH + s * NCH, NCH, NCH2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
            )
            if TL:
                t_ready = pt.clock(0, CPU)
            rstd = _rstd(ssq, s, s < S, NCH, H, EPS)
            p = lg.anchor(ch * (SC // 2) + lg.arange(0, SC // 2))
            xl = tl.load(xs + s * H + 2 * p, volatile=True)
            xh = tl.load(xs + s * H + 2 * p + 1, volatile=True)
            wn = tl.load(norm + p)
            tl.store(
                xn32 + s * (H // 2) + p,
                pt.bf16x2_pack(
                    _gemma(xl, rstd, pt.bf16x2_lo(wn)), _gemma(xh, rstd, pt.bf16x2_hi(wn))
                ),
            )
            pt.ticket_finish(done, t, tag)
        elif t < ROUTE0:
            # router: 16 experts x one K part, fp32
            u = t - ROUTER0
            g = u // RP
            part_k = u % RP
            # its 16 rows x RK columns of fp32 weights are asked for while the seam lands
            st.prefetch_l2(router + g * 16 * H + part_k * RK, 4 * H, 4 * RK, 16, CPU)
            dt.wait_items(
                done, NPUSH, S * NCH, NSN2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
            )
            if TL:
                t_ready = pt.clock(0, CPU)
            acc = _router_part(
                xs, ssq, norm.to(tl.pointer_type(tl.bfloat16)), router, g, part_k,
                S, H, NCH, RK, EPS, RROWS,
            )  # fmt: skip
            rows = lg.arange(0, 16)
            ex = g * 16 + lg.arange(0, 16)
            tl.store(
                logit + (part_k * S + rows[:, None]) * E + ex[None, :], acc, mask=rows[:, None] < S
            )
            if NRQ > 0:
                pt.ticket_finish(done, t, tag)  # the route items wait for every router item
            # else the last router item to finish routes: no hand-off to a route task to
            # notice; its done pair also vouches for the norm items (the routed up items
            # read xn and wait for nothing else), so it waits for them before marking it
            elif dt.last_arrival(rcount, RG * RP):
                _route(
                    logit, bias, slots, nslots_p, slot_e, wtab, scratch,
                    S, E, K, RP, T_IDS, T_TOPW, O_TABLE, SUBSET, RSF, RT,
                )  # fmt: skip
                dt.wait_items(
                    done, NORM0, S * NCH, NSN2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
                )
                pt.ticket_finish(done, ROUTED, tag)
        elif t < SHUP:
            if NRQ > 0:  # (no code for the stage where it has no items)
                # route item: the top-k of rows [q RR, (q + 1) RR), once every router item is
                # done; the last to finish builds the slot table from every row's picks
                dt.wait_items(
                    done, ROUTER0, RG * RP, NRG2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
                )
                if TL:
                    t_ready = pt.clock(0, CPU)
                _route_rows(
                    logit, bias, slots, scratch, (t - ROUTE0) * RR,
                    S, E, K, RP, T_IDS, T_TOPW, O_TABLE, RSF, RR,
                )  # fmt: skip
                if dt.last_arrival(rcount, NRQ):
                    _route_gathered(
                        slots, nslots_p, slot_e, wtab, scratch,
                        S, E, K, T_IDS, T_TOPW, O_TABLE, SUBSET, RT,
                    )  # fmt: skip
                    dt.wait_items(
                        done, NORM0, S * NCH, NSN2, tag, ctl, health, peers, rank, world,
                        R_ITEMS, CPU,
                    )  # fmt: skip
                    pt.ticket_finish(done, ROUTED, tag)
        elif (ush >= 0) & (ush < NSH):
            # the shared expert's up items: no routing needed (first: they stream while the
            # router items route, their weights asked for before xn exists)
            u = ush
            c = u // UKS0
            kp = u % UKS0
            if SPF:
                dt.prefetch_rows(sw13, c * BN, BN, H, kp * (H // UKS0), H // UKS0, SFMT, CPU)
                dt.prefetch_rows(sw13, I + c * BN, BN, H, kp * (H // UKS0), H // UKS0, SFMT, CPU)
            dt.wait_items(
                done, NORM0, S * NCH, NSN2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
            )
            if TL:
                t_ready = pt.clock(0, CPU)
            g, v = _up_item(
                xn, sw13, sw13_scale, c, kp, H // UBK0 // UKS0, UBK0, S, H, I, BN, SFMT, STAGES,
                PAIR, CPU,
            )  # fmt: skip
            _finish_up(
                g,
                v,
                0,
                c,
                kp,
                upart + c * (UKS0 * 2 * BN * S),
                ucount + c,
                scount,
                mid,
                done,
                SLOTDONE,
                tag,
                UKS0,
                S,
                I,
                BN,
                NC,
                ALPHA,
                BETA,
                LIMIT,
            )
        elif (ush >= NSH) & (ush < NSHD):
            # sdown: the shared expert's down rows [d*DC, (d+1)*DC), once its up items are
            # done (no routing needed: the routed down items add their groups to it); with
            # SPF (the shared expert's early prefetch) its rows are asked of L2 first
            d = ush - NSH
            if SPF:
                dt.prefetch_rows(sw2, d * DC, DC, I, 0, I, SFMT, CPU)
            ok = dt.wait_items(
                done, SLOTDONE, 1, 1, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
            )
            if TL:
                t_ready = pt.clock(0, CPU)
            y = dt.any_stream_rows(
                sw2, sw2_scale, mid, d * DC, 0, I // DBK0, I, DC, DBK0, S, SFMT, STAGES, CPU, True
            )
            # live rows only (a padding row uses no expert): part 0 of the column block
            r = lg.arange(0, 16)
            live = (r < S) & (tl.load(slots + r, mask=r < S, other=-1) >= 0)
            _down_part(
                tl.where(live[None, :], y, 0.0), ok, d, 0, dpart, dcount, peers, rank, world,
                tag, S, H, DC, NG + 1, P_AR2,
            )  # fmt: skip
        else:
            u = t - STATIC
            nup = (nslots - HAS_SHARED) * NROUTED
            u = tl.where(u >= nup, u - NSH_LATE, u)  # past the shared up items, if late
            if u < nup:
                # up: routed slot j, rows [c*BN, (c+1)*BN) of gate and up, K part kp
                j = HAS_SHARED + u // NROUTED
                c = (u // UKS) % NC
                kp = u % UKS
                e = tl.load(slot_e + j, volatile=True)
                w, ws = dt.stacked_expert(e, w13, w13_scale, 2 * I, H, FMT)
                if UPF:
                    dt.prefetch_rows(w, c * BN, BN, H, kp * (H // UKS), H // UKS, FMT, CPU)
                    dt.prefetch_rows(w, I + c * BN, BN, H, kp * (H // UKS), H // UKS, FMT, CPU)
                g, v = _up_item(
                    xn, w, ws, c, kp, H // UBK // UKS, UBK, S, H, I, BN, FMT, USTAGES, PAIR, CPU
                )
                rp = (
                    upart
                    + NC * UKS0 * 2 * BN * S
                    + ((j - HAS_SHARED) * NC + c) * (UKS * 2 * BN * S)
                )
                _finish_up(
                    g,
                    v,
                    j,
                    c,
                    kp,
                    rp,
                    ucount + j * NC + c,
                    scount,
                    mid,
                    done,
                    SLOTDONE,
                    tag,
                    UKS,
                    S,
                    I,
                    BN,
                    NC,
                    ALPHA,
                    BETA,
                    LIMIT,
                )
            elif u < nup + ND * NG:
                # down: output rows [d*DC, (d+1)*DC) over slot group q, weighted by wtab
                d = (u - nup) // NG
                q = (u - nup) % NG
                _down_item(
                    d, q, nslots, slot_e, wtab, mid, w2, w2_scale, dpart, dcount, done,
                    SLOTDONE, tag, ctl, health, peers, rank, world, S, H, I, DC, DBK, NG,
                    GJ2, DRING, HAS_SHARED, FMT, DSTAGES, DPF, P_AR2, R_ITEMS, CPU,
                )  # fmt: skip
            elif u < nup + ND * NG + S * NF:
                # final (row s, FC columns): the ranks' partials in rank order -> out; one
                # row an item, so no item waits out S polls in a row
                s = (u - nup - ND * NG) // NF
                f = (u - nup - ND * NG) % NF
                p = lg.anchor(f * (FC // 2) + lg.arange(0, FC // 2))
                lo, hi, ok = dt.reduce_row(
                    me, P_AR2 // 8, s, p, f * (FC // 2), p >= 0, H // 2,
                    tag, ctl, health, peers, rank, world, R_AR2, CPU,
                )  # fmt: skip
                tl.store(
                    out + s * (H // 2) + p,
                    pt.bf16x2_pack(tl.where(ok, lo, float("nan")), tl.where(ok, hi, float("nan"))),
                )
                pt.ticket_finish(done, t, tag)
            else:
                # the TP fault handshake: every final task here is done; tell every rank,
                # hear from every rank (a rank that gave up has set its alarm here)
                dt.wait_items(
                    done,
                    t - S * NF,
                    S * NF,
                    NF2,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    R_ITEMS,
                    CPU,
                )
                if TL:
                    t_ready = pt.clock(0, CPU)
                dt.handshake(me, peers, rank, world, P_HS // 8, W2P, tag, ctl, health, R_HS, CPU)
        if TL:
            if t < total:  # the item's (program, ticket, start, ready, end, mark) in ns
                stamps = (scratch + O_TL).to(tl.pointer_type(tl.int64))
                dt.stamp_item(stamps, t, t_begin, t_ready, dt.NO_MARK, CPU)
        if t < total:
            t = pt.ticket_take(counter, total)
    if (routed == 0) & (t >= STATIC):
        # this program's only draw was past the upper bound: it may still be the last taker
        nslots = _slot_count(
            done, nslots_p, ROUTED, MAXSLOTS, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
        )
        dt.ticket_reset_if_last(counter, t, STATIC + (nslots - HAS_SHARED) * NROUTED + tail)


# Integer arguments that vary per launch or per rank: never specialized (a value of 1 or a
# multiple of 16 would otherwise compile another binary: e.g. one per rank).
_RUNTIME_INTS = ["slot", "final", "rank", "world"]
ffn_kernel = triton.jit(do_not_specialize=_RUNTIME_INTS)(_ffn_body)
ffn_gluon = gluon.jit(do_not_specialize=_RUNTIME_INTS)(_ffn_body)


@triton.jit
def _rstd(ssq, s, mask, NCH: tl.constexpr, H: tl.constexpr, EPS: tl.constexpr):
    """1 / RMS of rows `s` (a scalar or a block) from the seam chunks' sums of squares,
    added in column order: the norm items and the router's own normalisation agree bit
    for bit."""
    total_sq = tl.load(ssq + s * NCH, mask=mask, other=0.0, volatile=True)
    for q in tl.static_range(1, NCH):  # unrolled
        total_sq += tl.load(ssq + s * NCH + q, mask=mask, other=0.0, volatile=True)
    return 1.0 / tl.sqrt_rn(total_sq / H + EPS)


@triton.jit
def _gemma(x, rstd, w):
    """Gemma RMSNorm of fp32 x with its row's 1 / RMS and the bf16 weight w (as fp32)."""
    return x * rstd * (w + 1.0)


@triton.jit
def _router_part(
    xs,
    ssq,
    norm,
    router,
    g,
    part_k,
    S: tl.constexpr,
    H: tl.constexpr,
    NCH: tl.constexpr,
    RK: tl.constexpr,
    EPS: tl.constexpr,
    RROWS: tl.constexpr,
):
    """fp32 logits [16 rows, 16 experts] of experts g*16.. over columns part_k*RK.. of the
    normed input, normalised here from the seam's `xs` and sums of squares (rounded to
    bf16 as the norm items round `xn`): the router waits for the seam, not the norm.
    At S <= RROWS one row at a time (its FMAs along K run side by side), else on the
    tensor cores: the bf16 rows times the fp32 weights split into three bf16 parts, each
    product exact and summed in fp32 (an fp32 FMA dot's K steps form one serial chain:
    ~20 us an item at S = 16)."""
    acc = lg.anchor(lg.zeros((16, 16), tl.float32))
    mid_acc = lg.zeros_like(acc, tl.float32)
    lo_acc = lg.zeros_like(acc, tl.float32)
    rows = lg.along(lg.arange(0, 16), acc, 1)
    ex = g * 16 + lg.arange(0, 16)
    live = rows < S
    rstd = _rstd(ssq, rows, live, NCH, H, EPS)
    for c in tl.static_range(RK // 128):  # unrolled: every chunk's loads fly together
        k = part_k * RK + c * 128 + lg.arange(0, 128)
        wr = lg.anchor(tl.load(router + ex[:, None] * H + k[None, :]))
        wn = tl.load(norm + k).to(tl.float32)
        if S <= RROWS:
            for s in tl.static_range(S):
                r = tl.sum(tl.where(rows == s, rstd, 0.0), 0)
                x = dt.bf16_round(_gemma(tl.load(xs + s * H + k, volatile=True), r, wn))
                dot = lg.along(tl.sum(wr * x[None, :], 1), acc, 0)
                acc += tl.where(rows[:, None] == s, dot[None, :], 0.0)
        else:
            x = tl.load(
                xs + rows[:, None] * H + k[None, :], mask=live[:, None], other=0.0, volatile=True
            )
            x = dt.bf16_round(_gemma(x, rstd[:, None], wn[None, :])).to(tl.bfloat16)
            hi = wr.to(tl.bfloat16)  # wr = hi + mid + lo exactly (8 + 8 + 8 significant bits)
            rest = wr - hi.to(tl.float32)
            mid = rest.to(tl.bfloat16)
            lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
            acc = lg.dot_bf16(x, tl.trans(hi), acc)
            mid_acc = lg.dot_bf16(x, tl.trans(mid), mid_acc)
            lo_acc = lg.dot_bf16(x, tl.trans(lo), lo_acc)
    return acc + (mid_acc + lo_acc)


@triton.jit
def _down_item(
    d,
    q,
    nslots,
    slot_e,
    wtab,
    mid,
    w2,
    w2_scale,
    dpart,
    dcount,
    done,
    slotdone,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    S: tl.constexpr,
    H: tl.constexpr,
    I: tl.constexpr,
    DC: tl.constexpr,
    DBK: tl.constexpr,
    NG: tl.constexpr,
    GJ2: tl.constexpr,
    DRING: tl.constexpr,
    SH: tl.constexpr,
    FMT: tl.constexpr,
    STAGES: tl.constexpr,
    DPF: tl.constexpr,
    P_AR2: tl.constexpr,
    R_ITEMS: tl.constexpr,
    CPU: tl.constexpr,
):
    """Down rows [d*DC, (d+1)*DC) of the routed slots of group q, weighted per row by wtab:
    part SH + q of the column block (SH: the shared expert's sdown part comes first). DPF
    1: each slot's weights are asked of L2, then the slot waited for, before its stream; 2:
    the group at once (every slot's weights asked for, then one wait for all of them), so
    a slot's short stream starts with no round trip of its own. A slot's expert id and row
    weights are loaded a slot ahead."""
    t = lg.arange(0, 16)
    per = (nslots - SH + NG - 1) // NG
    j0 = SH + q * per
    j1 = tl.minimum(j0 + per, nslots)
    acc = dt.stream_zeros(DC)
    ok = nslots >= 0
    if DPF == 2:
        for j in range(j0, j1):
            w, ws = dt.stacked_expert(tl.load(slot_e + j, volatile=True), w2, w2_scale, H, I, FMT)
            dt.prefetch_rows(w, d * DC, DC, I, 0, I, FMT, CPU)
    if DPF == 2 or DRING:
        ok = ok & dt.wait_items(
            done, slotdone + j0, j1 - j0, GJ2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
        )
    if DRING:  # (the Gluon build's MXFP4 only)
        if j1 > j0:
            acc = dt.gl_stream_experts(
                w2, w2_scale, mid + j0 * S * I, S, slot_e + j0, wtab + j0 * S, j1 - j0, d * DC,
                I // DBK, I, H, DC, DBK, STAGES,
            )  # fmt: skip
    else:
        e_next = tl.load(slot_e + tl.maximum(tl.minimum(j0, j1 - 1), 0), volatile=True)
        for j in range(j0, j1):
            e = e_next
            e_next = tl.load(slot_e + tl.minimum(j + 1, j1 - 1), volatile=True)
            wrow = tl.load(wtab + j * S + t, mask=t < S, other=0.0, volatile=True)
            w, ws = dt.stacked_expert(e, w2, w2_scale, H, I, FMT)
            if DPF != 2:
                if DPF:
                    dt.prefetch_rows(w, d * DC, DC, I, 0, I, FMT, CPU)
                ok = ok & dt.wait_items(
                    done, slotdone + j, 1, 1, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
                )
            y = dt.any_stream_rows(
                w, ws, mid + j * S * I, d * DC, 0, I // DBK, I, DC, DBK, S, FMT, STAGES, CPU, True
            )
            acc += tl.where(wrow[None, :] != 0.0, wrow[None, :] * y, 0.0)
    _down_part(acc, ok, d, SH + q, dpart, dcount, peers, rank, world, tag, S, H, DC, NG + SH, P_AR2)


@triton.jit
def _down_part(
    acc,
    ok,
    d,
    q,
    dpart,
    dcount,
    peers,
    rank,
    world,
    tag,
    S: tl.constexpr,
    H: tl.constexpr,
    DC: tl.constexpr,
    PARTS: tl.constexpr,
    P_AR2: tl.constexpr,
):
    """Store part q of down column block d (NaN where a wait gave up); the last of its
    PARTS to arrive sums them in part order and sends the bf16 result to every rank's
    ar2."""
    n = lg.arange(0, DC)
    t = lg.arange(0, 16)
    live = t[None, :] < S
    acc = tl.where(ok, acc, float("nan"))
    base = lg.like(dpart + d * (PARTS * DC * S) + n[:, None] * S + t[None, :], acc)
    tl.store(base + q * (DC * S), acc, mask=live)
    if dt.last_arrival(dcount + d, PARTS):
        tot = dt.sum_parts(base, PARTS, DC * S, live)  # in part order
        p = d * (DC // 2) + lg.arange(0, DC // 2)
        off = P_AR2 // 8 + rank * 16 * (H // 2)
        dt.push_pairs(peers, world, off, H // 2, p, dt.tile_pairs(tot, DC), True, tag, S)


@triton.jit
def _slot_count(
    done,
    nslots_p,
    ROUTE: tl.constexpr,
    MAXSLOTS: tl.constexpr,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    region,
    CPU: tl.constexpr,
):
    """The route's slot count (waits for the route's done item, set by the last router
    item, a smaller ticket)."""
    dt.wait_items(done, ROUTE, 1, 1, tag, ctl, health, peers, rank, world, region, CPU)
    return tl.minimum(tl.maximum(tl.load(nslots_p, volatile=True), 0), MAXSLOTS).to(tl.int64)


@triton.jit
def _topk_table(scratch, O_TABLE: tl.constexpr, T_IDS: tl.constexpr, T_TOPW: tl.constexpr):
    """The table's topk_ids (int32 [S, K]) and topk_w (fp32 [S, K]) in the scratch."""
    ids_p = (scratch + O_TABLE + T_IDS).to(tl.pointer_type(tl.int32))
    topw_p = (scratch + O_TABLE + T_TOPW).to(tl.pointer_type(tl.float32))
    return ids_p, topw_p


@triton.jit
def _route_rows(
    logit,
    bias,
    slots,
    scratch,
    r0,
    S: tl.constexpr,
    E: tl.constexpr,
    K: tl.constexpr,
    RP: tl.constexpr,
    T_IDS: tl.constexpr,
    T_TOPW: tl.constexpr,
    O_TABLE: tl.constexpr,
    RSF: tl.constexpr,
    RT: tl.constexpr,
):
    """Top-k of sigmoid + bias (ties -> lower id, NaN last) of rows r0 .. r0 + RT - 1 (those
    < S), their renormalized weights x RSF -> the table's topk_ids / topk_w (-1 / 0 for
    padding rows). Returns (taken [RT, E]: k + 1 at a row's k-th pick, else 0; the weights
    [RT, E], 0 off the picks and in padding rows; live [RT]; rows [RT]). Follows vLLM's
    `fused_topk_bias` (sigmoid branch) for the scores and weights."""
    rows = r0 + lg.arange(0, RT)
    ex = lg.arange(0, E)
    rmask = rows < S
    lsum = lg.anchor(lg.zeros((RT, E), tl.float32))
    for p in tl.static_range(RP):  # unrolled: the parts' loads fly together, summed in order
        lsum += tl.load(  # other programs' stores: past L1
            logit + (p * S + rows[:, None]) * E + ex[None, :],
            mask=rmask[:, None],
            other=0.0,
            volatile=True,
        )
    score = tl.sigmoid(lsum)
    key = score + tl.load(bias + ex)[None, :]
    key = tl.where(key != key, float("-inf"), key)
    live = rmask & (tl.load(slots + rows, mask=rmask, other=-1) >= 0)
    ids_p, topw_p = _topk_table(scratch, O_TABLE, T_IDS, T_TOPW)
    taken = lg.zeros((RT, E), tl.int32)
    wsum = lg.zeros((RT,), tl.float32)
    # pick k's id and score kept in lane k of an [RT, E] tile as picked (K <= E): no
    # reductions after the loop (two a pick, on the route's one program, before)
    kid = lg.zeros((RT, E), tl.int32)
    ksc = lg.zeros((RT, E), tl.float32)
    for k in tl.static_range(K):
        avail = taken == 0
        m = tl.max(tl.where(avail, key, float("-inf")), 1)
        pick = tl.min(tl.where(avail & (key == m[:, None]), ex[None, :], E), 1)
        hit = ex[None, :] == pick[:, None]
        taken = tl.where(hit, k + 1, taken)
        sc = tl.sum(tl.where(hit, score, 0.0), 1)
        wsum += sc
        kid = tl.where(ex[None, :] == k, pick[:, None], kid)
        ksc = tl.where(ex[None, :] == k, sc[:, None], ksc)
    wfull = tl.where(taken > 0, score, 0.0) / wsum[:, None] * RSF
    wfull = tl.where(live[:, None], wfull, 0.0)
    kw = ksc / wsum[:, None] * RSF  # (wfull's value at each pick)
    kl = live[:, None]
    at = rows[:, None] * K + ex[None, :]
    km = rmask[:, None] & (ex[None, :] < K)
    tl.store(ids_p + at, tl.where(kl, kid, -1), mask=km)
    tl.store(topw_p + at, tl.where(kl, kw, 0.0), mask=km)
    return taken, wfull, live, rows


@triton.jit
def _route_table(
    taken,
    wfull,
    live,
    rows,
    nslots_p,
    slot_e,
    wtab,
    S: tl.constexpr,
    E: tl.constexpr,
    SUBSET: tl.constexpr,
):
    """The slot table of every row's picks (`_route_rows`' taken, weights, live, rows over
    all S rows): shared expert first (unless ROUTED), then the union in ascending id."""
    ex = lg.arange(0, E)
    rmask = rows < S
    used = tl.max(tl.where(live[:, None] & (taken > 0), 1, 0), 0)  # [E]
    if SUBSET == 2:
        used = used * 0
    if SUBSET == 1:
        first = 0
    else:
        first = 1
    # (Gluon scans only a plain blocked layout: there and back)
    pos = first + lg.along(tl.cumsum(lg.plain(used), 0), wfull, 0) - 1
    tl.store(slot_e + pos, ex, mask=used > 0)
    tl.store(
        wtab + pos[None, :] * S + rows[:, None], wfull, mask=(used[None, :] > 0) & rmask[:, None]
    )
    if SUBSET != 1:
        tl.store(slot_e, E)
        tl.store(wtab + rows, tl.where(live, 1.0, 0.0), mask=rmask)
    tl.store(nslots_p, first + tl.sum(used, 0))


@triton.jit
def _route_gathered(
    slots,
    nslots_p,
    slot_e,
    wtab,
    scratch,
    S: tl.constexpr,
    E: tl.constexpr,
    K: tl.constexpr,
    T_IDS: tl.constexpr,
    T_TOPW: tl.constexpr,
    O_TABLE: tl.constexpr,
    SUBSET: tl.constexpr,
    RT: tl.constexpr,
):
    """The slot table from every row's picks as the route items stored them (other
    programs' stores): the table `_route_body` builds from its registers, bit for bit."""
    rows = lg.arange(0, RT)
    ex = lg.arange(0, E)
    rmask = rows < S
    ids_p, topw_p = _topk_table(scratch, O_TABLE, T_IDS, T_TOPW)
    taken = lg.anchor(lg.zeros((RT, E), tl.int32))
    wfull = lg.zeros_like(taken, tl.float32)
    for k in tl.static_range(K):
        kid = tl.load(ids_p + rows * K + k, mask=rmask, other=-1, volatile=True)
        kw = tl.load(topw_p + rows * K + k, mask=rmask, other=0.0, volatile=True)
        hit = ex[None, :] == kid[:, None]
        taken = tl.where(hit, k + 1, taken)
        wfull = tl.where(hit, kw[:, None], wfull)
    live = rmask & (tl.load(slots + rows, mask=rmask, other=-1) >= 0)
    _route_table(taken, wfull, live, rows, nslots_p, slot_e, wtab, S, E, SUBSET)


def _route_body(
    logit,
    bias,
    slots,
    nslots_p,
    slot_e,
    wtab,
    scratch,
    S: tl.constexpr,
    E: tl.constexpr,
    K: tl.constexpr,
    RP: tl.constexpr,
    T_IDS: tl.constexpr,
    T_TOPW: tl.constexpr,
    O_TABLE: tl.constexpr,
    SUBSET: tl.constexpr,
    RSF: tl.constexpr,
    RT: tl.constexpr,
):
    """Every row's top-k and the slot table in one program (the last router item, where no
    route stage follows). Tiles hold RT rows (S rounded up to a power of two, at least
    tile `rt`): 4 rows put one on each warp, so that its reductions over the experts stay
    in a warp (2 rows split each over two warps)."""
    taken, wfull, live, rows = _route_rows(
        logit, bias, slots, scratch, 0, S, E, K, RP, T_IDS, T_TOPW, O_TABLE, RSF, RT
    )
    _route_table(taken, wfull, live, rows, nslots_p, slot_e, wtab, S, E, SUBSET)


_route = triton.jit(_route_body)


# -- host side ---------------------------------------------------------------------------

_FMT = {WeightFormat.BF16: 0, WeightFormat.MXFP4: 1, WeightFormat.FP8: 2}
_SUB = {Experts.ALL: 0, Experts.ROUTED: 1, Experts.SHARED: 2}
REGIONS = {name: region_id(f"ffn.{name}") for name in ("ar1", "ar2", "items", "handshake")}


def _p2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def constexprs(b: FfnBuild, cpu: bool) -> dict:
    """The kernel's compile-time arguments for build `b`."""
    c, p = b.cfg, b.plan
    sl = scratch_layout(b)
    tb = table_offsets(b)
    pl = peer_layout(c, b.tp)
    return dict(
        S=b.rows,
        H=c.hidden_size,
        E=c.num_experts,
        K=c.top_k,
        I=b.inter,
        FMT=3 if b.weights is WeightFormat.MXFP4 and not (b.rot or b.frag) else _FMT[b.weights],
        SFMT=_FMT[b.weights.shared_format],
        SUBSET=_SUB[b.experts],
        MAXSLOTS=b.max_slots,
        NPUSH=p.push,
        PUSHC=p.push_cols,
        SC=p.seam_cols,
        NCH=p.seam_chunks,
        NCH2=_p2(p.seam_chunks),
        NSN2=_p2(b.rows * p.seam_chunks),
        O_SSQ=sl["ssq"][0],
        RG=p.router_groups,
        RP=p.router_parts,
        RK=p.router_k,
        BN=p.bn,
        NC=p.nc,
        UBK=p.ubk,
        UKS=p.uks,
        UBK0=p.ubk0,
        UKS0=p.uks0,
        DC=p.dc,
        ND=p.down,
        DBK=p.dbk,
        DBK0=p.dbk0,
        NG=p.ng,
        GJ2=_p2(-(-b.max_routed // p.ng)),
        DRING=int(bool(p.dring) and b.frag and b.weights is WeightFormat.MXFP4),
        STAGES=p.stages,
        USTAGES=p.ust or p.stages,
        DSTAGES=p.dst or p.stages,
        PAIR=p.pair,
        RROWS=p.rrows,
        UPF=p.upf,
        SPF=p.spf,
        DPF=p.dpf,
        SFIRST=p.sfirst,
        RR=p.rr,
        NRQ=route_items(b),
        NRG2=_p2(p.router_groups * p.router_parts),
        NF=p.final,
        NF2=_p2(b.rows * p.final),
        FC=p.fc,
        W2P=_p2(b.tp),
        O_DONE=sl["done"][0],
        O_COUNT=sl["count"][0],
        MAXTICKETS=max_tickets(b),
        O_XS=sl["xs"][0],
        O_XN=sl["xn"][0],
        O_LOGIT=sl["logit"][0],
        O_TABLE=sl["table"][0],
        O_MID=sl["mid"][0],
        O_UPART=sl["upart"][0],
        O_DPART=sl["dpart"][0],
        T_WTAB=tb["wtab"],
        T_IDS=tb["topk_ids"],
        T_TOPW=tb["topk_w"],
        P_AR1=pl["ar1"][0],
        P_AR2=pl["ar2"][0],
        P_HS=pl["hs"][0],
        R_AR1=REGIONS["ar1"],
        R_AR2=REGIONS["ar2"],
        R_ITEMS=REGIONS["items"],
        R_HS=REGIONS["handshake"],
        ALPHA=c.swiglu_alpha,
        BETA=c.swiglu_beta,
        LIMIT=c.swiglu_limit,
        EPS=c.rms_norm_eps,
        RSF=c.routed_scaling_factor,
        CPU=bool(cpu),
        TL=b.timeline,
        O_TL=sl["timeline"][0] if b.timeline else 0,
        RT=max(p.rt, _p2(b.rows)),
        GL=b.frag,
    )


def kernel_args(
    b: FfnBuild,
    *,
    part,
    residual,
    out,
    residual_out,
    slots,
    weights,
    scratch,
    slot,
    final,
    ctl,
    health,
    tickets,
    peers,
    rank,
    world,
) -> list:
    """The runtime arguments in spec.ARGS order, then the runtime's (bf16 activations and
    the norm weight as int32 pairs; a missing scale is any tensor)."""

    def pairs(t):
        return t.view(torch.int32)

    w = weights

    def sc(t):
        return scratch if t is None else t

    return [
        pairs(part),
        pairs(residual),
        pairs(out),
        pairs(residual_out),
        slots,
        pairs(w.norm),
        w.router,
        w.bias,
        w.w13,
        sc(w.w13_scale),
        w.w2,
        sc(w.w2_scale),
        w.shared_w13,
        sc(w.shared_w13_scale),
        w.shared_w2,
        sc(w.shared_w2_scale),
        scratch,
        slot,
        int(bool(final)),
        ctl,
        health,
        tickets,
        peers,
        rank,
        world,
    ]


def kernel_types(fmt: WeightFormat) -> dict[str, str]:
    """Triton types of the kernel's runtime arguments for an expert format."""
    w, s = {
        WeightFormat.BF16: ("*bf16", "*u8"),
        WeightFormat.MXFP4: ("*u8", "*u8"),
        WeightFormat.FP8: ("*fp8e4nv", "*fp32"),
    }[fmt]
    sw, ss = ("*fp8e4nv", "*fp32") if fmt is WeightFormat.FP8 else ("*bf16", "*u8")
    return {
        "part": "*i32",
        "residual": "*i32",
        "out": "*i32",
        "residual_out": "*i32",
        "slots": "*i64",
        "norm": "*i32",
        "router": "*fp32",
        "bias": "*fp32",
        "w13": w,
        "w13_scale": s,
        "w2": w,
        "w2_scale": s,
        "sw13": sw,
        "sw13_scale": ss,
        "sw2": sw,
        "sw2_scale": ss,
        "scratch": "*u8",
        "slot": "i32",
        "final": "i32",
        "ctl": "*i64",
        "health": "i64",
        "tickets": "*i64",
        "peers": "*i64",
        "rank": "i32",
        "world": "i32",
    }


def kernel_of(b: FfnBuild):
    """The jitted kernel of build `b`: Gluon's for ``mxfp4-frag`` experts, else Triton's."""
    return ffn_gluon if b.frag else ffn_kernel


def compile_for(b: FfnBuild, target: str):
    """Compile build `b` ahead of time for `target` ("sm90" or "gfx950") without a GPU, with
    the specialization of a real launch (16-byte aligned pointers). Run it in a subprocess:
    a backend abort would take the caller down."""
    from mono_runtime.compile_check import compile_for as compile_kernel

    return compile_kernel(
        kernel_of(b),
        kernel_types(b.weights),
        constexprs(b, cpu=False),
        num_warps=b.plan.warps,
        target=target,
        maxnreg=b.plan.regs or None,
    )


def launch(b: FfnBuild, grid: int, cpu: bool, **args):
    """Launch build `b` on already-validated tensors (the runner checks them)."""
    cap = {"maxnreg": b.plan.regs} if b.plan.regs and not cpu else {}
    return kernel_of(b)[(grid,)](
        *kernel_args(b, **args), **constexprs(b, cpu), num_warps=b.plan.warps, **cap
    )
