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
def sigmoid_topk_row(
    logits,
    bias,
    src,
    STRIDE: tl.constexpr,
    E: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    SCALE: tl.constexpr,
    RENORM: tl.constexpr,
):
    """(ids int32 [KP], weights fp32 [KP]) of one row: fp32 `logits` and `bias` are
    [E2] blocks (lanes >= E ignored), logit i also at src[i STRIDE] (fp32, e.g. the
    payload half of a pair word). The top K of sigmoid(logits) + bias in descending
    order (ties -> lower id, NaN keys last), weighted by the unbiased scores, renormalized
    to sum 1 when RENORM, times SCALE; lanes >= K of the result are 0. KP: K rounded up to
    a power of two.

    One CTA reduction a pick, in a loop (H100, K2's route item at S = 1: ~16-19 us, ~40
    with two reductions a pick). Every warp holding the whole row, each pick inside a warp
    with no barrier, took 6.9 us alone on an SM but 29.6 inside K2 (stop 52), where each of
    its warps did the whole row's work beside a streaming program. The picks' scores are
    read back from `src` in one load after the last pick."""
    ex = lg.like(lg.arange(0, logits.shape[0]), logits)
    key = tl.sigmoid(logits) + bias
    key = tl.where((key != key) | (ex >= E), float("-inf"), key)
    # one max a pick instead of a max and an argmin: the key's bits made to sort as signed
    # integers (-0 taken as +0, as a float compare does) over the inverted id, so the
    # largest word is the largest key at its lowest id; a picked lane's word drops below
    # every key's
    bits = tl.where(key == 0.0, 0.0, key).to(tl.int32, bitcast=True)
    word = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64) << 32
    word = word | (ex ^ (logits.shape[0] - 1)).to(tl.int64)  # (a power of two: the id inverted)
    word = tl.where(ex >= E, _TAKEN, word)
    kk = lg.anchor(lg.arange(0, KP))
    ids = lg.zeros_like(kk, tl.int32)
    for k in range(K):
        best = tl.max(word, 0)
        pick = (best & 0xFFFFFFFF).to(tl.int32) ^ (logits.shape[0] - 1)
        word = tl.where(word == best, _TAKEN, word)
        ids = tl.where(kk == k, pick, ids)
    live = kk < K
    w = tl.where(
        live, tl.sigmoid(tl.load(src + ids * STRIDE, mask=live, other=0.0, volatile=True)), 0.0
    )
    if RENORM:
        w = w / tl.sum(w, 0)
    return ids, w * SCALE
