"""K1's Triton build: one launch from a KDA layer's AttnRes inputs to o_proj's input.

The work plan (six stages in one ticket loop) is described in `spec.py`. Each step
names the vLLM 0.33 function whose numerics it follows; bf16 hand-offs between stock
kernels are bf16 roundings here too, and split reductions differ only in their order.
The protocol is mono_runtime's (`protocol_triton`, imported as `pt`), as in every other
kernel: tickets come from the runner's counter of the launch's tag slot (`ticket_take`;
the last taker resets it), an item done is a (tag, 1) pair in the done region past the
spec's scratch layout (`ticket_finish`, after a CTA barrier), and a stage waits for every
item of the stage before with one bounded `poll` over their pairs (the runner's deadline,
watching the alarm words), then reads what they wrote with L1-bypassing loads. A wait that
gives up sets this rank's alarm word at every peer and records what it waited for in the
runner's health words: `after_step()` raises MonoFault, `guard()` poisons the step's
hidden states, and nothing hangs. An item whose wait gave up writes NaN to its output and
nothing to the caches; every later wait of the step gives up at once (the alarm is set).
A final launch (the step's last) ends in the TP fault handshake, so that every rank
records the give-up in the same step; fault injection stalls a rank just before it.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from mono_runtime import protocol as P
from mono_runtime import protocol_triton as pt
from mono_runtime.kernel import RUNTIME_ARGS
from mono_runtime.protocol import region_id

from . import spec
from .spec import ALIGN, K1Build

F32 = tl.float32
BF16 = tl.bfloat16
# spec's numbers as constexprs the kernel may read
CTRL_WORDS = tl.constexpr(spec.CTRL_WORDS)
ROW_TILE = tl.constexpr(spec.ROW_TILE)
HS_LANES = tl.constexpr(P.MAX_RANKS)  # the handshake's poll covers any world


def _items_of(stage: str):
    return lambda pair: (f"{stage} item {pair} of this rank's launch", None)


# Region ids the timeline names: a wait for a stage's items names that stage (the pair is
# the item's index in it); the handshake's pair p is rank p's.
REGIONS = {name: region_id(f"kda.{name}", _items_of(name)) for name in spec.STAGES}
REGIONS["handshake"] = region_id("kda.handshake", lambda pair: (f"from rank {pair}", pair))
R_ARES = tl.constexpr(REGIONS["ares"])
R_MIX = tl.constexpr(REGIONS["mix"])
R_X = tl.constexpr(REGIONS["x"])
R_PROJ = tl.constexpr(REGIONS["proj"])
R_KDA = tl.constexpr(REGIONS["kda"])
R_NORM = tl.constexpr(REGIONS["norm"])
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
        return tl.dot(a.to(F32), b.to(F32))
    return tl.dot(a, b)


@triton.jit
def _source(ptrs, is_block, prefix_row, cm):
    """One AttnRes source of a row's hidden slice in fp32: the block at `ptrs`, or the
    prefix (already loaded) for the last source; stages 1 and 2 read sources alike."""
    v = tl.load(ptrs, mask=cm & is_block, other=0.0).to(F32)
    return tl.where(is_block, v, prefix_row)


@triton.jit
def _prefetch_rows(in_proj, rows, nm, x_waiting, junk_word, HID: tl.constexpr, BK: tl.constexpr):
    """While x is not ready yet, stream this item's in_proj rows into L2 (HBM is idle
    during the AttnRes stages). The loads feed a sum that is stored only if it is NaN
    (never, for finite weights), so the compiler keeps them."""
    if x_waiting:
        junk = tl.zeros((), F32)
        for k0 in range(0, HID, BK):
            kk = k0 + tl.arange(0, BK)
            wt = tl.load(
                in_proj + rows[:, None] * HID + kk[None, :],
                mask=nm[:, None] & (kk < HID)[None, :],
                other=0.0,
                eviction_policy="evict_last",
            )
            junk += tl.sum(tl.sum(wt.to(F32), axis=1), axis=0)
        if junk != junk:
            tl.store(junk_word, 1)


@triton.jit
def _wait_stage(
    done,
    first: tl.constexpr,
    N: tl.constexpr,
    N2: tl.constexpr,
    tag,
    ctl,
    health,
    peers,
    rank,
    world,
    region: tl.constexpr,
    CPU: tl.constexpr,
):
    """Wait (bounded: `pt.poll`) until the N items first..first+N-1 of a stage before this
    one (smaller tickets) are done; then their stores are visible to this program. False:
    the wait gave up (recorded in health, the alarm set), and so does every later wait
    of the step. N2: N rounded up to a power of two."""
    return pt.wait_done(done, first, N, N2, tag, ctl, health, peers, rank, world, region, 0, CPU)


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
    t: tl.constexpr,
    j: tl.constexpr,
    conv_dim_stride,
    conv_pos_stride,
    L: tl.constexpr,
    NP: tl.constexpr,
):
    """Tap j of token t's window [state[first], state[first+1], state[first+2], x_0 ..]."""
    if t + j < 3:
        v = tl.load(
            cbase + ch.to(tl.int64) * conv_dim_stride + (first + t + j) * conv_pos_stride,
            mask=cmask,
            other=0.0,
        )
    else:
        v = tl.load(
            proj + (r * L + t + j - 3) * NP + ch, mask=cmask, other=0.0, cache_modifier=".cg"
        )
    return v.to(F32)


