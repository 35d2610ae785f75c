"""Tensor constructors that one `@triton.jit` helper body can use under Triton, under
Gluon and in the CPU interpreter alike.

Why: a Gluon kernel may call `@triton.jit` helpers (they compile with Gluon's semantics),
but Triton's `tl.arange` / `tl.zeros` / `tl.full` give no layout, which Gluon requires.
These give Gluon's AutoLayout instead: the value takes the layout of whatever concrete
tensor it meets (a caller's pointer block, a weight tile), so the protocol and decode
helpers are written once for both languages. A block that meets no concrete tensor (a
poll's rank lanes) is pinned with `anchor`. Under Triton and the interpreter these are
exactly `tl.arange` / `tl.full`.
"""

from __future__ import annotations

import triton.language as tl
from triton.language import core


def _gluon(semantic) -> bool:
    return type(semantic).__name__ == "GluonSemantic"


def _builtin(fn):
    """Like `triton.language.core.builtin`, but callable without a compiler: the CPU
    interpreter calls a helper's builtins as plain functions (no `_semantic`), and then
    these fall back to `tl`'s own (which the interpreter has patched)."""
    setattr(fn, core.TRITON_BUILTIN, True)
    return fn


@_builtin
def arange(start, end, _semantic=None):
    """`tl.arange(start, end)`; an AutoLayout block under Gluon."""
    if _semantic is None:
        return tl.arange(start, end)
    start, end = core._unwrap_if_constexpr(start), core._unwrap_if_constexpr(end)
    if _gluon(_semantic):
        return _semantic.arange(start, end, None)
    return _semantic.arange(start, end)


@_builtin
def full(shape, value, dtype, _semantic=None):
    """`tl.full(shape, value, dtype)`; an AutoLayout block under Gluon."""
    if _semantic is None:
        return tl.full(shape, value, dtype)
    shape = core._unwrap_shape(shape)
    value, dtype = core._unwrap_if_constexpr(value), core._unwrap_if_constexpr(dtype)
    if _gluon(_semantic):
        return _semantic.full(shape, value, dtype, None)
    return _semantic.full(shape, value, dtype)


@_builtin
def zeros(shape, dtype, _semantic=None):
    """`tl.zeros(shape, dtype)`; an AutoLayout block under Gluon."""
    return full(shape, 0, dtype, _semantic=_semantic)


@_builtin
def gluon(_semantic=None):
    """constexpr True in a kernel compiled by Gluon, False under Triton and the
    interpreter: a helper branches on it statically (`if lg.gluon():`)."""
    return tl.constexpr(_semantic is not None and _gluon(_semantic))


def _plain_layout(semantic, rank: int):
    """The plain blocked layout: the last dimension across a warp's lanes, the first
    across warps."""
    from triton.experimental.gluon.language import _layouts

    return _layouts.BlockedLayout(
        [1] * rank,
        [1] * (rank - 1) + [32],
        [semantic.builder.options.num_warps] + [1] * (rank - 1),
        list(range(rank - 1, -1, -1)),
    )


@_builtin
def anchor(x, _semantic=None):
    """`x` itself; under Gluon, an AutoLayout block is given the plain blocked layout: for
    blocks that meet no tensor of a concrete layout."""
    if _semantic is None or not _gluon(_semantic):
        return x
    from triton.experimental.gluon.language import _layouts

    if not isinstance(x.type.layout, _layouts.AutoLayout):
        return x
    return _semantic.set_auto_layout(x, _plain_layout(_semantic, len(x.shape)))


def _anchor_blocked(x, semantic, blocked):
    """`x` itself; under Gluon, an AutoLayout block given the blocked layout
    `blocked(num_warps)` returns (sizes a thread, threads a warp, warps, order)."""
    if semantic is None or not _gluon(semantic):
        return x
    from triton.experimental.gluon.language import _layouts

    if not isinstance(x.type.layout, _layouts.AutoLayout):
        return x
    layout = _layouts.BlockedLayout(*blocked(semantic.builder.options.num_warps))
    return semantic.set_auto_layout(x, layout)


@_builtin
def anchor_rows(x, _semantic=None):
    """`x` itself; under Gluon, an AutoLayout 2-D block given a blocked layout with a
    warp's lanes down its rows: for [rows, tokens] blocks whose token count may be 1, where
    the plain layout's 32 lanes along that dimension would each load the same value."""
    return _anchor_blocked(x, _semantic, lambda w: ([1, 1], [32, 1], [w, 1], [1, 0]))


