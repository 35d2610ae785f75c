"""A standalone GEMV on the streaming engine: y[S, N] = x[S, K] @ W[N, K]^T.

What `mono bench gemv` times (the engine's bandwidth per format, beside cuBLAS) and what
the engine's tests check against `layout.dequantize`. One program per (row block, K part);
K parts are summed on the host in part order, so the result is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .device import stream_rows
from .layout import BF16, FP8_B128, MXFP4_K32, MXFP4_ROT, TILE_ROWS, StreamFormat


@dataclass(frozen=True)
class GemvTiles:
    """BN weight rows x BK columns per step, `split` K parts, `stages` pipeline depth,
    `warps` per program; `asm`: the inline-PTX MXFP4 decode (GPU only)."""

    bn: int = 128
    bk: int = 256
    split: int = 1
    stages: int = 4
    warps: int = 4
    asm: bool = True

    def check(self, fmt: StreamFormat, n: int, k: int) -> None:
        if n % self.bn or k % (self.bk * self.split):
            raise ValueError(f"tiles {self}: N={n}, K={k} must divide into bn x (bk * split)")
        if fmt == FP8_B128 and (self.bk > 128 or self.bn > 128):
            raise ValueError(f"tiles {self}: fp8-b128 needs bk <= 128 inside one 128 block")
        if fmt in (MXFP4_ROT, MXFP4_K32) and self.bk < 32:
            raise ValueError(f"tiles {self}: mxfp4 needs bk >= 32 (one scale group)")
        if fmt == MXFP4_ROT and self.bn % TILE_ROWS:
            raise ValueError(f"tiles {self}: mxfp4-rot needs bn a multiple of {TILE_ROWS}")


@triton.jit
def gemv_kernel(
    w,
    ws,
    x,
    y,
    N: tl.constexpr,
    KROW: tl.constexpr,
    S: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    FMT: tl.constexpr,
    STAGES: tl.constexpr,
    CPU: tl.constexpr,
    ASM: tl.constexpr,
):
    pid = tl.program_id(0)
    rb = pid // SPLIT
    part = pid % SPLIT
    NSTEP: tl.constexpr = KROW // BK // SPLIT
    acc = stream_rows(
        w, ws, x, rb * BN, part * (NSTEP * BK), NSTEP, KROW, BN, BK, S, FMT, STAGES, CPU, ASM
    )
    n = rb * BN + tl.arange(0, BN)
    t = tl.arange(0, acc.shape[1])
    tl.store(y + part * (acc.shape[1] * N) + t[None, :] * N + n[:, None], acc, mask=t[None, :] < S)


def gemv(
    w: torch.Tensor,
    ws: torch.Tensor | None,
    x: torch.Tensor,
    fmt: StreamFormat,
    tiles: GemvTiles = GemvTiles(),
    partials: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 [S, N]: x (bf16 [S, K], S <= 64) times W in `fmt`'s layout."""
    fmt = StreamFormat(fmt)
    s, k = x.shape
    n = w.shape[0]
    if not 1 <= s <= 64 or x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise ValueError(
            f"x: expected contiguous bf16 [S <= 64, K], got {x.dtype} {tuple(x.shape)}"
        )
    tiles.check(fmt, n, k)
    cpu = x.device.type == "cpu"
    nt = max(16, triton.next_power_of_2(s))  # the stream's token rows (device._acc)
    if partials is None:
        partials = torch.empty(tiles.split, nt, n, dtype=torch.float32, device=x.device)
    elif tuple(partials.shape) != (tiles.split, nt, n) or partials.dtype != torch.float32:
        raise ValueError(
            f"partials: expected fp32 {(tiles.split, nt, n)}, got {partials.dtype} "
            f"{tuple(partials.shape)}"
        )
    gemv_kernel[(n // tiles.bn * tiles.split,)](
        w,
        w if ws is None else ws,
        x,
        partials,
        N=n,
        KROW=k,
        S=s,
        BN=tiles.bn,
        BK=tiles.bk,
        SPLIT=tiles.split,
        FMT=int(fmt),
        STAGES=tiles.stages,
        CPU=cpu,
        ASM=tiles.asm and not cpu,
        num_warps=tiles.warps,
    )
    return partials[:, :s].sum(0) if tiles.split > 1 else partials[0, :s]


__all__ = ["BF16", "FP8_B128", "MXFP4_K32", "MXFP4_ROT", "GemvTiles", "gemv"]
