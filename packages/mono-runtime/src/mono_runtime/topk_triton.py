"""MoE expert selection on the device (`@triton.jit`): mono_runtime.routing's rule, one
token row at a time.

Why one row: a row's top-k needs only that row's logits, so a kernel can route rows in
parallel items and keep one [E] vector live rather than a [rows, E] tile (896 experts x 16
rows would not fit in registers). The FFN's `_route` (a [rows, E] tile) computes the same
rule and could call this per row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import lang as lg

# below every key's word (-inf's is -0x7F800001 << 32 and up): a lane already picked
_TAKEN = tl.constexpr(-(1 << 63))


@triton.jit
def _top4(a0, a1, a2, a3, b0, b1, b2, b3):
    """The 4 largest of two descending lists of 4, descending: the k-th is the largest
    min(a[i], b[j]) over i + j = k (a[-1] = b[-1] = +inf), a merge without branches."""
    c0 = tl.maximum(a0, b0)
    c1 = tl.maximum(tl.maximum(a1, b1), tl.minimum(a0, b0))
    c2 = tl.maximum(tl.maximum(a2, b2), tl.maximum(tl.minimum(a0, b1), tl.minimum(a1, b0)))
    c3 = tl.maximum(
        tl.maximum(a3, b3),
        tl.maximum(tl.minimum(a0, b2), tl.maximum(tl.minimum(a1, b1), tl.minimum(a2, b0))),
    )
    return c0, c1, c2, c3


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def sigmoid_topk_row(
    logits,
    bias,
    E: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    SCALE: tl.constexpr,
    RENORM: tl.constexpr,
):
    """(ids int32 [KP], weights fp32 [KP]) of one row: fp32 `logits` and `bias` are
    [E2] blocks (lanes >= E ignored). The top K of sigmoid(logits) + bias in descending
    order (ties -> lower id, NaN keys last), weighted by the unbiased scores, renormalized
    to sum 1 when RENORM, times SCALE; lanes >= K of the result are 0. KP: K rounded up to
    a power of two."""
    ex = lg.like(lg.arange(0, logits.shape[0]), logits)
    score = tl.sigmoid(logits)
    key = score + bias
    key = tl.where((key != key) | (ex >= E), float("-inf"), key)
    # one max a pick instead of a max and an argmin: the key's bits made to sort as signed
    # integers (-0 taken as +0, as a float compare does) over the inverted id, so the
    # largest word is the largest key at its lowest id
    bits = tl.where(key == 0.0, 0.0, key).to(tl.int32, bitcast=True)
    word = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64) << 32
    word = word | (ex ^ (logits.shape[0] - 1)).to(tl.int64)  # (a power of two: the id inverted)
    kk = lg.anchor(lg.arange(0, KP))
    ids = lg.zeros_like(kk, tl.int32)
    w = lg.zeros_like(kk, tl.float32)
    wsum = tl.sum(w, 0)
    word = tl.where(ex >= E, _TAKEN, word)
    none = lg.zeros_like(word, tl.int64) + _TAKEN
    for g in tl.static_range((K + 3) // 4):  # four picks a block reduction
        c0, c1, c2, c3 = tl.reduce((word, none, none, none), 0, _top4)
        for i in tl.static_range(4):
            if 4 * g + i < K:
                c = c0 if i == 0 else (c1 if i == 1 else (c2 if i == 2 else c3))
                pick = (c & 0xFFFFFFFF).to(tl.int32) ^ (logits.shape[0] - 1)
                ids = tl.where(kk == 4 * g + i, pick, ids)
        got = (word == c0) | (word == c1) | (word == c2) | (word == c3)
        s0, s1, s2, s3 = tl.reduce(
            (
                tl.where(word == c0, score, 0.0),
                tl.where(word == c1, score, 0.0),
                tl.where(word == c2, score, 0.0),
                tl.where(word == c3, score, 0.0),
            ),
            0,
            _add4,
        )
        for i in tl.static_range(4):
            if 4 * g + i < K:
                sc = s0 if i == 0 else (s1 if i == 1 else (s2 if i == 2 else s3))
                wsum += sc
                w = tl.where(kk == 4 * g + i, sc, w)
        word = tl.where(got, _TAKEN, word)
    if RENORM:
        w = w / wsum
    return ids, w * SCALE
