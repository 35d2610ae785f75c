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
from mono_runtime import protocol_triton as pt
from mono_runtime.protocol import region_id

from ..formats import WeightFormat
from .spec import Experts, FfnBuild, max_tickets, peer_layout, scratch_layout, table_offsets

# -- dequantization ---------------------------------------------------------------------


@triton.jit
def _e2m1(code, CPU: tl.constexpr):
    """bf16 of 4-bit e2m1 codes (int32), assembled as bits: a normal code's exponent and
    mantissa fields are its magnitude shifted into place (+ the bias); 1 is 0.5, 0 is 0."""
    mag = code & 7
    bits = tl.where(mag >= 2, (mag << 6) + 0x3F00, mag * 0x3F00) | ((code & 8) << 12)
    return _bf16_of_bits(bits, CPU)


@triton.jit
def _e8m0(s, CPU: tl.constexpr):
    """bf16 2**(s - 127) of uint8 e8m0 codes (s = 0 is the subnormal 2**-127)."""
    s = s.to(tl.int32)
    return _bf16_of_bits(tl.where(s == 0, 0x40, s << 7), CPU)


@triton.jit
def _bf16_of_bits(bits, CPU: tl.constexpr):
    """bf16 of 16-bit patterns held in int32 (the interpreter mis-reads an int16 -> bf16
    bitcast: there through the exact fp32 of the same top half)."""
    if CPU:
        return (bits << 16).to(tl.float32, bitcast=True).to(tl.bfloat16)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _weight_tile(w, ws, row0, k0, NROWS: tl.constexpr, KROW: tl.constexpr,
                 BK: tl.constexpr, FMT: tl.constexpr, CPU: tl.constexpr):
    """(bf16 [NROWS, BK] tile at (row0, k0) of a row-major weight of KROW logical columns,
    the scale its dot product takes). MXFP4 values times their e8m0 scales and fp8 values
    are exact in bf16; the fp8 128x128 block scale is returned for the caller to apply."""
    r = row0 + tl.arange(0, NROWS)
    if FMT == 1:
        kb = k0 // 2 + tl.arange(0, BK // 2)
        byte = tl.load(w + r[:, None] * (KROW // 2) + kb[None, :]).to(tl.int32)
        vals = tl.reshape(_e2m1(tl.join(byte & 15, byte >> 4), CPU), (NROWS, BK // 32, 32))
        ks = k0 // 32 + tl.arange(0, BK // 32)
        sc = _e8m0(tl.load(ws + r[:, None] * (KROW // 32) + ks[None, :]), CPU)
        if CPU:  # the interpreter mis-multiplies bf16: exact fp32 products there
            tile = (vals.to(tl.float32) * sc[:, :, None].to(tl.float32)).to(tl.bfloat16)
        else:  # bf16 products are exact (times a power of two) and half the registers
            tile = vals * sc[:, :, None]
        tile = tl.reshape(tile, (NROWS, BK))
        scale = 1.0
    elif FMT == 2:
        k = k0 + tl.arange(0, BK)
        tile = tl.load(w + r[:, None] * KROW + k[None, :]).to(tl.bfloat16)
        scale = tl.load(ws + (row0 // 128) * ((KROW + 127) // 128) + k0 // 128)
    else:
        k = k0 + tl.arange(0, BK)
        tile = tl.load(w + r[:, None] * KROW + k[None, :])
        scale = 1.0
    return tile, scale


@triton.jit
def _round_bf16(x):
    """x rounded to bf16 (nearest even, as the runtime's packing rounds), as fp32."""
    return (pt.bf16_bits(x) << 16).to(tl.float32, bitcast=True)


# -- the expert GEMVs ----------------------------------------------------------------------


@triton.jit
def _up_dots(xn, w, ws, c, S: tl.constexpr, H: tl.constexpr, I: tl.constexpr,
             IC: tl.constexpr, UK: tl.constexpr, FMT: tl.constexpr, CPU: tl.constexpr):
    """fp32 [16, IC] gate and up of rows [c*IC, (c+1)*IC) (and I + those) over every row."""
    rows = tl.arange(0, 16)
    g = tl.zeros((16, IC), tl.float32)
    u = tl.zeros((16, IC), tl.float32)
    for k0 in range(0, H, UK):
        k = k0 + tl.arange(0, UK)
        x = tl.load(xn + rows[:, None] * H + k[None, :], mask=rows[:, None] < S, other=0.0)
        tg, sg = _weight_tile(w, ws, c * IC, k0, IC, H, UK, FMT, CPU)
        tu, su = _weight_tile(w, ws, I + c * IC, k0, IC, H, UK, FMT, CPU)
        if CPU:  # the interpreter mis-reads bf16 dot operands: fp32 there
            x32 = x.to(tl.float32)
            g += tl.dot(x32, tl.trans(tg).to(tl.float32), input_precision="ieee") * sg
            u += tl.dot(x32, tl.trans(tu).to(tl.float32), input_precision="ieee") * su
        else:  # bf16 tensor-core operands (exact products), fp32 sums
            g += tl.dot(x, tl.trans(tg)) * sg
            u += tl.dot(x, tl.trans(tu)) * su
    return g, u


@triton.jit
def _down_dot(mid, w, ws, d0, S: tl.constexpr, H: tl.constexpr, I: tl.constexpr,
              DC: tl.constexpr, DK: tl.constexpr, FMT: tl.constexpr, CPU: tl.constexpr):
    """fp32 [16, DC]: columns [d0, d0+DC) of one slot's down projection of its `mid` rows."""
    rows = tl.arange(0, 16)
    y = tl.zeros((16, DC), tl.float32)
    for k0 in range(0, I, DK):
        k = k0 + tl.arange(0, DK)
        m = tl.load(mid + rows[:, None] * I + k[None, :], mask=rows[:, None] < S, other=0.0)
        t, sc = _weight_tile(w, ws, d0, k0, DC, I, DK, FMT, CPU)
        if CPU:
            y += tl.dot(m.to(tl.float32), tl.trans(t).to(tl.float32), input_precision="ieee") * sc
        else:
            y += tl.dot(m, tl.trans(t)) * sc
    return y


# -- the kernel ---------------------------------------------------------------------------


@triton.jit
def _wait_items(done, first, N: tl.constexpr, N2: tl.constexpr, tag, ctl, health, peers,
                rank, world, region, CPU: tl.constexpr):
    """Wait (bounded) until items first..first+N-1 (smaller tickets) are done; then their
    stores are visible to this program. N2: N rounded up to a power of two."""
    i = tl.arange(0, N2)
    m = i < N
    _, ok = pt.poll(done + first + i, m, tag, ctl, health, peers, rank, world, region, first,
                    CPU)
    tl.atomic_add(done + first + i, 0, mask=m, sem="acquire", scope="gpu")
    tl.debug_barrier()
    return ok


# Integer arguments that vary per launch or per rank: never specialized (a value of 1 or a
# multiple of 16 would otherwise compile another binary: e.g. one per rank).
@triton.jit(do_not_specialize=["slot", "final", "rank", "world"])
def ffn_kernel(
    part, residual, out, residual_out, slots,
    norm, router, bias, w13, w13_scale, w2, w2_scale, sw13, sw13_scale, sw2, sw2_scale,
    scratch, slot, final,
    ctl, health, tickets, peers, rank, world,
    S: tl.constexpr, H: tl.constexpr, E: tl.constexpr, K: tl.constexpr, I: tl.constexpr,
    FMT: tl.constexpr, SFMT: tl.constexpr, SUBSET: tl.constexpr, MAXSLOTS: tl.constexpr,
    NPUSH: tl.constexpr, PUSHC: tl.constexpr, SC: tl.constexpr,
    RG: tl.constexpr, RP: tl.constexpr, RK: tl.constexpr, NRTR2: tl.constexpr,
    NC: tl.constexpr, NC2: tl.constexpr, IC: tl.constexpr, UK: tl.constexpr,
    ND: tl.constexpr, DC: tl.constexpr, DK: tl.constexpr, NF: tl.constexpr, NF2: tl.constexpr,
    FC: tl.constexpr, W2P: tl.constexpr,
    O_DONE: tl.constexpr, O_COUNT: tl.constexpr, MAXTICKETS: tl.constexpr, O_XS: tl.constexpr,
    O_XN: tl.constexpr, O_LOGIT: tl.constexpr,
    O_TABLE: tl.constexpr, O_MID: tl.constexpr,
    T_WTAB: tl.constexpr, T_IDS: tl.constexpr, T_TOPW: tl.constexpr,
    P_AR1: tl.constexpr, P_AR2: tl.constexpr, P_HS: tl.constexpr,
    R_AR1: tl.constexpr, R_AR2: tl.constexpr, R_ITEMS: tl.constexpr, R_HS: tl.constexpr,
    ALPHA: tl.constexpr, BETA: tl.constexpr, LIMIT: tl.constexpr, EPS: tl.constexpr,
    RSF: tl.constexpr, CPU: tl.constexpr,
):
    tag = pt.step_tag(ctl, slot)
    counter = tickets + slot
    done = (scratch + O_DONE).to(tl.pointer_type(tl.int64))
    upcount = (scratch + O_COUNT).to(tl.pointer_type(tl.int32))
    ALLUP: tl.constexpr = MAXTICKETS  # the done item of the whole up stage
    xs = (scratch + O_XS).to(tl.pointer_type(tl.float32))
    xn = (scratch + O_XN).to(tl.pointer_type(tl.bfloat16))
    xn32 = (scratch + O_XN).to(tl.pointer_type(tl.int32))
    logit = (scratch + O_LOGIT).to(tl.pointer_type(tl.float32))
    nslots_p = (scratch + O_TABLE).to(tl.pointer_type(tl.int32))
    slot_e = (scratch + O_TABLE + 4).to(tl.pointer_type(tl.int32))
    wtab = (scratch + O_TABLE + T_WTAB).to(tl.pointer_type(tl.float32))
    mid = (scratch + O_MID).to(tl.pointer_type(tl.bfloat16))
    me = pt.peer_data(peers, rank)
    ROUTE: tl.constexpr = NPUSH + S + RG * RP
    STATIC: tl.constexpr = ROUTE + 1
    tail = ND + NF + final  # the handshake task closes final launches

    pt.fault_stall(ctl, peers, rank, world, CPU)
    total = STATIC + MAXSLOTS * NC + tail  # an upper bound until the slot count is known
    t = pt.ticket_take(counter, total)
    total = t * 0 + total
    nslots = t * 0 + MAXSLOTS
    routed = t * 0
    while t < total:
        if (t >= STATIC) & (routed == 0):
            nslots = _slot_count(done, nslots_p, ROUTE, MAXSLOTS, tag, ctl, health, peers, rank,
                                 world, R_ITEMS, CPU)
            total = STATIC + nslots * NC + tail
            routed = t * 0 + 1
            _reset_if_last(counter, t, total)
        if t >= total:
            pass  # drawn before this program knew the slot count: no task, no more draws
        elif t < NPUSH:
            # push: pairs of columns [t*PUSHC, (t+1)*PUSHC) of every row to every rank
            p = t * (PUSHC // 2) + tl.arange(0, PUSHC // 2)
            for s in range(S):
                payload = tl.load(part + s * (H // 2) + p)
                for dst in range(world):
                    dst_ar1 = pt.peer_data(peers, dst) + P_AR1 // 8
                    pt.publish(dst_ar1 + (rank * 16 + s) * (H // 2) + p, payload, tag, p >= 0,
                               "sys")
        elif t < NPUSH + S:
            # seam of row s: rank-ordered sum, + residual, Gemma RMSNorm
            s = t - NPUSH
            ssq = tl.sum(tl.zeros((2,), tl.float32), 0)
            for c0 in range(0, H // 2, SC // 2):
                p = c0 + tl.arange(0, SC // 2)
                lo, hi, ok = pt.reduce_bf16x2(me + P_AR1 // 8 + s * (H // 2) + p, 16 * (H // 2),
                                              p >= 0, tag, ctl, health, peers, rank, world,
                                              R_AR1, s * (H // 2) + c0, CPU)
                r = tl.load(residual + s * (H // 2) + p)
                xl = tl.where(ok, _round_bf16(lo) + pt.bf16x2_lo(r), float("nan"))
                xh = tl.where(ok, _round_bf16(hi) + pt.bf16x2_hi(r), float("nan"))
                tl.store(residual_out + s * (H // 2) + p, pt.bf16x2_pack(xl, xh))
                tl.store(xs + s * H + 2 * p, xl)
                tl.store(xs + s * H + 2 * p + 1, xh)
                ssq += tl.sum(xl * xl, 0) + tl.sum(xh * xh, 0)
            rstd = 1.0 / tl.sqrt_rn(ssq / H + EPS)
            tl.debug_barrier()  # xs is re-read below by other threads of this program
            for c0 in range(0, H // 2, SC // 2):
                p = c0 + tl.arange(0, SC // 2)
                xl = tl.load(xs + s * H + 2 * p)
                xh = tl.load(xs + s * H + 2 * p + 1)
                wn = tl.load(norm + p)
                tl.store(xn32 + s * (H // 2) + p,
                         pt.bf16x2_pack(xl * rstd * (pt.bf16x2_lo(wn) + 1.0),
                                        xh * rstd * (pt.bf16x2_hi(wn) + 1.0)))
            pt.ticket_finish(done, t, tag)
        elif t < ROUTE:
            # router: 16 experts x one K part, fp32
            u = t - NPUSH - S
            g = u // RP
            part_k = u % RP
            _wait_items(done, NPUSH, S, 16, tag, ctl, health, peers, rank, world, R_ITEMS, CPU)
            rows = tl.arange(0, 16)
            ex = g * 16 + tl.arange(0, 16)
            acc = tl.zeros((16, 16), tl.float32)
            for k0 in range(part_k * RK, (part_k + 1) * RK, 128):
                k = k0 + tl.arange(0, 128)
                x = tl.load(xn + rows[:, None] * H + k[None, :], mask=rows[:, None] < S, other=0.0)
                wr = tl.load(router + ex[:, None] * H + k[None, :])
                acc += tl.dot(x.to(tl.float32), tl.trans(wr), input_precision="ieee")
            tl.store(logit + (part_k * S + rows[:, None]) * E + ex[None, :], acc,
                     mask=rows[:, None] < S)
            pt.ticket_finish(done, t, tag)
        elif t < STATIC:
            _wait_items(done, NPUSH + S, RG * RP, NRTR2, tag, ctl, health, peers, rank, world,
                        R_ITEMS, CPU)
            _route(logit, bias, slots, nslots_p, slot_e, wtab, scratch, S, E, K, RP,
                   T_IDS, T_TOPW, O_TABLE, SUBSET, RSF)
            tl.atomic_xchg(upcount, 0, sem="relaxed", scope="gpu")
            tl.debug_barrier()
            if tl.load(nslots_p) == 0:
                pt.ticket_finish(done, ALLUP, tag)  # no up task: the stage is complete
            pt.ticket_finish(done, t, tag)
        else:
            u = t - STATIC
            if u < nslots * NC:
                # up: slot j, gate/up rows [c*IC, (c+1)*IC) -> SwiGLU-OAI -> mid
                j = u // NC
                c = u % NC
                e = tl.load(slot_e + j, volatile=True)
                if e == E:
                    g, v = _up_dots(xn, sw13, sw13_scale, c, S, H, I, IC, UK, SFMT, CPU)
                else:
                    eo = e.to(tl.int64)
                    if FMT == 1:
                        g, v = _up_dots(xn, w13 + eo * (2 * I * H // 2),
                                        w13_scale + eo * (2 * I * H // 32), c, S, H, I, IC, UK,
                                        FMT, CPU)
                    elif FMT == 2:
                        g, v = _up_dots(xn, w13 + eo * (2 * I * H),
                                        w13_scale + eo * ((2 * I // 128) * ((H + 127) // 128)),
                                        c, S, H, I, IC, UK, FMT, CPU)
                    else:
                        g, v = _up_dots(xn, w13 + eo * (2 * I * H), w13_scale, c, S, H, I, IC,
                                        UK, FMT, CPU)
                g = tl.minimum(g, LIMIT)
                v = tl.minimum(tl.maximum(v, -LIMIT), LIMIT)
                h = g * tl.sigmoid(ALPHA * g) * (v + BETA)
                rows = tl.arange(0, 16)
                cols = c * IC + tl.arange(0, IC)
                tl.store(mid + (j * S + rows[:, None]) * I + cols[None, :],
                         _round_bf16(h).to(tl.bfloat16), mask=rows[:, None] < S)
                # the stage's last up task marks item ALLUP: down waits on one pair, not
                # on every up task (the route task zeroed the count before any up began)
                tl.debug_barrier()
                if tl.atomic_add(upcount, 1, sem="acq_rel", scope="gpu") == nslots * NC - 1:
                    pt.ticket_finish(done, ALLUP, tag)
            elif u < nslots * NC + ND:
                # down: columns [d0, d0+DC) over every slot, weighted -> every rank's ar2
                d0 = (u - nslots * NC) * DC
                rows = tl.arange(0, 16)
                acc = tl.zeros((16, DC), tl.float32)
                ok = _wait_items(done, ALLUP, 1, 1, tag, ctl, health, peers, rank, world,
                                 R_ITEMS, CPU)
                for j in range(nslots):
                    e = tl.load(slot_e + j, volatile=True)
                    wrow = tl.load(wtab + j * S + rows, mask=rows < S, other=0.0, volatile=True)
                    if e == E:
                        y = _down_dot(mid + j * S * I, sw2, sw2_scale, d0, S, H, I, DC, DK, SFMT,
                                      CPU)
                    else:
                        eo = e.to(tl.int64)
                        if FMT == 1:
                            y = _down_dot(mid + j * S * I, w2 + eo * (H * I // 2),
                                          w2_scale + eo * (H * I // 32), d0, S, H, I, DC, DK, FMT,
                                          CPU)
                        elif FMT == 2:
                            y = _down_dot(mid + j * S * I, w2 + eo * (H * I),
                                          w2_scale + eo * ((H // 128) * ((I + 127) // 128)),
                                          d0, S, H, I, DC, DK, FMT, CPU)
                        else:
                            y = _down_dot(mid + j * S * I, w2 + eo * (H * I), w2_scale, d0, S, H,
                                          I, DC, DK, FMT, CPU)
                    acc += tl.where(wrow[:, None] != 0.0, wrow[:, None] * y, 0.0)
                acc = tl.where(ok, acc, float("nan"))
                lo, hi = tl.split(tl.reshape(acc, (16, DC // 2, 2)))
                payload = pt.bf16x2_pack(lo, hi)
                p = d0 // 2 + tl.arange(0, DC // 2)
                for dst in range(world):
                    dst_ar2 = pt.peer_data(peers, dst) + P_AR2 // 8
                    pt.publish(dst_ar2 + (rank * 16 + rows[:, None]) * (H // 2) + p[None, :],
                               payload, tag, rows[:, None] < S, "sys")
            elif u < nslots * NC + ND + NF:
                # final: the ranks' partials in rank order -> out
                f = u - nslots * NC - ND
                p = f * (FC // 2) + tl.arange(0, FC // 2)
                for s in range(S):
                    lo, hi, ok = pt.reduce_bf16x2(me + P_AR2 // 8 + s * (H // 2) + p,
                                                  16 * (H // 2), p >= 0, tag, ctl, health, peers,
                                                  rank, world, R_AR2, s * (H // 2) + f * (FC // 2),
                                                  CPU)
                    tl.store(out + s * (H // 2) + p,
                             pt.bf16x2_pack(tl.where(ok, lo, float("nan")),
                                        tl.where(ok, hi, float("nan"))))
                pt.ticket_finish(done, t, tag)
            else:
                # the TP fault handshake: every final task here is done; tell every rank,
                # hear from every rank (a rank that gave up has set its alarm here)
                _wait_items(done, t - NF, NF, NF2, tag, ctl, health, peers, rank, world,
                            R_ITEMS, CPU)
                i = tl.arange(0, W2P)
                for dst in range(world):
                    pt.publish(pt.peer_data(peers, dst) + P_HS // 8 + rank + i, i, tag, i == 0,
                               "sys")
                pt.poll(me + P_HS // 8 + i, i < world, tag, ctl, health, peers, rank, world,
                        R_HS, 0, CPU)
        if t < total:
            t = pt.ticket_take(counter, total)
    if (routed == 0) & (t >= STATIC):
        # this program's only draw was past the upper bound: it may still be the last taker
        nslots = _slot_count(done, nslots_p, ROUTE, MAXSLOTS, tag, ctl, health, peers, rank,
                             world, R_ITEMS, CPU)
        _reset_if_last(counter, t, STATIC + nslots * NC + tail)


@triton.jit
def _slot_count(done, nslots_p, ROUTE: tl.constexpr, MAXSLOTS: tl.constexpr, tag, ctl, health,
                peers, rank, world, region, CPU: tl.constexpr):
    """The route task's slot count (waits for the route item, a smaller ticket)."""
    _wait_items(done, ROUTE, 1, 1, tag, ctl, health, peers, rank, world, region, CPU)
    return tl.minimum(tl.maximum(tl.load(nslots_p, volatile=True), 0), MAXSLOTS).to(tl.int64)


@triton.jit
def _reset_if_last(counter, t, n_items):
    """ticket_take's last-taker reset, for a ticket drawn against an upper bound of the
    item count: the launch draws n_items + P tickets in all, the last one resets."""
    if t == n_items + tl.num_programs(0) - 1:
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@triton.jit
def _route(logit, bias, slots, nslots_p, slot_e, wtab, scratch, S: tl.constexpr,
           E: tl.constexpr, K: tl.constexpr, RP: tl.constexpr, T_IDS: tl.constexpr,
           T_TOPW: tl.constexpr, O_TABLE: tl.constexpr, SUBSET: tl.constexpr, RSF: tl.constexpr):
    """Top-k of sigmoid + bias (ties -> lower id, NaN last), renormalized weights x RSF, and
    the slot table: shared expert first (unless ROUTED), then the union in ascending id.
    Follows vLLM's `fused_topk_bias` (sigmoid branch) for the scores and weights."""
    rows = tl.arange(0, 16)
    ex = tl.arange(0, E)
    rmask = rows < S
    lg = tl.zeros((16, E), tl.float32)
    for p in range(RP):
        lg += tl.load(logit + (p * S + rows[:, None]) * E + ex[None, :], mask=rmask[:, None],
                      other=0.0)
    score = tl.sigmoid(lg)
    key = score + tl.load(bias + ex)[None, :]
    key = tl.where(key != key, float("-inf"), key)
    live = rmask & (tl.load(slots + rows, mask=rmask, other=-1) >= 0)
    ids_p = (scratch + O_TABLE + T_IDS).to(tl.pointer_type(tl.int32))
    topw_p = (scratch + O_TABLE + T_TOPW).to(tl.pointer_type(tl.float32))
    taken = tl.zeros((16, E), tl.int32)
    wsum = tl.zeros((16,), tl.float32)
    for k in tl.static_range(K):
        avail = taken == 0
        m = tl.max(tl.where(avail, key, float("-inf")), 1)
        pick = tl.min(tl.where(avail & (key == m[:, None]), ex[None, :], E), 1)
        hit = ex[None, :] == pick[:, None]
        taken = tl.where(hit, k + 1, taken)
        wsum += tl.sum(tl.where(hit, score, 0.0), 1)
    wfull = tl.where(taken > 0, score, 0.0) / wsum[:, None] * RSF
    wfull = tl.where(live[:, None], wfull, 0.0)
    for k in tl.static_range(K):
        hit = taken == k + 1
        kid = tl.sum(tl.where(hit, ex[None, :], 0), 1)
        kw = tl.sum(tl.where(hit, wfull, 0.0), 1)
        tl.store(ids_p + rows * K + k, tl.where(live, kid, -1), mask=rmask)
        tl.store(topw_p + rows * K + k, kw, mask=rmask)
    used = tl.max(tl.where(live[:, None] & (taken > 0), 1, 0), 0)  # [E]
    if SUBSET == 2:
        used = used * 0
    if SUBSET == 1:
        first = 0
    else:
        first = 1
    pos = first + tl.cumsum(used, 0) - 1
    tl.store(slot_e + pos, ex, mask=used > 0)
    tl.store(wtab + pos[None, :] * S + rows[:, None], wfull,
             mask=(used[None, :] > 0) & rmask[:, None])
    if SUBSET != 1:
        tl.store(slot_e, E)
        tl.store(wtab + rows, tl.where(live, 1.0, 0.0), mask=rmask)
    tl.store(nslots_p, first + tl.sum(used, 0))


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
        S=b.rows, H=c.hidden_size, E=c.num_experts, K=c.top_k, I=b.inter,
        FMT=_FMT[b.weights], SFMT=_FMT[b.weights.shared_format], SUBSET=_SUB[b.experts],
        MAXSLOTS=b.max_slots, NPUSH=p.push, PUSHC=p.push_cols, SC=p.seam_cols,
        RG=p.router_groups, RP=p.router_parts, RK=p.router_k,
        NRTR2=_p2(p.router_groups * p.router_parts),
        NC=p.nc, NC2=_p2(p.nc), IC=p.ic, UK=p.uk, ND=p.down, DC=p.dc, DK=p.dk,
        NF=p.final, NF2=_p2(p.final), FC=p.fc, W2P=_p2(b.tp),
        O_DONE=sl["done"][0], O_COUNT=sl["count"][0], MAXTICKETS=max_tickets(b),
        O_XS=sl["xs"][0], O_XN=sl["xn"][0], O_LOGIT=sl["logit"][0],
        O_TABLE=sl["table"][0], O_MID=sl["mid"][0],
        T_WTAB=tb["wtab"], T_IDS=tb["topk_ids"], T_TOPW=tb["topk_w"],
        P_AR1=pl["ar1"][0], P_AR2=pl["ar2"][0], P_HS=pl["hs"][0],
        R_AR1=REGIONS["ar1"], R_AR2=REGIONS["ar2"], R_ITEMS=REGIONS["items"],
        R_HS=REGIONS["handshake"],
        ALPHA=c.swiglu_alpha, BETA=c.swiglu_beta, LIMIT=c.swiglu_limit, EPS=c.rms_norm_eps,
        RSF=c.routed_scaling_factor, CPU=bool(cpu),
    )


def kernel_args(b: FfnBuild, *, part, residual, out, residual_out, slots, weights, scratch,
                slot, final, ctl, health, tickets, peers, rank, world) -> list:
    """The runtime arguments in spec.ARGS order, then the runtime's (bf16 activations and
    the norm weight as int32 pairs; a missing scale is any tensor)."""

    def pairs(t):
        return t.view(torch.int32)

    w = weights

    def sc(t):
        return scratch if t is None else t

    return [
        pairs(part), pairs(residual), pairs(out), pairs(residual_out), slots,
        pairs(w.norm), w.router, w.bias, w.w13, sc(w.w13_scale), w.w2, sc(w.w2_scale),
        w.shared_w13, sc(w.shared_w13_scale), w.shared_w2, sc(w.shared_w2_scale),
        scratch, slot, int(bool(final)), ctl, health, tickets, peers, rank, world,
    ]


def launch(b: FfnBuild, grid: int, cpu: bool, **args):
    """Launch build `b` on already-validated tensors (the runner checks them)."""
    return ffn_kernel[(grid,)](*kernel_args(b, **args), **constexprs(b, cpu))
