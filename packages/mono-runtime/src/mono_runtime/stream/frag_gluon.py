"""The ``mxfp4-frag`` weight stream in Gluon: mma.sync fed from decoded registers.

Why Gluon: Triton chooses every layout itself, and on sm_90 its MXFP4 loop (`device`)
pays for that in instructions: a wgmma needs its activation tile in shared memory behind
a descriptor rebuilt for each 16-column step (~160 of the 815 instructions a trip), and
the copies' addresses are recomputed each step (~60). Gluon states the layouts: each lane
loads its own ``mxfp4-frag`` words (`frag`), one 16-byte shared-memory load per block,
decodes them in registers into exactly the m16n8k16 A fragment, and issues mma.sync with
the activations' B fragment from shared memory (ldmatrix): 583 instructions a trip of
the same 32 K values, no spills (sm_90, compiled here). On the H200 the GEMV streams a
67 MB weight at 77% of the copy bandwidth at S = 1, where the Triton loop reaches 60-62%
(docs/PERFORMANCE.md, stop 35).

One program: BN weight rows (W warps, 16 rows a warp at a time) times the S <= 16 token
rows (the MMA's N: 8, or 16 past 8 rows) over K/SPLIT columns, in a STAGES-deep cp.async
ring of BK-column steps (codes, scales and the activation slice). The decode is the
``mxfp4-rot`` one (same bits, same scale: ``(s + 63) << 7`` as bf16, the fp32 result
times 2^63 at the end), so a weight decodes to the same bf16 values in both engines.
Gluon has no interpreter: CPU tests check the layout (`frag`) and the compiled sm_90 code.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import ampere
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

# triton 3.6 (the GPU machine) names the CTA barrier thread_barrier; later releases barrier
_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier


def _decode_asm() -> str:
    """PTX for two words of one lane (pack 4 of int16 halves): $8, $9 the words, $10 the
    16-bit e8m0 pair (row g, row g + 8) of their group; $2m + j output m of word j."""
    asm = """{
.reg .b32 t, u, sp, sg, sh;
.reg .b16 lo, hi;
prmt.b32 sp, $10, 0, 0x4140;
mad.lo.u32 sp, sp, 128, 0x1F801F80;
mov.b32 {lo, hi}, sp;
mov.b32 sg, {lo, lo};
mov.b32 sh, {hi, hi};
"""
    for j in range(2):
        q = f"${8 + j}"
        o = [f"${2 * m + j}" for m in range(4)]
        asm += f"""and.b32 t, {q}, 0x81C081C0; mul.rn.bf16x2 {o[0]}, t, sg;
shf.r.wrap.b32 t, {q}, {q}, 4; and.b32 t, t, 0x81C081C0; mul.rn.bf16x2 {o[1]}, t, sh;
shf.r.wrap.b32 t, {q}, {q}, 10; and.b32 t, t, 0x81C081C0; mul.rn.bf16x2 {o[2]}, t, sg;
shf.r.wrap.b32 t, {q}, {q}, 14; shf.r.wrap.b32 u, {q}, {q}, 6;
and.b32 t, t, 0x00400040; and.b32 u, u, 0x81808180; or.b32 t, t, u; mul.rn.bf16x2 {o[3]}, t, sh;
"""
    return asm + "}"


# the bf16 tiles' and activation slices' shared layout (16-byte vectors, 8-way swizzle)
_SW = gl.constexpr(gl.SwizzledSharedLayout(8, 1, 8, order=[1, 0]))

_ASM = gl.constexpr(_decode_asm())
_CONSTRAINTS = gl.constexpr(",".join(["=r"] * 8 + ["r"] * 4))

# ``fp8-frag`` (`frag8`): one word of four e4m3 bytes -> $0 the bf16x2 of bytes 0 and 2
# (row g), $1 that of bytes 1 and 3 (row g + 8): sign, exponent and mantissa shifted into
# bf16 place (the value times 2^-120), times 2^120 (bf16 0x7B80), exact
_ASM8 = gl.constexpr("""{
.reg .b32 a, b, s, k;
mov.b32 k, 0x7B807B80;
and.b32 s, $2, 0x80008000; and.b32 a, $2, 0x7F007F00; shr.b32 a, a, 4; or.b32 a, a, s;
shl.b32 b, $2, 8;
and.b32 s, b, 0x80008000; and.b32 b, b, 0x7F007F00; shr.b32 b, b, 4; or.b32 b, b, s;
mul.rn.bf16x2 $0, b, k; mul.rn.bf16x2 $1, a, k;
}""")


@gluon.jit
def frag_gemv_kernel(
    w,
    ws,
    x,
    y,
    S,
    N: gl.constexpr,
    K: gl.constexpr,
    PT: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    SPLIT: gl.constexpr,
    STAGES: gl.constexpr,
    W: gl.constexpr,
    NT: gl.constexpr,
    F: gl.constexpr,
):
    """y[part, s, n] (fp32, PT rows a part) = sum over K part `part` of W[n, k] x[s, k] for
    s < S, rows n of row block pid // SPLIT; W in ``mxfp4-frag`` (F 1) or ``fp8-frag``
    (F 2)."""
    KP: gl.constexpr = K // SPLIT
    pid = gl.program_id(0)
    rb = pid // SPLIT
    part = pid % SPLIT
    r0 = rb * BN
    acc = _ring(w, ws, x, S, r0, r0, part * KP, KP // BK, K, BN, BK, STAGES, W, NT, F, False)
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8]
    )
    on = r0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    ot = gl.arange(0, NT, layout=gl.SliceLayout(0, mma))
    gl.store(y + part * (PT * N) + ot[None, :] * N + on[:, None], acc, mask=(ot < S)[None, :])


@gluon.jit
def frag_stream_rows(
    w,
    ws,
    x,
    S,
    row0,
    k_begin,
    NSTEP: gl.constexpr,
    K: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
    W: gl.constexpr,
    NT: gl.constexpr,
):
    """fp32 [BN, NT] in the mma.sync layout (NVMMADistributedLayout [2, 0], W warps along
    the rows): weight rows row0.. (a multiple of 16) of an ``mxfp4-frag`` weight of K
    columns times x[:S, k_begin : k_begin + NSTEP * BK] (bf16, row stride K; rows past S
    read as zero): the engine's one loop, for any Gluon kernel to stream weights with."""
    return _ring(w, ws, x, S, row0, row0, k_begin, NSTEP, K, BN, BK, STAGES, W, NT, 1, False)


@gluon.jit
def frag_stream_row_pair(
    w,
    ws,
    x,
    S,
    row_a,
    row_b,
    k_begin,
    NSTEP: gl.constexpr,
    K: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
    W: gl.constexpr,
    NT: gl.constexpr,
):
    """`frag_stream_rows` of two row blocks (row_a.., row_b.., BN rows each, multiples of
    16: a gate block and its up block) in ONE ring: each K step's copies carry both blocks
    and one activation slice, whose B fragments both blocks' MMAs share. Twice the bytes
    in flight of two streams one after the other, and one prologue and drain instead of
    two. (acc_a, acc_b), each fp32 [BN, NT] in the streams' layout. BN >= 16 W: the two
    blocks' decoded rows are apart within each thread only then."""
    gl.static_assert(BN >= 16 * W, "frag_stream_row_pair: BN must be >= 16 x warps")
    return _ring(w, ws, x, S, row_a, row_b, k_begin, NSTEP, K, 2 * BN, BK, STAGES, W, NT, 1, True)


@gluon.jit
def frag_stream_experts(
    w,
    ws,
    x,
    S,
    eids,
    wt,
    nj,
    row0,
    NSTEP: gl.constexpr,
    K: gl.constexpr,
    N: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
    W: gl.constexpr,
    NT: gl.constexpr,
):
    """A grouped GEMV in one ring: sum over j < nj (>= 1, at run time) of wt[j, t] x
    (rows row0.. of expert eids[j]'s [N, K] ``mxfp4-frag`` matrix, stacked from w / ws, times
    x[j]'s [:S, :K] bf16 rows, x + j S K): one ring over all nj K passes, so the next
    expert's first copies fly while this one's last steps compute, where one stream per
    expert drains and refills its ring each time. A term with weight 0 adds 0 (its sums may
    be anything). Each expert's id is read one expert ahead of its copies, its weights at
    its first step. fp32 [BN, NT] in the streams' layout."""
    return _ring(
        w, ws, x, S, row0, row0, 0, NSTEP, K, BN, BK, STAGES, W, NT, 1, False,
        True, eids, wt, nj, N,
    )  # fmt: skip


@gluon.jit
def bf16_stream_rows(
    w,
    x,
    S,
    row0,
    k_begin,
    NSTEP: gl.constexpr,
    K: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
    W: gl.constexpr,
    NT: gl.constexpr,
):
    """`frag_stream_rows` for a plain bf16 weight (row-major [*, K]): the same ring and
    result layout, the weight tile read into the MMA's A fragment by ldmatrix, so a Gluon
    kernel streams its bf16 matrices (a shared expert) beside its MXFP4 ones."""
    return _ring(w, w, x, S, row0, row0, k_begin, NSTEP, K, BN, BK, STAGES, W, NT, 0, False)


@gluon.jit
def bf16_stream_row_pair(
    w,
    x,
    S,
    row_a,
    row_b,
    k_begin,
    NSTEP: gl.constexpr,
    K: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
    W: gl.constexpr,
    NT: gl.constexpr,
):
    """`frag_stream_row_pair` for a plain bf16 weight."""
    return _ring(
        w, w, x, S, row_a, row_b, k_begin, NSTEP, K, 2 * BN, BK, STAGES, W, NT, False, True
    )


@gluon.jit
def bf16_rows_ask(
    w,
    row0,
    k_begin,
    NSTEP: gl.constexpr,
    K: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    W: gl.constexpr,
):
    """Every one of a small item's NSTEP steps of BN bf16 weight rows, asked for at once into
    shared memory (one cp.async group); returns the buffer for `bf16_stream_asked`. Weights
    need no result: a program asks before it waits for the item's activations, so an item
    taken long before its input (K2's router: ~22 us at S = 1) finds them there."""
    wpre = gl.allocate_shared_memory(gl.bfloat16, [NSTEP, BN, BK], _SW)
    w_off = _bf16_offsets(row0, row0, K, BN, BK, W, False)
    for st in gl.static_range(NSTEP):
        cp.async_copy_global_to_shared(wpre.index(st), w + w_off + k_begin + st * BK)
    cp.commit_group()
    return wpre


@gluon.jit
def bf16_stream_asked(
    wpre,
    x,
    S,
    k_begin,
    NSTEP: gl.constexpr,
    K: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
    W: gl.constexpr,
    NT: gl.constexpr,
):
    """`bf16_stream_rows` of the weights `bf16_rows_ask` put in `wpre` (its NSTEP, BN, BK):
    only the activation slices go through the STAGES-deep ring (its weight arguments
    unused: x stands in for them)."""
    return _ring(
        x, x, x, S, 0, 0, k_begin, NSTEP, K, BN, BK, STAGES, W, NT, 0, False, PRE=True, wpre=wpre
    )


@gluon.jit
def _bf16_offsets(
    row0,
    row1,
    K: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    W: gl.constexpr,
    TWO: gl.constexpr,
):
    """The element offsets of a [BN, BK] bf16 tile of a row-major [*, K] weight (TWO: BN / 2
    rows from row0, BN / 2 from row1), 16 bytes a thread: a ring slot's copy."""
    TK: gl.constexpr = min(BK // 8, 32)  # threads along K
    wc_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TK, TK], [W, 1], [1, 0])
    wn = gl.arange(0, BN, layout=gl.SliceLayout(1, wc_l))
    wk = gl.arange(0, BK, layout=gl.SliceLayout(0, wc_l))
    wrow = gl.where(wn < BN // 2, row0 + wn, row1 + wn - BN // 2) if TWO else row0 + wn
    return wrow.to(gl.int64)[:, None] * K + wk[None, :]


@gluon.jit
def fp8_stream_rows(
    w,
    ws,
    x,
    S,
    row0,
    k_begin,
    NSTEP: gl.constexpr,
    K: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
    W: gl.constexpr,
    NT: gl.constexpr,
):
    """`frag_stream_rows` for an ``fp8-frag`` weight (int32 words, `frag8`) with its fp32
    128 x 128 block scales ws ``[N/128, ceil(K/128)]``: each half step's sums times its
    block's scale, as ``fp8-b128`` dequantizes. Rows row0 .. row0 + BN in one scale block."""
    return _ring(w, ws, x, S, row0, row0, k_begin, NSTEP, K, BN, BK, STAGES, W, NT, 2, False)


@gluon.jit
def fp8_stream_row_pair(
    w,
    ws,
    x,
    S,
    row_a,
    row_b,
    k_begin,
    NSTEP: gl.constexpr,
    K: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
    W: gl.constexpr,
    NT: gl.constexpr,
):
    """`frag_stream_row_pair` for an ``fp8-frag`` weight (`fp8_stream_rows`)."""
    gl.static_assert(BN >= 16 * W, "fp8_stream_row_pair: BN must be >= 16 x warps")
    return _ring(w, ws, x, S, row_a, row_b, k_begin, NSTEP, K, 2 * BN, BK, STAGES, W, NT, 2, True)


@gluon.jit
def _ring(
    w,
    ws,
    x,
    S,
    row0,
    row1,
    k_begin,
    NSTEP: gl.constexpr,
    K: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
    W: gl.constexpr,
    NT: gl.constexpr,
    F: gl.constexpr,
    TWO: gl.constexpr,
    MULTI: gl.constexpr = False,
    eids=None,
    wt=None,
    nj=1,
    EN: gl.constexpr = 0,
    PRE: gl.constexpr = False,
    wpre=None,
):
    """Every stream's loop: a STAGES-deep cp.async ring of BK-column steps (weights, their
    scale words for F 1, and the activation slice), two mma.sync accumulator chains over
    each step's halves. F: 1 ``mxfp4-frag`` words decoded in registers into the A fragment
    (the fp32 sums x 2^63 at the end: the decode's scales leave it); 2 ``fp8-frag`` words
    decoded so, each half step's sums times its 128 x 128 block's fp32 scale (ws); 0 bf16
    tiles read into it by ldmatrix. TWO: the tile's BN rows are BN / 2 from row0 and BN / 2
    from row1, their sums returned apart (two [BN / 2, NT]); else BN rows from row0 (row1
    unused), one [BN, NT]. MULTI (F 1, one part): `frag_stream_experts`' nj passes of
    NSTEP steps over stacked [EN, K] experts, each pass's sums weighted by its wt row. PRE
    (F 0, one part): the weights of all NSTEP steps are in `wpre` (`bf16_rows_ask`), asked
    for before the activations existed; only the activations go through the ring."""
    gl.static_assert(not PRE or (F == 0 and not TWO and not MULTI), "PRE: bf16, one part")
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8]
    )
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    AR: gl.constexpr = BN // 2 if TWO else BN  # rows of an accumulator
    WB: gl.constexpr = 128 if F == 1 else 256  # words of a 16 x 64 block (F 1, 2)
    if F != 0:
        RB: gl.constexpr = BN // 16
        RH: gl.constexpr = BN // 32  # blocks of a part (TWO)
        CB: gl.constexpr = BK // 64
        blk0 = (row0 // 16).to(gl.int64)  # the parts' first 16-row blocks (stacked experts
        blk1 = (row1 // 16).to(gl.int64) - RH  # pass 2^31 B); blk1 + r for blocks r >= RH
        # copies, 16 bytes a thread (scales 8): words [R, c, WB], scales [R, c, 8], x [NT, BK]
        wc_l: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [W, 1, 1], [2, 1, 0])
        xc_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [W, 1], [1, 0])
        plain3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])
        wbuf = gl.allocate_shared_memory(gl.int32, [STAGES, RB, CB, WB], plain3)
        wr = gl.arange(0, RB, layout=gl.SliceLayout(1, gl.SliceLayout(2, wc_l)))
        wcb = gl.arange(0, CB, layout=gl.SliceLayout(0, gl.SliceLayout(2, wc_l)))
        we = gl.arange(0, WB, layout=gl.SliceLayout(0, gl.SliceLayout(1, wc_l)))
        wb = gl.where(wr < RH, blk0 + wr, blk1 + wr) if TWO else blk0 + wr
        w_off = (wb[:, None, None] * (K // 64) + wcb[None, :, None]) * WB
        w_off = w_off + we[None, None, :]
        plain6: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[5, 4, 3, 2, 1, 0])
        if F == 1:
            sc_l: gl.constexpr = gl.BlockedLayout([1, 1, 2], [2, 4, 4], [W, 1, 1], [2, 1, 0])
            # registers: lane (g, t) holds the 8 halves of its words j = 0..3 of each block
            q_l: gl.constexpr = gl.BlockedLayout(
                [1, 1, 1, 1, 8], [1, 1, 8, 4, 1], [W, 1, 1, 1, 1], [4, 3, 2, 1, 0]
            )
            # the scale pairs (group 2c, 2c + 1) of row g, for all four lanes t, both words
            s_l: gl.constexpr = gl.BlockedLayout(
                [1, 1, 1, 1, 2, 4], [1, 1, 8, 4, 1, 1], [W, 1, 1, 1, 1, 1], [5, 4, 3, 2, 1, 0]
            )
            plain5: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[4, 3, 2, 1, 0])
            sbuf = gl.allocate_shared_memory(gl.int32, [STAGES, RB, CB, 8], plain3)
            sr = gl.arange(0, RB, layout=gl.SliceLayout(1, gl.SliceLayout(2, sc_l)))
            scb = gl.arange(0, CB, layout=gl.SliceLayout(0, gl.SliceLayout(2, sc_l)))
            se = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, sc_l)))
            sb = gl.where(sr < RH, blk0 + sr, blk1 + sr) if TWO else blk0 + sr
            s_off = (sb[:, None, None] * (K // 64) + scb[None, :, None]) * 8
            s_off = s_off + se[None, None, :]
        else:
            # registers: lane (g, t) holds the 16 bytes of its four words of each (block,
            # 32-column half jh): [R, c, jh, g, t, 16]
            q_l: gl.constexpr = gl.BlockedLayout(
                [1, 1, 1, 1, 1, 16], [1, 1, 1, 8, 4, 1], [W, 1, 1, 1, 1, 1], [5, 4, 3, 2, 1, 0]
            )
            NKB: gl.constexpr = (K + 127) // 128
            sp0 = ws + (row0 // 128) * NKB  # the parts' rows of block scales
            sp1 = ws + (row1 // 128) * NKB
            zero = gl.zeros([AR, NT], gl.float32, mma)
    else:
        TK: gl.constexpr = min(BK // 8, 32)  # threads along K, 16 bytes each
        xc_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TK, TK], [W, 1], [1, 0])
        if PRE:  # every step's weights are in wpre already (`bf16_rows_ask`)
            wbuf = wpre
            w_off = 0
        else:
            wbuf = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], _SW)
            w_off = _bf16_offsets(row0, row1, K, BN, BK, W, TWO)
    xbuf = gl.allocate_shared_memory(gl.bfloat16, [STAGES, NT, BK], _SW)
    xn = gl.arange(0, NT, layout=gl.SliceLayout(1, xc_l))
    xk = gl.arange(0, BK, layout=gl.SliceLayout(0, xc_l))
    x_off = xn[:, None] * K + xk[None, :]
    x_live = (xn < S)[:, None] & (xk >= 0)[None, :]  # rows past S are zero-filled

    lift: gl.constexpr = 2.0**63 if F == 1 else 1.0  # the mxfp4 scales leave 2^63 to the sums
    total = NSTEP
    if MULTI:
        gl.static_assert(F == 1 and not TWO, "frag_stream_experts: mxfp4-frag, one part")
        gl.static_assert(NSTEP >= STAGES - 1, "frag_stream_experts: NSTEP >= STAGES - 1")
        EW: gl.constexpr = EN * K // 8  # int32 words of an expert's codes, then scales
        ESW: gl.constexpr = EN * K // 128
        nj = gl.to_tensor(nj).to(gl.int32)  # (ring slots are int32; nj may be a constant 1)
        total = nj * NSTEP
        # (other programs' stores, read past L1)
        e_iss = gl.load(eids, volatile=True).to(gl.int64)  # the expert being issued
        e_pre = gl.load(eids + gl.minimum(1, nj - 1), volatile=True).to(gl.int64)  # the next
        wj = w + e_iss * EW
        wsj = ws + e_iss * ESW
        ot = gl.arange(0, NT, layout=gl.SliceLayout(0, mma))
        wrow = gl.zeros([NT], gl.float32, gl.SliceLayout(0, mma))
        tot = gl.zeros([AR, NT], gl.float32, mma)
    else:
        wj = w
        wsj = ws
    for st in gl.static_range(STAGES - 1):
        _copy_step(wj, x, wbuf, xbuf, st, w_off, x_off, x_live, k_begin + st * BK, F, WB, PRE)
        if F == 1:
            cp.async_copy_global_to_shared(
                sbuf.index(st), wsj + s_off + ((k_begin + st * BK) // 64) * 8
            )
        cp.commit_group()

    acc = gl.zeros([AR, NT], gl.float32, mma)
    acc1 = gl.zeros([AR, NT], gl.float32, mma)
    if TWO:  # the second part's two chains
        acc2 = gl.zeros([AR, NT], gl.float32, mma)
        acc3 = gl.zeros([AR, NT], gl.float32, mma)
    for i in range(total):
        if F == 2:  # the step's block scales: asked for before the wait, used after the MMAs
            ka = (k_begin + i * BK) // 128
            kb = (k_begin + i * BK + BK // 2) // 128
            sa0 = gl.load(sp0 + ka)
            sa1 = gl.load(sp0 + kb)
            if TWO:
                sb0 = gl.load(sp1 + ka)
                sb1 = gl.load(sp1 + kb)
        cp.wait_group(STAGES - 2)
        _barrier()  # every lane's copies of step i landed; step i - 1's slot is free
        nxt = i + STAGES - 1
        if MULTI:
            if nxt < total:
                jn = nxt // NSTEP
                kn = nxt - jn * NSTEP
                if kn == 0:  # the next expert's first step: its id came an expert ahead
                    e_iss = e_pre
                    e_pre = gl.load(eids + gl.minimum(jn + 1, nj - 1), volatile=True)
                    e_pre = e_pre.to(gl.int64)
                k0 = kn * BK
                slot = nxt % STAGES
                _copy_step(
                    w + e_iss * EW, x + jn * (S * K), wbuf, xbuf, slot, w_off, x_off, x_live,
                    k0, F, WB,
                )  # fmt: skip
                cp.async_copy_global_to_shared(
                    sbuf.index(slot), ws + e_iss * ESW + s_off + (k0 // 64) * 8
                )
        elif nxt < NSTEP:
            k0 = k_begin + nxt * BK
            slot = nxt % STAGES
            _copy_step(w, x, wbuf, xbuf, slot, w_off, x_off, x_live, k0, F, WB, PRE)
            if F == 1:
                cp.async_copy_global_to_shared(sbuf.index(slot), ws + s_off + (k0 // 64) * 8)
        cp.commit_group()
        if MULTI:
            jc = i // NSTEP
            if i - jc * NSTEP == 0:  # this expert's weights, used after its last step
                wrow = gl.load(wt + jc * S + ot, mask=ot < S, other=0.0, volatile=True)
        cur = i % STAGES
        if F == 1:
            q = wbuf.index(cur)._reinterpret(gl.int16, [RB, CB, 8, 4, 8], plain5).load(q_l)
            sc = sbuf.index(cur)._reinterpret(gl.int16, [RB, CB, 8, 1, 2, 1], plain6).load(s_l)
            sc, _ = gl.broadcast(sc, gl.zeros([RB, CB, 8, 4, 2, 4], gl.int16, s_l))
            sc = gl.convert_layout(gl.reshape(sc, [RB, CB, 8, 4, 8]), q_l, assert_trivial=True)
            p0, p1, p2, p3 = gl.inline_asm_elementwise(
                _ASM, _CONSTRAINTS, [q, sc], dtype=(gl.bfloat16,) * 4, is_pure=True, pack=4
            )
            t = gl.join(gl.join(p0, p1), gl.join(p2, p3))  # [R, c, g, t, (j, e), mr, mk]
            t = gl.reshape(t, [RB, CB, 8, 4, 4, 2, 2, 2])  # [R, c, g, t, j, e, mr, mk]
            t = gl.permute(t, [0, 6, 2, 1, 4, 7, 3, 5])  # [R, mr, g, c, j, mk, t, e]
        elif F == 2:
            q = wbuf.index(cur)._reinterpret(gl.int8, [RB, CB, 2, 8, 4, 16], plain6).load(q_l)
            t = gl.inline_asm_elementwise(
                _ASM8, "=r,=r,r", [q], dtype=gl.bfloat16, is_pure=True, pack=4
            )
            t = gl.reshape(t, [RB, CB, 2, 8, 4, 2, 2, 2, 2])  # [R, c, jh, g, t, jl, h, mr, mk]
            t = gl.permute(t, [0, 7, 3, 1, 2, 5, 6, 4, 8])  # [R, mr, g, c, jh, jl, h, t, mk]
        if F != 0:
            # two accumulators, each over half the step's columns: two dependent mma.sync
            # chains of half the length (H200: 72% -> 77% of copy at S = 1, 67 MB weight)
            if TWO:  # and the rows in two parts (the tile's outer row blocks)
                h = gl.permute(gl.reshape(t, [2, AR, 2, BK // 2]), [1, 3, 2, 0])
                ha, hb = gl.split(h)  # [AR, BK / 2, column half] of each part
                a0, a1 = gl.split(ha)
                c0, c1 = gl.split(hb)
                c0 = gl.convert_layout(c0, a_l)
                c1 = gl.convert_layout(c1, a_l)
            else:
                h = gl.permute(gl.reshape(t, [BN, 2, BK // 2]), [0, 2, 1])
                a0, a1 = gl.split(h)
            a0 = gl.convert_layout(a0, a_l)
            a1 = gl.convert_layout(a1, a_l)
        else:
            wsl = wbuf.index(i if PRE else cur)  # (wpre holds every step)
            a0 = wsl.slice(0, AR, dim=0).slice(0, BK // 2, dim=1).load(a_l)
            a1 = wsl.slice(0, AR, dim=0).slice(BK // 2, BK // 2, dim=1).load(a_l)
            if TWO:
                c0 = wbuf.index(cur).slice(AR, AR, dim=0).slice(0, BK // 2, dim=1).load(a_l)
                c1 = wbuf.index(cur).slice(AR, AR, dim=0).slice(BK // 2, BK // 2, dim=1)
                c1 = c1.load(a_l)
        b0 = xbuf.index(cur).slice(0, BK // 2, dim=1).permute([1, 0]).load(b_l)
        b1 = xbuf.index(cur).slice(BK // 2, BK // 2, dim=1).permute([1, 0]).load(b_l)
        if F == 2:  # each half step's block product, scaled, into its chain
            acc = acc + ampere.mma_v2(a0, b0, zero) * sa0
            acc1 = acc1 + ampere.mma_v2(a1, b1, zero) * sa1
            if TWO:
                acc2 = acc2 + ampere.mma_v2(c0, b0, zero) * sb0
                acc3 = acc3 + ampere.mma_v2(c1, b1, zero) * sb1
        else:
            acc = ampere.mma_v2(a0, b0, acc)
            acc1 = ampere.mma_v2(a1, b1, acc1)
            if TWO:
                acc2 = ampere.mma_v2(c0, b0, acc2)
                acc3 = ampere.mma_v2(c1, b1, acc3)
        if MULTI:
            if i - (i // NSTEP) * NSTEP == NSTEP - 1:  # an expert's last step: weigh it in
                y = (acc + acc1) * lift
                tot += gl.where(wrow[None, :] != 0.0, wrow[None, :] * y, 0.0)
                acc = gl.zeros([AR, NT], gl.float32, mma)
                acc1 = gl.zeros([AR, NT], gl.float32, mma)
    cp.wait_group(0)
    _barrier()  # every warp is done with the ring: a caller's next stream may reuse it
    if MULTI:
        return tot
    elif TWO:
        return (acc + acc1) * lift, (acc2 + acc3) * lift
    else:
        return (acc + acc1) * lift


@gluon.jit
def _copy_step(
    w, x, wbuf, xbuf, slot, w_off, x_off, x_live, k0, F: gl.constexpr, WB: gl.constexpr,
    PRE: gl.constexpr = False,
):  # fmt: skip
    """One ring slot's weight and activation copies of the step at column k0 (the caller
    adds the mxfp4 scale words and commits the group); PRE: the activation's only."""
    if F != 0:
        cp.async_copy_global_to_shared(wbuf.index(slot), w + w_off + (k0 // 64) * WB)
    elif not PRE:
        cp.async_copy_global_to_shared(wbuf.index(slot), w + w_off + k0)
    cp.async_copy_global_to_shared(xbuf.index(slot), x + x_off + k0, mask=x_live)


@gluon.jit
def mma_zeros(BN: gl.constexpr, NT: gl.constexpr, W: gl.constexpr):
    """fp32 zeros [BN, NT] in the streams' result layout: an accumulator of their results
    that a loop carries."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8]
    )
    return gl.zeros([BN, NT], gl.float32, mma)
