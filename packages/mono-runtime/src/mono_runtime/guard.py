"""The device-side fault check: poison a tensor with NaN when any alarm word is set."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import protocol as P

_MAX_RANKS = tl.constexpr(P.MAX_RANKS)


@triton.jit
def _guard_kernel(x, n, peers, rank, world, BLOCK: tl.constexpr):
    head = tl.load(peers + rank).to(tl.pointer_type(tl.int32))
    ranks = tl.arange(0, _MAX_RANKS)
    raised = tl.max(tl.load(head + ranks, mask=ranks < world, other=0, volatile=True), 0)
    if raised != 0:
        for start in range(0, n, BLOCK):
            i = start + tl.arange(0, BLOCK)
            tl.store(
                x + i, tl.full([BLOCK], float("nan"), tl.float32).to(x.dtype.element_ty), mask=i < n
            )


def guard_nan(x: torch.Tensor, peers: torch.Tensor, rank: int, world: int) -> None:
    if not x.is_floating_point() or not x.is_contiguous():
        raise ValueError(f"guard: x must be a contiguous floating tensor, got {x.dtype}")
    _guard_kernel[(1,)](x, x.numel(), peers, rank, world, BLOCK=1024)
