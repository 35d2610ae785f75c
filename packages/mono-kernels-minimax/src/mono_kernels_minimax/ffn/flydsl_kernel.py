"""Device code of the FlyDSL FFN build (see flydsl_build.py, which imports this module only
when it builds a kernel): FlyDSL's MLIR bindings must not load into a process that never
builds one, because a second set of MLIR bindings in that process (vLLM's CUTLASS DSL on
NVIDIA) aborts it. Stage helpers take `c`, a dict of the program's traced values and the
build's numbers.

No ``from __future__ import annotations``: FlyDSL reads kernel annotations at trace time.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.ast_rewriter import ASTRewriter
from flydsl.expr import const_expr, range_constexpr, rocdl
from flydsl.expr import math as fmath
from flydsl.expr.typing import Int32, Int64, T
from mono_runtime import protocol as proto
from mono_runtime.flydsl import protocol as P

from .flydsl_build import (
    DOWN_KLANES,
    MX,
    REGION_NAMES,
    THREADS,
    UP_KLANES,
    WAVE,
    WAVES,
    kernel_name,
)
from .spec import FfnBuild


def _ptr(addr, index, ir_type, nbytes):
    at = fx.Int64(addr) + fx.Int64(index) * nbytes
    return fx.inttoptr(fx.PointerType.get(ir_type, fx.AddressSpace.Global, nbytes), at)


def ld_i32(addr, i):
    return fx.generic_load(_ptr(addr, i, T.i32, 4), dtype=fx.Int32)


def st_i32(addr, i, v):
    fx.generic_store(_ptr(addr, i, T.i32, 4), fx.Int32(v))


def ld_f32(addr, i):
    return fx.generic_load(_ptr(addr, i, T.f32, 4), dtype=fx.Float32)


def st_f32(addr, i, v):
    fx.generic_store(_ptr(addr, i, T.f32, 4), fx.Float32(v))


def ld_u8(addr, i):
    """Byte i at addr, zero-extended."""
    return fx.Int32(fx.generic_load(_ptr(addr, i, T.i8, 1), dtype=fx.Int8)) & 0xFF


def st_bf16(addr, i, x):
    """bf16 element i := x (fp32) rounded to nearest even."""
    fx.generic_store(_ptr(addr, i, T.i16, 2), fx.Int16(P.bf16_bits(x)))


def lo(word):
    return P.bf16x2_lo(word)


def hi(word):
    return P.bf16x2_hi(word)


def round_bf16(x):
    """x rounded to bf16 (nearest even), as fp32."""
    return (P.bf16_bits(x) << 16).bitcast(fx.Float32)


def sigmoid(x):
    return fx.Float32(1.0) / (fx.Float32(1.0) + fmath.exp(-x))


def uniform(v):
    """A value every lane holds alike, made wave-uniform for the compiler (scalar branch)."""
    return fx.Int32(rocdl.readfirstlane(T.i32, fx.Int32(v).ir_value()))


def e2m1(code):
    """fp32 of a 4-bit e2m1 code (Int32 0..15): exponent field 0 is 0 or 0.5."""
    mag = code & 7
    e = mag >> 1
    m = mag & 1
    normal = (((e + 126) << 23) | (m << 22)).bitcast(fx.Float32)
    v = (e == 0).select(fx.Float32(m) * 0.5, normal)
    return ((code & 8) != 0).select(-v, v)


def e8m0(s):
    """2**(s - 127) of an e8m0 code (s = 0 is the subnormal 2**-127)."""
    return (s == 0).select(fx.Int32(0x400000), s << 23).bitcast(fx.Float32)


def xsum(v, offsets):
    """v summed over the lanes ``lane ^ o`` for o in ``offsets`` (a butterfly)."""
    for o in offsets:
        v = v + fx.gpu.shuffle_xor(v, o, WAVE)
    return v


def weight_block(c, w, ws, row, blk, krow, mx):
    """The 32 fp32 weights of k-block ``blk`` of row ``row`` of a row-major weight with
    ``krow`` logical columns: mxfp4-k32 (codes x e8m0 scale) or bf16."""
    out = []
    if const_expr(mx):
        base = fx.Int64(row) * (krow // 2) + fx.Int64(blk) * (MX // 2)
        scale = e8m0(ld_u8(ws, fx.Int64(row) * (krow // MX) + blk))
        for q in range_constexpr(MX // 8):
            word = ld_i32(w + base, q)
            for n in range_constexpr(8):
                out.append(e2m1((word >> (4 * n)) & 15) * scale)
    else:
        base = fx.Int64(row) * (krow // 2) + fx.Int64(blk) * (MX // 2)
        for q in range_constexpr(MX // 2):
            word = ld_i32(w, base + q)
            out += [lo(word), hi(word)]
    return out


# -- program-level steps ------------------------------------------------------------------


def draw(c, total):
    """The next ticket of this program (lane 0 draws; every lane gets it, wave-uniform)."""
    if c["tid"] == 0:
        t = fx.Int32(P.ticket_take(c["counter"], total, c["programs"]))
        fx.ptr_store(t, c["lds"].tick.ptr)
    fx.gpu.barrier()
    t = uniform(fx.ptr_load(c["lds"].tick.ptr))
    fx.gpu.barrier()
    return t


def finish_item(c, t):
    """Ticket t's task is done: every lane's stores first, then its done pair."""
    P.drain()
    if c["tid"] == 0:
        P.ticket_finish(c["done"], t, c["tag"])


def wait_items(c, first, n):
    """Wait (bounded) until items first .. first + n - 1 (smaller tickets) are done; lane 0
    polls, the barrier passes its acquire on to every lane. Returns ok, in every lane."""
    if c["tid"] == 0:
        _, ok = P.poll(
            c["prog"],
            [(c["done"], fx.Int64(first) + q) for q in range_constexpr(n)],
            c["tag"],
            P.DEVICE,
            c["regions"]["items"],
            first,
        )
        fx.ptr_store(ok.select(fx.Int32(1), fx.Int32(0)), c["lds"].tick.ptr + 2)
    fx.gpu.barrier()
    ok = fx.ptr_load(c["lds"].tick.ptr + 2) != 0
    fx.gpu.barrier()
    return ok


def slot_count(c):
    """The route task's slot count, once its item is done (a smaller ticket)."""
    k = c["k"]
    wait_items(c, c["route"], 1)
    got = ld_i32(c["table"], 0)
    got = (got < k["MAXSLOTS"]).select(got, fx.Int32(k["MAXSLOTS"]))
    return uniform((got > 0).select(got, fx.Int32(0)))


