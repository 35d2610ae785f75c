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
    kk = lg.anchor(lg.arange(0, KP))
    ids = lg.zeros_like(kk, tl.int32)
    w = lg.zeros_like(kk, tl.float32)
    wsum = tl.sum(w, 0)
    taken = ex >= E
    for k in tl.static_range(K):
        m = tl.max(tl.where(taken, float("-inf"), key), 0)
        pick = tl.min(tl.where((~taken) & (key == m), ex, logits.shape[0]), 0)
        hit = ex == pick
        taken = taken | hit
        sc = tl.sum(tl.where(hit, score, 0.0), 0)
        wsum += sc
        ids = tl.where(kk == k, pick, ids)
        w = tl.where(kk == k, sc, w)
    if RENORM:
        w = w / wsum
    return ids, w * SCALE