@triton.jit
def _conv_token(
    cbase,
    proj,
    ch,
    cmask,
    w4,
    first,
    r,
    t: tl.constexpr,
    conv_dim_stride,
    conv_pos_stride,
    L: tl.constexpr,
    NP: tl.constexpr,
):
    """One token of `_causal_conv1d_update_kernel` (width 4, no bias, SiLU), stored as
    bf16 like its output tensor."""
    jj = tl.arange(0, 4)[None, :]
    acc = _conv_in(
        cbase, proj, ch, cmask, first, r, t, 0, conv_dim_stride, conv_pos_stride, L, NP
    ) * tl.sum(tl.where(jj == 0, w4, 0.0), axis=1)
    acc += _conv_in(
        cbase, proj, ch, cmask, first, r, t, 1, conv_dim_stride, conv_pos_stride, L, NP
    ) * tl.sum(tl.where(jj == 1, w4, 0.0), axis=1)
    acc += _conv_in(
        cbase, proj, ch, cmask, first, r, t, 2, conv_dim_stride, conv_pos_stride, L, NP
    ) * tl.sum(tl.where(jj == 2, w4, 0.0), axis=1)
    acc += _conv_in(
        cbase, proj, ch, cmask, first, r, t, 3, conv_dim_stride, conv_pos_stride, L, NP
    ) * tl.sum(tl.where(jj == 3, w4, 0.0), axis=1)
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
        x = tl.load(proj + (r * L + t) * NP + ch, mask=cmask, cache_modifier=".cg")
        tl.store(cp + (2 + t) * conv_pos_stride, x, mask=cmask)


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
    BN: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    MAX_SRC: tl.constexpr,
    E1: tl.constexpr,
    E2: tl.constexpr,
    E3: tl.constexpr,
    E4: tl.constexpr,
    E5: tl.constexpr,
    E6: tl.constexpr,
    OFF_PART: tl.constexpr,
    OFF_MSQ: tl.constexpr,
    OFF_MIXED: tl.constexpr,
    OFF_X: tl.constexpr,
    OFF_PROJ: tl.constexpr,
    OFF_O: tl.constexpr,
    OFF_DONE: tl.constexpr,
    N4P: tl.constexpr,
    N5P: tl.constexpr,
    N6P: tl.constexpr,
    PREFETCH: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    P: tl.constexpr = NH * D
    NVC: tl.constexpr = D // BV
    RT: tl.constexpr = ROW_TILE
    junk_word = scratch.to(tl.pointer_type(tl.int32)) + CTRL_WORDS - 1
    done = (scratch + OFF_DONE).to(tl.pointer_type(tl.int64))  # one (tag, 1) pair per item
    part = (scratch + OFF_PART).to(tl.pointer_type(F32))
    msq = (scratch + OFF_MSQ).to(tl.pointer_type(F32))
    mixbuf = (scratch + OFF_MIXED).to(tl.pointer_type(F32))
    xbuf = (scratch + OFF_X).to(tl.pointer_type(BF16))
    proj = (scratch + OFF_PROJ).to(tl.pointer_type(BF16))
    obuf = (scratch + OFF_O).to(tl.pointer_type(BF16))

    tag = pt.step_tag(ctl, slot)
    counter = tickets + slot
    total = E6 + final.to(tl.int32)  # a final launch's last item: the TP fault handshake
    t = pt.ticket_take(counter, total)
    while t < total:
        if t < E1:
            # -- 1 ares: `_attn_res_kernel` (nvidia/ops/attn_res.py), per hidden slice --
            cols = t * BH + tl.arange(0, BH)
            cm = cols < HID
            wnq = tl.load(ares_norm + cols, mask=cm, other=0.0).to(F32) * tl.load(
                ares_qk + cols, mask=cm, other=0.0
            ).to(F32)
            for s in tl.static_range(S):
                p = tl.load(prefix + s * HID + cols, mask=cm, other=0.0).to(F32)
                if HAS_DELTA:
                    d = tl.load(delta + s * HID + cols, mask=cm, other=0.0).to(F32)
                    p = _rne(p + d)  # the bf16 prefix-add
                    tl.store(prefix + s * HID + cols, p.to(BF16), mask=cm)
                if WRITE_BLOCK:
                    tl.store(
                        blocks + s * blocks_row_stride + write_idx * blocks_block_stride + cols,
                        p.to(BF16),
                        mask=cm,
                    )
                row = blocks + s * blocks_row_stride + cols
                for j in range(0, num_blocks + 1):
                    v = _source(row + j * blocks_block_stride, j < num_blocks, p, cm)
                    pp = part + ((s * MAX_SRC + j) * C1P + t) * 2
                    tl.store(pp, tl.sum(v * v, axis=0))
                    tl.store(pp + 1, tl.sum(v * wnq, axis=0))
            pt.ticket_finish(done, t, tag)
        elif t < E2:
            # -- 2 mix: the AttnRes softmax over sources (prefix last), per slice --
            c = t - E1
            _wait_stage(done, 0, C1, C1P, tag, ctl, health, peers, rank, world, R_ARES, INTERPRET)
            cols = c * BH + tl.arange(0, BH)
            cm = cols < HID
            ci = tl.arange(0, C1P)
            cim = ci < C1
            for s in tl.static_range(S):
                p = tl.load(prefix + s * HID + cols, mask=cm, other=0.0, cache_modifier=".cg").to(
                    F32
                )
                mx = tl.full((), float("-inf"), F32)
                den = tl.zeros((), F32)
                mixed = tl.zeros((BH,), F32)
                row = blocks + s * blocks_row_stride + cols
                for j in range(0, num_blocks + 1):
                    pq = part + (s * MAX_SRC + j) * C1P * 2 + ci * 2
                    ss = tl.sum(tl.load(pq, mask=cim, other=0.0, cache_modifier=".cg"), axis=0)
                    qd = tl.sum(tl.load(pq + 1, mask=cim, other=0.0, cache_modifier=".cg"), axis=0)
                    logit = qd * tl.rsqrt(ss * (1.0 / HID) + eps)
                    v = _source(row + j * blocks_block_stride, j < num_blocks, p, cm)
                    new_mx = tl.maximum(mx, logit)
                    old_scale = tl.exp(mx - new_mx)
                    e = tl.exp(logit - new_mx)
                    den = den * old_scale + e
                    mixed = mixed * old_scale + e * v
                    mx = new_mx
                mixed = mixed / den
                tl.store(mixbuf + s * HID + cols, mixed, mask=cm)
                tl.store(msq + s * C1P + c, tl.sum(tl.where(cm, mixed * mixed, 0.0), axis=0))
            pt.ticket_finish(done, t, tag)
        elif t < E3:
            # -- 3 x: the input RMSNorm (AttnRes APPLY_OUTPUT_NORM) -> bf16 x --
            c = t - E2
            _wait_stage(done, E1, C1, C1P, tag, ctl, health, peers, rank, world, R_MIX, INTERPRET)
            cols = c * BH + tl.arange(0, BH)
            cm = cols < HID
            ci = tl.arange(0, C1P)
            wn = tl.load(in_norm + cols, mask=cm, other=0.0).to(F32)
            for s in tl.static_range(S):
                ssum = tl.sum(
                    tl.load(msq + s * C1P + ci, mask=ci < C1, other=0.0, cache_modifier=".cg"),
                    axis=0,
                )
                rstd = tl.rsqrt(ssum * (1.0 / HID) + out_eps)
                mixed = tl.load(mixbuf + s * HID + cols, mask=cm, other=0.0, cache_modifier=".cg")
                tl.store(xbuf + s * HID + cols, _bf16(mixed * rstd * wn), mask=cm)
            pt.ticket_finish(done, t, tag)
        elif t < E4:
            # -- 4 proj: in_proj_qkvgfab (a bf16 GEMM, fp32 accumulate) --
            n = t - E3
            rows = n * BN + tl.arange(0, BN)
            nm = rows < NP
            if n < PREFETCH:
                x_waiting = pt.pair_tag(tl.load(done + E3 - 1, volatile=True)) != tag
                _prefetch_rows(in_proj, rows, nm, x_waiting, junk_word, HID, BK)
            _wait_stage(done, E2, C1, C1P, tag, ctl, health, peers, rank, world, R_X, INTERPRET)
            si = tl.arange(0, RT)
            sm = si < S
            acc = tl.zeros((RT, BN), F32)
            kb = tl.arange(0, BK)
            wp = in_proj + rows[:, None] * HID + kb[None, :]
            xp = xbuf + si[:, None] * HID + kb[None, :]
            # two weight tiles in flight: the next tile's loads issue before this dot
            w_next = tl.load(wp, mask=nm[:, None] & (kb < HID)[None, :], other=0.0)
            for k0 in range(0, HID, BK):
                w_cur = w_next
                w_next = tl.load(
                    wp + k0 + BK, mask=nm[:, None] & (k0 + BK + kb < HID)[None, :], other=0.0
                )
                xt = tl.load(
                    xp + k0,
                    mask=sm[:, None] & (k0 + kb < HID)[None, :],
                    other=0.0,
                    cache_modifier=".cg",
                )
                acc += _dot(xt, tl.trans(w_cur), INTERPRET)
            tl.store(
                proj + si[:, None] * NP + rows[None, :], _bf16(acc), mask=sm[:, None] & nm[None, :]
            )
            pt.ticket_finish(done, t, tag)
        elif t < E5:
            # -- 5 kda: f_b + gate, conv update, l2norm, delta rule on BV state rows --
            u = t - E4
            r = u // (NH * NVC)
            h = (u // NVC) % NH
            vc = u % NVC
            ok = _wait_stage(
                done, E3, E4 - E3, N4P, tag, ctl, health, peers, rank, world, R_PROJ, INTERPRET
            )
            ibase, cslot, first, islot, conv_ok, live = _slots(
                state_indices, num_accepted, r, indices_row_stride, num_slots, SPEC, L
            )
            cbase = conv_state + cslot * conv_slot_stride
            dk = tl.arange(0, D)
            dv = vc * BV + tl.arange(0, BV)
            qch = h * D + dk
            kch = P + h * D + dk
            vch = 2 * P + h * D + dv
            allk = dk < D
            allv = dv < D
            # f_b_proj (bf16 GEMM) for the request's L tokens, then the gate of
            # fused_recurrent_kda_fwd_kernel: lower_bound * sigmoid(exp(A_log) * (g + dt_bias))
            li = tl.arange(0, RT)
            fcol = tl.arange(0, DFA)
            fa = tl.load(
                proj + (r * L + li)[:, None] * NP + FA_OFF + fcol[None, :],
                mask=(li < L)[:, None],
                other=0.0,
                cache_modifier=".cg",
            )
            fbw = tl.load(f_b + (h * D + dk)[:, None] * DFA + fcol[None, :])
            g1 = _rne(_dot(fa, tl.trans(fbw), INTERPRET))
            a = tl.exp(tl.load(a_log + h).to(F32))
            dtb = tl.load(dt_bias + h * D + dk).to(F32)
            decay = tl.exp(lower_bound * tl.sigmoid(a * (g1 + dtb[None, :])))
            jj = tl.arange(0, 4)
            wq = tl.load(conv_w + qch[:, None] * 4 + jj[None, :]).to(F32)
            wk = tl.load(conv_w + kch[:, None] * 4 + jj[None, :]).to(F32)
            wv = tl.load(conv_w + vch[:, None] * 4 + jj[None, :]).to(F32)
            hoff = h * D * D
            sp = state + islot * state_slot_stride + hoff + dv[:, None] * D + dk[None, :]
            st = tl.load(sp, mask=live, other=0.0).to(F32)
            for tt in tl.static_range(L):
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
                beta = tl.sigmoid(
                    tl.load(proj + s * NP + BETA_OFF + h, cache_modifier=".cg").to(F32)
                )
                st = st * dec[None, :]
                val = (val - tl.sum(st * k[None, :], axis=1)) * beta
                st = st + val[:, None] * k[None, :]
                o = tl.sum(st * q[None, :], axis=1)
                o = tl.where(ok, o, float("nan"))
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
                tl.store(dst, st, mask=ok_t)
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
            pt.ticket_finish(done, t, tag)
        elif t < E6:
            # -- 6 norm: FusedRMSNormGated(sigmoid) per head; q/k conv state --
            u = t - E5
            r = u // NH
            h = u % NH
            ok = _wait_stage(
                done, E4, E5 - E4, N5P, tag, ctl, health, peers, rank, world, R_KDA, INTERPRET
            )
            ibase, cslot, first, islot, conv_ok, live = _slots(
                state_indices, num_accepted, r, indices_row_stride, num_slots, SPEC, L
            )
            dk = tl.arange(0, D)
            wo = tl.load(o_norm + dk).to(F32)
            for tt in tl.static_range(L):
                s = r * L + tt
                o6 = tl.load(obuf + s * P + h * D + dk, cache_modifier=".cg").to(F32)
                g2 = tl.load(proj + s * NP + G_OFF + h * D + dk, cache_modifier=".cg").to(F32)
                y = o6 * tl.rsqrt(tl.sum(o6 * o6, axis=0) / D + o_norm_eps) * wo * tl.sigmoid(g2)
                y = tl.where(ok, tl.where(live, y, 0.0), float("nan"))
                tl.store(out + s * P + h * D + dk, _bf16(y))
            cbase = conv_state + cslot * conv_slot_stride
            allk = (dk < D) & conv_ok & ok
            _conv_state_write(
                cbase, proj, h * D + dk, allk, first, r, conv_dim_stride, conv_pos_stride, L, NP
            )
            _conv_state_write(
                cbase, proj, P + h * D + dk, allk, first, r, conv_dim_stride, conv_pos_stride, L, NP
            )
            pt.ticket_finish(done, t, tag)
        else:
            # -- the TP fault handshake (final launches): every norm item here is done;
            # tell every rank, hear from every rank. A rank that gave up has set its alarm
            # here first, so every rank records a give-up in this step. Fault injection
            # stalls the named rank before its first (here: only) peer store.
            _wait_stage(
                done, E5, E6 - E5, N6P, tag, ctl, health, peers, rank, world, R_NORM, INTERPRET
            )
            pt.fault_stall(ctl, peers, rank, world, INTERPRET)
            i = tl.arange(0, HS_LANES)
            for dst in range(world):
                pt.publish(pt.peer_data(peers, dst) + rank + i, i, tag, i == 0, "sys")
            me = pt.peer_data(peers, rank)
            pt.poll(me + i, i < world, tag, ctl, health, peers, rank, world, R_HS, 0, INTERPRET)
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
        C1P=1 << max(0, (c1 - 1).bit_length()),
        BN=build.block_n,
        BK=build.block_k,
        BV=build.block_v,
        MAX_SRC=build.max_sources,
        E1=ends[0],
        E2=ends[1],
        E3=ends[2],
        E4=ends[3],
        E5=ends[4],
        E6=ends[5],
        OFF_PART=lay["part"][0],
        OFF_MSQ=lay["msq"][0],
        OFF_MIXED=lay["mixed"][0],
        OFF_X=lay["x"][0],
        OFF_PROJ=lay["proj"][0],
        OFF_O=lay["o"][0],
        OFF_DONE=build.scratch_bytes,
        N4P=1 << max(0, (items[3] - 1).bit_length()),
        N5P=1 << max(0, (items[4] - 1).bit_length()),
        N6P=1 << max(0, (items[5] - 1).bit_length()),
        PREFETCH=build.prefetch_items,
        INTERPRET=os.environ.get("TRITON_INTERPRET") == "1",
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
