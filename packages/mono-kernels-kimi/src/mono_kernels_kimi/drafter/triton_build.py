"""Triton build of the drafter kernel (spec.py): one persistent launch runs every draft layer
and the final norm for up to 8 requests of one step on one TP rank.

A grid of programs takes tickets from the runtime's per-slot counter; ticket t's item is
fixed by spec.layer_stages (static counts), and the kernel reads top to bottom as one
function per stage. Projections are streamed by mono_runtime.stream's `stream_rows`,
weight rows as the dot's wide operand against all the launch's rows at once (16, or 64 in
the wide build: each weight streams once a step, however many requests read it). The
layers' weights and KV caches are reached through a device table of addresses (one row a
layer), so one binary serves every layer. bf16 activations travel between ranks as int32
pairs (column 2i in the low half), exactly a mailbox payload; rank sums add in rank order
(fp32), so every rank gets bit-identical results.

Code size: every item waits at one call site (`_deps` names what it waits for), every
row norm reduces over ranks at one call site, and loops over row tiles, chunks, splits
and heads are run-time loops, so the binary holds each protocol wait once (a fraction of
the compile time, and of the instruction cache, of an unrolled kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from mono_runtime import decode_triton as dt
from mono_runtime import protocol_triton as pt
from mono_runtime.protocol import region_id
from mono_runtime.stream import device as st

from . import spec
from .spec import (
    LAYER_POINTERS,
    MAX_REQUESTS,
    DrafterBuild,
    final_start,
    layer_stages,
    layer_starts,
    p2,
    peer_layout,
    per_layer,
    scratch_layout,
    tickets,
)

# columns of the per-layer pointer table
_W_IN, _W_QKVA, _W_QALN, _W_KVALN, _W_QB, _W_KVB, _W_O, _W_POST, _W_GU, _W_DOWN = (
    tl.constexpr(i) for i in range(10)
)
_W_KS, _W_QS, _W_CACHE = (tl.constexpr(i) for i in range(10, 13))
_NPTR = tl.constexpr(len(LAYER_POINTERS))


@triton.jit
def _bf16(x):
    """x rounded to bf16 (nearest even, as the pair packing rounds), as fp32."""
    return (pt.bf16_bits(x) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _ptr(lw, j: tl.constexpr, DT: tl.constexpr):
    """Column j of a layer's pointer-table row as a pointer to DT, 16-byte aligned (the
    runner refuses weights and caches that are not): without the hint Triton cannot prove
    the alignment of a loaded address and streams weights by 2-byte loads, not async
    copies."""
    return tl.multiple_of(tl.load(lw + j).to(tl.pointer_type(DT)), 16)


@triton.jit
def _dot(a, b, acc, CPU: tl.constexpr):
    """acc + a @ b: bf16 operands (exact: callers pass bf16 values) and fp32 sums; fp32
    operands under the interpreter, which mis-reads bf16 dot operands. Values are stored as
    bf16 through `_bf16`: the interpreter's fp32 -> bf16 cast does not round to nearest."""
    if CPU:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)


@triton.jit
def _fp8_bits(x):
    """e4m3fn code (int32 0..255) of fp32 x saturated to +-448, nearest even, in integer
    ops so the interpreter and the GPU round alike (the cache insert's conversion)."""
    a = tl.minimum(tl.abs(x), 448.0)
    b = a.to(tl.int32, bitcast=True)
    r = b + 0x7FFFF + ((b >> 20) & 1)
    normal = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)  # nearest even of a / 2^-9
    sign = (x.to(tl.int32, bitcast=True) >> 24) & 0x80
    return tl.where(a < 0.015625, sub, normal) | sign


