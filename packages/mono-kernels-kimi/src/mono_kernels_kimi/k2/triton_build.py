"""Triton build of K2 (spec.py): one persistent launch per Kimi-K3 MoE layer and TP rank.

A grid of programs takes tickets from the runtime's per-slot counter; ticket t's item is
fixed by spec.stages (static counts: the up stage is sized for the widest union), and the
kernel reads top to bottom as one function per stage. Every weight is streamed once by
mono_runtime.stream's `stream_rows`, weight rows as the dot's wide operand against the
step's <= 16 token rows. bf16 activations travel between ranks as int32 pairs (column 2i
in the low half), which is exactly a mailbox payload; rank sums add in rank order (fp32),
so every rank gets bit-identical results.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from mono_runtime import decode_triton as dt
from mono_runtime import lang as lg
from mono_runtime import protocol_triton as pt
from mono_runtime.protocol import region_id
from mono_runtime.topk_triton import sigmoid_topk_row
from triton.experimental import gluon

from .spec import K2Build, p2, peer_layout, scratch_layout, starts, table_offsets

NAN_PAIR = tl.constexpr(0x7FC07FC0)  # two bf16 quiet NaNs: what a failed gather stores


@triton.jit
def _tanh(x):
    """tanh to fp32 accuracy: through one exp of -2|x| (no overflow), and by its series
    near 0, where 1 - exp(-2|x|) would cancel."""
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    x2 = x * x
    y = tl.where(
        a < 0.0625, a * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0))), (1.0 - e) / (1.0 + e)
    )
    return tl.where(x < 0, -y, y)


@triton.jit
def _situ(g, u, BETA: tl.constexpr, LBETA: tl.constexpr):
    """vLLM's SituAndMul on fp32 gate and up: beta tanh(g/beta) sigmoid(g) * lb tanh(u/lb)."""
    return BETA * _tanh(g / BETA) * tl.sigmoid(g) * (LBETA * _tanh(u / LBETA))


@triton.jit
def _share_row0(rank, g, SHARE: tl.constexpr, TOTAL: tl.constexpr, BN: tl.constexpr):
    """`_share`'s first row alone (a prefetch needs no more)."""
    return tl.minimum(rank * SHARE + g * BN, TOTAL - BN)


@triton.jit
def _share(rank, g, SHARE: tl.constexpr, TOTAL: tl.constexpr, BN: tl.constexpr):
    """Item g of this rank's SHARE rows of a whole [TOTAL, *] weight: (first row of the BN
    streamed, which rows of them to keep). A share smaller than BN streams neighbouring
    rows too (the weight is whole on every rank) and keeps only its own."""
    first = rank * SHARE + g * BN
    r0 = _share_row0(rank, g, SHARE, TOTAL, BN)
    rows = r0 + lg.arange(0, BN)
    keep = (rows >= first) & (rows < tl.minimum(first + BN, (rank + 1) * SHARE))
    return r0, rows, keep


