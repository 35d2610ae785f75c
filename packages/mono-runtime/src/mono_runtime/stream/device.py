"""Device half of the weight-streaming engine (Triton).

`stream_rows` is the one loop every kernel streams weights with: BN weight rows (the wide
M operand of each dot) against the <= 16 token rows of an activation (the narrow N
operand), over NSTEP fixed K steps that Triton software-pipelines (`tl.range`, STAGES
deep). FMT is a `layout.StreamFormat` code. The result is fp32 ``[BN, 16]``: weight row
by token row.

MXFP4 decode (``mxfp4-s{BK}``): each nibble's 3 magnitude bits go to bf16 bits 8..6 and its
sign to bit 15, which is the e2m1 value times 2^-126 (0.5 lands on the subnormal 2^-127);
the tile is then multiplied by the e8m0 scale times 2^(126 - MX_LIFT) in bf16 and the
fp32 result by 2^MX_LIFT: every product is exact for e8m0 codes 58..254 (scales 2^-69 to
2^127; a code of 255, OCP's NaN, gives inf as the checkpoint reading does). On the GPU the
decode is one inline-PTX block per 4 bytes (`prmt` into 16-bit lanes, masks and shifts on
two lanes per op); under the interpreter the same bits come from plain integer ops.
"""

from __future__ import annotations

import triton
import triton.language as tl

MX_LIFT = tl.constexpr(63)  # the power of two the bf16 scale leaves to the fp32 result (see above)

_MX_DECODE_PTX = tl.constexpr("""
{
.reg .b32 t0, t1, a, b;
prmt.b32 t0, $4, 0, 0x4140;
prmt.b32 t1, $4, 0, 0x4342;
and.b32 a, t0, 0x00070007; shl.b32 a, a, 6; and.b32 b, t0, 0x00080008; shl.b32 b, b, 12;
or.b32 $0, a, b;
and.b32 a, t1, 0x00070007; shl.b32 a, a, 6; and.b32 b, t1, 0x00080008; shl.b32 b, b, 12;
or.b32 $1, a, b;
and.b32 a, t0, 0x00700070; shl.b32 a, a, 2; and.b32 b, t0, 0x00800080; shl.b32 b, b, 8;
or.b32 $2, a, b;
and.b32 a, t1, 0x00700070; shl.b32 a, a, 2; and.b32 b, t1, 0x00800080; shl.b32 b, b, 8;
or.b32 $3, a, b;
}
""")


@triton.jit
def bf16_of_bits(bits, CPU: tl.constexpr):
    """bf16 of 16-bit patterns held in int32 (the interpreter mis-reads an int16 -> bf16
    bitcast: there through the exact fp32 of the same top half)."""
    if CPU:
        return (bits << 16).to(tl.float32, bitcast=True).to(tl.bfloat16)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def mx_nibbles(byte, CPU: tl.constexpr, ASM: tl.constexpr):
    """(low, high) nibbles of uint8 e2m1 pairs as value x 2^-126: bf16 on the GPU, the same
    numbers in fp32 under the interpreter (whose bf16 casts flush the subnormal 2^-127)."""
    if ASM and not CPU:
        lo, hi = tl.inline_asm_elementwise(
            _MX_DECODE_PTX,
            "=r,=r,=r,=r,r",
            [byte],
            dtype=(tl.bfloat16, tl.bfloat16),
            is_pure=True,
            pack=4,
        )
    else:
        b = byte.to(tl.int32)
        lo = ((b & 7) << 6) | ((b & 8) << 12)
        hi = ((b & 0x70) << 2) | ((b & 0x80) << 8)
        if CPU:
            lo = (lo << 16).to(tl.float32, bitcast=True)
            hi = (hi << 16).to(tl.float32, bitcast=True)
        else:
            lo = lo.to(tl.int16).to(tl.bfloat16, bitcast=True)
            hi = hi.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return lo, hi


@triton.jit
def mx_scale(s, CPU: tl.constexpr):
    """bf16 2^(s - 127 + 126 - MX_LIFT) of uint8 e8m0 codes (inf past the bf16 range)."""
    e = s.to(tl.int32) + (126 - MX_LIFT)  # biased bf16 exponent of the lifted scale
    bits = tl.where(e >= 255, 0x7F80, tl.where(e <= 0, 0, e << 7))
    return bf16_of_bits(bits, CPU)


