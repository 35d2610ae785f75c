"""K1's Triton build: one launch from a KDA layer's AttnRes inputs to o_proj's input.

The work plan (four stages in one ticket loop) is described in `spec.py`. Each step
names the vLLM 0.33 function whose numerics it follows; bf16 hand-offs between stock
kernels are bf16 roundings here too, and split reductions differ only in their order.
The protocol is mono_runtime's (`protocol_triton`, imported as `pt`), as in every other
kernel: tickets come from the runner's counter of the launch's tag slot (`ticket_take`;
the last taker resets it), an item done is a (tag, 1) pair in the done region past the
spec's scratch layout (`ticket_finish`, after a CTA barrier), and an item waits for the
items it reads (its row's AttnRes items, a head's proj items, ...: one contiguous ticket
range each) with one bounded `poll` over their pairs (`wait_done`: the runner's deadline,
watching the alarm words), then reads what they wrote with L1-bypassing loads. A wait that
gives up sets this rank's alarm word at every peer and records what it waited for in the
runner's health words: `after_step()` raises MonoFault, `guard()` poisons the step's
hidden states, and nothing hangs. An item whose wait gave up writes NaN to its output and
nothing to the caches; every later wait of the step gives up at once (the alarm is set).
A final launch (the step's last) ends in the TP fault handshake, so that every rank
records the give-up in the same step; fault injection stalls a rank just before it.
A timeline build stamps each ticket's program, start, ready (its done-pair waits over)
and end (mono_runtime's `stamp_item`, as K2 and the FFN do); other builds compile without
a trace of it.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from mono_runtime import decode_triton as dt
from mono_runtime import protocol as P
from mono_runtime import protocol_triton as pt
from mono_runtime.kernel import RUNTIME_ARGS
from mono_runtime.protocol import region_id

from . import spec
from .spec import ALIGN, K1Build

F32 = tl.float32
BF16 = tl.bfloat16
# spec's numbers as constexprs the kernel may read
ROW_TILE = tl.constexpr(spec.ROW_TILE)
HS_LANES = tl.constexpr(P.MAX_RANKS)  # the handshake's poll covers any world


def _items_of(stage: str):
    return lambda pair: (f"{stage} item {pair} of this rank's launch", None)


# Region ids the timeline names: a wait for a stage's items names that stage (the pair is
# the item's index in it); the handshake's pair p is rank p's.
REGIONS = {name: region_id(f"kda.{name}", _items_of(name)) for name in spec.STAGE_NAMES}
REGIONS["handshake"] = region_id("kda.handshake", lambda pair: (f"from rank {pair}", pair))
R_ARES = tl.constexpr(REGIONS["ares"])
R_MIX = tl.constexpr(REGIONS["mix"])
R_PROJ = tl.constexpr(REGIONS["proj"])
R_HEAD = tl.constexpr(REGIONS["head"])
R_HS = tl.constexpr(REGIONS["handshake"])

# What a launch takes after spec.ARGS: its tag slot, whether it is the step's last, then
# the runner's words (mono_runtime.kernel.RUNTIME_ARGS, in that order).
RUNTIME_TYPES = {"slot": "i32", "final": "i1", **{a.name: a.type for a in RUNTIME_ARGS}}
LAUNCH_ARGS = spec.ARGS + tuple(RUNTIME_TYPES)


@triton.jit
def _rne(x):
    """x rounded to the nearest bf16 (ties to even), kept in fp32: what a bf16 store of
    a GPU kernel does (the runtime's rounding; the interpreter's own cast truncates)."""
    return (pt.bf16_bits(x) << 16).to(F32, bitcast=True)


@triton.jit
def _bf16(x):
    return _rne(x).to(BF16)


@triton.jit
def _dot(a, b, INTERPRET: tl.constexpr):
    """bf16 x bf16 -> fp32 on tensor cores; the interpreter multiplies bf16 storage as
    integers, so it gets the (exact) fp32 upcasts."""
    if INTERPRET:
        return tl.dot(a.to(F32), b.to(F32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _block_sources(blocks_row, cols, cm, num_blocks, block_stride, MSP: tl.constexpr):
    """fp32 [MSP, BH]: blocks 0 .. num_blocks - 1 of one row's hidden block in one load (a
    stage pays one memory latency for all of them), zeros past them. No item of the launch
    writes them but the one block it may write, which `_sources` replaces: a stage may load
    them before its wait."""
    j = tl.arange(0, MSP)
    ptrs = blocks_row + j[:, None].to(tl.int64) * block_stride + cols[None, :]
    return tl.load(ptrs, mask=(j < num_blocks)[:, None] & cm[None, :], other=0.0).to(F32)


@triton.jit
def _sources(v, prefix_row, num_blocks, write_idx, MSP: tl.constexpr):
    """The AttnRes sources [MSP, BH] from the blocks `v` (`_block_sources`): the prefix
    (already loaded) at row num_blocks; the block this launch writes reads as the new
    prefix, so no item reads it back through memory."""
    j = tl.arange(0, MSP)
    take_prefix = (j == num_blocks) | ((j == write_idx) & (j < num_blocks))
    return tl.where(take_prefix[:, None], prefix_row[None, :], v)


@triton.jit
def _proj_block_row(b, NH: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, NSH: tl.constexpr):
    """First in_proj row of proj row block b in item order: the NSH blocks of f_a and beta
    (rows 4P..), then head by head its q, k, v and g blocks."""
    P: tl.constexpr = NH * D
    hb = b - NSH
    h = hb // (4 * D // BN)
    i = hb % (4 * D // BN)
    head_row = (i // (D // BN)) * P + h * D + (i % (D // BN)) * BN
    return tl.where(b < NSH, 4 * P + b * BN, head_row)


@triton.jit
def _proj_part(
    w,
    in_norm,
    mixbuf,
    rstd,
    rows,
    nm,
    k_begin,
    NSTEP: tl.constexpr,
    HID: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    S: tl.constexpr,
    STAGES: tl.constexpr,
    CPU: tl.constexpr,
):
    """fp32 [BN, 16]: in_proj rows `rows` (the dot's wide M operand) times x^T over K
    k_begin .. k_begin + NSTEP x BK, in a fixed-count loop Triton software-pipelines
    (the engine's `stream_rows` shape). x exists only here: the loader makes each tile
    from AttnRes's fp32 mix, the rows' rstd and in_norm, rounded to bf16 as
    `_attn_res_kernel` stores x (the engine's loader reads a bf16 x from memory, which
    would cost K1 a stage and a full barrier). Rows past in_proj (the last f_a/beta
    block) load as zeros."""
    n = tl.arange(0, ROW_TILE)
    acc = tl.zeros((BN, ROW_TILE), F32)
    for i in tl.range(0, NSTEP, num_stages=STAGES):
        k = k_begin + i * BK + tl.arange(0, BK)
        wt = tl.load(w + rows[:, None] * HID + k[None, :], mask=nm[:, None], other=0.0)
        mx = tl.load(
            mixbuf + n[None, :] * HID + k[:, None],
            mask=(n < S)[None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        xf = mx * rstd[None, :] * tl.load(in_norm + k).to(F32)[:, None]
        if CPU:
            acc = tl.dot(wt.to(F32), _rne(xf), acc, input_precision="ieee")
        else:
            acc = tl.dot(wt, xf.to(BF16), acc)  # cvt.rn: the same rounding as _rne
    return acc


@triton.jit
def _proj_ld(proj, s, ch, mask, NP: tl.constexpr):
    """in_proj's bf16 output (token row s, channels ch) in fp32, bypassing L1."""
    return tl.load(proj + s * NP + ch, mask=mask, other=0.0, cache_modifier=".cg").to(F32)


@triton.jit
def _slots(
    state_indices,
    num_accepted,
    r,
    indices_row_stride,
    num_slots,
    SPEC: tl.constexpr,
    L: tl.constexpr,
):
    """(row base, conv slot, first column, initial slot, conv ok, live) of request r:
    `causal_conv1d_update` reads/writes conv_state_indices = state_indices[:, 0] from
    entry num_accepted - 1; `fused_recurrent_kda_fwd_kernel` starts from
    state_indices[r, num_accepted - 1]; a slot <= 0 (null block / padding) or past the
    cache is skipped."""
    ibase = state_indices + r * indices_row_stride
    conv_slot = tl.load(ibase).to(tl.int64)
    if SPEC:
        # clamped: a bad count must not read another request's slot (checked on the host)
        first = tl.minimum(tl.maximum(tl.load(num_accepted + r).to(tl.int64) - 1, 0), L - 1)
    else:
        first = tl.zeros((), tl.int64)
    init_slot = tl.load(ibase + first).to(tl.int64)
    conv_ok = (conv_slot > 0) & (conv_slot < num_slots)
    live = (init_slot > 0) & (init_slot < num_slots)
    return (
        ibase,
        tl.where(conv_ok, conv_slot, 0),
        first,
        tl.where(live, init_slot, 0),
        conv_ok,
        live,
    )


@triton.jit
def _conv_in(
    cbase,
    proj,
    ch,
    cmask,
    first,
    r,
    t,
    j: tl.constexpr,
    conv_dim_stride,
    conv_pos_stride,
    L: tl.constexpr,
    NP: tl.constexpr,
):
    """Tap j of token t's window [state[first], state[first+1], state[first+2], x_0 ..]
    (t is a runtime token index: the token loop is not unrolled, which keeps one
    token's values live at a time)."""
    pos = t + j
    in_state = pos < 3
    v = tl.load(
        cbase + ch.to(tl.int64) * conv_dim_stride + (first + pos) * conv_pos_stride,
        mask=cmask & in_state,
        other=0.0,
    ).to(F32)
    x = _proj_ld(proj, r * L + pos - 3, ch, cmask & (pos >= 3), NP)
    return tl.where(in_state, v, x)


@triton.jit
def _conv_token(
    cbase,
    proj,
    ch,
    cmask,
    w4,
    first,
    r,
    t,
    conv_dim_stride,
    conv_pos_stride,
    L: tl.constexpr,
    NP: tl.constexpr,
):
    """One token of `_causal_conv1d_update_kernel` (width 4, no bias, SiLU), stored as
    bf16 like its output tensor."""
    jj = tl.arange(0, 4)[None, :]
    acc = tl.zeros_like(ch).to(F32)
    for j in tl.static_range(4):
        x = _conv_in(
            cbase, proj, ch, cmask, first, r, t, j, conv_dim_stride, conv_pos_stride, L, NP
        )
        acc += x * tl.sum(tl.where(jj == j, w4, 0.0), axis=1)
    acc = acc / (1 + tl.exp(-acc))
    return _rne(acc)


@triton.jit
def _conv_state_write(
    cbase,
    proj,
    ch,
    cmask,
    first,
    r,
    conv_dim_stride,
    conv_pos_stride,
    L: tl.constexpr,
    NP: tl.constexpr,
):
    """The spec conv state after the step: [window[1], window[2], x_0 .. x_{L-1}] from
    entry 0 (`_causal_conv1d_update_kernel`'s sliding window)."""
    cp = cbase + ch.to(tl.int64) * conv_dim_stride
    old1 = tl.load(cp + (first + 1) * conv_pos_stride, mask=cmask)
    old2 = tl.load(cp + (first + 2) * conv_pos_stride, mask=cmask)
    tl.debug_barrier()
    tl.store(cp, old1, mask=cmask)
    tl.store(cp + conv_pos_stride, old2, mask=cmask)
    for t in tl.static_range(L):
        x = _proj_ld(proj, r * L + t, ch, cmask, NP)
        tl.store(cp + (2 + t) * conv_pos_stride, x.to(BF16), mask=cmask)


@triton.jit
def _qk_conv_state_write(
    cbase, proj, h, dk, ok, first, r, conv_dim_stride, conv_pos_stride, L: tl.constexpr,
    NP: tl.constexpr, P: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """Head h's q and k channels' spec conv state after the step (`_conv_state_write`),
    once every reader of their old window is done; nothing where not `ok`."""
    for base in tl.static_range(2):
        _conv_state_write(
            cbase, proj, base * P + h * D + dk, (dk < D) & ok, first, r, conv_dim_stride,
            conv_pos_stride, L, NP,
        )  # fmt: skip


@triton.jit
def _gated_norm(o, g, wo, ok, live, eps, D: tl.constexpr):
    """FusedRMSNormGated (sigmoid) of one head's core output (bf16 values in fp32) with its
    gate g: 0 on a request without a live slot, NaN where a wait gave up."""
    y = o * tl.rsqrt(tl.sum(o * o, axis=0) / D + eps) * wo * tl.sigmoid(g)
    return tl.where(ok, tl.where(live, y, 0.0), float("nan"))


# Integers that vary per launch or per rank are never specialized (a value of 1 or a
# multiple of 16 would otherwise compile another binary: e.g. one per rank or slot).
@triton.jit(do_not_specialize=["slot", "final", "rank", "world"])
def k1_kernel(
    prefix,
    delta,
    blocks,
    ares_norm,
    ares_qk,
    in_norm,
    in_proj,
    f_b,
    conv_w,
    a_log,
    dt_bias,
    o_norm,
    conv_state,
    state,
    state_indices,
    num_accepted,
    out,
    scratch,
    blocks_row_stride,
    blocks_block_stride,
    conv_slot_stride,
    conv_dim_stride,
    conv_pos_stride,
    state_slot_stride,
    indices_row_stride,
    num_blocks,
    write_idx,
    num_slots,
    eps,
    out_eps,
    o_norm_eps,
    lower_bound,
    slot,
    final,
    ctl,
    health,
    tickets,
    peers,
    rank,
    world,
    S: tl.constexpr,
    R: tl.constexpr,
    L: tl.constexpr,
    SPEC: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    WRITE_BLOCK: tl.constexpr,
    HID: tl.constexpr,
    NH: tl.constexpr,
    D: tl.constexpr,
    DFA: tl.constexpr,
    NP: tl.constexpr,
    G_OFF: tl.constexpr,
    FA_OFF: tl.constexpr,
    BETA_OFF: tl.constexpr,
    BH: tl.constexpr,
    C1: tl.constexpr,
    C1P: tl.constexpr,
    MSP: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    KS: tl.constexpr,
    STAGES: tl.constexpr,
    PF: tl.constexpr,
    BV: tl.constexpr,
    NSH: tl.constexpr,
    N2P: tl.constexpr,
    NSHP: tl.constexpr,
    HBP: tl.constexpr,
    N4P: tl.constexpr,
    E1: tl.constexpr,
    E2: tl.constexpr,
    E3: tl.constexpr,
    E4: tl.constexpr,
    OFF_CNT: tl.constexpr,
    OFF_PART: tl.constexpr,
    OFF_MSQ: tl.constexpr,
    OFF_MIXED: tl.constexpr,
    OFF_KPARTS: tl.constexpr,
    OFF_PROJ: tl.constexpr,
    OFF_O: tl.constexpr,
    OFF_DONE: tl.constexpr,
    TL: tl.constexpr,
    OFF_TL: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    P: tl.constexpr = NH * D
    NVC: tl.constexpr = D // BV
    FUSED: tl.constexpr = NVC == 1  # one item a (head, request) normalizes its own output
    HEAD_ITEMS: tl.constexpr = NVC + (not FUSED)  # a (head, request)'s kda items, its norm
    HB: tl.constexpr = 4 * D // BN  # proj row blocks of one head
    KP: tl.constexpr = HID // KS  # K of one proj item
    RT: tl.constexpr = ROW_TILE
    done = (scratch + OFF_DONE).to(tl.pointer_type(tl.int64))  # one (tag, 1) pair per item
    part = (scratch + OFF_PART).to(tl.pointer_type(F32))
    msq = (scratch + OFF_MSQ).to(tl.pointer_type(F32))
    mixbuf = (scratch + OFF_MIXED).to(tl.pointer_type(F32))
    kparts = (scratch + OFF_KPARTS).to(tl.pointer_type(F32))
    cnt = (scratch + OFF_CNT).to(tl.pointer_type(tl.int32))
    proj = (scratch + OFF_PROJ).to(tl.pointer_type(BF16))
    obuf = (scratch + OFF_O).to(tl.pointer_type(BF16))

    tag = pt.step_tag(ctl, slot)
    counter = tickets + slot
    total = E4 + final.to(tl.int32)  # a final launch's last item: the TP fault handshake
    t = pt.ticket_take(counter, total)
    while t < total:
        if TL:
            t_begin = pt.clock(0, INTERPRET)
            t_ready = t_begin
        if t < E2:
            # -- 1 ares / 2 mix: `_attn_res_kernel` (nvidia/ops/attn_res.py) per (row,
            # hidden block); the sources of the block in one load --
            s = tl.where(t < E1, t, t - E1) // C1
            c = t % C1
            cols = c * BH + tl.arange(0, BH)
            cm = cols < HID
            j = tl.arange(0, MSP)
            row = blocks + s * blocks_row_stride
            if WRITE_BLOCK:
                wi = write_idx
            else:
                wi = -1
            pp = part + (s * 2 * MSP + j) * C1P + c
            if t < E1:
                p = tl.load(prefix + s * HID + cols, mask=cm, other=0.0).to(F32)
                if HAS_DELTA:
                    d = tl.load(delta + s * HID + cols, mask=cm, other=0.0).to(F32)
                    p = _rne(p + d)  # the bf16 prefix-add
                    tl.store(prefix + s * HID + cols, p.to(BF16), mask=cm)
                if WRITE_BLOCK:
                    wb = row + write_idx * blocks_block_stride + cols
                    tl.store(wb, p.to(BF16), mask=cm)
                v = _block_sources(row, cols, cm, num_blocks, blocks_block_stride, MSP)
                src = _sources(v, p, num_blocks, wi, MSP)
                wnq = tl.load(ares_norm + cols, mask=cm, other=0.0).to(F32) * tl.load(
                    ares_qk + cols, mask=cm, other=0.0
                ).to(F32)
                tl.store(pp, tl.sum(src * src, axis=1))
                tl.store(pp + MSP * C1P, tl.sum(src * wnq[None, :], axis=1))
            else:
                # the softmax over the sources (prefix last) once this row's partials are in;
                # the blocks asked for before the wait, the prefix with the partials (a load
                # after the softmax's barriers would wait for them: one latency each)
                v = _block_sources(row, cols, cm, num_blocks, blocks_block_stride, MSP)
                pt.wait_done(
                    done,
                    s * C1,
                    C1,
                    C1P,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    R_ARES,
                    s * C1,
                    INTERPRET,
                )
                if TL:
                    t_ready = pt.clock(0, INTERPRET)
                ci = tl.arange(0, C1P)
                pq = part + (s * 2 * MSP + j[:, None]) * C1P + ci[None, :]
                pm = (j <= num_blocks)[:, None] & (ci < C1)[None, :]
                ss = tl.load(pq, mask=pm, other=0.0, cache_modifier=".cg")
                qd = tl.load(pq + MSP * C1P, mask=pm, other=0.0, cache_modifier=".cg")
                p = tl.load(prefix + s * HID + cols, mask=cm, other=0.0, cache_modifier=".cg").to(
                    F32
                )
                ss = tl.sum(ss, axis=1)
                qd = tl.sum(qd, axis=1)
                logit = tl.where(
                    j <= num_blocks, qd * tl.rsqrt(ss * (1.0 / HID) + eps), -float("inf")
                )
                e = tl.exp(logit - tl.max(logit, axis=0))
                wts = e / tl.sum(e, axis=0)
                src = _sources(v, p, num_blocks, wi, MSP)
                mixed = tl.sum(wts[:, None] * src, axis=0)
                tl.store(mixbuf + s * HID + cols, mixed, mask=cm)
                tl.store(msq + s * C1P + c, tl.sum(tl.where(cm, mixed * mixed, 0.0), axis=0))
            pt.ticket_finish(done, t, tag)
        elif t < E3:
            # -- 3 proj: in_proj_qkvgfab (a bf16 GEMM, fp32 accumulate), K part kp of
            # row block b; the input RMSNorm (AttnRes APPLY_OUTPUT_NORM) in the loader --
            u = t - E2
            kp = u % KS
            row0 = _proj_block_row(u // KS, NH, D, BN, NSH)
            rows = row0 + tl.arange(0, BN)
            nm = rows < NP
            if PF > 0:  # the item's first PF columns asked of L2 while AttnRes runs
                r0 = tl.minimum(row0, NP - BN)  # (the last block's rows past in_proj: theirs)
                dt.prefetch_rows(in_proj, r0, BN, HID, kp * KP, PF, 0, INTERPRET)
            pt.wait_done(
                done, E1, E2 - E1, N2P, tag, ctl, health, peers, rank, world, R_MIX, 0, INTERPRET
            )
            if TL:
                t_ready = pt.clock(0, INTERPRET)
            n = tl.arange(0, RT)
            sm = n < S
            ci = tl.arange(0, C1P)
            ms = tl.load(
                msq + n[:, None] * C1P + ci[None, :],
                mask=sm[:, None] & (ci < C1)[None, :],
                other=0.0,
                cache_modifier=".cg",
            )
            rstd = tl.rsqrt(tl.sum(ms, axis=1) * (1.0 / HID) + out_eps)
            acc = _proj_part(
                in_proj,
                in_norm,
                mixbuf,
                rstd,
                rows,
                nm,
                kp * KP,
                KP // BK,
                HID,
                BN,
                BK,
                S,
                STAGES,
                INTERPRET,
            )
            # the row block's last K part to finish sums the parts in part order
            b = u // KS
            last, acc = dt.split_k(acc, kparts + b * (KS * BN * S), cnt + b, kp, KS, BN, S)
            if last:
                tl.store(
                    proj + n[None, :] * NP + rows[:, None],
                    _bf16(acc),
                    mask=nm[:, None] & sm[None, :],
                )
            pt.ticket_finish(done, t, tag)
        elif t < E4:
            u = t - E3
            grp = u // HEAD_ITEMS  # head-major: the first heads' proj items finish first
            h = grp // R
            r = grp % R
            vc = u % HEAD_ITEMS
            ibase, cslot, first, islot, conv_ok, live = _slots(
                state_indices, num_accepted, r, indices_row_stride, num_slots, SPEC, L
            )
            cbase = conv_state + cslot * conv_slot_stride
            dk = tl.arange(0, D)
            if vc < NVC:
                # -- 4 kda: f_b + gate, conv update, l2norm, delta rule on BV state rows,
                # once the f_a/beta rows and this head's q, k, v rows are projected. What
                # does not come from proj (weights, the state rows: a previous launch's) is
                # loaded before the waits, its latency passing while they poll --
                dv = vc * BV + tl.arange(0, BV)
                qch = h * D + dk
                kch = P + h * D + dk
                vch = 2 * P + h * D + dv
                li = tl.arange(0, RT)
                fcol = tl.arange(0, DFA)
                fbw = tl.load(f_b + (h * D + dk)[:, None] * DFA + fcol[None, :])
                a = tl.exp(tl.load(a_log + h).to(F32))
                dtb = tl.load(dt_bias + h * D + dk).to(F32)
                jj = tl.arange(0, 4)
                wq = tl.load(conv_w + qch[:, None] * 4 + jj[None, :]).to(F32)
                wk = tl.load(conv_w + kch[:, None] * 4 + jj[None, :]).to(F32)
                wv = tl.load(conv_w + vch[:, None] * 4 + jj[None, :]).to(F32)
                hoff = h * D * D
                sp = state + islot * state_slot_stride + hoff + dv[:, None] * D + dk[None, :]
                stt = tl.load(sp, mask=live, other=0.0).to(F32)
                if FUSED:  # the gated norm's weight (this item normalizes the head)
                    wo = tl.load(o_norm + dv).to(F32)
                ok = pt.wait_done(
                    done,
                    E2,
                    NSH * KS,
                    NSHP,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    R_PROJ,
                    0,
                    INTERPRET,
                )
                h0 = (NSH + h * HB) * KS
                ok = ok & pt.wait_done(
                    done,
                    E2 + h0,
                    HB * KS,
                    HBP,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    R_PROJ,
                    h0,
                    INTERPRET,
                )
                if TL:
                    t_ready = pt.clock(0, INTERPRET)
                allk = dk < D
                allv = dv < D
                # f_b_proj (bf16 GEMM) for the request's L tokens, then the gate of
                # fused_recurrent_kda_fwd_kernel: lower_bound * sigmoid(exp(A_log) * (g + dt_bias))
                fa = tl.load(
                    proj + (r * L + li)[:, None] * NP + FA_OFF + fcol[None, :],
                    mask=(li < L)[:, None],
                    other=0.0,
                    cache_modifier=".cg",
                )
                g1 = _rne(_dot(fa, tl.trans(fbw), INTERPRET))
                decay = tl.exp(lower_bound * tl.sigmoid(a * (g1 + dtb[None, :])))
                for tt in range(L):
                    s = r * L + tt
                    q = _conv_token(
                        cbase,
                        proj,
                        qch,
                        allk,
                        wq,
                        first,
                        r,
                        tt,
                        conv_dim_stride,
                        conv_pos_stride,
                        L,
                        NP,
                    )
                    k = _conv_token(
                        cbase,
                        proj,
                        kch,
                        allk,
                        wk,
                        first,
                        r,
                        tt,
                        conv_dim_stride,
                        conv_pos_stride,
                        L,
                        NP,
                    )
                    val = _conv_token(
                        cbase,
                        proj,
                        vch,
                        allv,
                        wv,
                        first,
                        r,
                        tt,
                        conv_dim_stride,
                        conv_pos_stride,
                        L,
                        NP,
                    )
                    q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * (D**-0.5)
                    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
                    dec = tl.sum(tl.where(li[:, None] == tt, decay, 0.0), axis=0)
                    beta = tl.sigmoid(_proj_ld(proj, s, BETA_OFF + h, h < NH, NP))
                    stt = stt * dec[None, :]
                    val = (val - tl.sum(stt * k[None, :], axis=1)) * beta
                    stt = stt + val[:, None] * k[None, :]
                    o = tl.sum(stt * q[None, :], axis=1)
                    o = tl.where(ok, o, float("nan"))
                    if FUSED:
                        g2 = _proj_ld(proj, s, G_OFF + h * D + dv, allv, NP)
                        y = _gated_norm(_rne(o), g2, wo, ok, live, o_norm_eps, D)
                        tl.store(out + s * P + h * D + dv, _bf16(y))
                    else:
                        tl.store(obuf + s * P + h * D + dv, _bf16(o), mask=allv & live)
                    slot_t = tl.load(ibase + tt).to(tl.int64)
                    ok_t = live & ok & (slot_t > 0) & (slot_t < num_slots)
                    dst = (
                        state
                        + tl.where(ok_t, slot_t, 0) * state_slot_stride
                        + hoff
                        + dv[:, None] * D
                        + dk[None, :]
                    )
                    tl.store(dst, stt, mask=ok_t)
                _conv_state_write(
                    cbase,
                    proj,
                    vch,
                    allv & conv_ok & ok,
                    first,
                    r,
                    conv_dim_stride,
                    conv_pos_stride,
                    L,
                    NP,
                )
                if FUSED:  # this item was the old q/k window's only reader
                    _qk_conv_state_write(
                        cbase, proj, h, dk, conv_ok & ok, first, r, conv_dim_stride,
                        conv_pos_stride, L, NP, P, D,
                    )  # fmt: skip
            else:
                # -- 4 norm: FusedRMSNormGated(sigmoid) of the head, after its NVC kda
                # items; then the q/k channels' conv state (every reader of the old
                # window was one of them) --
                g0 = grp * HEAD_ITEMS
                ok = pt.wait_done(
                    done,
                    E3 + g0,
                    NVC,
                    NVC,
                    tag,
                    ctl,
                    health,
                    peers,
                    rank,
                    world,
                    R_HEAD,
                    g0,
                    INTERPRET,
                )
                if TL:
                    t_ready = pt.clock(0, INTERPRET)
                wo = tl.load(o_norm + dk).to(F32)
                for tt in range(L):
                    s = r * L + tt
                    o6 = tl.load(obuf + s * P + h * D + dk, cache_modifier=".cg").to(F32)
                    g2 = _proj_ld(proj, s, G_OFF + h * D + dk, dk < D, NP)
                    y = _gated_norm(o6, g2, wo, ok, live, o_norm_eps, D)
                    tl.store(out + s * P + h * D + dk, _bf16(y))
                _qk_conv_state_write(
                    cbase, proj, h, dk, conv_ok & ok, first, r, conv_dim_stride,
                    conv_pos_stride, L, NP, P, D,
                )  # fmt: skip
            pt.ticket_finish(done, t, tag)
        else:
            # -- the TP fault handshake (final launches): every head item here is done;
            # tell every rank, hear from every rank. A rank that gave up has set its alarm
            # here first, so every rank records a give-up in this step. Fault injection
            # stalls the named rank before its first (here: only) peer store.
            pt.wait_done(
                done, E3, E4 - E3, N4P, tag, ctl, health, peers, rank, world, R_HEAD, 0, INTERPRET
            )
            if TL:
                t_ready = pt.clock(0, INTERPRET)
            pt.fault_stall(ctl, peers, rank, world, INTERPRET)
            i = tl.arange(0, HS_LANES)
            for dst in range(world):
                pt.publish(pt.peer_data(peers, dst) + rank + i, i, tag, i == 0, "sys")
            me = pt.peer_data(peers, rank)
            pt.poll(me + i, i < world, tag, ctl, health, peers, rank, world, R_HS, 0, INTERPRET)
        if TL:  # the item's (program, ticket, start, ready, end, mark)
            stamps = (scratch + OFF_TL).to(tl.pointer_type(tl.int64))
            dt.stamp_item(stamps, t, t_begin, t_ready, dt.NO_MARK, INTERPRET)
        t = pt.ticket_take(counter, total)


def done_bytes(build: K1Build) -> int:
    """The done region past spec's scratch layout: one int64 (tag, 1) pair per item."""
    return -(-8 * build.total_items // ALIGN) * ALIGN


def scratch_need(build: K1Build) -> int:
    """Bytes of scratch a launch of `build` uses: spec's layout, then the done pairs."""
    return build.scratch_bytes + done_bytes(build)


def peer_bytes(world: int) -> int:
    """Bytes of peer data (past the runtime's alarm head) the handshake uses: one pair per
    rank, at the start of each rank's peer data."""
    return 8 * world


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def constexprs(build: K1Build, cfg_offsets: tuple[int, int, int]) -> dict:
    """The kernel's constexpr arguments for a build (`cfg_offsets`: g, f_a, beta column
    offsets in an in_proj row)."""
    items = build.stage_items
    ends, acc = [], 0
    for n in items:
        acc += n
        ends.append(acc)
    lay = build.scratch_layout()
    c1 = build.slices
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    return dict(
        S=build.rows,
        R=build.requests,
        L=build.L,
        SPEC=build.spec,
        HAS_DELTA=build.delta,
        WRITE_BLOCK=build.write_block,
        HID=build.hidden,
        NH=build.heads,
        D=build.head_dim,
        DFA=build.f_a_dim,
        NP=build.in_proj_rows,
        G_OFF=cfg_offsets[0],
        FA_OFF=cfg_offsets[1],
        BETA_OFF=cfg_offsets[2],
        BH=build.block_h,
        C1=c1,
        C1P=_pow2(c1),
        MSP=_pow2(build.max_sources),
        BN=build.block_n,
        BK=build.block_k,
        KS=build.split_k,
        STAGES=build.stages,
        PF=build.proj_pf,
        BV=build.block_v,
        NSH=build.shared_blocks,
        N2P=_pow2(items[1]),
        NSHP=_pow2(build.shared_blocks * build.split_k),
        HBP=_pow2(build.head_blocks * build.split_k),
        N4P=_pow2(items[3]),
        E1=ends[0],
        E2=ends[1],
        E3=ends[2],
        E4=ends[3],
        OFF_CNT=lay["cnt"][0],
        OFF_PART=lay["part"][0],
        OFF_MSQ=lay["msq"][0],
        OFF_MIXED=lay["mixed"][0],
        OFF_KPARTS=lay["kparts"][0],
        OFF_PROJ=lay["proj"][0],
        OFF_O=lay["o"][0],
        OFF_DONE=build.scratch_bytes,
        TL=build.timeline,
        OFF_TL=lay["timeline"][0] if build.timeline else 0,
        INTERPRET=interpret,
    )


def offsets(build: K1Build) -> tuple[int, int, int]:
    p = build.local_proj
    return 3 * p, 4 * p, 4 * p + build.f_a_dim


def launch(build: K1Build, args: dict, num_warps: int | None = None) -> None:
    """Launch K1 with `args` holding every name of `LAUNCH_ARGS`: spec.ARGS (validated by
    the caller), the tag slot, `final`, and the runner's words (MonoRunner.launch_args()
    and peer_args(): ctl, health, tickets, peers, rank, world). The scratch must hold
    `scratch_need(build)` bytes and be zeroed with the runner's (its done pairs are
    tagged)."""
    if args["scratch"].numel() < scratch_need(build):
        raise ValueError(
            f"K1 argument `scratch`: {args['scratch'].numel()} bytes, a launch of this build "
            f"needs {scratch_need(build)} (spec's layout and the done pairs)"
        )
    k1_kernel[(build.programs,)](
        *(args[name] for name in LAUNCH_ARGS),
        **constexprs(build, offsets(build)),
        num_warps=num_warps or build.num_warps,
    )


# Pointer element types of the kernel's tensor arguments (the rest are i32/fp32 scalars).
POINTERS = {
    "prefix": "*bf16",
    "delta": "*bf16",
    "blocks": "*bf16",
    "ares_norm": "*bf16",
    "ares_qk": "*bf16",
    "in_norm": "*bf16",
    "in_proj": "*bf16",
    "f_b": "*bf16",
    "conv_w": "*fp32",
    "a_log": "*fp32",
    "dt_bias": "*fp32",
    "o_norm": "*bf16",
    "conv_state": "*bf16",
    "state": "*fp32",
    "state_indices": "*i32",
    "num_accepted": "*i32",
    "out": "*bf16",
    "scratch": "*u8",
}
FLOATS = ("eps", "out_eps", "o_norm_eps", "lower_bound")


def kernel_types() -> dict[str, str]:
    """Triton types of K1's runtime arguments, in spec.ARGS order (a model's bf16 o_norm)."""
    return {name: POINTERS.get(name, "fp32" if name in FLOATS else "i32") for name in spec.ARGS}


def compile_for(build: K1Build, target: str):
    """Compile K1 ahead of time for `target` ("sm90" or "gfx950") without a GPU, with the
    specialization of a real launch (16-byte aligned pointers); returns triton's
    CompiledKernel (asm, n_regs, n_spills, metadata). Run it in a subprocess: a backend
    abort would take the caller down."""
    from mono_runtime.compile_check import compile_for as compile_kernel

    consts = constexprs(build, offsets(build))
    consts["INTERPRET"] = False
    return compile_kernel(
        k1_kernel,
        {**kernel_types(), **RUNTIME_TYPES},
        consts,
        num_warps=build.num_warps,
        target=target,
    )