def _k2_body(
    core,
    prefix,
    blocks,
    out,
    slots,
    o_proj,
    mlp_res_norm,
    mlp_res_proj,
    post_norm,
    router,
    bias,
    latent_down,
    latent_norm,
    up_proj,
    shared_w13,
    shared_w2,
    w13,
    w13_scale,
    w2,
    w2_scale,
    scratch,
    blocks_row,
    blocks_block,
    sources,
    reset,
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
    KO: tl.constexpr,
    LAT: tl.constexpr,
    E: tl.constexpr,
    K: tl.constexpr,
    RI: tl.constexpr,
    SI: tl.constexpr,
    NB: tl.constexpr,
    NB2: tl.constexpr,
    EPR: tl.constexpr,
    LPR: tl.constexpr,
    HPR: tl.constexpr,
    MAXSLOTS: tl.constexpr,
    FMT: tl.constexpr,
    OC: tl.constexpr,
    OBK: tl.constexpr,
    RC: tl.constexpr,
    NCH: tl.constexpr,
    RBK: tl.constexpr,
    DKS: tl.constexpr,
    NR: tl.constexpr,
    RR: tl.constexpr,
    NL: tl.constexpr,
    LB: tl.constexpr,
    SB: tl.constexpr,
    SD: tl.constexpr,
    SDK: tl.constexpr,
    BN: tl.constexpr,
    NC: tl.constexpr,
    UBK: tl.constexpr,
    UKS: tl.constexpr,
    PBK: tl.constexpr,
    DC: tl.constexpr,
    DBK: tl.constexpr,
    NG: tl.constexpr,
    NG2: tl.constexpr,
    UC: tl.constexpr,
    FC: tl.constexpr,
    NF: tl.constexpr,
    STAGES: tl.constexpr,
    UPAIR: tl.constexpr,
    RING: tl.constexpr,
    UPF: tl.constexpr,
    XPF: tl.constexpr,
    RPF: tl.constexpr,
    RST: tl.constexpr,
    RRES: tl.constexpr,
    DRING: tl.constexpr,
    GNC2: tl.constexpr,
    S2: tl.constexpr,
    NS2: tl.constexpr,
    NCH2: tl.constexpr,
    SNCH2: tl.constexpr,
    SHUP2: tl.constexpr,
    NC2: tl.constexpr,
    SNF2: tl.constexpr,
    LP2: tl.constexpr,
    E2: tl.constexpr,
    KP: tl.constexpr,
    SK2: tl.constexpr,
    WT2: tl.constexpr,
    T_COL: tl.constexpr,
    T_MIX: tl.constexpr,
    T_NORM: tl.constexpr,
    T_ROUTER: tl.constexpr,
    T_LATDOWN: tl.constexpr,
    T_SHUP: tl.constexpr,
    T_SHDOWN: tl.constexpr,
    T_GATHER: tl.constexpr,
    T_ROUTE: tl.constexpr,
    T_UNION: tl.constexpr,
    T_UP: tl.constexpr,
    T_DOWN: tl.constexpr,
    T_DSUM: tl.constexpr,
    T_LRED: tl.constexpr,
    T_UPPROJ: tl.constexpr,
    T_FINAL: tl.constexpr,
    T_HS: tl.constexpr,
    O_DONE: tl.constexpr,
    O_PNEW: tl.constexpr,
    O_SSQ: tl.constexpr,
    O_DOT: tl.constexpr,
    O_MIX: tl.constexpr,
    O_SSQ2: tl.constexpr,
    O_X: tl.constexpr,
    O_SMID: tl.constexpr,
    O_XLAT: tl.constexpr,
    O_TABLE: tl.constexpr,
    O_MID: tl.constexpr,
    O_COUNT: tl.constexpr,
    O_UCOUNT: tl.constexpr,
    O_KPART: tl.constexpr,
    O_UPART: tl.constexpr,
    O_DPART: tl.constexpr,
    O_NLAT: tl.constexpr,
    T_SLOTE: tl.constexpr,
    T_WTAB: tl.constexpr,
    T_IDS: tl.constexpr,
    T_TOPW: tl.constexpr,
    P_AR1: tl.constexpr,
    P_LG: tl.constexpr,
    P_LAT: tl.constexpr,
    P_RL: tl.constexpr,
    P_SH: tl.constexpr,
    P_UPO: tl.constexpr,
    P_HS: tl.constexpr,
    R_AR1: tl.constexpr,
    R_LG: tl.constexpr,
    R_LAT: tl.constexpr,
    R_RL: tl.constexpr,
    R_SH: tl.constexpr,
    R_UPO: tl.constexpr,
    R_ITEMS: tl.constexpr,
    R_HS: tl.constexpr,
    EPS: tl.constexpr,
    RSF: tl.constexpr,
    RENORM: tl.constexpr,
    LNORM: tl.constexpr,
    BETA: tl.constexpr,
    LBETA: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
    TL: tl.constexpr,
    O_TL: tl.constexpr,
    GL: tl.constexpr,
):
    """The kernel, one body for two compilers: Triton (`k2_kernel`, also the interpreter's)
    and Gluon (`k2_gluon`: the helpers stream on the mma.sync engine there). GL names the
    compiler in the build's constexprs: Triton's compile cache does not tell the two apart."""
    tag = pt.step_tag(ctl, slot)
    counter = tickets + slot
    done = (scratch + O_DONE).to(tl.pointer_type(tl.int64))
    me = pt.peer_data(peers, rank)
    pt.fault_stall(ctl, peers, rank, world, CPU)
    total = T_HS + final  # the handshake closes final launches
    # One ticket draw site, at the top of the loop (as the drafter's): a draw before the
    # loop and one at its end let ptxas leave the first draw's lane-0 atomic without a
    # reconvergence point before its broadcast barrier (sass.split_broadcasts); warp 0
    # then reaches that barrier split, the warps' barriers pair one apart and each warp
    # works another item (the Gluon build's H200 fault: rows of other warps' items in ar1)
    more = total == total
    while more:
        t = pt.ticket_take(counter, total)
        more = t < total
        if more:
            if TL:
                t_begin = pt.clock(0, CPU)
                t_ready = t_begin
                t_mark = dt.NO_MARK + t_begin - t_begin  # (int64, as the clocks)
            if t < T_COL:
                _oproj(
                    t,
                    core,
                    o_proj,
                    peers,
                    rank,
                    world,
                    tag,
                    S,
                    H,
                    KO,
                    OC,
                    OBK,
                    STAGES,
                    P_AR1,
                    CPU,
                    ASM,
                )
            elif t < T_MIX:
                _col(
                    t,
                    (t - T_COL) // NCH,
                    (t - T_COL) % NCH,
                    prefix,
                    blocks,
                    slots,
                    mlp_res_norm,
                    mlp_res_proj,
                    scratch,
                    done,
                    blocks_row,
                    blocks_block,
                    sources,
                    reset,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    me,
                    S,
                    H,
                    NB,
                    NB2,
                    RC,
                    NCH,
                    O_PNEW,
                    O_SSQ,
                    O_DOT,
                    P_AR1,
                    R_AR1,
                    CPU,
                )
            elif t < T_NORM:
                s_ = (t - T_MIX) // NCH
                src = _mix_sources(
                    s_, (t - T_MIX) % NCH, blocks, blocks_row, blocks_block, sources, NB2, RC
                )
                dt.wait_items(
                    done,
                    T_COL + s_ * NCH,
                    NCH,
                    NCH2,
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
                _mix(
                    s_,
                    (t - T_MIX) % NCH,
                    src,
                    scratch,
                    H,
                    NB,
                    RC,
                    NCH,
                    NS2,
                    NCH2,
                    O_PNEW,
                    O_SSQ,
                    O_DOT,
                    O_MIX,
                    O_SSQ2,
                    EPS,
                    sources,
                )
                if TL:  # the mix stored: what the publish after it costs reads apart
                    t_mark = pt.clock(0, CPU)
                pt.ticket_finish(done, t, tag)
            elif t < T_ROUTER:
                s_ = (t - T_NORM) // NCH
                ready = _norm(
                    s_,
                    (t - T_NORM) % NCH,
                    post_norm,
                    scratch,
                    done,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    H,
                    RC,
                    NCH,
                    NCH2,
                    T_MIX,
                    O_MIX,
                    O_SSQ2,
                    O_X,
                    EPS,
                    R_ITEMS,
                    CPU,
                    TL,
                )
                if TL:
                    t_ready = ready
                pt.ticket_finish(done, t, tag)
            elif (t < T_ROUTE) | ((t >= T_LATDOWN) & (t < T_GATHER)):
                # router, latent down and shared up, each split over DKS parts of K: all read
                # x, every row of it; the first RPF (router, or all of a router item's rows
                # into shared memory: RRES) / XPF (the others) columns of their weights are
                # asked for while the norm items land.
                # u: the item's index in the three stages as one (the route and union items
                # sit between the router's and latdown's tickets)
                u = t - T_ROUTER - (t >= T_LATDOWN).to(tl.int32) * (T_LATDOWN - T_ROUTE)
                kp = u % DKS  # every stage of the three has DKS parts an item
                cnt = (scratch + O_COUNT).to(tl.pointer_type(tl.int32)) + u // DKS
                buf = (scratch + O_KPART).to(tl.pointer_type(tl.float32))
                x = (scratch + O_X).to(tl.pointer_type(tl.bfloat16))
                if t < T_LATDOWN:
                    g = (t - T_ROUTER) // DKS
                    ready = _router(
                        g,
                        kp,
                        x,
                        router,
                        buf + g * (DKS * RR * S),
                        cnt,
                        done,
                        tag,
                        ctl,
                        health,
                        peers,
                        rank,
                        world,
                        S,
                        H,
                        E,
                        EPR,
                        RR,
                        RBK,
                        DKS,
                        RST,
                        RPF,
                        RRES,
                        T_NORM,
                        NCH,
                        SNCH2,
                        P_LG,
                        R_ITEMS,
                        CPU,
                        ASM,
                        TL,
                    )
                else:
                    if XPF:
                        if t < T_SHUP:
                            r0 = _share_row0(rank, (t - T_LATDOWN) // DKS, LPR, LAT, LB)
                            dt.prefetch_rows(
                                latent_down, r0, LB, H, kp * (H // DKS), XPF, 0, CPU, ASM
                            )
                        else:
                            r0 = ((t - T_SHUP) // DKS) * SB
                            for half in tl.static_range(2):  # gate rows, then up rows
                                dt.prefetch_rows(
                                    shared_w13, half * SI + r0, SB, H, kp * (H // DKS), XPF, 0,
                                    CPU, ASM,
                                )  # fmt: skip
                    dt.wait_items(
                        done, T_NORM, S * NCH, SNCH2, tag, ctl, health, peers, rank, world,
                        R_ITEMS, CPU,
                    )  # fmt: skip
                    ready = dt.ready_clock(TL, CPU)
                    if t < T_SHUP:
                        g = (t - T_LATDOWN) // DKS
                        _latdown(
                            g,
                            kp,
                            x,
                            latent_down,
                            buf + (NR * RR + g * LB) * (DKS * S),
                            cnt,
                            peers,
                            rank,
                            world,
                            tag,
                            S,
                            H,
                            LAT,
                            LPR,
                            LB,
                            RBK,
                            DKS,
                            STAGES,
                            P_LAT,
                            CPU,
                            ASM,
                        )
                    else:
                        c = (t - T_SHUP) // DKS
                        _shup(
                            c,
                            kp,
                            x,
                            shared_w13,
                            scratch,
                            buf + (NR * RR + NL * LB) * (DKS * S) + c * (DKS * 2 * SB * S),
                            cnt,
                            S,
                            H,
                            SI,
                            SB,
                            RBK,
                            DKS,
                            STAGES,
                            O_SMID,
                            BETA,
                            LBETA,
                            CPU,
                            ASM,
                            RING,
                        )
                        pt.ticket_finish(done, t, tag)
                if TL:
                    t_ready = ready
            elif t < T_UNION:
                ready, mark = _route(
                    t - T_ROUTE,
                    bias,
                    slots,
                    scratch,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    me,
                    E,
                    E2,
                    K,
                    KP,
                    O_TABLE,
                    T_IDS,
                    T_TOPW,
                    P_LG,
                    R_LG,
                    RSF,
                    RENORM,
                    CPU,
                    TL,
                )
                if TL:
                    t_ready = ready
                    t_mark = mark
                pt.ticket_finish(done, t, tag)
            elif t < T_LATDOWN:
                dt.wait_items(
                    done, T_ROUTE, S, S2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
                )
                if TL:
                    t_ready = pt.clock(0, CPU)
                _union(
                    scratch,
                    S,
                    E,
                    E2,
                    K,
                    MAXSLOTS,
                    SK2,
                    WT2,
                    O_TABLE,
                    T_SLOTE,
                    T_WTAB,
                    T_IDS,
                    T_TOPW,
                )
                pt.ticket_finish(done, t, tag)
            elif t < T_UP:
                _gather(
                    t - T_GATHER,
                    scratch,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    me,
                    LAT,
                    LP2,
                    O_XLAT,
                    P_LAT,
                    R_LAT,
                    CPU,
                )
                pt.ticket_finish(done, t, tag)
            elif t < T_DOWN:
                ok = dt.wait_items(
                    done, T_UNION, 1, 1, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
                )
                ok = ok & dt.wait_items(
                    done, T_GATHER, S, S2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
                )
                if TL:
                    t_ready = pt.clock(0, CPU)
                _up(
                    (t - T_UP) // (NC * UKS),
                    (t - T_UP) // UKS % NC,
                    (t - T_UP) % UKS,
                    w13,
                    w13_scale,
                    scratch,
                    ok,
                    S,
                    E,
                    LAT,
                    RI,
                    MAXSLOTS,
                    BN,
                    UBK,
                    UKS,
                    FMT,
                    STAGES,
                    UPAIR == 2,
                    RING,
                    O_TABLE,
                    T_SLOTE,
                    O_XLAT,
                    O_MID,
                    O_UCOUNT,
                    O_UPART,
                    BETA,
                    LBETA,
                    CPU,
                    ASM,
                )
                pt.ticket_finish(done, t, tag)
            elif t < T_DSUM:
                ready = _down(
                    (t - T_DOWN) // NG,
                    (t - T_DOWN) % NG,
                    w2,
                    w2_scale,
                    scratch,
                    done,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    S,
                    E,
                    LAT,
                    RI,
                    MAXSLOTS,
                    NC,
                    UKS,
                    NC2,
                    NG,
                    DC,
                    DBK,
                    FMT,
                    STAGES,
                    T_UNION,
                    T_UP,
                    O_TABLE,
                    T_SLOTE,
                    T_WTAB,
                    O_MID,
                    O_DPART,
                    DRING,
                    GNC2,
                    R_ITEMS,
                    CPU,
                    ASM,
                    TL,
                )
                if TL:
                    t_ready = ready
                pt.ticket_finish(done, t, tag)
            elif t < T_SHDOWN:
                dt.wait_items(
                    done,
                    T_DOWN + (t - T_DSUM) * NG,
                    NG,
                    NG2,
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
                mark = _dsum(
                    t - T_DSUM, scratch, peers, rank, world, tag, S, S2, LAT, NG, DC, O_DPART, P_RL,
                    CPU, TL,
                )  # fmt: skip
                if TL:
                    t_mark = mark
            elif t < T_LRED:
                # (after dsum: its items fill the programs that idle while dsum and
                # lred run, and no down item waits behind them for a program)
                ready = _shdown(
                    t - T_SHDOWN,
                    shared_w2,
                    scratch,
                    done,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    S,
                    H,
                    SI,
                    SB,
                    SD,
                    SDK,
                    DKS,
                    SHUP2,
                    STAGES,
                    T_SHUP,
                    O_SMID,
                    P_SH,
                    R_ITEMS,
                    CPU,
                    ASM,
                    TL,
                )
                if TL:
                    t_ready = ready
            elif t < T_UPPROJ:
                ready, mark = _lred(
                    t - T_LRED,
                    latent_norm,
                    scratch,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    me,
                    LAT,
                    LP2,
                    O_NLAT,
                    P_RL,
                    R_RL,
                    EPS,
                    LNORM,
                    CPU,
                    TL,
                )
                if TL:
                    t_ready = ready
                    t_mark = mark
                pt.ticket_finish(done, t, tag)
            elif t < T_FINAL:
                ready = _upproj(
                    t - T_UPPROJ,
                    up_proj,
                    scratch,
                    done,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    S,
                    H,
                    LAT,
                    HPR,
                    UC,
                    PBK,
                    S2,
                    STAGES,
                    UPF,
                    T_LRED,
                    O_NLAT,
                    P_UPO,
                    R_ITEMS,
                    CPU,
                    ASM,
                    TL,
                )
                if TL:
                    t_ready = ready
            elif t < T_HS:
                _final(
                    (t - T_FINAL) // NF,
                    (t - T_FINAL) % NF,
                    out,
                    slots,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    me,
                    H,
                    FC,
                    P_SH,
                    P_UPO,
                    R_SH,
                    R_UPO,
                    CPU,
                )
                pt.ticket_finish(done, t, tag)
            else:
                # the TP fault handshake: every final item here is done; tell every rank, hear
                # from every rank (a rank that gave up has set its alarm here)
                dt.wait_items(
                    done, T_FINAL, S * NF, SNF2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
                )
                if TL:
                    t_ready = pt.clock(0, CPU)
                dt.handshake(me, peers, rank, world, P_HS // 8, 8, tag, ctl, health, R_HS, CPU)
            if TL:  # the item's (program, ticket, start, ready, end, mark)
                dt.stamp_item(
                    (scratch + O_TL).to(tl.pointer_type(tl.int64)), t, t_begin, t_ready, t_mark, CPU
                )


# Integer arguments that vary per launch or per rank: never specialized (a value of 1 or a
# multiple of 16 would otherwise compile another binary: e.g. one per rank or layer).
_RUNTIME_INTS = ["blocks_row", "blocks_block", "sources", "reset", "slot", "final", "rank", "world"]
k2_kernel = triton.jit(do_not_specialize=_RUNTIME_INTS)(_k2_body)
# the same body compiled by Gluon: its weight streams on the mma.sync engine
# (decode_triton.any_stream_rows), MXFP4 experts in mxfp4-frag
k2_gluon = gluon.jit(do_not_specialize=_RUNTIME_INTS)(_k2_body)


# -- the stages, in ticket order ---------------------------------------------------------


@triton.jit
def _oproj(
    i,
    core,
    o_proj,
    peers,
    rank,
    world,
    tag,
    S: tl.constexpr,
    H: tl.constexpr,
    KO: tl.constexpr,
    OC: tl.constexpr,
    OBK: tl.constexpr,
    STAGES: tl.constexpr,
    P_AR1: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
):
    """OC columns of this rank's o_proj partial (bf16, as a GEMM leaves it) -> every rank's
    ar1[this rank]."""
    acc = dt.any_stream_rows(
        o_proj, o_proj, core, i * OC, 0, KO // OBK, KO, OC, OBK, S, 0, STAGES, CPU, ASM
    )
    q = i * (OC // 2) + lg.arange(0, OC // 2)
    dt.push_pairs(
        peers,
        world,
        P_AR1 // 8 + rank * 16 * (H // 2),
        H // 2,
        q,
        dt.tile_pairs(acc, OC),
        True,
        tag,
        S,
    )


@triton.jit
def _col(
    t,
    s,
    ch,
    prefix,
    blocks,
    slots,
    mlp_res_norm,
    mlp_res_proj,
    scratch,
    done,
    blocks_row,
    blocks_block,
    sources,
    reset,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    me,
    S: tl.constexpr,
    H: tl.constexpr,
    NB: tl.constexpr,
    NB2: tl.constexpr,
    RC: tl.constexpr,
    NCH: tl.constexpr,
    O_PNEW: tl.constexpr,
    O_SSQ: tl.constexpr,
    O_DOT: tl.constexpr,
    P_AR1: tl.constexpr,
    R_AR1: tl.constexpr,
    CPU: tl.constexpr,
):
    """Row s, columns [ch RC, (ch + 1) RC): o = the ranks' partials in rank order (bf16);
    the new prefix (reset: o; else bf16(prefix + o)) -> pnew (and the prefix, live rows);
    each source's sum of squares and dot with norm * proj over the chunk."""
    p = lg.anchor(ch * (RC // 2) + lg.arange(0, RC // 2))
    ssq = (scratch + O_SSQ).to(tl.pointer_type(tl.float32)) + s * ((NB + 1) * NCH) + ch
    dot = (scratch + O_DOT).to(tl.pointer_type(tl.float32)) + s * ((NB + 1) * NCH) + ch
    # First what needs no o_proj partial, while o_proj's items still stream: the sources'
    # sums (every source's chunk in one load, not one latency a source) and the prefix's
    # and weights' loads; after the wait only the prefix's own sums are left
    grid = lg.anchor(lg.zeros((NB2, RC // 2), tl.int32))  # (Gluon: sources x columns)
    jj = lg.along(lg.arange(0, NB2), grid, 1)
    sq = lg.zeros_like(jj, tl.float32)
    dp = lg.zeros_like(jj, tl.float32)
    for half in tl.static_range(2):
        k = lg.along(ch * RC + half * (RC // 2) + lg.arange(0, RC // 2), grid, 0)
        w = tl.load(mlp_res_norm + k).to(tl.float32) * tl.load(mlp_res_proj + k).to(tl.float32)
        src = blocks + s * blocks_row + jj[:, None] * blocks_block + k[None, :]
        b = tl.load(src, mask=(jj < sources)[:, None], other=0.0).to(tl.float32)
        sq += tl.sum(b * b, 1)
        dp += tl.sum(b * w[None, :], 1)
    tl.store(ssq + jj * NCH, sq, mask=jj < sources)
    tl.store(dot + jj * NCH, dp, mask=jj < sources)
    wl = tl.load(mlp_res_norm + 2 * p).to(tl.float32) * tl.load(mlp_res_proj + 2 * p).to(tl.float32)
    wh = tl.load(mlp_res_norm + 2 * p + 1).to(tl.float32) * tl.load(mlp_res_proj + 2 * p + 1).to(
        tl.float32
    )
    old = tl.load(prefix + s * (H // 2) + p)
    live = tl.load(slots + s) >= 0
    lo, hi, ok = dt.reduce_row(
        me, P_AR1 // 8, s, p, ch * (RC // 2), p >= 0, H // 2,
        tag, ctl, health, peers, rank, world, R_AR1, CPU,
    )  # fmt: skip
    ol, oh = dt.bf16_round(lo), dt.bf16_round(hi)
    pl = tl.where(reset != 0, ol, dt.bf16_round(pt.bf16x2_lo(old) + ol))
    ph = tl.where(reset != 0, oh, dt.bf16_round(pt.bf16x2_hi(old) + oh))
    pl = tl.where(ok, pl, float("nan"))
    ph = tl.where(ok, ph, float("nan"))
    packed = pt.bf16x2_pack(pl, ph)
    tl.store((scratch + O_PNEW).to(tl.pointer_type(tl.int32)) + s * (H // 2) + p, packed)
    tl.store(prefix + s * (H // 2) + p, packed, mask=(p >= 0) & live)
    tl.store(ssq + NB * NCH, tl.sum(pl * pl + ph * ph, 0))
    tl.store(dot + NB * NCH, tl.sum(pl * wl + ph * wh, 0))
    pt.ticket_finish(done, t, tag)


@triton.jit
def _mix_sources(
    s,
    ch,
    blocks,
    blocks_row,
    blocks_block,
    sources,
    NB2: tl.constexpr,
    RC: tl.constexpr,
):
    """Row s's AttnRes sources over columns [ch RC, (ch + 1) RC), bf16 [NB2, RC] (rows past
    `sources` zero): loaded before the mix item's wait, since no item of the launch writes
    them, so their latency overlaps the wait (loads after it queue behind its barriers)."""
    j = lg.arange(0, NB2)
    k = ch * RC + lg.arange(0, RC)
    src = lg.anchor_cols(blocks + s * blocks_row + j[:, None] * blocks_block + k[None, :])
    return tl.load(src, mask=(j < sources)[:, None] & (k >= 0)[None, :], other=0.0)


@triton.jit
def _mix(
    s,
    ch,
    src,
    scratch,
    H: tl.constexpr,
    NB: tl.constexpr,
    RC: tl.constexpr,
    NCH: tl.constexpr,
    NS2: tl.constexpr,
    NCH2: tl.constexpr,
    O_PNEW: tl.constexpr,
    O_SSQ: tl.constexpr,
    O_DOT: tl.constexpr,
    O_MIX: tl.constexpr,
    O_SSQ2: tl.constexpr,
    EPS: tl.constexpr,
    sources,
):
    """Row s, columns [ch RC, (ch + 1) RC): softmax over the sources of (dot x rstd), then
    the mix (the sources `src` (`_mix_sources`) in order, then the prefix) -> mix (fp32)
    and its sum of squares. The prefix is asked for with the sums, before the softmax's
    reductions (a load after a barrier waits for it)."""
    grid = lg.anchor(lg.zeros((NS2, NCH2), tl.int32))  # (Gluon: the sources x chunks layout)
    jj = lg.along(lg.arange(0, NS2), grid, 1)
    cc = lg.along(lg.arange(0, NCH2), grid, 0)
    m2 = (jj[:, None] <= NB) & (cc[None, :] < NCH)
    off = s * ((NB + 1) * NCH) + jj[:, None] * NCH + cc[None, :]
    ssq = (scratch + O_SSQ).to(tl.pointer_type(tl.float32))
    dot = (scratch + O_DOT).to(tl.pointer_type(tl.float32))
    sq = tl.load(ssq + off, mask=m2, other=0.0, volatile=True)
    dt = tl.load(dot + off, mask=m2, other=0.0, volatile=True)
    k = lg.along(ch * RC + lg.arange(0, RC), src, 0)
    pnew = (scratch + O_PNEW).to(tl.pointer_type(tl.bfloat16)) + s * H
    prefix = tl.load(pnew + k, volatile=True).to(tl.float32)
    sq = tl.sum(sq, 1)
    dt = tl.sum(dt, 1)
    valid = (jj < sources) | (jj == NB)
    logit = tl.where(valid, dt / tl.sqrt_rn(sq / H + EPS), float("-inf"))
    ex = tl.where(valid, tl.exp(logit - tl.max(logit, 0)), 0.0)
    wts = ex / tl.sum(ex, 0)
    # the sources' weights as a column over src's rows (sources past NB2 weigh nothing)
    j = lg.along(lg.arange(0, src.shape[0]), src, 1)
    wj = lg.zeros_like(j, tl.float32)
    for q in tl.static_range(NB):  # (NB <= NB2 sources: one weight each, in order)
        wj = tl.where(j == q, tl.sum(tl.where(jj == q, wts, 0.0), 0), wj)
    acc = tl.sum(wj[:, None] * src.to(tl.float32), 0)
    acc += tl.sum(tl.where(jj == NB, wts, 0.0), 0) * prefix
    tl.store((scratch + O_MIX).to(tl.pointer_type(tl.float32)) + s * H + k, acc)
    tl.store(
        (scratch + O_SSQ2).to(tl.pointer_type(tl.float32)) + s * NCH + ch, tl.sum(acc * acc, 0)
    )


@triton.jit
def _norm(
    s,
    ch,
    post_norm,
    scratch,
    done,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    H: tl.constexpr,
    RC: tl.constexpr,
    NCH: tl.constexpr,
    NCH2: tl.constexpr,
    T_MIX: tl.constexpr,
    O_MIX: tl.constexpr,
    O_SSQ2: tl.constexpr,
    O_X: tl.constexpr,
    EPS: tl.constexpr,
    R_ITEMS: tl.constexpr,
    CPU: tl.constexpr,
    TL: tl.constexpr,
):
    """Row s, the same columns: post_attention_layernorm over the row's chunk sums (in
    chunk order) -> x (bf16), the MoE input. The weights are loaded before the wait for
    the row's mix items (one HBM latency off the chain); returns the timeline's ready
    clock."""
    k = lg.anchor(ch * RC + lg.arange(0, RC))
    w = tl.load(post_norm + k).to(tl.float32)
    dt.wait_items(
        done, T_MIX + s * NCH, NCH, NCH2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
    )
    ready = dt.ready_clock(TL, CPU)
    ssq2 = (scratch + O_SSQ2).to(tl.pointer_type(tl.float32)) + s * NCH
    ss = tl.sum(lg.anchor(lg.zeros((2,), tl.float32)), 0)
    for q in tl.static_range(NCH):  # unrolled: the loads fly together, summed in order
        ss += tl.load(ssq2 + q, volatile=True)
    rstd = 1.0 / tl.sqrt_rn(ss / H + EPS)
    v = tl.load((scratch + O_MIX).to(tl.pointer_type(tl.float32)) + s * H + k, volatile=True)
    tl.store(
        (scratch + O_X).to(tl.pointer_type(tl.bfloat16)) + s * H + k,
        dt.bf16_round(v * rstd * w).to(tl.bfloat16),
    )
    return ready


@triton.jit
def _router(
    g,
    kp,
    x,
    router,
    buf,
    cnt,
    done,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    S: tl.constexpr,
    H: tl.constexpr,
    E: tl.constexpr,
    EPR: tl.constexpr,
    RR: tl.constexpr,
    RBK: tl.constexpr,
    DKS: tl.constexpr,
    RST: tl.constexpr,
    RPF: tl.constexpr,
    RRES: tl.constexpr,
    T_NORM: tl.constexpr,
    NCH: tl.constexpr,
    SNCH2: tl.constexpr,
    P_LG: tl.constexpr,
    R_ITEMS: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
    TL: tl.constexpr,
):
    """RR of this rank's router rows over K part kp, once the norm items are done (their
    first RPF columns asked of L2 before the wait; RRES, the Gluon build: every step of
    them into shared memory); the last part: fp32 logits -> every rank's lg (all-gather).
    Returns the timeline's ready clock."""
    r0, rows, keep = _share(rank, g, EPR, E, RR)
    KP: tl.constexpr = H // DKS
    if RRES:
        wpre = dt.rows_ask(router, r0, kp * KP, KP // RBK, H, RR, RBK)
    elif RPF:
        dt.prefetch_rows(router, r0, RR, H, kp * KP, RPF, 0, CPU, ASM)
    dt.wait_items(done, T_NORM, S * NCH, SNCH2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU)
    ready = dt.ready_clock(TL, CPU)
    if RRES:
        acc = dt.asked_stream_rows(wpre, x, S, kp * KP, KP // RBK, H, RR, RBK, RST)
    else:
        acc = dt.any_stream_rows(
            router, router, x, r0, kp * KP, KP // RBK, H, RR, RBK, S, 0, RST, CPU, ASM
        )
    last, acc = dt.split_k(acc, buf, cnt, kp, DKS, RR, S)
    if last:
        payload = tl.trans(acc).to(tl.int32, bitcast=True)
        dt.push_pairs(peers, world, P_LG // 8, E, rows, payload, keep[None, :], tag, S)
    return ready


@triton.jit
def _latdown(
    g,
    kp,
    x,
    latent_down,
    buf,
    cnt,
    peers,
    rank,
    world,
    tag,
    S: tl.constexpr,
    H: tl.constexpr,
    LAT: tl.constexpr,
    LPR: tl.constexpr,
    LB: tl.constexpr,
    RBK: tl.constexpr,
    DKS: tl.constexpr,
    STAGES: tl.constexpr,
    P_LAT: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
):
    """LB of this rank's latent_down rows over K part kp; the last part: bf16 -> every
    rank's lat (all-gather)."""
    r0, rows, keep = _share(rank, g, LPR, LAT, LB)
    KP: tl.constexpr = H // DKS
    acc = dt.any_stream_rows(
        latent_down, latent_down, x, r0, kp * KP, KP // RBK, H, LB, RBK, S, 0, STAGES, CPU, ASM
    )
    last, acc = dt.split_k(acc, buf, cnt, kp, DKS, LB, S)
    if last:
        q = r0 // 2 + lg.arange(0, LB // 2)
        pairs = dt.tile_pairs(acc, LB)
        kq = tl.sum(tl.reshape(lg.anchor(keep).to(tl.int32), (LB // 2, 2)), 1) == 2
        kq = lg.along(kq, pairs, 0)
        dt.push_pairs(peers, world, P_LAT // 8, LAT // 2, q, pairs, kq[None, :], tag, S)


@triton.jit
def _shup(
    c,
    kp,
    x,
    shared_w13,
    scratch,
    buf,
    cnt,
    S: tl.constexpr,
    H: tl.constexpr,
    SI: tl.constexpr,
    SB: tl.constexpr,
    RBK: tl.constexpr,
    DKS: tl.constexpr,
    STAGES: tl.constexpr,
    O_SMID: tl.constexpr,
    BETA: tl.constexpr,
    LBETA: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
    RING: tl.constexpr,
):
    """SB gate + SB up rows of the shared gate_up over K part kp (RING: in one loop, one
    ring on the Gluon build; else one stream after the other); the last part: bf16 (as
    its GEMM leaves them), SiTU -> smid (bf16)."""
    KP: tl.constexpr = H // DKS
    if RING:
        g, u = dt.any_stream_row_pair(
            shared_w13, shared_w13, x, c * SB, SI + c * SB, kp * KP, KP // RBK, H, SB, RBK, S,
            0, STAGES, CPU, ASM, False, True,
        )  # fmt: skip
    else:
        g = dt.any_stream_rows(
            shared_w13, shared_w13, x, c * SB, kp * KP, KP // RBK, H, SB, RBK, S, 0, STAGES,
            CPU, ASM,
        )  # fmt: skip
        u = dt.any_stream_rows(
            shared_w13, shared_w13, x, SI + c * SB, kp * KP, KP // RBK, H, SB, RBK, S, 0,
            STAGES, CPU, ASM,
        )  # fmt: skip
    last, g, u = dt.split_k_pair(g, u, buf, cnt, kp, DKS, SB, S)
    if last:
        h = _situ(dt.bf16_round(g), dt.bf16_round(u), BETA, LBETA)
        smid = (scratch + O_SMID).to(tl.pointer_type(tl.bfloat16))
        dt.store_mid(smid, 0, c, h, S, SI, SB)


@triton.jit
def _shdown(
    d,
    shared_w2,
    scratch,
    done,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    S: tl.constexpr,
    H: tl.constexpr,
    SI: tl.constexpr,
    SB: tl.constexpr,
    SD: tl.constexpr,
    SDK: tl.constexpr,
    DKS: tl.constexpr,
    SHUP2: tl.constexpr,
    STAGES: tl.constexpr,
    T_SHUP: tl.constexpr,
    O_SMID: tl.constexpr,
    P_SH: tl.constexpr,
    R_ITEMS: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
    TL: tl.constexpr,
):
    """SD output columns of this rank's shared-expert partial (K = SI; its rows asked of
    L2 before the wait for every shup item) -> bf16 -> every rank's sh[this rank]; returns
    the timeline's ready clock (`dt.ready_clock`).

    Every shup item means all DKS K parts of each of the SI / SB row blocks: smid's block
    is written by whichever part finishes last, so waiting for SI / SB items only covered
    the first blocks (the H200 read a half-written smid; the interpreter's ticket order
    hid it)."""
    dt.prefetch_rows(shared_w2, d * SD, SD, SI, 0, SI, 0, CPU, ASM)
    dt.wait_items(
        done, T_SHUP, (SI // SB) * DKS, SHUP2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU
    )
    ready = dt.ready_clock(TL, CPU)
    smid = (scratch + O_SMID).to(tl.pointer_type(tl.bfloat16))
    acc = dt.any_stream_rows(
        shared_w2, shared_w2, smid, d * SD, 0, SI // SDK, SI, SD, SDK, S, 0, STAGES, CPU, ASM
    )
    q = d * (SD // 2) + lg.arange(0, SD // 2)
    dt.push_pairs(
        peers,
        world,
        P_SH // 8 + rank * 16 * (H // 2),
        H // 2,
        q,
        dt.tile_pairs(acc, SD),
        True,
        tag,
        S,
    )
    return ready


@triton.jit
def _gather(
    s,
    scratch,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    me,
    LAT: tl.constexpr,
    LP2: tl.constexpr,
    O_XLAT: tl.constexpr,
    P_LAT: tl.constexpr,
    R_LAT: tl.constexpr,
    CPU: tl.constexpr,
):
    """Row s of the gathered latent input (every rank's share) -> xlat."""
    i = lg.anchor(lg.arange(0, LP2))
    m = i < LAT // 2
    v, ok = pt.poll(
        me + P_LAT // 8 + s * (LAT // 2) + i,
        m,
        tag,
        ctl,
        health,
        peers,
        rank,
        world,
        R_LAT,
        s * (LAT // 2),
        CPU,
    )
    xlat = (scratch + O_XLAT).to(tl.pointer_type(tl.int32))
    tl.store(xlat + s * (LAT // 2) + i, tl.where(ok, v, NAN_PAIR), mask=m)


@triton.jit
def _route(
    s,
    bias,
    slots,
    scratch,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    me,
    E: tl.constexpr,
    E2: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    O_TABLE: tl.constexpr,
    T_IDS: tl.constexpr,
    T_TOPW: tl.constexpr,
    P_LG: tl.constexpr,
    R_LG: tl.constexpr,
    RSF: tl.constexpr,
    RENORM: tl.constexpr,
    CPU: tl.constexpr,
    TL: tl.constexpr,
):
    """Row s: top-k of the gathered fp32 logits (mono_runtime.routing's rule) -> topk_ids,
    topk_w (-1 and 0 on a padding row). Returns the timeline's ready clock (logits in) and
    mark (the picks made: on an H100, stop 53, 13.9 us after the logits were in at S = 1,
    where one program alone makes its picks and writes them in 4.4)."""
    e = lg.anchor(lg.arange(0, E2))
    b = tl.load(bias + e, mask=e < E, other=0.0)
    live = tl.load(slots + s) >= 0  # (before the poll, as the bias: no latency after it)
    row = me + P_LG // 8 + s * E
    v, ok = pt.poll(row + e, e < E, tag, ctl, health, peers, rank, world, R_LG, s * E, CPU)
    ready = dt.ready_clock(TL, CPU)
    logits = tl.where(ok, v.to(tl.float32, bitcast=True), float("nan"))
    # the picks' scores read back from the pair words' payload halves (little-endian)
    ids, w = sigmoid_topk_row(
        logits, b, row.to(tl.pointer_type(tl.float32)), 2, E, K, KP, RSF, RENORM
    )
    mark = dt.ready_after(ids.to(tl.float32), TL, CPU)
    w = tl.where(ok, w, float("nan"))
    kk = lg.anchor(lg.arange(0, KP))
    ids_p = (scratch + O_TABLE + T_IDS).to(tl.pointer_type(tl.int32))
    topw_p = (scratch + O_TABLE + T_TOPW).to(tl.pointer_type(tl.float32))
    tl.store(ids_p + s * K + kk, tl.where(live, ids, -1), mask=kk < K)
    tl.store(topw_p + s * K + kk, tl.where(live, w, 0.0), mask=kk < K)
    return ready, mark


@triton.jit
def _union(
    scratch,
    S: tl.constexpr,
    E: tl.constexpr,
    E2: tl.constexpr,
    K: tl.constexpr,
    MAXSLOTS: tl.constexpr,
    SK2: tl.constexpr,
    WT2: tl.constexpr,
    O_TABLE: tl.constexpr,
    T_SLOTE: tl.constexpr,
    T_WTAB: tl.constexpr,
    T_IDS: tl.constexpr,
    T_TOPW: tl.constexpr,
):
    """The slot table: the live rows' experts in ascending id (slot_expert, nslots) and
    wtab[slot, row], the row's weight for the slot's expert (0 where it did not pick it).
    The picks become a bitmap of the experts (one OR reduction); a pick's slot is the
    number of set bits below its own. No table is read back (an expert-indexed table in
    global memory took four store -> barrier -> load round trips, ~7 us on an H100 at S =
    1), and the cost hardly grows with S (distinct ids counted pick against pick took 47
    us at S = 16). H100, stop 52: 0.6 / 1.2 us alone at S = 1 / 16, 4.2 / 6.8 inside K2."""
    table = scratch + O_TABLE
    slot_e = (table + T_SLOTE).to(tl.pointer_type(tl.int32))
    wtab = (table + T_WTAB).to(tl.pointer_type(tl.float32))
    ids_p = (table + T_IDS).to(tl.pointer_type(tl.int32))
    z = lg.anchor(lg.arange(0, WT2))
    tl.store(wtab + z, 0.0, mask=z < MAXSLOTS * S)
    # the bitmap's words: 32 bits (4 words at tiny E, so that the interpreter counts
    # across words)
    BITS: tl.constexpr = min(32, max(E2 // 4, 1))
    WD: tl.constexpr = E2 // BITS
    # [words, picks], each thread whole columns: the sums over words stay in a thread
    cols = lg.anchor_cols(lg.zeros((WD, SK2), tl.int32))
    r = lg.along(lg.arange(0, SK2), cols, 0)
    idr = tl.load(ids_p + r, mask=r < S * K, other=-1, volatile=True)
    okr = (r < S * K) & (idr >= 0) & (idr < E)
    topw = (table + T_TOPW).to(tl.pointer_type(tl.float32))
    w = tl.load(topw + r, mask=okr, other=0.0, volatile=True)
    wi = tl.where(okr, idr // BITS, -1)
    one = lg.like(lg.full((SK2,), 1, tl.uint32), r)
    bit = tl.where(okr, one << (idr % BITS).to(tl.uint32), 0)
    # the bitmap: word v = the OR of the bits of the picks in word v
    grid = lg.anchor(lg.zeros((WD, SK2), tl.int32))
    v = lg.along(lg.arange(0, WD), grid, 1)
    hit = v[:, None] == lg.along(wi, grid, 0)[None, :]
    words = tl.reduce(tl.where(hit, lg.along(bit, grid, 0)[None, :], 0), 1, _bit_or)
    vc = lg.along(lg.arange(0, WD), cols, 1)[:, None]
    wc = lg.along(words, cols, 1)[:, None]
    below = tl.sum(tl.where(vc < wi[None, :], dt.popc(wc), 0), 0)
    own = tl.sum(tl.where(vc == wi[None, :], wc, 0), 0)
    slot = below + dt.popc(own & (bit - 1))
    nslots = tl.sum(dt.popc(words), 0)
    tl.debug_barrier()  # the zeros stored before the picks' weights
    tl.store(slot_e + slot, idr, mask=okr)
    tl.store(wtab + slot * S + r // K, w, mask=okr)
    tl.store(table.to(tl.pointer_type(tl.int32)), nslots)


@triton.jit
def _bit_or(a, b):
    """The union's bitmap reduction."""
    return a | b


@triton.jit
def _slot_count(scratch, O_TABLE: tl.constexpr, MAXSLOTS: tl.constexpr):
    """The union's slot count, clamped (a failed wait may read a stale table)."""
    n = tl.load((scratch + O_TABLE).to(tl.pointer_type(tl.int32)), volatile=True)
    return tl.minimum(tl.maximum(n, 0), MAXSLOTS)


@triton.jit
def _slot_expert(scratch, j, E: tl.constexpr, O_TABLE: tl.constexpr, T_SLOTE: tl.constexpr):
    e = tl.load((scratch + O_TABLE + T_SLOTE).to(tl.pointer_type(tl.int32)) + j, volatile=True)
    return tl.minimum(tl.maximum(e, 0), E - 1)


@triton.jit
def _up(
    j,
    c,
    kp,
    w13,
    w13_scale,
    scratch,
    ok,
    S: tl.constexpr,
    E: tl.constexpr,
    LAT: tl.constexpr,
    RI: tl.constexpr,
    MAXSLOTS: tl.constexpr,
    BN: tl.constexpr,
    UBK: tl.constexpr,
    UKS: tl.constexpr,
    FMT: tl.constexpr,
    STAGES: tl.constexpr,
    ONE_TILE: tl.constexpr,
    RING: tl.constexpr,
    O_TABLE: tl.constexpr,
    T_SLOTE: tl.constexpr,
    O_XLAT: tl.constexpr,
    O_MID: tl.constexpr,
    O_UCOUNT: tl.constexpr,
    O_UPART: tl.constexpr,
    BETA: tl.constexpr,
    LBETA: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
):
    """Slot j's gate and up rows [c BN, (c + 1) BN) (MXFP4, fp32 sums; in one loop,
    ONE_TILE: as one tile; RING: one ring on the Gluon build) over K part kp of UKS, SiTU
    -> mid[j] (bf16) by the part that finished last, the parts summed in order (split K:
    more, shorter items where few slots leave SMs idle); nothing for a slot past the
    union's count."""
    # the slot's expert asked for with the count, not after it: one latency before the
    # stream, not two (past the count it reads a stale entry, clamped, and is not used)
    e = _slot_expert(scratch, j, E, O_TABLE, T_SLOTE)
    if j < _slot_count(scratch, O_TABLE, MAXSLOTS):
        w, ws = dt.stacked_expert(e, w13, w13_scale, 2 * RI, LAT, FMT)
        xlat = (scratch + O_XLAT).to(tl.pointer_type(tl.bfloat16))
        KP: tl.constexpr = LAT // UKS
        g, u = dt.any_stream_row_pair(
            w, ws, xlat, c * BN, RI + c * BN, kp * KP, KP // UBK, LAT, BN, UBK, S, FMT, STAGES,
            CPU, ASM, ONE_TILE, RING,
        )  # fmt: skip
        g = tl.where(ok, g, float("nan"))  # a part that gave up poisons the sum
        i = j * (RI // BN) + c
        upart = (scratch + O_UPART).to(tl.pointer_type(tl.float32)) + i * (UKS * 2 * BN * S)
        ucount = (scratch + O_UCOUNT).to(tl.pointer_type(tl.int32)) + i
        last, g, u = dt.split_k_pair(g, u, upart, ucount, kp, UKS, BN, S)
        if last:
            mid = (scratch + O_MID).to(tl.pointer_type(tl.bfloat16))
            dt.store_mid(mid, j, c, _situ(g, u, BETA, LBETA), S, RI, BN)


@triton.jit
def _down(
    d,
    q,
    w2,
    w2_scale,
    scratch,
    done,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    S: tl.constexpr,
    E: tl.constexpr,
    LAT: tl.constexpr,
    RI: tl.constexpr,
    MAXSLOTS: tl.constexpr,
    NC: tl.constexpr,
    UKS: tl.constexpr,
    NC2: tl.constexpr,
    NG: tl.constexpr,
    DC: tl.constexpr,
    DBK: tl.constexpr,
    FMT: tl.constexpr,
    STAGES: tl.constexpr,
    T_UNION: tl.constexpr,
    T_UP: tl.constexpr,
    O_TABLE: tl.constexpr,
    T_SLOTE: tl.constexpr,
    T_WTAB: tl.constexpr,
    O_MID: tl.constexpr,
    O_DPART: tl.constexpr,
    DRING: tl.constexpr,
    GNC2: tl.constexpr,
    R_ITEMS: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
    TL: tl.constexpr,
):
    """Latent columns [d DC, (d + 1) DC) of this rank's routed partial over the slots of
    group q in order (ascending expert id), each as soon as its up items are done (its
    weights asked of L2 first; DRING: all of them in one ring after one wait), weighted by
    wtab, in fp32 -> dpart[d, q]. Returns the timeline's ready clock, after the wait for
    the route (the waits for the slots' up items count as its work)."""
    ok = dt.wait_items(done, T_UNION, 1, 1, tag, ctl, health, peers, rank, world, R_ITEMS, CPU)
    ready = dt.ready_clock(TL, CPU)
    nslots = _slot_count(scratch, O_TABLE, MAXSLOTS)
    per = (nslots + NG - 1) // NG
    j1 = tl.minimum((q + 1) * per, nslots)
    wtab = (scratch + O_TABLE + T_WTAB).to(tl.pointer_type(tl.float32))
    mid = (scratch + O_MID).to(tl.pointer_type(tl.bfloat16))
    t = lg.arange(0, 16)
    j0 = tl.minimum(q * per, nslots)
    acc = dt.stream_zeros(DC)
    if DRING:  # (the Gluon build only) one wait for the group's up items, then one ring
        ok = ok & dt.wait_items(
            done, T_UP + j0 * NC * UKS, (j1 - j0) * NC * UKS, GNC2, tag, ctl, health, peers,
            rank, world, R_ITEMS, CPU,
        )  # fmt: skip
        if j1 > j0:
            slot_e = (scratch + O_TABLE + T_SLOTE).to(tl.pointer_type(tl.int32))
            acc = dt.gl_stream_experts(
                w2, w2_scale, mid + j0 * S * RI, S, slot_e + j0, wtab + j0 * S, j1 - j0, d * DC,
                RI // DBK, RI, LAT, DC, DBK, STAGES,
            )  # fmt: skip
    else:
        for j in range(j0, j1):
            e = _slot_expert(scratch, j, E, O_TABLE, T_SLOTE)
            wrow = tl.load(wtab + j * S + t, mask=t < S, other=0.0, volatile=True)
            w, ws = dt.stacked_expert(e, w2, w2_scale, LAT, RI, FMT)
            dt.prefetch_rows(w, d * DC, DC, RI, 0, RI, FMT, CPU, ASM)
            ok = ok & dt.wait_items(
                done, T_UP + j * NC * UKS, NC * UKS, NC2, tag, ctl, health, peers, rank, world,
                R_ITEMS, CPU,
            )  # fmt: skip
            y = dt.any_stream_rows(
                w, ws, mid + j * S * RI, d * DC, 0, RI // DBK, RI, DC, DBK, S, FMT, STAGES, CPU,
                ASM,
            )  # fmt: skip
            acc += tl.where(wrow[None, :] != 0.0, wrow[None, :] * y, 0.0)
    acc = tl.where(ok, acc, float("nan"))
    n = lg.arange(0, DC)
    dpart = (scratch + O_DPART).to(tl.pointer_type(tl.float32))
    tl.store(dpart + ((d * NG + q) * DC + n[:, None]) * S + t[None, :], acc, mask=t[None, :] < S)
    return ready


@triton.jit
def _dsum(
    d,
    scratch,
    peers,
    rank,
    world,
    tag,
    S: tl.constexpr,
    S2: tl.constexpr,
    LAT: tl.constexpr,
    NG: tl.constexpr,
    DC: tl.constexpr,
    O_DPART: tl.constexpr,
    P_RL: tl.constexpr,
    CPU: tl.constexpr,
    TL: tl.constexpr,
):
    """Column block d's groups summed in group order, rounded once, in S2 token lanes ->
    every rank's rl[this rank]. Returns the timeline's mark: the clock once the groups'
    partials are loaded (an H100 timeline had these items end 7-10 us after their wait
    returned at S = 1, for 4 KB each: the mark splits loads from the push)."""
    n = lg.arange(0, DC)
    t = lg.arange(0, S2)
    dpart = (scratch + O_DPART).to(tl.pointer_type(tl.float32))
    base = dpart + (d * NG * DC + n[:, None]) * S + t[None, :]
    # one token: lanes down the columns (the plain layout's lanes along the token each
    # loaded every value, 256 loads a thread: sm_90 SASS). Wider, the plain layout: lanes
    # down the columns there made K2 10% slower at S = 8 (H100, stop 54: 252.3 against
    # 228.3 us, the two binaries differing only here)
    if S2 == 1:
        base = lg.anchor_rows(base)
    else:
        base = lg.anchor(base)
    acc = dt.sum_parts(base, NG, DC * S, t[None, :] < S)
    mark = dt.ready_after(acc, TL, CPU)
    q = d * (DC // 2) + lg.arange(0, DC // 2)
    dt.push_pairs(
        peers,
        world,
        P_RL // 8 + rank * 16 * (LAT // 2),
        LAT // 2,
        q,
        dt.tile_pairs(acc, DC),
        True,
        tag,
        S,
    )
    return mark


@triton.jit
def _lred(
    s,
    latent_norm,
    scratch,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    me,
    LAT: tl.constexpr,
    LP2: tl.constexpr,
    O_NLAT: tl.constexpr,
    P_RL: tl.constexpr,
    R_RL: tl.constexpr,
    EPS: tl.constexpr,
    LNORM: tl.constexpr,
    CPU: tl.constexpr,
    TL: tl.constexpr,
):
    """Row s: the ranks' routed partials in rank order -> bf16 -> routed_expert_norm
    (normalized in fp32, rounded, times the bf16 weight, rounded) -> nlat. Returns the
    timeline's ready clock (the partials in) and mark (the row normed: an H100 timeline
    had ~6 us between the two)."""
    i = lg.anchor(lg.arange(0, LP2))
    m = i < LAT // 2
    if LNORM:  # the weights before the wait: one HBM latency off the chain
        wl = tl.load(latent_norm + 2 * i, mask=m, other=0.0).to(tl.float32)
        wh = tl.load(latent_norm + 2 * i + 1, mask=m, other=0.0).to(tl.float32)
    lo, hi, ok = dt.reduce_row(
        me, P_RL // 8, s, i, 0, m, LAT // 2, tag, ctl, health, peers, rank, world, R_RL, CPU
    )
    ready = dt.ready_clock(TL, CPU)
    vl = tl.where(ok, dt.bf16_round(lo), float("nan"))
    vh = tl.where(ok, dt.bf16_round(hi), float("nan"))
    if LNORM:
        ss = tl.sum(tl.where(m, vl * vl + vh * vh, 0.0), 0)
        rstd = 1.0 / tl.sqrt_rn(ss / LAT + EPS)
        vl = dt.bf16_round(vl * rstd) * wl
        vh = dt.bf16_round(vh * rstd) * wh
    mark = dt.ready_after(vl, TL, CPU)
    nlat = (scratch + O_NLAT).to(tl.pointer_type(tl.int32))
    tl.store(nlat + s * (LAT // 2) + i, pt.bf16x2_pack(vl, vh), mask=m)
    return ready, mark


@triton.jit
def _upproj(
    u,
    up_proj,
    scratch,
    done,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    S: tl.constexpr,
    H: tl.constexpr,
    LAT: tl.constexpr,
    HPR: tl.constexpr,
    UC: tl.constexpr,
    PBK: tl.constexpr,
    S2: tl.constexpr,
    STAGES: tl.constexpr,
    UPF: tl.constexpr,
    T_LRED: tl.constexpr,
    O_NLAT: tl.constexpr,
    P_UPO: tl.constexpr,
    R_ITEMS: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
    TL: tl.constexpr,
):
    """UC of this rank's H/tp up_proj rows (their first UPF columns asked of L2 before the
    wait for every lred item) over the normed latent -> bf16 -> every rank's upo (the
    column's owner); returns the timeline's ready clock."""
    r0 = rank * HPR + u * UC
    if UPF:
        dt.prefetch_rows(up_proj, r0, UC, LAT, 0, UPF, 0, CPU, ASM)
    dt.wait_items(done, T_LRED, S, S2, tag, ctl, health, peers, rank, world, R_ITEMS, CPU)
    ready = dt.ready_clock(TL, CPU)
    nlat = (scratch + O_NLAT).to(tl.pointer_type(tl.bfloat16))
    acc = dt.any_stream_rows(
        up_proj, up_proj, nlat, r0, 0, LAT // PBK, LAT, UC, PBK, S, 0, STAGES, CPU, ASM
    )
    q = r0 // 2 + lg.arange(0, UC // 2)
    dt.push_pairs(peers, world, P_UPO // 8, H // 2, q, dt.tile_pairs(acc, UC), True, tag, S)
    return ready


@triton.jit
def _final(
    s,
    f,
    out,
    slots,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    me,
    H: tl.constexpr,
    FC: tl.constexpr,
    P_SH: tl.constexpr,
    P_UPO: tl.constexpr,
    R_SH: tl.constexpr,
    R_UPO: tl.constexpr,
    CPU: tl.constexpr,
):
    """Row s, FC columns: bf16(the ranks' shared partials in rank order) + the column
    owner's up-projection -> out (bf16; 0 on a padding row)."""
    p = lg.anchor(f * (FC // 2) + lg.arange(0, FC // 2))
    live = tl.load(slots + s) >= 0  # (before the polls: a load after them waits for them)
    lo, hi, ok = dt.reduce_row(
        me, P_SH // 8, s, p, f * (FC // 2), p >= 0, H // 2,
        tag, ctl, health, peers, rank, world, R_SH, CPU,
    )  # fmt: skip
    up, got = pt.poll(
        me + P_UPO // 8 + s * (H // 2) + p,
        p >= 0,
        tag,
        ctl,
        health,
        peers,
        rank,
        world,
        R_UPO,
        s * (H // 2) + f * (FC // 2),
        CPU,
    )
    ok = ok & got
    ol = tl.where(ok, dt.bf16_round(lo) + pt.bf16x2_lo(up), float("nan"))
    oh = tl.where(ok, dt.bf16_round(hi) + pt.bf16x2_hi(up), float("nan"))
    tl.store(out + s * (H // 2) + p, tl.where(live, pt.bf16x2_pack(ol, oh), 0))


# -- host side ---------------------------------------------------------------------------

REGIONS = {
    name: region_id(f"k2.{name}")
    for name in ("ar1", "lg", "lat", "rl", "sh", "upo", "items", "handshake")
}

LAUNCH_ARGS = (
    "core", "prefix", "blocks", "out", "slots", "o_proj", "mlp_res_norm", "mlp_res_proj",
    "post_norm", "router", "bias", "latent_down", "latent_norm", "up_proj", "shared_w13",
    "shared_w2", "w13", "w13_scale", "w2", "w2_scale", "scratch", "blocks_row",
    "blocks_block", "sources", "reset", "slot", "final", "ctl", "health", "tickets",
    "peers", "rank", "world",
)  # fmt: skip


def constexprs(b: K2Build, cpu: bool, asm: bool = True) -> dict:
    """The kernel's compile-time arguments for build `b` (`asm`: the MXFP4 decode's inline
    PTX, NVIDIA only)."""
    c, p = b.cfg, b.plan
    sl, tb, pl, st_ = scratch_layout(b), table_offsets(b), peer_layout(c), starts(b)
    return dict(
        S=b.rows,
        H=c.hidden_size,
        KO=c.o_proj_in,
        LAT=c.latent_size,
        E=c.num_experts,
        K=c.num_experts_per_token,
        RI=c.routed_intermediate,
        SI=c.shared_intermediate,
        NB=c.num_attn_res_blocks,
        NB2=p2(c.num_attn_res_blocks),
        EPR=c.experts_per_rank,
        LPR=c.latent_per_rank,
        HPR=c.hidden_per_rank,
        MAXSLOTS=b.max_slots,
        FMT=1 if b.packed else 3,  # mxfp4-frag: mxfp4-rot's offsets (decode_triton)
        GL=b.frag,
        OC=p.oc,
        OBK=p.obk,
        RC=p.rc,
        NCH=p.nch,
        RBK=p.rbk,
        DKS=p.dks,
        NR=p.nr,
        RR=p.rr,
        NL=p.nl,
        LB=p.lb,
        SB=p.sb,
        SD=p.sd,
        SDK=p.sdk,
        BN=p.bn,
        NC=p.nc,
        UBK=p.ubk,
        UKS=p.uks,
        PBK=p.pbk,
        DC=p.dc,
        DBK=p.dbk,
        NG=p.ng,
        NG2=p2(p.ng),
        UC=p.uc,
        FC=p.fc,
        NF=p.nf,
        STAGES=p.stages,
        UPAIR=p.upair,
        RING=bool(p.ring),
        UPF=p.upf,
        XPF=p.xpf,
        RPF=p.rpf,
        RST=p.rst,
        RRES=bool(p.rres) and b.frag,
        DRING=bool(p.dring) and b.frag,
        GNC2=p2(-(-b.max_slots // p.ng) * p.nc * p.uks),
        S2=p2(b.rows),
        NS2=p2(c.num_attn_res_blocks + 1),
        NCH2=p2(p.nch),
        SNCH2=p2(b.rows * p.nch),
        SHUP2=p2(p.nsu * p.dks),
        NC2=p2(p.nc * p.uks),
        SNF2=p2(b.rows * p.nf),
        LP2=p2(c.latent_size // 2),
        E2=p2(c.num_experts),
        KP=p2(c.num_experts_per_token),
        SK2=p2(b.rows * c.num_experts_per_token),
        WT2=p2(b.max_slots * b.rows),
        **{f"T_{n.upper()}": st_[n] for n in st_ if n not in ("oproj", "handshake")},
        T_HS=st_["handshake"],
        **{f"O_{name.upper()}": sl[name][0] for name in sl if name != "timeline"},
        TL=b.timeline,
        O_TL=sl["timeline"][0] if b.timeline else 0,
        T_SLOTE=tb["slot_expert"],
        T_WTAB=tb["wtab"],
        T_IDS=tb["topk_ids"],
        T_TOPW=tb["topk_w"],
        **{f"P_{name.upper()}": pl[name][0] for name in pl},
        **{f"R_{name.upper()}": REGIONS[name] for name in REGIONS if name != "handshake"},
        R_HS=REGIONS["handshake"],
        EPS=c.rms_norm_eps,
        RSF=c.routed_scaling_factor,
        RENORM=c.moe_renormalize,
        LNORM=c.latent_moe_use_norm,
        BETA=c.activation_situ_beta,
        LBETA=c.activation_situ_linear_beta,
        CPU=bool(cpu),
        ASM=bool(asm),
    )


def kernel_types() -> dict[str, str]:
    """Triton types of the kernel's runtime arguments (bf16 prefix and out as int32 pairs)."""
    bf16 = ("o_proj", "mlp_res_norm", "mlp_res_proj", "post_norm", "router", "latent_down",
            "latent_norm", "up_proj", "shared_w13", "shared_w2", "core", "blocks")  # fmt: skip
    types = {name: "*bf16" for name in bf16}
    types.update(
        prefix="*i32",
        out="*i32",
        slots="*i64",
        bias="*fp32",
        w13="*u8",
        w13_scale="*u8",
        w2="*u8",
        w2_scale="*u8",
        scratch="*u8",
        blocks_row="i32",
        blocks_block="i32",
        sources="i32",
        reset="i32",
        slot="i32",
        final="i32",
        ctl="*i64",
        health="i64",
        tickets="*i64",
        peers="*i64",
        rank="i32",
        world="i32",
    )
    return {name: types[name] for name in LAUNCH_ARGS}


def kernel_args(
    b: K2Build,
    *,
    core,
    prefix,
    blocks,
    out,
    slots,
    weights,
    scratch,
    sources,
    reset,
    slot,
    final,
    ctl,
    health,
    tickets,
    peers,
    rank,
    world,
) -> list:
    """The runtime arguments in LAUNCH_ARGS order (the runner checked the tensors)."""
    w = weights
    named = dict(
        core=core,
        prefix=prefix.view(torch.int32),
        blocks=blocks,
        out=out.view(torch.int32),
        slots=slots,
        **{name: getattr(w, name) for name in LAUNCH_ARGS[5:20]},
        scratch=scratch,
        blocks_row=blocks.stride(0),
        blocks_block=blocks.stride(1),
        sources=int(sources),
        reset=int(bool(reset)),
        slot=slot,
        final=int(bool(final)),
        ctl=ctl,
        health=health,
        tickets=tickets,
        peers=peers,
        rank=rank,
        world=world,
    )
    return [named[name] for name in LAUNCH_ARGS]


def kernel_of(b: K2Build):
    """The jitted kernel of build `b`: Gluon's for ``mxfp4-frag`` experts, else Triton's."""
    return k2_gluon if b.frag else k2_kernel


def compile_for(b: K2Build, target: str):
    """Compile build `b` ahead of time for `target` ("sm90" or "gfx950") without a GPU, with
    a real launch's specialization. Run it in a subprocess: a backend abort would take the
    caller down."""
    from mono_runtime.compile_check import compile_for as compile_kernel

    return compile_kernel(
        kernel_of(b),
        kernel_types(),
        constexprs(b, cpu=False, asm=target != "gfx950"),
        num_warps=b.plan.warps,
        target=target,
    )


def native_asm() -> bool:
    """Whether this torch drives NVIDIA GPUs (the MXFP4 decode's inline PTX); ROCm: no."""
    return torch.version.hip is None


def launch(b: K2Build, grid: int, cpu: bool, **args):
    """Launch build `b` on already-validated arguments (the runner checks them)."""
    return kernel_of(b)[(grid,)](
        *kernel_args(b, **args), **constexprs(b, cpu, native_asm()), num_warps=b.plan.warps
    )