@triton.jit
def _scaled(vals, sc, BN: tl.constexpr, HALF: tl.constexpr, CPU: tl.constexpr):
    """vals [BN, HALF] times one scale per 32 columns (sc [BN, HALF // 32]), in bf16."""
    v = tl.reshape(vals, (BN, HALF // 32, 32))
    if CPU:  # fp32 values (see mx_nibbles): exact fp32 products, rounded once
        t = (v * sc[:, :, None].to(tl.float32)).to(tl.bfloat16)
    else:
        t = v * sc[:, :, None]
    return tl.reshape(t, (BN, HALF))


@triton.jit
def _mma(acc, w, x, k0, KROW: tl.constexpr, BK: tl.constexpr, S: tl.constexpr, CPU: tl.constexpr):
    """acc [BN, 16] + the weight tile w [BN, BK] (the dot's M side) times activation
    columns k0.. (rows >= S as zero). bf16 operands, fp32 sums; fp32 operands under the
    interpreter, which mis-reads bf16 dot operands."""
    n = tl.arange(0, 16)
    k = k0 + tl.arange(0, BK)
    xt = tl.load(x + n[None, :] * KROW + k[:, None], mask=n[None, :] < S, other=0.0)
    if CPU:
        return tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(w, xt, acc)


@triton.jit
def stream_step(
    acc,
    w,
    ws,
    x,
    row0,
    k0,
    KROW: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    S: tl.constexpr,
    FMT: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
):
    """acc [BN, 16] + W[row0 : row0 + BN, k0 : k0 + BK] @ X[:, k0 : k0 + BK]^T."""
    r = row0 + tl.arange(0, BN)
    if FMT == 1:
        j = tl.arange(0, BK // 2)
        byte = tl.load(w + r[:, None] * (KROW // 2) + (k0 // 2 + j)[None, :])
        lo, hi = mx_nibbles(byte, CPU, ASM)
        if BK >= 64:  # each half spans BK / 64 scale groups
            g = tl.arange(0, BK // 64)
            sp = ws + r[:, None] * (KROW // 32) + (k0 // 32 + g)[None, :]
            lo = _scaled(lo, mx_scale(tl.load(sp), CPU), BN, BK // 2, CPU)
            hi = _scaled(hi, mx_scale(tl.load(sp + BK // 64), CPU), BN, BK // 2, CPU)
        else:  # BK = 32: both halves in one group
            sc = mx_scale(tl.load(ws + r * (KROW // 32) + k0 // 32), CPU)[:, None]
            if CPU:
                lo = (lo * sc.to(tl.float32)).to(tl.bfloat16)
                hi = (hi * sc.to(tl.float32)).to(tl.bfloat16)
            else:
                lo = lo * sc
                hi = hi * sc
        acc = _mma(acc, lo, x, k0, KROW, BK // 2, S, CPU)
        acc = _mma(acc, hi, x, k0 + BK // 2, KROW, BK // 2, S, CPU)
    elif FMT == 3:  # the checkpoint's mxfp4-k32: nibbles interleaved along k
        j = tl.arange(0, BK // 2)
        byte = tl.load(w + r[:, None] * (KROW // 2) + (k0 // 2 + j)[None, :])
        lo, hi = mx_nibbles(byte, CPU, ASM)
        g = k0 // 32 + tl.arange(0, BK // 32)
        sc = mx_scale(tl.load(ws + r[:, None] * (KROW // 32) + g[None, :]), CPU)
        t = _scaled(tl.reshape(tl.join(lo, hi), (BN, BK)), sc, BN, BK, CPU)
        acc = _mma(acc, t, x, k0, KROW, BK, S, CPU)
    elif FMT == 2:
        k = k0 + tl.arange(0, BK)
        t = tl.load(w + r[:, None] * KROW + k[None, :]).to(tl.bfloat16)
        sc = tl.load(ws + (row0 // 128) * ((KROW + 127) // 128) + k0 // 128)
        acc += _mma(tl.zeros_like(acc), t, x, k0, KROW, BK, S, CPU) * sc
    else:
        k = k0 + tl.arange(0, BK)
        t = tl.load(w + r[:, None] * KROW + k[None, :])
        acc = _mma(acc, t, x, k0, KROW, BK, S, CPU)
    return acc


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
    """fp32 [BN, 16]: weight rows row0.. of W (KROW logical columns, layout FMT) times the
    activation rows X[:16, k_begin : k_begin + NSTEP * BK] (bf16, row stride KROW), over a
    fixed-count, software-pipelined loop. FP8 tiles must not straddle a 128-row block."""
    acc = tl.zeros((BN, 16), tl.float32)
    for i in tl.range(0, NSTEP, num_stages=STAGES):
        acc = stream_step(acc, w, ws, x, row0, k_begin + i * BK, KROW, BN, BK, S, FMT, CPU, ASM)
    if FMT == 1 or FMT == 3:
        acc = acc * (2.0**MX_LIFT)
    return acc


@triton.jit
def prefetch_l2(base, stride, row_bytes, NROWS: tl.constexpr, CPU: tl.constexpr):
    """Ask L2 for NROWS rows of `row_bytes` each, `stride` bytes apart from `base` (bytes,
    addresses and sizes multiples of 16), without waiting: 128 bulk prefetches (sm_90
    `cp.async.bulk.prefetch.L2`), one per thread of a 4-warp program, each a piece of one
    row; nothing under the interpreter. Weights do not depend on activations, so a program
    may prefetch an item's weights before that item's inputs exist."""
    if not CPU:
        PIECES: tl.constexpr = 128 // NROWS
        lane = tl.arange(0, 128)
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