@triton.jit
def _fp8_value(code):
    """fp32 of e4m3fn codes (int32 0..255)."""
    e = (code >> 3) & 15
    m = code & 7
    norm = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, norm)
    v = tl.where((code & 0x80) != 0, -mag, mag)
    return tl.where((code & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def _fp8_trip(x, scale):
    """bf16 x through the fp8 query path: e4m3 of x / scale, times scale, to bf16."""
    return _bf16(_fp8_value(_fp8_bits(x * (1.0 / scale))) * scale)


@triton.jit
def _prefetch(
    w, r0, c0, K: tl.constexpr, KC: tl.constexpr, NROWS: tl.constexpr, CPU: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    """L2 prefetch of NROWS rows from row r0, columns c0..c0 + KC, of a bf16 weight of K
    columns (mono_runtime.stream's, NVIDIA only): an item asks for its weights before it
    waits for its inputs."""
    st.prefetch_l2(w + r0 * K + c0, 2 * K, 2 * KC, NROWS, CPU)


@triton.jit
def _deps(
    k, u, ngroups, nreq, NL: tl.constexpr, PER_LAYER: tl.constexpr, NRG: tl.constexpr,
    RS: tl.constexpr, NHG: tl.constexpr, NSPLIT: tl.constexpr, NLC: tl.constexpr,
    DKS: tl.constexpr, NO: tl.constexpr, T_QKVA: tl.constexpr, T_QKVN: tl.constexpr,
    T_QB: tl.constexpr, T_ABSORB: tl.constexpr, T_ATTN: tl.constexpr, T_COMB: tl.constexpr,
    T_UV: tl.constexpr, T_OPROJ: tl.constexpr, T_POST: tl.constexpr, T_GU: tl.constexpr,
    T_DOWN: tl.constexpr,
):  # fmt: skip
    """(first, count) of the items ticket (layer k, local u) waits for: spec.waits, and
    nothing for an item without work (a row group or request past the launch's). A row
    group has RS items in each row stage; one waits for all of its group's in the last."""
    base = k * PER_LAYER
    first = base + T_GU + (u - T_DOWN) // NO * ((T_DOWN - T_GU) // DKS)
    n = u * 0 + (T_DOWN - T_GU) // DKS  # down: its K part's gate_up row tiles
    if k == NL:  # the final norm of group u // RS: the last layer's post items (residual)
        first = base - PER_LAYER + T_POST + u // RS * RS
        n = (u // RS < ngroups).to(tl.int32) * RS
    elif u < T_QKVA:  # norm: the previous layer's post items of the group
        first = base - PER_LAYER + T_POST + u // RS * RS
        n = ((k > 0) & (u // RS < ngroups)).to(tl.int32) * RS
    elif u < T_QKVN:
        first = base
        n = u * 0 + NRG * RS
    elif u < T_QB:
        first = base + T_QKVA
        n = (u - T_QKVN < ngroups).to(tl.int32) * (T_QKVN - T_QKVA)
    elif u < T_ABSORB:
        first = base + T_QKVN
        n = u * 0 + NRG
    elif u < T_ATTN:
        first = base + T_QB
        n = u * 0 + (T_ABSORB - T_QB)
    elif u < T_COMB:  # attn: every absorb item (the block's cache entries came before)
        first = base + T_ABSORB
        n = ((u - T_ATTN) // (NHG * NSPLIT) < nreq).to(tl.int32) * (T_ATTN - T_ABSORB)
    elif u < T_UV:  # comb: its request and group's splits
        first = base + T_ATTN + (u - T_COMB) // NLC * NSPLIT
        n = ((u - T_COMB) // (NLC * NHG) < nreq).to(tl.int32) * NSPLIT
    elif u < T_OPROJ:  # uv: every comb item (each head's latent, every request's rows)
        first = base + T_COMB
        n = u * 0 + (T_UV - T_COMB)
    elif u < T_POST:
        first = base + T_UV
        n = u * 0 + (T_OPROJ - T_UV)
    elif u < T_GU:  # post: the group's norm items (the residual)
        first = base + (u - T_POST) // RS * RS
        n = ((u - T_POST) // RS < ngroups).to(tl.int32) * RS
    elif u < T_DOWN:
        first = base + T_POST
        n = u * 0 + NRG * RS
    return first, n


@triton.jit
def _gemv_tiles(
    w,
    x,
    row0,
    keep,
    dst,
    part,
    nrows,
    K: tl.constexpr,
    KP: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    DST_ROW: tl.constexpr,
    ROWSP: tl.constexpr,
    RPASS: tl.constexpr,
    STAGES: tl.constexpr,
    F32: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
):
    """dst[token, row] = W[row0 + i] . x[token] over K columns part x KP.. + KP, for the kept
    rows, the launch's ROWSP padded rows RPASS at a time (one pass over the weights up to
    64 rows): bf16 (as a bf16 GEMM leaves it; KP = K), or (F32) the part's fp32 sum into
    part `part` of ROWSP x DST_ROW (`dst`: the region's byte address)."""
    m = tl.arange(0, BN)
    for p in range(0, ROWSP // RPASS):
        if p * RPASS < nrows:
            acc = st.stream_rows(
                w, w, x + p * RPASS * K, row0, part * KP, KP // BK, K, BN, BK, RPASS, 0,
                STAGES, CPU, ASM,
            )  # fmt: skip
            tok = p * RPASS + tl.arange(0, RPASS)
            at = tok[None, :] * DST_ROW + (row0 + m)[:, None]
            live = keep[:, None] & (tok < nrows)[None, :]
            if F32:
                out = dst.to(tl.pointer_type(tl.float32)) + part * (ROWSP * DST_ROW)
                tl.store(out + at, acc, mask=live)
            else:
                tl.store(dst.to(tl.pointer_type(tl.bfloat16)) + at, _bf16(acc).to(tl.bfloat16),
                         mask=live)  # fmt: skip


@triton.jit
def _tile(i, ROWS: tl.constexpr, BN: tl.constexpr):
    """Item i's BN-row tile of a ROWS-row weight: (first row streamed, rows kept). The last
    tile ends at the last row and keeps only rows no earlier item kept."""
    first = i * BN
    r0 = tl.minimum(first, ROWS - BN)
    rows = r0 + tl.arange(0, BN)
    return r0, rows >= first


@triton.jit
def _push(peers, world, off, rows, nrows, acc, OC: tl.constexpr, q0, tag, HP: tl.constexpr):
    """Publish acc [OC columns, 16 tokens] (fp32, rounded to bf16 pairs) at pair
    off + token * HP + q0 + j of every rank's peer data, tokens `rows` < nrows."""
    lo, hi = tl.split(tl.reshape(tl.trans(acc), (acc.shape[1], OC // 2, 2)))
    q = q0 + tl.arange(0, OC // 2)
    for dst in range(world):
        pt.publish_value(
            pt.peer_data(peers, dst) + off + rows[:, None] * HP + q[None, :],
            pt.bf16x2_pack(lo, hi),
            tag,
            (rows < nrows)[:, None] & (q >= 0)[None, :],
            "sys",
        )


# Integer arguments that vary per launch or per rank: never specialized.
@triton.jit(do_not_specialize=["nreq", "bt_stride", "slot", "rank", "world"])
def drafter_kernel(
    embeds,
    positions,
    slot_mapping,
    block_table,
    seq_lens,
    out,
    table,
    final_norm,
    rope,
    scratch,
    nreq,
    bt_stride,
    slot,
    ctl,
    health,
    tickets,
    peers,
    rank,
    world,
    H: tl.constexpr,
    QL: tl.constexpr,
    L: tl.constexpr,
    R: tl.constexpr,
    P: tl.constexpr,
    V: tl.constexpr,
    NH: tl.constexpr,
    IL: tl.constexpr,
    Q: tl.constexpr,
    BS: tl.constexpr,
    KC: tl.constexpr,
    NL: tl.constexpr,
    ROWS: tl.constexpr,
    ROWSP: tl.constexpr,
    RPASS: tl.constexpr,
    TILES: tl.constexpr,
    MAXROWS: tl.constexpr,
    QA: tl.constexpr,
    QBN: tl.constexpr,
    LA: tl.constexpr,
    NLA: tl.constexpr,
    LC: tl.constexpr,
    NLC: tl.constexpr,
    VB: tl.constexpr,
    NVB: tl.constexpr,
    HG: tl.constexpr,
    NHG: tl.constexpr,
    QHR: tl.constexpr,
    RP: tl.constexpr,
    NSPLIT: tl.constexpr,
    QKS: tl.constexpr,
    GKS: tl.constexpr,
    DKS: tl.constexpr,
    NO: tl.constexpr,
    NSP2: tl.constexpr,
    PF: tl.constexpr,
    GPAIR: tl.constexpr,
    AST: tl.constexpr,
    CST: tl.constexpr,
    OC: tl.constexpr,
    GB: tl.constexpr,
    HK: tl.constexpr,
    QK: tl.constexpr,
    VK: tl.constexpr,
    IK: tl.constexpr,
    LK: tl.constexpr,
    RC: tl.constexpr,
    QC: tl.constexpr,
    RB: tl.constexpr,
    NRG: tl.constexpr,
    RS: tl.constexpr,
    W2: tl.constexpr,
    STAGES: tl.constexpr,
    PER_LAYER: tl.constexpr,
    T_QKVA: tl.constexpr,
    T_QKVN: tl.constexpr,
    T_QB: tl.constexpr,
    T_ABSORB: tl.constexpr,
    T_ATTN: tl.constexpr,
    T_COMB: tl.constexpr,
    T_UV: tl.constexpr,
    T_OPROJ: tl.constexpr,
    T_POST: tl.constexpr,
    T_GU: tl.constexpr,
    T_DOWN: tl.constexpr,
    T_FINAL: tl.constexpr,
    TOTAL: tl.constexpr,
    O_DONE: tl.constexpr,
    O_RES: tl.constexpr,
    O_XA: tl.constexpr,
    O_QKV: tl.constexpr,
    O_QC: tl.constexpr,
    O_Q: tl.constexpr,
    O_QLAT: tl.constexpr,
    O_QPE: tl.constexpr,
    O_PO: tl.constexpr,
    O_PM: tl.constexpr,
    O_PL: tl.constexpr,
    O_LAT: tl.constexpr,
    O_V: tl.constexpr,
    O_XM: tl.constexpr,
    O_MID: tl.constexpr,
    O_GUP: tl.constexpr,
    O_GCNT: tl.constexpr,
    O_DUP: tl.constexpr,
    O_DCNT: tl.constexpr,
    O_TOT: tl.constexpr,
    O_RSS: tl.constexpr,
    O_RCNT: tl.constexpr,
    P_AR1: tl.constexpr,
    P_AR2: tl.constexpr,
    R_AR1: tl.constexpr,
    R_AR2: tl.constexpr,
    R_ITEMS: tl.constexpr,
    EPS: tl.constexpr,
    SCALE: tl.constexpr,
    SITU: tl.constexpr,
    FP8: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
    TL: tl.constexpr,
    O_TL: tl.constexpr,
):
    tag0 = pt.step_tag(ctl, slot)
    counter = tickets + slot
    done = (scratch + O_DONE).to(tl.pointer_type(tl.int64))
    me = pt.peer_data(peers, rank)
    nrows = nreq * Q
    ngroups = (nrows + RB - 1) // RB  # row groups holding rows: the others have no work
    pt.fault_stall(ctl, peers, rank, world, CPU)
    # One ticket draw site, at the top of the loop (the loop leaves on the first ticket past
    # the last item). Two sites (a draw before the loop and one at its end) let LLVM merge
    # their counter resets into one block: the loop then has two entries, and ptxas leaves
    # the first draw's lane-0 atomic without a reconvergence point before the barrier that
    # broadcasts the ticket, so warp 0 reaches that barrier split and the warps' barriers
    # pair up one apart from then on (H200 at 2+ warps: garbage tickets, illegal addresses).
    more = nreq == nreq
    while more:
        t = pt.ticket_take(counter, TOTAL)
        more = t < TOTAL
        if more:
            if TL:
                t_begin = pt.clock(0, CPU)
                t_ready = t_begin
            k = (t // PER_LAYER).to(tl.int32)  # the layer; NL for the final norm's items
            u = t.to(tl.int32) - k * PER_LAYER
            lw = table + tl.minimum(k, NL - 1) * _NPTR
            tag = pt.step_tag(ctl, slot + k)  # layer k's pushes (spec: one slot a layer)
            first, n = _deps(
                k, u, ngroups, nreq, NL, PER_LAYER, NRG, RS, NHG, NSPLIT, NLC, DKS, NO, T_QKVA,
                T_QKVN, T_QB, T_ABSORB, T_ATTN, T_COMB, T_UV, T_OPROJ, T_POST, T_GU, T_DOWN,
            )  # fmt: skip
            # the item's weight rows, asked of L2 before its wait (NVIDIA; PF 2: only qkv_a's
            # and q_b's, spec.Plan.pf), unless its inputs are in already: then the requests
            # only queue ahead of its stream's (a later wave's gate_up and down items spent
            # 4-5 us before their first load, stop 57's timeline)
            ahead = u * 0 + 1
            if ASM and (not CPU) and (PF > 0):
                # (the look only where the stage prefetches: it costs a round trip before
                # the item's wait)
                pre = (k < NL) & (
                    ((u >= T_QKVA) & (u < T_QKVN))
                    | ((u >= T_QB) & (u < T_ABSORB))
                    | (
                        (PF == 1)
                        & (
                            ((u >= T_ABSORB) & (u < T_ATTN) & (P <= 128))
                            | ((u >= T_UV) & (u < T_POST))
                            | (u >= T_GU)
                        )
                    )
                )
                if pre:
                    ahead = dt.done_already(done, first, n, W2, tag0)
            if ahead == 0:
                if (k == NL) | (u < T_QKVA):
                    pass
                elif u < T_QKVN:
                    r0, _ = _tile((u - T_QKVA) // QKS, QL + L + R, QA)
                    c0 = ((u - T_QKVA) % QKS) * (H // QKS)
                    _prefetch(_ptr(lw, _W_QKVA, tl.bfloat16), r0, c0, H, H // QKS, QA, CPU, ASM)
                elif u < T_QB:
                    pass
                elif u < T_ABSORB:
                    r0, _ = _tile(u - T_QB, NH * (P + R), QBN)
                    _prefetch(_ptr(lw, _W_QB, tl.bfloat16), r0, 0, QL, QL, QBN, CPU, ASM)
                elif PF == 2:
                    pass
                elif u < T_ATTN:  # absorb: its head's W_UK rows (kv_b_proj's k_nope rows)
                    if P <= 128:  # (a prefetch's rows: one a thread at most)
                        r0 = (u - T_ABSORB) // NLA * (P + V)
                        c0 = (u - T_ABSORB) % NLA * LA
                        _prefetch(_ptr(lw, _W_KVB, tl.bfloat16), r0, c0, L, LA, P, CPU, ASM)
                elif (u >= T_UV) & (u < T_OPROJ):  # uv: its W_UV rows (kv_b_proj's v rows)
                    r0 = (u - T_UV) // NVB * (P + V) + P + (u - T_UV) % NVB * VB
                    _prefetch(_ptr(lw, _W_KVB, tl.bfloat16), r0, 0, L, L, VB, CPU, ASM)
                elif (u >= T_OPROJ) & (u < T_POST):
                    r0 = (u - T_OPROJ) * OC
                    _prefetch(_ptr(lw, _W_O, tl.bfloat16), r0, 0, NH * V, NH * V, OC, CPU, ASM)
                elif (u >= T_GU) & (u < T_DOWN):
                    r0 = (u - T_GU) // GKS * GB
                    c0 = ((u - T_GU) % GKS) * (H // GKS)
                    _prefetch(_ptr(lw, _W_GU, tl.bfloat16), r0, c0, H, H // GKS, GB, CPU, ASM)
                    _prefetch(_ptr(lw, _W_GU, tl.bfloat16), IL + r0, c0, H, H // GKS, GB, CPU, ASM)
                elif u >= T_DOWN:  # its K part's columns
                    r0 = (u - T_DOWN) % NO * OC
                    c0 = (u - T_DOWN) // NO * (IL // DKS)
                    _prefetch(_ptr(lw, _W_DOWN, tl.bfloat16), r0, c0, IL, IL // DKS, OC, CPU, ASM)
            if n > 0:
                # (mono_runtime's wait: an acquire load a pair where this kernel's own had
                # made an acquire add, a read-modify-write every waiter of a stage sent to
                # the same words)
                dt.wait_items(done, first, n, W2, tag0, ctl, health, peers, rank, world, R_ITEMS,
                              CPU)  # fmt: skip
                if TL:
                    t_ready = pt.clock(0, CPU)
            if (k == NL) | (u < T_QKVA) | ((u >= T_POST) & (u < T_GU)):
                # a row stage: norm, post or the final norm, item v of row group v // RS
                v = tl.where((k < NL) & (u >= T_POST), u - T_POST, u)
                g = v // RS
                if g < ngroups:
                    src = me + P_AR2 // 8  # norm and final: the MLP partials of layer k - 1
                    region = u * 0 + R_AR2
                    rtag = pt.step_tag(ctl, slot + k - 1)
                    w = _ptr(lw, _W_IN, tl.bfloat16)
                    dst = (scratch + O_XA).to(tl.pointer_type(tl.int32))
                    row = g * RB + tl.arange(0, RB)
                    zero = row < 0
                    if (k < NL) & (u >= T_POST):  # post: the o_proj partials of layer k
                        src = me + P_AR1 // 8
                        region = u * 0 + R_AR1
                        rtag = tag
                        w = _ptr(lw, _W_POST, tl.bfloat16)
                        dst = (scratch + O_XM).to(tl.pointer_type(tl.int32))
                    if k == NL:  # padding requests' rows come out 0
                        w = final_norm
                        dst = out
                        zero = tl.load(seq_lens + row // Q, mask=row < nrows, other=1) == 0
                    _row_item(
                        v, (k == 0) & (u < T_QKVA), embeds, w, src, region, dst, scratch, nrows,
                        zero, rtag, ctl, health, peers, rank, world, H, RC, RB, RS, MAXROWS,
                        O_RES, O_TOT, O_RSS, O_RCNT, EPS, CPU,
                    )  # fmt: skip
            elif u < T_QKVN:
                r0, keep = _tile((u - T_QKVA) // QKS, QL + L + R, QA)
                _gemv_tiles(
                    _ptr(lw, _W_QKVA, tl.bfloat16),
                    (scratch + O_XA).to(tl.pointer_type(tl.bfloat16)),
                    r0, keep, scratch + O_QKV, (u - T_QKVA) % QKS, nrows, H, H // QKS, QA, HK,
                    QL + L + R, ROWSP, RPASS, STAGES, QKS > 1, CPU, ASM,
                )  # fmt: skip
            elif u < T_QB:
                if u - T_QKVN < ngroups:
                    _qkvn(
                        u - T_QKVN, lw, positions, slot_mapping, rope, scratch, nrows,
                        QL, L, R, QC, RB, QKS, ROWSP, O_QKV, O_QC, EPS, FP8,
                    )  # fmt: skip
            elif u < T_ABSORB:
                r0, keep = _tile(u - T_QB, NH * (P + R), QBN)
                _gemv_tiles(
                    _ptr(lw, _W_QB, tl.bfloat16), (scratch + O_QC).to(tl.pointer_type(tl.bfloat16)),
                    r0, keep, scratch + O_Q, 0, nrows, QL, QL, QBN, QK, NH * (P + R), ROWSP,
                    RPASS, STAGES, False, CPU, ASM,
                )  # fmt: skip
            elif u < T_ATTN:
                _absorb(
                    (u - T_ABSORB) // NLA, (u - T_ABSORB) % NLA, lw, positions, rope, scratch,
                    nrows, L, R, P, V, NH, ROWSP, TILES, LA, RP, O_Q, O_QLAT, O_QPE, FP8, CPU,
                )  # fmt: skip
            elif u < T_COMB:
                i = u - T_ATTN
                if i // (NHG * NSPLIT) < nreq:
                    _attn(
                        i // (NHG * NSPLIT), (i // NSPLIT) % NHG, i % NSPLIT, lw, block_table,
                        seq_lens, scratch, bt_stride, L, R, Q, BS, KC, ROWSP, HG, NHG, QHR, RP,
                        NSPLIT, O_QLAT, O_QPE, O_PO, O_PM, O_PL, SCALE, FP8, AST, CPU,
                    )  # fmt: skip
            elif u < T_UV:
                rg = (u - T_COMB) // NLC  # its (request, head group)
                if rg // NHG < nreq:
                    _comb(
                        rg // NHG, rg % NHG, (u - T_COMB) % NLC, scratch, seq_lens, BS, L, Q,
                        ROWSP, LC, HG, NHG, QHR, NSPLIT, NSP2, O_PO, O_PM, O_PL, O_LAT, CST,
                    )  # fmt: skip
            elif u < T_OPROJ:
                _uv(
                    (u - T_UV) // NVB, (u - T_UV) % NVB, lw, scratch, nrows, L, P, V, NH, ROWSP,
                    RPASS, VB, LK, O_LAT, O_V, STAGES, CPU, ASM,
                )  # fmt: skip
            elif u < T_GU:  # oproj (post items are row stages)
                _project_push(
                    u - T_OPROJ, 0, _ptr(lw, _W_O, tl.bfloat16),
                    (scratch + O_V).to(tl.pointer_type(tl.bfloat16)), scratch, nrows, peers,
                    world, P_AR1 // 8 + rank * MAXROWS * (H // 2), tag, NH * V, VK, H, OC, 1,
                    ROWSP, RPASS, 0, 0, STAGES, CPU, ASM,
                )  # fmt: skip
            elif u < T_DOWN:
                _gu(
                    (u - T_GU) // GKS, (u - T_GU) % GKS, _ptr(lw, _W_GU, tl.bfloat16), scratch,
                    nrows, H, IL, GB, HK, GKS, ROWSP, RPASS, O_XM, O_MID, O_GUP, O_GCNT, SITU,
                    GPAIR, STAGES, CPU, ASM,
                )  # fmt: skip
            else:
                _project_push(
                    (u - T_DOWN) % NO, (u - T_DOWN) // NO, _ptr(lw, _W_DOWN, tl.bfloat16),
                    (scratch + O_MID).to(tl.pointer_type(tl.bfloat16)), scratch, nrows, peers,
                    world, P_AR2 // 8 + rank * MAXROWS * (H // 2), tag, IL, IK, H, OC, DKS,
                    ROWSP, RPASS, O_DUP, O_DCNT, STAGES, CPU, ASM,
                )  # fmt: skip
            if (k < NL) & ((u < T_OPROJ) | ((u >= T_POST) & (u < T_DOWN))):
                pt.ticket_finish(done, t, tag0)
            if TL:  # the item's (program, ticket, start, ready, end, mark)
                stamps = (scratch + O_TL).to(tl.pointer_type(tl.int64))
                dt.stamp_item(stamps, t, t_begin, t_ready, dt.NO_MARK, CPU)


# -- the stages, in ticket order ---------------------------------------------------------


@triton.jit
def _lanes(g, c, nrows, H: tl.constexpr, RB: tl.constexpr, RC: tl.constexpr):
    """Row group g's rows and pair columns of chunk c, as one 1-D block of RB x RC / 2 lanes
    (polls take 1-D blocks): (row, pair column, live) of each lane; a lane is live on a
    launch's row and inside the row (the last chunk of a row not a power of two is not)."""
    f = tl.arange(0, RB * (RC // 2))
    row = g * RB + f // (RC // 2)
    p = c * (RC // 2) + f % (RC // 2)
    return row, p, (row < nrows) & (p < H // 2)


@triton.jit
def _per_row(x, RB: tl.constexpr, RC: tl.constexpr):
    """Lane values [RB x RC / 2] summed per row -> [RB]."""
    return tl.sum(tl.reshape(x, (RB, RC // 2)), 1)


@triton.jit
def _store_tot(
    scratch, row, p, lo, hi, live, H: tl.constexpr, RB: tl.constexpr, RC: tl.constexpr,
    O_TOT: tl.constexpr,
):  # fmt: skip
    """Keep a norm's fp32 input for its second pass; each row's sum of squares."""
    tot = (scratch + O_TOT).to(tl.pointer_type(tl.float32)) + row * H + 2 * p
    tl.store(tot, lo, mask=live)
    tl.store(tot + 1, hi, mask=live)
    return _per_row(tl.where(live, lo * lo + hi * hi, 0.0), RB, RC)


@triton.jit
def _normed_inputs(
    g, c, w, scratch, nrows, H: tl.constexpr, RC: tl.constexpr, RB: tl.constexpr,
    O_TOT: tl.constexpr,
):  # fmt: skip
    """Chunk c of row group g's norm input (fp32 pairs, from L2) and weight (0 past the
    row: a chunk past the last loads nothing)."""
    row, p, live = _lanes(g, c, nrows, H, RB, RC)
    tot = (scratch + O_TOT).to(tl.pointer_type(tl.float32)) + row * H + 2 * p
    lo = tl.load(tot, mask=live, other=0.0, cache_modifier=".cg")
    hi = tl.load(tot + 1, mask=live, other=0.0, cache_modifier=".cg")
    wl = tl.load(w + 2 * p, mask=live, other=0.0).to(tl.float32)
    wh = tl.load(w + 2 * p + 1, mask=live, other=0.0).to(tl.float32)
    return lo, hi, wl, wh


@triton.jit
def _normed_store(
    g, w, dst, scratch, nrows, ss, zero, H: tl.constexpr, RC: tl.constexpr,
    RB: tl.constexpr, O_TOT: tl.constexpr, EPS,
):  # fmt: skip
    """Second pass of a row norm (`ir.ops.rms_norm`): each row's fp32 values (tot) times
    rstd, rounded to bf16, times the weight (a bf16 product) -> dst pairs (0 on rows
    where `zero`, [RB] per row). The next chunk's loads are issued before this chunk's
    store: one memory latency for the pass, not one a chunk."""
    tl.debug_barrier()
    rstd = 1.0 / tl.sqrt_rn(ss / H + EPS)
    r = tl.reshape(tl.broadcast_to(rstd[:, None], (RB, RC // 2)), (RB * (RC // 2),))
    z = tl.reshape(tl.broadcast_to(zero[:, None], (RB, RC // 2)), (RB * (RC // 2),))
    lo, hi, wl, wh = _normed_inputs(g, 0, w, scratch, nrows, H, RC, RB, O_TOT)
    for c in range(0, (H + RC - 1) // RC):
        nlo, nhi, nwl, nwh = _normed_inputs(g, c + 1, w, scratch, nrows, H, RC, RB, O_TOT)
        row, p, live = _lanes(g, c, nrows, H, RB, RC)
        packed = pt.bf16x2_pack(_bf16(lo * r) * wl, _bf16(hi * r) * wh)
        tl.store(dst + row * (H // 2) + p, tl.where(z, 0, packed), mask=live)
        lo, hi, wl, wh = nlo, nhi, nwl, nwh


@triton.jit
def _embed_chunk(
    g, c, embeds, scratch, nrows, H: tl.constexpr, RC: tl.constexpr, RB: tl.constexpr,
    O_RES: tl.constexpr, O_TOT: tl.constexpr,
):  # fmt: skip
    """Layer 0, row group g, chunk c: the embedding is the residual; its sum of squares."""
    row, p, live = _lanes(g, c, nrows, H, RB, RC)
    e = tl.load(embeds + row * (H // 2) + p, mask=live, other=0)
    tl.store((scratch + O_RES).to(tl.pointer_type(tl.int32)) + row * (H // 2) + p, e, mask=live)
    return _store_tot(
        scratch, row, p, pt.bf16x2_lo(e), pt.bf16x2_hi(e), live, H, RB, RC, O_TOT
    )  # fmt: skip


@triton.jit
def _add_chunk(
    g, c, src, region, scratch, nrows, tag, ctl, health, peers, rank, world,
    H: tl.constexpr, RC: tl.constexpr, RB: tl.constexpr, MAXROWS: tl.constexpr,
    O_RES: tl.constexpr, O_TOT: tl.constexpr, CPU: tl.constexpr,
):  # fmt: skip
    """Row group g, chunk c (`fused_allreduce_rms_norm`'s first pass): the ranks' bf16 pairs
    at `src` (peer region `region`, tagged `tag`) summed in rank order -> bf16, plus the
    residual in fp32 (poisoned where a wait gave up) -> the new residual (bf16) and the
    norm's fp32 input; its sum of squares. The residual is loaded before the polls (the
    item's wait made it visible), so its latency passes while they spin."""
    row, p, live = _lanes(g, c, nrows, H, RB, RC)
    res = (scratch + O_RES).to(tl.pointer_type(tl.int32)) + row * (H // 2) + p
    old = tl.load(res, mask=live, other=0)
    lo, hi, ok = pt.reduce_bf16x2(
        src + row * (H // 2) + p, MAXROWS * (H // 2), live, tag, ctl, health, peers, rank,
        world, region, g * RB * (H // 2) + c * (RC // 2), CPU,
    )  # fmt: skip
    lo = tl.where(ok, _bf16(lo) + pt.bf16x2_lo(old), float("nan"))
    hi = tl.where(ok, _bf16(hi) + pt.bf16x2_hi(old), float("nan"))
    tl.store(res, pt.bf16x2_pack(lo, hi), mask=live)
    return _store_tot(scratch, row, p, lo, hi, live, H, RB, RC, O_TOT)


@triton.jit
def _row_item(
    v, layer0, embeds, w, src, region, dst, scratch, nrows, zero, tag, ctl, health, peers,
    rank, world, H: tl.constexpr, RC: tl.constexpr, RB: tl.constexpr, RS: tl.constexpr,
    MAXROWS: tl.constexpr, O_RES: tl.constexpr, O_TOT: tl.constexpr, O_RSS: tl.constexpr,
    O_RCNT: tl.constexpr, EPS: tl.constexpr, CPU: tl.constexpr,
):  # fmt: skip
    """Row item v of a row stage: row group v // RS's all-reduce (or, in layer 0, its
    embedding) plus residual, then its RMSNorm with `w` -> dst pairs (0 on rows where
    `zero`). RS = 1: the whole row, chunk by chunk, then the second pass. Else chunk v % RS
    alone; the group's last chunk item to finish sums the chunks' squares in chunk order
    (the same sum as one item's) and makes the second pass for the whole row."""
    g = v // RS
    NCH: tl.constexpr = (H + RC - 1) // RC
    ss = tl.zeros((RB,), tl.float32)
    for c in range(v % RS, v % RS + NCH // RS):  # every chunk (RS = 1) or chunk v % RS
        if layer0:
            ss += _embed_chunk(g, c, embeds, scratch, nrows, H, RC, RB, O_RES, O_TOT)
        else:
            ss += _add_chunk(
                g, c, src, region, scratch, nrows, tag, ctl, health, peers, rank, world, H,
                RC, RB, MAXROWS, O_RES, O_TOT, CPU,
            )  # fmt: skip
    last = v == v
    if RS > 1:
        rss = (scratch + O_RSS).to(tl.pointer_type(tl.float32)) + g * (RS * RB)
        tl.store(rss + (v % RS) * RB + tl.arange(0, RB), ss)
        last = dt.last_arrival((scratch + O_RCNT).to(tl.pointer_type(tl.int32)) + g, RS)
        if last:
            ss = dt.sum_parts(rss + tl.arange(0, RB), RS, RB, tl.arange(0, RB) < RB)
    if last:
        _normed_store(g, w, dst, scratch, nrows, ss, zero, H, RC, RB, O_TOT, EPS)


@triton.jit
def _qkv(qkv, at, live, QKS: tl.constexpr, PART: tl.constexpr):
    """fused_qkv_a's output at element offsets `at` of its region (byte address `qkv`), as
    fp32 of a bf16 (0 where not `live`): the bf16 region's, or its QKS fp32 K parts (PART
    elements apart) summed in part order, rounded to bf16."""
    if QKS == 1:
        return tl.load(qkv.to(tl.pointer_type(tl.bfloat16)) + at, mask=live, other=0.0).to(
            tl.float32
        )
    else:
        return _bf16(dt.sum_parts(qkv.to(tl.pointer_type(tl.float32)) + at, QKS, PART, live))


@triton.jit
def _qkvn(
    g, lw, positions, slot_mapping, rope, scratch, nrows, QL: tl.constexpr, L: tl.constexpr,
    R: tl.constexpr, QC: tl.constexpr, RB: tl.constexpr, QKS: tl.constexpr,
    ROWSP: tl.constexpr, O_QKV: tl.constexpr, O_QC: tl.constexpr, EPS: tl.constexpr,
    FP8: tl.constexpr,
):  # fmt: skip
    """Row group g: q_a_layernorm of q_c -> qc; kv_a_layernorm of kv_c and GPT-J RoPE of
    k_pe (fp32 table, fp32 math) -> the layer's cache entry at each row's slot, none for a
    negative slot (`fused_q_kv_rmsnorm` rounds once; an fp8 cache stores e4m3 of
    x / k_scale). Every load is issued before the first store, q_c whole (QC columns, the
    last masked) and kept in registers between the norm's two passes: one memory latency
    where q_c in 512-column chunks, read twice, took six in sequence (stop 54: 4.4 us)."""
    row = g * RB + tl.arange(0, RB)
    live = row < nrows
    src = row[:, None] * (QL + L + R)  # the rows' elements in qkv (`_qkv`)
    qkv = scratch + O_QKV
    PART: tl.constexpr = ROWSP * (QL + L + R)
    qi = tl.arange(0, QC)[None, :]
    qm = qi < QL
    x = _qkv(qkv, src + qi, qm, QKS, PART)
    li = tl.arange(0, L)[None, :]
    kv = _qkv(qkv, src + QL + li, li < L, QKS, PART)
    j = tl.arange(0, R // 2)[None, :]
    e = _qkv(qkv, src + QL + L + 2 * j, j < R, QKS, PART)
    o = _qkv(qkv, src + QL + L + 2 * j + 1, j < R, QKS, PART)
    pos = tl.load(positions + row, mask=live, other=0)[:, None]
    cos = tl.load(rope + pos * R + j)
    sin = tl.load(rope + pos * R + R // 2 + j)
    dst = tl.load(slot_mapping + row, mask=live, other=-1)
    qw = tl.load(_ptr(lw, _W_QALN, tl.bfloat16) + qi, mask=qm, other=0.0).to(tl.float32)
    kw = tl.load(_ptr(lw, _W_KVALN, tl.bfloat16) + li).to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, 1) / QL + EPS)
    qc = (scratch + O_QC).to(tl.pointer_type(tl.bfloat16)) + row[:, None] * QL
    tl.store(qc + qi, _bf16(x * rstd[:, None] * qw).to(tl.bfloat16), mask=live[:, None] & qm)
    kstd = 1.0 / tl.sqrt_rn(tl.sum(kv * kv, 1) / L + EPS)
    kv = _bf16(kv * kstd[:, None] * kw)
    pe_e = _bf16(e * cos - o * sin)
    pe_o = _bf16(o * cos + e * sin)
    m = (dst >= 0)[:, None]
    at = dst[:, None] * (L + R)
    if FP8:
        ks = 1.0 / tl.load(_ptr(lw, _W_KS, tl.float32))
        cache = _ptr(lw, _W_CACHE, tl.uint8) + at
        tl.store(cache + li, _fp8_bits(kv * ks).to(tl.uint8), mask=m)
        tl.store(cache + L + 2 * j, _fp8_bits(pe_e * ks).to(tl.uint8), mask=m)
        tl.store(cache + L + 2 * j + 1, _fp8_bits(pe_o * ks).to(tl.uint8), mask=m)
    else:
        cache = _ptr(lw, _W_CACHE, tl.bfloat16) + at
        tl.store(cache + li, kv.to(tl.bfloat16), mask=m)
        tl.store(cache + L + 2 * j, pe_e.to(tl.bfloat16), mask=m)
        tl.store(cache + L + 2 * j + 1, pe_o.to(tl.bfloat16), mask=m)


@triton.jit
def _absorb(
    h, c, lw, positions, rope, scratch, nrows, L: tl.constexpr, R: tl.constexpr,
    P: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, ROWSP: tl.constexpr,
    TILES: tl.constexpr, LA: tl.constexpr, RP: tl.constexpr, O_Q: tl.constexpr,
    O_QLAT: tl.constexpr, O_QPE: tl.constexpr, FP8: tl.constexpr, CPU: tl.constexpr,
):  # fmt: skip
    """Head h, latent columns [c LA, (c + 1) LA): q_nope @ W_UK (kv_b_proj's k_nope rows,
    read transposed: the latent columns are the dot's wide side) -> qlat; chunk 0 also ropes
    q_pe -> qpe (columns past R zero). An fp8 cache sends both through e4m3 and back."""
    lcol = c * LA + tl.arange(0, LA)
    pi = tl.arange(0, P)
    kvb = _ptr(lw, _W_KVB, tl.bfloat16)
    wt = tl.load(kvb + (h * (P + V) + pi)[None, :] * L + lcol[:, None])  # [LA, P]
    qs = 1.0
    if FP8:
        qs = tl.load(_ptr(lw, _W_QS, tl.float32))
    q = (scratch + O_Q).to(tl.pointer_type(tl.bfloat16))
    qlat = (scratch + O_QLAT).to(tl.pointer_type(tl.bfloat16)) + h * ROWSP * L
    n = tl.arange(0, 16)
    for tt in range(0, TILES):
        if tt * 16 < nrows:
            tok = tt * 16 + n
            xt = tl.load(q + tok[None, :] * (NH * (P + R)) + h * (P + R) + pi[:, None])  # [P, 16]
            acc = _bf16(_dot(wt, xt, tl.zeros((LA, xt.shape[1]), tl.float32), CPU))
            if FP8:
                acc = _fp8_trip(acc, qs)
            tl.store(
                qlat + tok[None, :] * L + lcol[:, None],
                acc.to(tl.bfloat16),
                mask=(tok < nrows)[None, :],
            )
            if c == 0:
                j = tl.arange(0, RP // 2)
                jm = (j < R // 2)[None, :]
                pos = tl.load(positions + tok, mask=tok < nrows, other=0)
                src = q + tok[:, None] * (NH * (P + R)) + h * (P + R) + P
                e = tl.load(src + 2 * j[None, :], mask=jm, other=0.0).to(tl.float32)
                o = tl.load(src + 2 * j[None, :] + 1, mask=jm, other=0.0).to(tl.float32)
                cos = tl.load(rope + pos[:, None] * R + j[None, :], mask=jm, other=0.0)
                sin = tl.load(rope + pos[:, None] * R + R // 2 + j[None, :], mask=jm, other=0.0)
                re = _bf16(e * cos - o * sin)
                ro = _bf16(o * cos + e * sin)
                if FP8:
                    re = _fp8_trip(re, qs)
                    ro = _fp8_trip(ro, qs)
                qpe = (scratch + O_QPE).to(tl.pointer_type(tl.bfloat16)) + h * ROWSP * RP
                m = (tok < nrows)[:, None]
                tl.store(qpe + tok[:, None] * RP + 2 * j[None, :], re.to(tl.bfloat16), mask=m)
                tl.store(qpe + tok[:, None] * RP + 2 * j[None, :] + 1, ro.to(tl.bfloat16), mask=m)


@triton.jit
def _entries(cache, slots, valid, col0, cols, ncols, ks, FP8: tl.constexpr, ENTRY: tl.constexpr):
    """bf16 cache entries [len(slots), len(cols)] (rows past `valid`, columns past `ncols`
    zero); an fp8 entry is (e4m3 -> fp32) x k_scale -> bf16, as TRITON_MLA reads it."""
    m = valid[:, None] & (cols < ncols)[None, :]
    off = slots[:, None] * ENTRY + col0 + cols[None, :]
    if FP8:
        x = tl.load(cache.to(tl.pointer_type(tl.uint8)) + off, mask=m, other=0).to(tl.int32)
        return tl.where(m, _bf16(_fp8_value(x) * ks), 0.0).to(tl.bfloat16)
    return tl.load(cache.to(tl.pointer_type(tl.bfloat16)) + off, mask=m, other=0.0)


@triton.jit
def _split_pages(seq, j, BS: tl.constexpr, NSPLIT: tl.constexpr):
    """Split j's share of a request's KV pages (seq cached positions): pages p0..p1-1."""
    pages = (seq + BS - 1) // BS
    per = (pages + NSPLIT - 1) // NSPLIT
    p0 = j * per
    return p0, tl.minimum(p0 + per, pages)


@triton.jit
def _live_splits(seq, BS: tl.constexpr, NSPLIT: tl.constexpr):
    """How many of `_split_pages`' splits hold a page (the first ones; 0 at seq 0)."""
    pages = (seq + BS - 1) // BS
    per = tl.maximum((pages + NSPLIT - 1) // NSPLIT, 1)
    return (pages + per - 1) // per


@triton.jit
def _attn(
    r, g, j, lw, block_table, seq_lens, scratch, bt_stride, L: tl.constexpr,
    R: tl.constexpr, Q: tl.constexpr, BS: tl.constexpr, KC: tl.constexpr,
    ROWSP: tl.constexpr, HG: tl.constexpr, NHG: tl.constexpr, QHR: tl.constexpr,
    RP: tl.constexpr, NSPLIT: tl.constexpr, O_QLAT: tl.constexpr, O_QPE: tl.constexpr,
    O_PO: tl.constexpr, O_PM: tl.constexpr, O_PL: tl.constexpr, SCALE: tl.constexpr,
    FP8: tl.constexpr, AST: tl.constexpr, CPU: tl.constexpr,
):  # fmt: skip
    """Request r, head group g, split j: the group's query rows (HG heads x Q tokens) over
    the split's share of the request's KV pages (non-causal: every row reads positions
    0..seq_len-1), online softmax in fp32; the PV dot takes each probability as the sum
    of two bf16 parts (the reference's fp32 probabilities to ~2^-17; the stock kernel
    rounds them once). -> (unnormalized output, max, sum) of the split."""
    i = tl.arange(0, QHR)
    qm = i < HG * Q
    head = g * HG + i // Q
    li = tl.arange(0, L)
    ri = tl.arange(0, RP)
    seq = tl.load(seq_lens + r)
    tok = r * Q + i % Q
    qlat = (scratch + O_QLAT).to(tl.pointer_type(tl.bfloat16))
    qpe = (scratch + O_QPE).to(tl.pointer_type(tl.bfloat16))
    ql = tl.load(
        qlat + (head * ROWSP + tok)[:, None] * L + li[None, :], mask=qm[:, None], other=0.0
    )
    qp = tl.load(
        qpe + (head * ROWSP + tok)[:, None] * RP + ri[None, :], mask=qm[:, None], other=0.0
    )
    p0, p1 = _split_pages(seq, j, BS, NSPLIT)
    cache = _ptr(lw, _W_CACHE, tl.int8)
    ks = 1.0
    if FP8:
        ks = tl.load(_ptr(lw, _W_KS, tl.float32))
    e = tl.arange(0, KC)
    m = tl.full((QHR,), float("-inf"), tl.float32)
    lsum = tl.zeros((QHR,), tl.float32)
    acc = tl.zeros((QHR, L), tl.float32)
    # KC entries of a page a trip; AST > 1: the next trips' block-table entries and rows
    # are loaded while this one's dots run
    for ch in tl.range(p0 * (BS // KC), p1 * (BS // KC), num_stages=AST):
        pg = ch // (BS // KC)
        blk = tl.load(block_table + r * bt_stride + pg).to(tl.int64)
        pos = ch * KC + e
        valid = pos < seq
        slots = blk * BS + (pos - pg * BS)
        kl = _entries(cache, slots, valid, 0, li, L, ks, FP8, L + R)  # [KC, L]
        kp = _entries(cache, slots, valid, L, ri, R, ks, FP8, L + R)  # [KC, RP]
        s = _dot(ql, tl.trans(kl), tl.zeros((QHR, KC), tl.float32), CPU)
        s = _dot(qp, tl.trans(kp), s, CPU) * SCALE
        s = tl.where(valid[None, :], s, float("-inf"))
        mn = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - mn)
        pr = tl.exp(s - mn[:, None])
        lsum = lsum * alpha + tl.sum(pr, 1)
        hi = _bf16(pr)  # p as two bf16 parts: the PV dot keeps ~16 bits of each probability
        acc = _dot(_bf16(pr - hi), kl, _dot(hi, kl, acc * alpha[:, None], CPU), CPU)
        m = mn
    part = (r * NHG + g) * NSPLIT + j
    tl.store((scratch + O_PO).to(tl.pointer_type(tl.float32)) + (part * QHR + i)[:, None] * L
             + li[None, :], acc)  # fmt: skip
    tl.store((scratch + O_PM).to(tl.pointer_type(tl.float32)) + part * QHR + i, m)
    tl.store((scratch + O_PL).to(tl.pointer_type(tl.float32)) + part * QHR + i, lsum)


@triton.jit
def _comb(
    r, g, c, scratch, seq_lens, BS: tl.constexpr, L: tl.constexpr, Q: tl.constexpr,
    ROWSP: tl.constexpr, LC: tl.constexpr, HG: tl.constexpr, NHG: tl.constexpr,
    QHR: tl.constexpr, NSPLIT: tl.constexpr, NSP2: tl.constexpr, O_PO: tl.constexpr,
    O_PM: tl.constexpr, O_PL: tl.constexpr, O_LAT: tl.constexpr, CST: tl.constexpr,
):  # fmt: skip
    """Request r, head group g, latent columns [c LC, (c + 1) LC): the splits' partials
    merged in a fixed order (a padding request's rows, seq_len 0, come out 0) -> latent
    (bf16). Only the splits that hold pages are read (the others weigh 0), two a trip: a
    chunk's loads in flight together, where the whole latent's [16, 512] fp32 tile was one
    serial 32 KB load a split (stop 54, H100: 21.8 us a comb item)."""
    i = tl.arange(0, QHR)
    li = c * LC + tl.arange(0, LC)
    js = tl.arange(0, NSP2)
    part0 = (r * NHG + g) * NSPLIT
    # the splits' max and sum at once, [NSP2, QHR] (a split past NSPLIT weighs 0); L2 loads
    # (.cg: this SM may hold an earlier layer's lines in L1)
    sp = (part0 + js)[:, None] * QHR + i[None, :]
    live = (js < NSPLIT)[:, None]
    pm = (scratch + O_PM).to(tl.pointer_type(tl.float32)) + sp
    pl = (scratch + O_PL).to(tl.pointer_type(tl.float32)) + sp
    mjs = tl.load(pm, mask=live, other=float("-inf"), cache_modifier=".cg")
    big = tl.max(mjs, 0)
    wjs = tl.where(mjs == float("-inf"), 0.0, tl.exp(mjs - big[None, :]))
    lsum = tl.sum(wjs * tl.load(pl, mask=live, other=0.0, cache_modifier=".cg"), 0)
    po = (scratch + O_PO).to(tl.pointer_type(tl.float32)) + (part0 * QHR + i)[:, None] * L
    pmj = (scratch + O_PM).to(tl.pointer_type(tl.float32)) + (part0 * QHR + i)[:, None]
    top = big[:, None]
    acc = tl.zeros((QHR, LC), tl.float32)
    nlive = _live_splits(tl.load(seq_lens + r), BS, NSPLIT)
    # splits j, j + 1 (weight 0 past nlive), each split's weight from its own max, loaded
    # beside its partial: picking it out of `wjs` took a cross-warp sum (8 barriers a trip)
    for j in tl.range(0, nlive, 2, num_stages=CST):
        m0 = tl.load(pmj + j * QHR, cache_modifier=".cg")
        m1 = tl.load(pmj + (j + 1) * QHR, mask=j + 1 < nlive, other=float("-inf"),
                     cache_modifier=".cg")  # fmt: skip
        x0 = tl.load(po + j * QHR * L + li[None, :], cache_modifier=".cg")
        x1 = tl.load(po + (j + 1) * QHR * L + li[None, :], mask=j + 1 < nlive, other=0.0,
                     cache_modifier=".cg")  # fmt: skip
        acc += tl.where(m0 == float("-inf"), 0.0, tl.exp(m0 - top)) * x0
        acc += tl.where(m1 == float("-inf"), 0.0, tl.exp(m1 - top)) * x1
    lat = tl.where(lsum[:, None] > 0, acc / lsum[:, None], 0.0)
    head = g * HG + i // Q
    tok = r * Q + i % Q
    latp = (scratch + O_LAT).to(tl.pointer_type(tl.bfloat16))
    tl.store(
        latp + (head * ROWSP + tok)[:, None] * L + li[None, :],
        _bf16(lat).to(tl.bfloat16),
        mask=(i < HG * Q)[:, None],
    )


@triton.jit
def _uv(
    h, c, lw, scratch, nrows, L: tl.constexpr, P: tl.constexpr, V: tl.constexpr,
    NH: tl.constexpr, ROWSP: tl.constexpr, RPASS: tl.constexpr, VB: tl.constexpr,
    LK: tl.constexpr, O_LAT: tl.constexpr, O_V: tl.constexpr, STAGES: tl.constexpr,
    CPU: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """Head h, v columns [c VB, (c + 1) VB): every row's latent @ W_UV (kv_b_proj's v rows,
    the dot's wide side) -> v (bf16), RPASS rows a pass over the weights."""
    kvb = _ptr(lw, _W_KVB, tl.bfloat16)
    lat = (scratch + O_LAT).to(tl.pointer_type(tl.bfloat16)) + h * ROWSP * L
    vp = (scratch + O_V).to(tl.pointer_type(tl.bfloat16))
    m = h * V + c * VB + tl.arange(0, VB)
    for p in range(0, ROWSP // RPASS):
        if p * RPASS < nrows:
            vh = st.stream_rows(
                kvb, kvb, lat + p * RPASS * L, h * (P + V) + P + c * VB, 0, L // LK, L, VB,
                LK, RPASS, 0, STAGES, CPU, ASM,
            )  # fmt: skip
            tok = p * RPASS + tl.arange(0, RPASS)
            tl.store(
                vp + tok[None, :] * (NH * V) + m[:, None],
                _bf16(vh).to(tl.bfloat16),
                mask=(tok < nrows)[None, :],
            )


@triton.jit
def _project_push(
    i, part, w, x, scratch, nrows, peers, world, off, tag, K: tl.constexpr, BK: tl.constexpr,
    H: tl.constexpr, OC: tl.constexpr, PARTS: tl.constexpr, ROWSP: tl.constexpr,
    RPASS: tl.constexpr, O_BUF: tl.constexpr, O_CNT: tl.constexpr, STAGES: tl.constexpr,
    CPU: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """OC output columns of a row-parallel projection (o_proj, down_proj) over the launch's
    ROWSP padded rows, RPASS a pass over the weights, over K part `part` of PARTS: this
    rank's bf16 partial -> every rank's reduction region (pairs at `off`), pushed by the
    part that finishes last with the parts' fp32 sums in part order (dt.split_k; the
    parts at O_BUF, their counts at O_CNT)."""
    KP: tl.constexpr = K // PARTS
    NP: tl.constexpr = ROWSP // RPASS
    for p in range(0, NP):
        if p * RPASS < nrows:
            acc = st.stream_rows(w, w, x + p * RPASS * K, i * OC, part * KP, KP // BK, K, OC,
                                 BK, RPASS, 0, STAGES, CPU, ASM)  # fmt: skip
            j = i * NP + p  # the (column block, pass)'s K parts and their count
            buf = (scratch + O_BUF).to(tl.pointer_type(tl.float32)) + j * (PARTS * OC * RPASS)
            cnt = (scratch + O_CNT).to(tl.pointer_type(tl.int32)) + j
            last, acc = dt.split_k(acc, buf, cnt, part, PARTS, OC, RPASS)
            if last:
                tok = p * RPASS + tl.arange(0, RPASS)
                _push(peers, world, off, tok, nrows, acc, OC, i * (OC // 2), tag, H // 2)


@triton.jit
def _gu(
    i, part, w, scratch, nrows, H: tl.constexpr, IL: tl.constexpr, GB: tl.constexpr,
    HK: tl.constexpr, GKS: tl.constexpr, ROWSP: tl.constexpr, RPASS: tl.constexpr,
    O_XM: tl.constexpr, O_MID: tl.constexpr, O_GUP: tl.constexpr, O_GCNT: tl.constexpr,
    SITU: tl.constexpr, GPAIR: tl.constexpr, STAGES: tl.constexpr, CPU: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    """GB gate + GB up rows of gate_up_proj over K part `part` of GKS; in the part that
    finishes last (all of them with one part) the sums as bf16 (as its GEMM leaves them),
    SiluAndMul or SituAndMul (beta 1, up unclipped) in fp32 -> mid (bf16)."""
    KP: tl.constexpr = H // GKS
    x = (scratch + O_XM).to(tl.pointer_type(tl.bfloat16))
    mid = (scratch + O_MID).to(tl.pointer_type(tl.bfloat16))
    m = tl.arange(0, GB)
    NP: tl.constexpr = ROWSP // RPASS
    for p in range(0, NP):
        if p * RPASS < nrows:
            xp = x + p * RPASS * H
            if GPAIR:
                g, u = st.stream_row_pair(w, w, xp, i * GB, IL + i * GB, part * KP, KP // HK, H,
                                          GB, HK, RPASS, 0, STAGES, CPU, ASM,
                                          GPAIR == 2)  # fmt: skip
            else:
                g = st.stream_rows(w, w, xp, i * GB, part * KP, KP // HK, H, GB, HK, RPASS, 0,
                                   STAGES, CPU, ASM)  # fmt: skip
                u = st.stream_rows(w, w, xp, IL + i * GB, part * KP, KP // HK, H, GB, HK, RPASS,
                                   0, STAGES, CPU, ASM)  # fmt: skip
            j = i * NP + p  # the (row tile, pass)'s K parts and their count
            buf = (scratch + O_GUP).to(tl.pointer_type(tl.float32)) + j * (GKS * 2 * GB * RPASS)
            cnt = (scratch + O_GCNT).to(tl.pointer_type(tl.int32)) + j
            last, g, u = dt.split_k_pair(g, u, buf, cnt, part, GKS, GB, RPASS)
            if last:
                g = _bf16(g)
                u = _bf16(u)
                if SITU:
                    e = tl.exp(-2.0 * tl.abs(g))
                    th = (1.0 - e) / (1.0 + e)
                    a = tl.where(g < 0, -th, th) * tl.sigmoid(g) * u
                else:
                    a = g * tl.sigmoid(g) * u
                tok = p * RPASS + tl.arange(0, RPASS)
                tl.store(
                    mid + tok[None, :] * IL + (i * GB + m)[:, None],
                    _bf16(a).to(tl.bfloat16),
                    mask=(tok < nrows)[None, :],
                )


# -- host side ---------------------------------------------------------------------------

REGIONS = {name: region_id(f"drafter.{name}") for name in ("ar1", "ar2", "items")}

LAUNCH_ARGS = (
    "embeds", "positions", "slot_mapping", "block_table", "seq_lens", "out", "table",
    "final_norm", "rope", "scratch", "nreq", "bt_stride", "slot", "ctl", "health", "tickets",
    "peers", "rank", "world",
)  # fmt: skip


def constexprs(b: DrafterBuild, cpu: bool, asm: bool = True) -> dict:
    """The kernel's compile-time arguments for build `b` (`asm`: NVIDIA inline PTX)."""
    c, p = b.cfg, b.plan
    sl, pl, ls = scratch_layout(b), peer_layout(c), layer_starts(b)
    return dict(
        H=c.hidden_size,
        QL=c.q_lora_rank,
        L=c.kv_lora_rank,
        R=c.qk_rope_head_dim,
        P=c.qk_nope_head_dim,
        V=c.v_head_dim,
        NH=c.local_heads,
        IL=c.local_intermediate,
        Q=c.query_len,
        BS=c.block_size,
        KC=p.kc,
        NL=c.num_hidden_layers,
        ROWS=b.rows,
        ROWSP=b.tiles * spec.TILE,
        RPASS=b.pass_rows,
        TILES=b.tiles,
        MAXROWS=MAX_REQUESTS * c.query_len,
        QA=p.qa,
        QBN=p.qbn,
        LA=p.la,
        NLA=p.nla,
        LC=p.lc,
        NLC=p.nlc,
        VB=p.vb,
        NVB=p.nvb,
        HG=p.hg,
        NHG=p.nhg,
        QHR=p.qhr,
        RP=p.rp,
        NSPLIT=p.nsplit,
        QKS=p.qks,
        GKS=p.gks,
        DKS=p.dks,
        NO=p.no,
        NSP2=p2(p.nsplit),
        PF=p.pf,
        GPAIR=p.gpair,
        AST=p.ast,
        CST=p.cst,
        OC=p.oc,
        GB=p.gb,
        HK=p.hk,
        QK=p.qk,
        VK=p.vk,
        IK=p.ik,
        LK=p.lk,
        RC=p.rc,
        QC=p.qc,
        RB=p.rb,
        NRG=b.rows // p.rb,
        RS=p.ri,
        W2=p2(max(n for _, n in layer_stages(b))),
        STAGES=p.stages,
        PER_LAYER=per_layer(b),
        **{f"T_{n.upper()}": ls[n] for n in ls if n != "norm"},
        T_FINAL=final_start(b),
        TOTAL=tickets(b),
        **{f"O_{name.upper()}": sl[name][0] for name in sl if name != "timeline"},
        **{f"P_{name.upper()}": pl[name][0] for name in pl},
        R_AR1=REGIONS["ar1"],
        R_AR2=REGIONS["ar2"],
        R_ITEMS=REGIONS["items"],
        EPS=c.rms_norm_eps,
        SCALE=c.softmax_scale,
        SITU=c.hidden_act == "situ",
        FP8=c.fp8_cache,
        CPU=bool(cpu),
        ASM=bool(asm),
        TL=b.timeline,
        O_TL=sl["timeline"][0] if b.timeline else 0,
    )


def kernel_types() -> dict[str, str]:
    """Triton types of the kernel's runtime arguments (bf16 embeds and out as int32 pairs)."""
    return dict(
        embeds="*i32",
        positions="*i64",
        slot_mapping="*i64",
        block_table="*i32",
        seq_lens="*i32",
        out="*i32",
        table="*i64",
        final_norm="*bf16",
        rope="*fp32",
        scratch="*u8",
        nreq="i32",
        bt_stride="i32",
        slot="i32",
        ctl="*i64",
        health="i64",
        tickets="*i64",
        peers="*i64",
        rank="i32",
        world="i32",
    )


def kernel_args(b: DrafterBuild, **args) -> list:
    """The runtime arguments in LAUNCH_ARGS order (the runner checked the tensors)."""
    named = dict(args)
    named["embeds"] = args["embeds"].view(torch.int32)
    named["out"] = args["out"].view(torch.int32)
    named["bt_stride"] = args["block_table"].stride(0)
    return [named[name] for name in LAUNCH_ARGS]


def compile_for(b: DrafterBuild, target: str):
    """Compile build `b` ahead of time for `target` ("sm90" or "gfx950") without a GPU, with
    a real launch's specialization. Run it in a subprocess: a backend abort would take the
    caller down."""
    from mono_runtime.compile_check import compile_for as compile_kernel

    return compile_kernel(
        drafter_kernel,
        kernel_types(),
        constexprs(b, cpu=False, asm=target != "gfx950"),
        num_warps=b.plan.warps,
        target=target,
    )


def launch(b: DrafterBuild, grid: int, cpu: bool, **args):
    """Launch build `b` on already-validated arguments (the runner checks them)."""
    return drafter_kernel[(grid,)](
        *kernel_args(b, **args), **constexprs(b, cpu), num_warps=b.plan.warps
    )