def reset_if_last(c, t, n_items):
    """ticket_take's last-taker reset for a ticket drawn against an upper bound of the item
    count: a launch draws n_items + programs tickets in all; the last one resets."""
    if (c["tid"] == 0) & (t == n_items + c["programs"] - 1):
        P.store64(c["counter"], 0, 0, P.DEVICE)


def block_sum(c, v):
    """v summed over the program (waves in order); every lane gets the sum."""
    v = xsum(v, (32, 16, 8, 4, 2, 1))
    red = c["lds"].red.ptr
    if c["tid"] % WAVE == 0:
        fx.ptr_store(v, red + c["tid"] // WAVE)
    fx.gpu.barrier()
    tot = fx.ptr_load(red)
    for w in range_constexpr(1, WAVES):
        tot = tot + fx.ptr_load(red + w)
    fx.gpu.barrier()
    return tot


# -- stages -------------------------------------------------------------------------------


def stage_push(c, t):
    """Columns [t*PUSHC, (t+1)*PUSHC) of every row, bf16 pairs, into every rank's ar1."""
    k, tid = c["k"], c["tid"]
    half = k["H"] // 2
    if tid < k["PUSHC"] // 2:
        p = t * (k["PUSHC"] // 2) + tid
        for s in range_constexpr(k["S"]):
            word = ld_i32(c["part"], s * half + p)
            for dst in range_constexpr(k["W"]):
                ar1 = P.peer_data(c["prog"], dst) + k["PL"]["ar1"]
                P.publish(ar1, (c["rank"] * 16 + s) * half + p, word, c["tag"], P.SYSTEM)


def stage_seam(c, t, s):
    """Row s: the ranks' ar1 pairs in rank order (fp32, rounded to bf16) + residual in fp32
    -> residual_out; Gemma RMSNorm -> xn. A failed wait poisons its columns (NaN)."""
    k, tid = c["k"], c["tid"]
    half, h = k["H"] // 2, k["H"]
    ssq = fx.Float32(0.0)
    ar1 = P.own_data(c["prog"]) + k["PL"]["ar1"]
    nan = fx.Float32(float("nan"))
    for c0 in range_constexpr(0, half, THREADS):
        p = c0 + tid
        if p < half:
            sl, sh, ok = P.reduce_bf16x2(
                c["prog"], ar1, 16 * half, s * half + p, c["tag"], c["regions"]["ar1"]
            )
            r = ld_i32(c["residual"], s * half + p)
            xl = ok.select(round_bf16(sl) + lo(r), nan)
            xh = ok.select(round_bf16(sh) + hi(r), nan)
            st_i32(c["residual_out"], s * half + p, P.bf16x2_pack(xl, xh))
            st_f32(c["xs"], s * h + 2 * p, xl)
            st_f32(c["xs"], s * h + 2 * p + 1, xh)
            ssq = ssq + xl * xl + xh * xh
    ssq = block_sum(c, ssq)
    rstd = fx.Float32(1.0) / fmath.sqrt(ssq / h + k["EPS"])
    for c0 in range_constexpr(0, half, THREADS):
        p = c0 + tid
        if p < half:
            xl = ld_f32(c["xs"], s * h + 2 * p)
            xh = ld_f32(c["xs"], s * h + 2 * p + 1)
            wn = ld_i32(c["norm"], p)
            st_i32(
                c["xn"],
                s * half + p,
                P.bf16x2_pack(xl * rstd * (lo(wn) + 1.0), xh * rstd * (hi(wn) + 1.0)),
            )
    finish_item(c, t)


def stage_router(c, t, u):
    """16 experts x one K part of the fp32 router GEMV for every row -> logit."""
    k, tid = c["k"], c["tid"]
    g, part = u // k["RP"], u % k["RP"]
    wait_items(c, k["NPUSH"], k["S"])
    s, e = tid // 16, g * 16 + tid % 16
    if s < k["S"]:
        acc = fx.Float32(0.0)
        half = k["H"] // 2
        for q in range(part * (k["RK"] // 2), (part + 1) * (k["RK"] // 2)):
            x = ld_i32(c["xn"], s * half + q)
            acc = acc + lo(x) * ld_f32(c["router"], e * k["H"] + 2 * q)
            acc = acc + hi(x) * ld_f32(c["router"], e * k["H"] + 2 * q + 1)
        st_f32(c["logit"], (part * k["S"] + s) * k["E"] + e, acc)
    finish_item(c, t)


def stage_route(c, t):
    """Top-k of sigmoid + bias (ties -> lower id, NaN last), renormalised x RSF; the slot
    table: the shared expert first (unless ROUTED), then the union in ascending id."""
    k, tid = c["k"], c["tid"]
    S, E, K = k["S"], k["E"], k["K"]
    wait_items(c, k["NPUSH"] + S, k["RG"] * k["RP"])
    used, pos = c["lds"].used.ptr, c["lds"].pos.ptr
    first = 1 if k["SHARED"] else 0
    for e0 in range_constexpr(0, E, THREADS):
        if e0 + tid < E:
            fx.ptr_store(fx.Int32(0), used + e0 + tid)
    fx.gpu.barrier()
    s = tid
    live = fx.Int32(0)
    ids, ws = [], []
    if s < S:
        live = (ld_i32(c["slots"], 2 * s + 1) >= 0).select(fx.Int32(1), fx.Int32(0))
        # scores in place of the first logit part (only this task reads the logits)
        for e in range(E):
            lg = ld_f32(c["logit"], s * E + e)
            for q in range_constexpr(1, k["RP"]):
                lg = lg + ld_f32(c["logit"], (q * S + s) * E + e)
            st_f32(c["logit"], s * E + e, sigmoid(lg))
    for j in range_constexpr(K):
        best_id, best, wsum = fx.Int32(-1), fx.Float32(float("-inf")), fx.Float32(0.0)
        if s < S:
            for e in range(E):
                key = ld_f32(c["logit"], s * E + e) + ld_f32(c["bias"], e)
                key = (key != key).select(fx.Float32(float("-inf")), key)
                free = fx.Int32(1)
                for q in range_constexpr(j):
                    free = (ids[q] == e).select(fx.Int32(0), free)
                better = (free != 0) & ((best_id < 0) | (key > best))
                best_id = better.select(fx.Int32(e), best_id)
                best = better.select(key, best)
        ids.append(best_id)
    wsum = fx.Float32(0.0)
    if s < S:
        for j in range_constexpr(K):
            wsum = wsum + ld_f32(c["logit"], s * E + ids[j])
    for j in range_constexpr(K):
        sc = fx.Float32(0.0)
        if s < S:
            sc = ld_f32(c["logit"], s * E + ids[j])
        ws.append((live != 0).select(sc / wsum * k["RSF"], fx.Float32(0.0)))
    if s < S:
        for j in range_constexpr(K):
            st_i32(c["table"] + k["T"]["topk_ids"], s * K + j, (live != 0).select(ids[j], -1))
            st_f32(c["table"] + k["T"]["topk_w"], s * K + j, ws[j])
            if const_expr(k["ROUTED"]):
                if live != 0:
                    fx.ptr_store(fx.Int32(1), used + ids[j])
    fx.gpu.barrier()
    if tid == 0:
        n = fx.Int32(first)
        for e in range(E):
            if fx.ptr_load(used + e) != 0:
                fx.ptr_store(n, pos + e)
                st_i32(c["table"] + k["T"]["slot_expert"], n, e)
                n = n + 1
        if const_expr(first == 1):
            st_i32(c["table"] + k["T"]["slot_expert"], 0, E)
        st_i32(c["table"], 0, n)
        fx.ptr_store(n, c["lds"].tick.ptr + 1)
    fx.gpu.barrier()
    nslots = fx.ptr_load(c["lds"].tick.ptr + 1)
    if s < S:
        wtab = c["table"] + k["T"]["wtab"]
        for j in range(first, nslots):
            st_f32(wtab, j * S + s, fx.Float32(0.0))
        if const_expr(k["ROUTED"]):
            for j in range_constexpr(K):
                if live != 0:
                    st_f32(wtab, fx.ptr_load(pos + ids[j]) * S + s, ws[j])
        if const_expr(first == 1):
            st_f32(wtab, s, (live != 0).select(fx.Float32(1.0), fx.Float32(0.0)))
    finish_item(c, t)


def up_dots(c, w, ws, rows, kl, s, mx):
    """This lane's k-blocks of the gate and up rows ``rows`` against row s of xn."""
    k = c["k"]
    H = k["H"]
    nblk = H // MX
    g, v = fx.Float32(0.0), fx.Float32(0.0)
    for b0 in range(0, nblk, UP_KLANES):
        blk = b0 + kl
        if blk < nblk:
            tg = weight_block(c, w, ws, rows[0], blk, H, mx)
            tu = weight_block(c, w, ws, rows[1], blk, H, mx)
            for q in range_constexpr(MX // 2):
                x = ld_i32(c["xn"], s * (H // 2) + blk * (MX // 2) + q)
                g = g + lo(x) * tg[2 * q] + hi(x) * tg[2 * q + 1]
                v = v + lo(x) * tu[2 * q] + hi(x) * tu[2 * q + 1]
    return g, v


def down_dots(c, w, ws, row, kl, j, s, mx):
    """This lane's k-blocks of down row ``row`` against slot j's mid row s."""
    k = c["k"]
    S, inter = k["S"], k["I"]
    nblk = inter // MX
    y = fx.Float32(0.0)
    for b0 in range(0, nblk, DOWN_KLANES):
        blk = b0 + kl
        if blk < nblk:
            t = weight_block(c, w, ws, row, blk, inter, mx)
            for q in range_constexpr(MX // 2):
                m = ld_i32(c["mid"], ((j * S + s) * inter) // 2 + blk * (MX // 2) + q)
                y = y + lo(m) * t[2 * q] + hi(m) * t[2 * q + 1]
    return y


def stage_up(c, t, u):
    """Slot j = u // NC, gate and up rows [ci*IC, (ci+1)*IC) of its expert over every row:
    SwiGLU-OAI -> bf16 mid[j, s, :]; flag upf[u]. Lane = row i (16) x k-lane (16); rows s
    one after another (the weight tile stays in cache between them)."""
    k, tid = c["k"], c["tid"]
    S, H, inter = k["S"], k["H"], k["I"]
    j, ci = u // k["NC"], u % k["NC"]
    e = ld_i32(c["table"] + k["T"]["slot_expert"], j)
    i, kl = tid // UP_KLANES, tid % UP_KLANES
    shared = e == k["E"]
    mx = k["MXFP4"]
    # routed experts in the build's format; the shared expert is bf16 in every format served
    per_expert = 2 * inter * H // 2 if mx else 2 * inter * H * 2
    w = shared.select(c["sw13"], c["w13"] + fx.Int64(e) * per_expert)
    ws = shared.select(c["sw13_scale"], c["w13_scale"] + fx.Int64(e) * (2 * inter * H // MX))
    rows = (ci * k["IC"] + i, inter + ci * k["IC"] + i)
    for s in range(S):
        g, v = fx.Float32(0.0), fx.Float32(0.0)
        if const_expr(not mx):
            g, v = up_dots(c, w, ws, rows, kl, s, False)
        else:
            if shared:
                g, v = up_dots(c, w, ws, rows, kl, s, False)
            else:
                g, v = up_dots(c, w, ws, rows, kl, s, True)
        g = xsum(g, (8, 4, 2, 1))
        v = xsum(v, (8, 4, 2, 1))
        if kl == 0:
            # clamps that keep NaN (a poisoned row stays poisoned)
            g = (g > k["LIMIT"]).select(fx.Float32(k["LIMIT"]), g)
            v = (v > k["LIMIT"]).select(fx.Float32(k["LIMIT"]), v)
            v = (v < -k["LIMIT"]).select(fx.Float32(-k["LIMIT"]), v)
            act = g * sigmoid(g * k["ALPHA"]) * (v + k["BETA"])
            st_bf16(c["mid"], (j * S + s) * inter + ci * k["IC"] + i, act)
    finish_item(c, t)


def stage_down(c, d, nslots):
    """Output columns [d*DC, (d+1)*DC) over every slot in slot order, weighted by wtab,
    fp32, rounded to bf16 once -> every rank's ar2. Lane = column (32) x k-lane (8)."""
    k, tid = c["k"], c["tid"]
    S, H, inter = k["S"], k["H"], k["I"]
    col, kl = tid // DOWN_KLANES, tid % DOWN_KLANES
    d0 = d * k["DC"]
    mx = k["MXFP4"]
    half = H // 2
    per_expert = H * inter // 2 if mx else H * inter * 2
    ok = fx.Int32(1)
    for j in range(nslots):
        got = wait_items(c, c["static"] + j * k["NC"], k["NC"])
        ok = got.select(ok, fx.Int32(0))
    for s in range(S):
        acc = fx.Float32(0.0)
        for j in range(nslots):
            e = ld_i32(c["table"] + k["T"]["slot_expert"], j)
            shared = e == k["E"]
            w = shared.select(c["sw2"], c["w2"] + fx.Int64(e) * per_expert)
            ws = shared.select(c["sw2_scale"], c["w2_scale"] + fx.Int64(e) * (H * inter // MX))
            y = fx.Float32(0.0)
            if const_expr(not mx):
                y = down_dots(c, w, ws, d0 + col, kl, j, s, False)
            else:
                if shared:
                    y = down_dots(c, w, ws, d0 + col, kl, j, s, False)
                else:
                    y = down_dots(c, w, ws, d0 + col, kl, j, s, True)
            y = xsum(y, (4, 2, 1))
            wrow = ld_f32(c["table"] + k["T"]["wtab"], j * S + s)
            acc = acc + (wrow != 0.0).select(wrow * y, fx.Float32(0.0))
        acc = (ok != 0).select(acc, fx.Float32(float("nan")))
        other = fx.gpu.shuffle_xor(acc, DOWN_KLANES, WAVE)  # column col ^ 1
        if (kl == 0) & (col % 2 == 0):
            word = P.bf16x2_pack(acc, other)
            for dst in range_constexpr(k["W"]):
                ar2 = P.peer_data(c["prog"], dst) + k["PL"]["ar2"]
                P.publish(
                    ar2, (c["rank"] * 16 + s) * half + (d0 + col) // 2, word, c["tag"], P.SYSTEM
                )


def stage_final(c, t, f):
    """Columns [f*FC, (f+1)*FC): the ranks' ar2 partials in rank order -> out (bf16)."""
    k, tid = c["k"], c["tid"]
    half = k["H"] // 2
    ar2 = P.own_data(c["prog"]) + k["PL"]["ar2"]
    nan = fx.Float32(float("nan"))
    if tid < k["FC"] // 2:
        p = f * (k["FC"] // 2) + tid
        for s in range_constexpr(k["S"]):
            sl, sh, ok = P.reduce_bf16x2(
                c["prog"], ar2, 16 * half, s * half + p, c["tag"], c["regions"]["ar2"]
            )
            st_i32(c["out"], s * half + p, P.bf16x2_pack(ok.select(sl, nan), ok.select(sh, nan)))
    finish_item(c, t)


def stage_handshake(c, t):
    """The final launch's last task (TP fault handshake): every final task of this rank is
    done; tell every rank, hear from every rank. A rank that gave up has set its alarm
    here, so this wait fails on every rank of a step in which any rank stopped waiting."""
    k = c["k"]
    wait_items(c, t - k["NF"], k["NF"])
    if c["tid"] == 0:
        hs = P.own_data(c["prog"]) + k["PL"]["hs"]
        for dst in range_constexpr(k["W"]):
            P.publish(
                P.peer_data(c["prog"], dst) + k["PL"]["hs"],
                c["rank"],
                fx.Int32(0),
                c["tag"],
                P.SYSTEM,
            )
        P.poll(
            c["prog"],
            [(hs, q) for q in range_constexpr(k["W"])],
            c["tag"],
            P.SYSTEM,
            c["regions"]["handshake"],
            0,
        )


_TRACED = (
    draw,
    finish_item,
    wait_items,
    slot_count,
    reset_if_last,
    block_sum,
    stage_push,
    stage_seam,
    stage_router,
    stage_route,
    stage_up,
    stage_down,
    stage_final,
    stage_handshake,
    weight_block,
    up_dots,
    down_dots,
)


def make_launcher(b: FfnBuild, programs: int, k: dict):
    """The ``flyc.jit`` launcher of build ``b`` (numbers ``k`` from flydsl_build.consts)."""
    for fn in _TRACED:
        ASTRewriter.transform(fn)
    regions = {name: proto.region_id(f"ffn.{name}") for name in REGION_NAMES}
    S, E, NC = k["S"], k["E"], k["NC"]
    route = k["NPUSH"] + S + k["RG"] * k["RP"]
    static = route + 1
    o = k["O"]

    @fx.struct
    class Lds:
        red: fx.Array[fx.Float32, WAVES, 16]
        tick: fx.Array[fx.Int32, 4, 16]  # [0] ticket, [1] slot count, [2] a wait's ok
        used: fx.Array[fx.Int32, E, 16]
        pos: fx.Array[fx.Int32, E, 16]

    @flyc.kernel(name=kernel_name(b, programs), known_block_size=[THREADS, 1, 1])
    def ffn(
        part: Int64,
        residual: Int64,
        out: Int64,
        residual_out: Int64,
        slots: Int64,
        norm: Int64,
        router: Int64,
        bias: Int64,
        w13: Int64,
        w13_scale: Int64,
        w2: Int64,
        w2_scale: Int64,
        sw13: Int64,
        sw13_scale: Int64,
        sw2: Int64,
        sw2_scale: Int64,
        scratch: Int64,
        slot: Int32,
        final: Int32,
        ctl: Int64,
        health: Int64,
        tickets: Int64,
        peers: Int64,
        rank: Int32,
        world: Int32,
    ):
        # `world` is the build's TP (k["W"], checked by the runner): rank loops unroll
        tid = fx.Int32(fx.thread_idx.x)
        c = {
            "k": k,
            "tid": tid,
            "rank": rank,
            "regions": regions,
            "static": static,
            "route": route,
            "programs": programs,
            "lds": fx.SharedAllocator().allocate(Lds).peek(),
            "prog": P.program(ctl, health, peers, rank, k["W"]),
            "tag": P.step_tag(ctl, slot),
            "counter": tickets + fx.Int64(slot) * 8,
            "done": scratch + o["done"],
            "part": part,
            "residual": residual,
            "out": out,
            "residual_out": residual_out,
            "slots": slots,
            "norm": norm,
            "router": router,
            "bias": bias,
            "w13": w13,
            "w13_scale": w13_scale,
            "w2": w2,
            "w2_scale": w2_scale,
            "sw13": sw13,
            "sw13_scale": sw13_scale,
            "sw2": sw2,
            "sw2_scale": sw2_scale,
            "xs": scratch + o["xs"],
            "xn": scratch + o["xn"],
            "logit": scratch + o["logit"],
            "table": scratch + o["table"],
            "mid": scratch + o["mid"],
        }
        P.fault_stall(c["prog"])
        tail = k["ND"] + k["NF"] + (final != 0).select(fx.Int32(1), fx.Int32(0))
        total = static + k["MAXSLOTS"] * NC + tail  # an upper bound until routed
        nslots = fx.Int32(k["MAXSLOTS"])
        routed = fx.Int32(0)
        t = draw(c, total)
        spent = fx.Int32(0)  # this program drew its one ticket past the end: stop drawing
        while (t < total) & (spent == 0):
            if (t >= static) & (routed == 0):
                nslots = slot_count(c)
                total = static + nslots * NC + tail
                routed = fx.Int32(1)
                reset_if_last(c, t, total)
            u = t - static
            if t >= total:
                # drawn against the upper bound, past the true end: this program's one draw
                # past the end (drawing again would over-count the takers)
                spent = fx.Int32(1)
            elif t < k["NPUSH"]:
                stage_push(c, t)
            elif t < k["NPUSH"] + S:
                stage_seam(c, t, t - k["NPUSH"])
            elif t < route:
                stage_router(c, t, t - k["NPUSH"] - S)
            elif t < static:
                stage_route(c, t)
            elif u < nslots * NC:
                stage_up(c, t, u)
            elif u < nslots * NC + k["ND"]:
                stage_down(c, u - nslots * NC, nslots)
            elif u < nslots * NC + k["ND"] + k["NF"]:
                stage_final(c, t, u - nslots * NC - k["ND"])
            else:
                stage_handshake(c, t)
            if (t < total) & (spent == 0):
                t = draw(c, total)
        if (routed == 0) & (t >= static):
            # this program's only draw was past the upper bound: it may be the last taker
            reset_if_last(c, t, static + slot_count(c) * NC + tail)

    @flyc.jit
    def launch(
        part: Int64,
        residual: Int64,
        out: Int64,
        residual_out: Int64,
        slots: Int64,
        norm: Int64,
        router: Int64,
        bias: Int64,
        w13: Int64,
        w13_scale: Int64,
        w2: Int64,
        w2_scale: Int64,
        sw13: Int64,
        sw13_scale: Int64,
        sw2: Int64,
        sw2_scale: Int64,
        scratch: Int64,
        slot: Int32,
        final: Int32,
        ctl: Int64,
        health: Int64,
        tickets: Int64,
        peers: Int64,
        rank: Int32,
        world: Int32,
        stream: fx.Stream = fx.Stream(None),  # noqa: B008
    ):
        ffn(
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
        ).launch(grid=(programs,), block=(THREADS,), stream=stream)

    return launch
