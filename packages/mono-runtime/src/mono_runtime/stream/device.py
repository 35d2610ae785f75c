"""Device half of the weight-streaming engine (Triton).

`stream_rows` is the one loop every kernel streams weights with: BN weight rows (the wide
M operand of each dot) against the S <= 64 token rows of an activation (the narrow N
operand, padded to 16, 32 or 64), over NSTEP fixed K steps that Triton software-pipelines
(`tl.range`, STAGES deep). FMT is a `layout.StreamFormat` code. The result is fp32
``[BN, 16]`` (``[BN, 32]``, ``[BN, 64]`` past 16 and 32 rows): weight row by token row.
Up to 64 rows take one pass: the weights stream once however many of those tokens read
them.

MXFP4 decode (``mxfp4-rot``, see `layout`): a 32-bit word of eight codes gives four bf16
pairs, each a rotation and a mask (the last two of each), which are the e2m1 values times
2^-126 (0.5 lands on the subnormal 2^-127); each pair is multiplied by the e8m0 scale times
2^(126 - MX_LIFT) in bf16 and the fp32 result by 2^MX_LIFT: every product is exact for
e8m0 codes 58..191 (scales 2^-69 to 2^64, far wider than any checkpoint's); the packer
refuses larger codes (`layout.ROT_SCALE_MAX`), so the decode needs no clamp. On the GPU
the decode and the scaling are one inline-PTX block per word (13 instructions per 8
values), a scale one shift-add, and Triton loads the words straight into the dot's
register operand: no shared-memory round trip for the decoded tile. The weight is
tile-major (`mx_rot_tile`), so the staged words are read without bank conflicts. Under the
interpreter the same bits come from plain integer ops and fp32 products, rounded once.

The checkpoint's ``mxfp4-k32`` goes through Triton's own scaled dot (`tl.dot_scaled`,
e2m1 x bf16): on sm_90 the compiler decodes and scales in the dot-operand registers, in
the interpreter with the same bf16 products. Its `fast_math` scale is the bf16 of bits
s << 7: exact for codes 1..254, inf for 255 as above (code 0 reads as 0, not 2^-127).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import lang as lg

MX_LIFT = tl.constexpr(63)  # the power of two the bf16 scale leaves to the fp32 result (see above)

_MX_ROT_PTX = tl.constexpr("""
{
.reg .b32 t, u;
and.b32 t, $4, 0x81C081C0; mul.rn.bf16x2 $0, t, $5;
shf.r.wrap.b32 t, $4, $4, 4; and.b32 t, t, 0x81C081C0; mul.rn.bf16x2 $1, t, $5;
shf.r.wrap.b32 t, $4, $4, 10; and.b32 t, t, 0x81C081C0; mul.rn.bf16x2 $2, t, $5;
shf.r.wrap.b32 t, $4, $4, 14; shf.r.wrap.b32 u, $4, $4, 6;
and.b32 t, t, 0x00400040; and.b32 u, u, 0x81808180; or.b32 t, t, u; mul.rn.bf16x2 $3, t, $5;
}
""")  # layout.ROTATIONS: outputs 0..3 of a word, times the bf16x2 scale


@triton.jit
def bf16_of_bits(bits, CPU: tl.constexpr):
    """bf16 of 16-bit patterns held in int32 (the interpreter mis-reads an int16 -> bf16
    bitcast: there through the exact fp32 of the same top half)."""
    if CPU:
        return (bits << 16).to(tl.float32, bitcast=True).to(tl.bfloat16)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _rotr(q, n: tl.constexpr):
    return (q >> n) | (q << (32 - n))


@triton.jit
def _lanes(t, s, BN: tl.constexpr, G: tl.constexpr):
    """[BN, G, 4] uint32 words -> [BN, G, 8] bf16: their 16-bit lanes (low lane first) read
    as bf16, times the scales s [BN, G, 1], through exact fp32 products rounded once (the
    interpreter's bf16 casts flush subnormals)."""
    lanes = tl.reshape(tl.join(t & 0xFFFF, t >> 16), (BN, G, 8))
    return ((lanes << 16).to(tl.float32, bitcast=True) * s).to(tl.bfloat16)


@triton.jit
def mx_rot_tile(
    w,
    ws,
    row_a,
    row_b,
    k0,
    KROW: tl.constexpr,
    BN: tl.constexpr,
    SPLIT: tl.constexpr,
    BK: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
):
    """bf16 [BN, BK]: rows row_a.. then row_b.. (`pair_rows`; multiples of 16), columns
    k0.. of an ``mxfp4-rot`` weight, decoded and scaled (without 2^MX_LIFT). The layout is
    tile-major (each block of 16 rows group by group, a group's 16 rows one contiguous
    256-byte run of codes and a 16-byte run of scales): loaded as [blocks, groups, run], a
    warp copies whole runs, and the staged tile is read from shared memory at 16-byte row
    strides (distinct banks; row-major rows K/2 bytes apart all fell in one bank: an 8-way
    conflict)."""
    G: tl.constexpr = BK // 32
    RB: tl.constexpr = BN // 16
    blk = pair_rows(row_a // 16, row_b // 16, RB, SPLIT // 16).to(tl.int64) * (KROW // 32)
    run = (blk[:, None] + (k0 // 32 + tl.arange(0, G))[None, :]) * 16  # [RB, G]: run starts
    rr = tl.arange(0, 16)
    raw = tl.load(ws + run[:, :, None] + rr[None, None, :])  # [RB, G, 16]
    raw = tl.reshape(tl.permute(raw, (0, 2, 1)), (BN, G))
    # a run's 16 rows of words as one contiguous last dimension (so each thread copies 16
    # contiguous bytes and a warp whole runs), then split into rows
    if ASM and not CPU:
        e = tl.arange(0, 128)
        q = tl.load(w.to(tl.pointer_type(tl.int16)) + run[:, :, None] * 8 + e[None, None, :])
        q = tl.reshape(tl.permute(tl.reshape(q, (RB, G, 16, 8)), (0, 2, 1, 3)), (BN, G, 8))
    else:
        e = tl.arange(0, 64)
        q = tl.load(w.to(tl.pointer_type(tl.uint32)) + run[:, :, None] * 4 + e[None, None, :])
        q = tl.reshape(tl.permute(tl.reshape(q, (RB, G, 16, 4)), (0, 2, 1, 3)), (BN, G, 4))
    return _mx_rot_decode(q, raw, BN, BK, CPU, ASM)


@triton.jit
def _mx_rot_decode(
    q, raw, BN: tl.constexpr, BK: tl.constexpr, CPU: tl.constexpr, ASM: tl.constexpr
):
    """bf16 [BN, BK] of a tile's mxfp4-rot words q ([BN, G, 8] int16 halves under ASM, else
    [BN, G, 4] uint32) and e8m0 codes raw [BN, G]. Each of the four outputs of a word is
    [BN, G, 8]; joined and permuted, output i's eight values are columns 8 i .. 8 i + 7
    of their group."""
    G: tl.constexpr = BK // 32
    if ASM and not CPU:
        s2 = tl.broadcast_to(mx_scale(raw, CPU)[:, :, None], (BN, G, 8))
        p0, p1, p2, p3 = tl.inline_asm_elementwise(
            _MX_ROT_PTX,
            "=r,=r,=r,=r,r,r",
            [q, s2],
            dtype=(tl.bfloat16,) * 4,
            is_pure=True,
            pack=2,
        )
    else:
        m = 0x81C081C0
        t3 = (_rotr(q, 14) & 0x00400040) | (_rotr(q, 6) & 0x81808180)
        s2 = mx_scale(raw, CPU)[:, :, None].to(tl.float32)
        p0 = _lanes(q & m, s2, BN, G)
        p1 = _lanes(_rotr(q, 4) & m, s2, BN, G)
        p2 = _lanes(_rotr(q, 10) & m, s2, BN, G)
        p3 = _lanes(t3, s2, BN, G)
    t = tl.join(tl.join(p0, p1), tl.join(p2, p3))  # [BN, G, 8, 2, 2]: [.., e, x, y] = p_{2y+x}
    return tl.reshape(tl.permute(t, (0, 1, 4, 3, 2)), (BN, BK))


@triton.jit
def mx_scale(s, CPU: tl.constexpr):
    """bf16 2^(s - 127 + 126 - MX_LIFT) of uint8 e8m0 codes s <= layout.ROT_SCALE_MAX: the
    biased bf16 exponent s + 126 - MX_LIFT shifted into place, one shift-add a scale with
    no clamp (the packer refuses larger codes; a clamp cost two more instructions a scale
    in a loop bound by its instruction issue)."""
    return bf16_of_bits((s.to(tl.int32) + (126 - MX_LIFT)) << 7, CPU)


@triton.jit
def _mma(acc, w, x, k0, KROW: tl.constexpr, BK: tl.constexpr, S: tl.constexpr, CPU: tl.constexpr):
    """acc [BN, NT] + the weight tile w [BN, BK] (the dot's M side) times activation
    columns k0.. (rows >= S as zero). bf16 operands, fp32 sums; fp32 operands under the
    interpreter, which mis-reads bf16 dot operands."""
    n = tl.arange(0, acc.shape[1])
    k = k0 + tl.arange(0, BK)
    xt = tl.load(x + n[None, :] * KROW + k[:, None], mask=n[None, :] < S, other=0.0)
    if CPU:
        return tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(w, xt, acc)


@triton.jit
def pair_rows(row_a, row_b, BN: tl.constexpr, SPLIT: tl.constexpr):
    """A tile's BN weight rows: SPLIT from row_a, the rest from row_b (SPLIT = BN: one
    block), so that two blocks make one dot (`stream_row_pair`'s ONE_TILE)."""
    i = tl.arange(0, BN)
    if SPLIT == BN:
        r = row_a + i
    else:
        r = tl.where(i < SPLIT, row_a + i, row_b + i - SPLIT)
    return r


@triton.jit
def stream_step(
    acc,
    w,
    ws,
    x,
    row_a,
    row_b,
    k0,
    KROW: tl.constexpr,
    BN: tl.constexpr,
    SPLIT: tl.constexpr,
    BK: tl.constexpr,
    S: tl.constexpr,
    FMT: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
):
    """acc [BN, NT] + W[rows, k0 : k0 + BK] @ X[:, k0 : k0 + BK]^T, rows `pair_rows`."""
    r = pair_rows(row_a, row_b, BN, SPLIT)
    if FMT == 1:
        t = mx_rot_tile(w, ws, row_a, row_b, k0, KROW, BN, SPLIT, BK, CPU, ASM)
        acc = _mma(acc, t, x, k0, KROW, BK, S, CPU)
    elif FMT == 3:  # the checkpoint's mxfp4-k32, decoded and scaled by Triton's scaled dot
        byte = tl.load(w + r[:, None] * (KROW // 2) + (k0 // 2 + tl.arange(0, BK // 2))[None, :])
        g = k0 // 32 + tl.arange(0, BK // 32)
        sc = tl.load(ws + r[:, None] * (KROW // 32) + g[None, :])
        n = tl.arange(0, acc.shape[1])
        k = k0 + tl.arange(0, BK)
        xt = tl.load(x + n[None, :] * KROW + k[:, None], mask=n[None, :] < S, other=0.0)
        acc = tl.dot_scaled(byte, sc, "e2m1", xt, None, "bf16", acc, fast_math=True)
    elif FMT == 2:
        k = k0 + tl.arange(0, BK)
        t = tl.load(w + r[:, None] * KROW + k[None, :]).to(tl.bfloat16)
        nkb: tl.constexpr = (KROW + 127) // 128
        sc = tl.load(ws + (row_a // 128) * nkb + k0 // 128)
        if SPLIT < BN:  # each block its own 128-row scale block
            sc_b = tl.load(ws + (row_b // 128) * nkb + k0 // 128)
            sc = tl.where(tl.arange(0, BN) < SPLIT, sc, sc_b)[:, None]
        acc += _mma(tl.zeros_like(acc), t, x, k0, KROW, BK, S, CPU) * sc
    else:
        k = k0 + tl.arange(0, BK)
        t = tl.load(w + r[:, None] * KROW + k[None, :])
        acc = _mma(acc, t, x, k0, KROW, BK, S, CPU)
    return acc


@triton.jit
def _acc(BN: tl.constexpr, S: tl.constexpr):
    """fp32 zeros [BN, NT]: a stream's sums, S token rows padded to NT = 16, 32 or 64 (the
    dot's N side)."""
    tl.static_assert(S <= 64, "a weight stream takes at most 64 token rows")
    return tl.zeros((BN, 16 if S <= 16 else (32 if S <= 32 else 64)), tl.float32)


@triton.jit
def stream_rows(
    w,
    ws,
    x,
    row0,
    k_begin,
    NSTEP: tl.constexpr,
    KROW: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    S: tl.constexpr,
    FMT: tl.constexpr,
    STAGES: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
):
    """fp32 [BN, NT]: weight rows row0.. of W (KROW logical columns, layout FMT) times the
    activation rows X[:S, k_begin : k_begin + NSTEP * BK] (bf16, row stride KROW; NT = S
    padded to 16, 32 or 64), over a fixed-count, software-pipelined loop. FP8 tiles must
    not straddle a 128-row block."""
    acc = _acc(BN, S)
    for i in tl.range(0, NSTEP, num_stages=STAGES):
        k0 = k_begin + i * BK
        acc = stream_step(acc, w, ws, x, row0, row0, k0, KROW, BN, BN, BK, S, FMT, CPU, ASM)
    if FMT == 1:
        acc = acc * (2.0**MX_LIFT)
    return acc


@triton.jit
def stream_row_pair(
    w,
    ws,
    x,
    row_a,
    row_b,
    k_begin,
    NSTEP: tl.constexpr,
    KROW: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    S: tl.constexpr,
    FMT: tl.constexpr,
    STAGES: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
    ONE_TILE: tl.constexpr,
):
    """`stream_rows` of two BN-row blocks of one weight (a gate block and its up block) in
    one pipelined loop: each K step loads both blocks, so an item keeps twice the bytes in
    flight and ramps its pipeline once, not twice. ONE_TILE: the blocks are one tile of
    2 BN rows and one dot (two dot chains in one loop, at 255 registers, made ptxas
    serialize every wgmma of the FFN and K2: C7515); else two dot chains. Each result is
    bit-identical to its own `stream_rows` (a dot's rows are independent)."""
    if ONE_TILE:
        acc = _acc(2 * BN, S)
        for i in tl.range(0, NSTEP, num_stages=STAGES):
            k0 = k_begin + i * BK
            acc = stream_step(
                acc, w, ws, x, row_a, row_b, k0, KROW, 2 * BN, BN, BK, S, FMT, CPU, ASM
            )
        acc_a, acc_b = tl.split(tl.permute(tl.reshape(acc, (2, BN, acc.shape[1])), (1, 2, 0)))
    else:
        acc_a = _acc(BN, S)
        acc_b = _acc(BN, S)
        for i in tl.range(0, NSTEP, num_stages=STAGES):
            k0 = k_begin + i * BK
            acc_a = stream_step(
                acc_a, w, ws, x, row_a, row_a, k0, KROW, BN, BN, BK, S, FMT, CPU, ASM
            )
            acc_b = stream_step(
                acc_b, w, ws, x, row_b, row_b, k0, KROW, BN, BN, BK, S, FMT, CPU, ASM
            )
    if FMT == 1:
        acc_a = acc_a * (2.0**MX_LIFT)
        acc_b = acc_b * (2.0**MX_LIFT)
    return acc_a, acc_b


@triton.jit
def prefetch_l2(base, stride, row_bytes, NROWS: tl.constexpr, CPU: tl.constexpr):
    """Ask L2 for NROWS rows of `row_bytes` each, `stride` bytes apart from `base` (bytes,
    addresses and sizes multiples of 16), without waiting: 128 bulk prefetches (sm_90
    `cp.async.bulk.prefetch.L2`), one per thread of a 4-warp program, each a piece of one
    row; nothing under the interpreter. Weights do not depend on activations, so a program
    may prefetch an item's weights before that item's inputs exist."""
    if not CPU:
        PIECES: tl.constexpr = 128 // NROWS
        lane = lg.anchor(lg.arange(0, 128))
        piece = (row_bytes // PIECES + 15) // 16 * 16
        off = (lane % PIECES).to(tl.int64) * piece
        size = tl.maximum(tl.minimum(row_bytes - off, piece), 0).to(tl.int32)
        addr = base.to(tl.pointer_type(tl.int8)) + (lane // PIECES).to(tl.int64) * stride + off
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2;"
            " mov.u32 $0, 0; }",
            "=r,l,r",
            [addr, size],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