@_builtin
def anchor_cols(x, _semantic=None):
    """`x` itself; under Gluon, an AutoLayout 2-D block given a blocked layout in which each
    thread holds whole columns (every row of them), lanes and warps along the columns: a
    sum over the rows then stays in each thread (a weighted sum of a few source rows)."""
    return _anchor_blocked(x, _semantic, lambda w: ([x.shape[0], 1], [1, 32], [1, w], [1, 0]))


@_builtin
def plain(x, _semantic=None):
    """`x` itself; under Gluon, `x` converted to the plain blocked layout (Gluon scans
    only such layouts)."""
    if _semantic is None or not _gluon(_semantic):
        return x
    return _semantic.convert_layout(x, _plain_layout(_semantic, len(x.shape)))


@_builtin
def zeros_like(x, dtype, _semantic=None):
    """Zeros of `x`'s shape in `dtype`, in `x`'s layout under Gluon: an accumulator a loop
    carries must enter the loop in the layout its updates have."""
    if _semantic is None:
        return tl.zeros(x.shape, dtype)
    dtype = core._unwrap_if_constexpr(dtype)
    if _gluon(_semantic):
        return _semantic.full(list(x.shape), 0, dtype, x.type.layout)
    return _semantic.full(list(x.shape), 0, dtype)


@_builtin
def like(x, ref, _semantic=None):
    """`x` itself; under Gluon, an AutoLayout block of `ref`'s shape takes `ref`'s layout
    now, at trace time: a value that an `if` may replace must have one type in both arms."""
    if _semantic is None or not _gluon(_semantic):
        return x
    from triton.experimental.gluon.language import _layouts

    if isinstance(x.type.layout, _layouts.AutoLayout) and not isinstance(
        ref.type.layout, _layouts.AutoLayout
    ):
        return _semantic.set_auto_layout(x, ref.type.layout)
    return x


@_builtin
def along(x, ref, dim, _semantic=None):
    """`x` itself; under Gluon, the 1-D block `x` converted to the layout that broadcasts
    it along dimension `dim` of the 2-D block `ref` (`x[None, :]` for dim 0): Triton
    inserts such conversions itself, e.g. for a row reduction broadcast back along the
    other dimension."""
    if _semantic is None or not _gluon(_semantic):
        return x
    from triton.experimental.gluon.language import _layouts

    dim = core._unwrap_if_constexpr(dim)
    layout = _layouts.SliceLayout(dim, ref.type.layout)
    if isinstance(x.type.layout, _layouts.AutoLayout):  # (triton 3.6 reduces no auto block)
        return _semantic.set_auto_layout(x, layout)
    return _semantic.convert_layout(x, layout)


@_builtin
def row_pairs(x, _semantic=None):
    """`x` itself; under Gluon, the 2-D block `x` converted to a layout in which a thread
    holds rows 2i and 2i + 1 of a column together: what splitting rows into bf16 pairs
    needs (a mma.sync result holds them in two lanes)."""
    if _semantic is None or not _gluon(_semantic):
        return x
    from triton.experimental.gluon.language import _layouts

    warps = _semantic.builder.options.num_warps
    layout = _layouts.BlockedLayout([2, 1], [2, 16], [warps, 1], [0, 1])
    return _semantic.convert_layout(x, layout)


@_builtin
def dot_bf16(a, b, acc, _semantic=None):
    """`acc + a @ b` of bf16 blocks on the tensor cores with fp32 sums (`tl.dot`); under
    Gluon, mma.sync with the operands and `acc` in its layout, the sum returned in `acc`'s
    (Gluon has no `tl.dot`). The CPU interpreter multiplies bf16 blocks as their raw
    16-bit words, so there the operands go as fp32: the same products, all exact."""
    if _semantic is None:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    if not _gluon(_semantic):
        return tl.dot(a, b, acc, _semantic=_semantic)
    from triton.experimental.gluon.language import _layouts
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2

    warps = _semantic.builder.options.num_warps
    mma = _layouts.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[warps, 1], instr_shape=[16, 8]
    )
    a = _semantic.convert_layout(a, _layouts.DotOperandLayout(0, mma, 2))
    b = _semantic.convert_layout(b, _layouts.DotOperandLayout(1, mma, 2))
    out = mma_v2(a, b, _semantic.convert_layout(acc, mma), _semantic=_semantic)
    return _semantic.convert_layout(out, acc.type.layout)
