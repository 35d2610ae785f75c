"""A standalone GEMV on the streaming engine: y[S, N] = x[S, K] @ W[N, K]^T.

What `mono bench gemv` times (the engine's bandwidth per format, beside cuBLAS) and what
the engine's tests check against `layout.dequantize`. One program per (row block, K part);
K parts are summed on the host in part order, so the result is deterministic. ``mxfp4-frag``
and ``fp8-frag`` weights stream through the Gluon engine (`frag_gluon`, NVIDIA GPUs only),
every other format through the Triton one (`device`, also in the CPU interpreter).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .device import stream_rows
from .layout import (
    BF16,
    FP8_B128,
    FP8_FRAG,
    MXFP4_FRAG,
    MXFP4_K32,
    MXFP4_ROT,
    TILE_ROWS,
    StreamFormat,
)

GLUON = {MXFP4_FRAG: 128, FP8_FRAG: 256}  # the Gluon engine's formats: int32 words a block


def _name(fmt: StreamFormat) -> str:
    """The layout's name as the docs write it (``mxfp4-frag``)."""
    return fmt.name.lower().replace("_", "-")


@dataclass(frozen=True)
class GemvTiles:
    """BN weight rows x BK columns per step, `split` K parts, `stages` pipeline depth,
    `warps` per program; `asm`: the inline-PTX MXFP4 decode (GPU only; ``mxfp4-frag``
    always decodes so)."""

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
        if fmt in GLUON and (
            self.warps not in (4, 8)
            or self.bn % (16 * self.warps)
            or self.bk % 64
            or self.stages < 2
        ):
            raise ValueError(
                f"tiles {self}: {_name(fmt)} needs 4 or 8 warps, bn a multiple of 16 x warps, "
                "bk a multiple of 64 and stages >= 2"
            )
        if fmt == FP8_FRAG and (self.bn > 128 or self.bk > 256):
            raise ValueError(
                f"tiles {self}: fp8-frag needs bn <= 128 and bk <= 256 (each half step "
                "inside one 128 x 128 scale block)"
            )


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
    sum_parts: bool = True,
) -> torch.Tensor | None:
    """fp32 [S, N]: x (bf16 [S, K], S <= 64) times W in `fmt`'s layout. `sum_parts=False`
    only launches the kernel (the K parts stay in `partials`; returns None): what the
    benchmark times, as the fused kernels sum their parts in-kernel."""
    fmt = StreamFormat(fmt)
    s, k = x.shape
    n = 16 * w.shape[0] if fmt in GLUON else w.shape[0]
    if not 1 <= s <= 64 or x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise ValueError(
            f"x: expected contiguous bf16 [S <= 64, K], got {x.dtype} {tuple(x.shape)}"
        )
    tiles.check(fmt, n, k)
    cpu = x.device.type == "cpu"
    words = (n // 16, k // 64, GLUON.get(fmt, 0))
    if fmt in GLUON and (cpu or s > 16 or tuple(w.shape) != words):
        raise ValueError(
            f"{_name(fmt)}: the Gluon engine takes <= 16 rows on an NVIDIA GPU and "
            f"words {words}; got S = {s} on {x.device}, words {tuple(w.shape)}"
        )
    nt = max(16, triton.next_power_of_2(s))  # the stream's token rows (device._acc)
    if partials is None:
        partials = torch.empty(tiles.split, nt, n, dtype=torch.float32, device=x.device)
    elif tuple(partials.shape) != (tiles.split, nt, n) or partials.dtype != torch.float32:
        raise ValueError(
            f"partials: expected fp32 {(tiles.split, nt, n)}, got {partials.dtype} "
            f"{tuple(partials.shape)}"
        )
    if fmt in GLUON:
        from .frag_gluon import frag_gemv_kernel

        frag_gemv_kernel[(n // tiles.bn * tiles.split,)](
            w, ws, x, partials, s, N=n, K=k, PT=nt, BN=tiles.bn, BK=tiles.bk,
            SPLIT=tiles.split, STAGES=tiles.stages, W=tiles.warps, NT=8 if s <= 8 else 16,
            F=1 if fmt == MXFP4_FRAG else 2, num_warps=tiles.warps,
        )  # fmt: skip
    else:
        _launch_triton(w, ws, x, partials, fmt, tiles, cpu)
    if not sum_parts:
        return None
    return partials[:, :s].sum(0) if tiles.split > 1 else partials[0, :s]


def _launch_triton(w, ws, x, partials, fmt, tiles, cpu) -> None:
    s, k = x.shape
    n = w.shape[0]
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


__all__ = [
    "BF16",
    "FP8_B128",
    "FP8_FRAG",
    "MXFP4_FRAG",
    "MXFP4_K32",
    "MXFP4_ROT",
    "GemvTiles",
    "gemv",
]
