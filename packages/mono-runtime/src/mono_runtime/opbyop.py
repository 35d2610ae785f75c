"""Library-op pieces of the op-by-op baselines the kernel benchmarks time their kernels
against: the fastest stock-like MoE path buildable from torch without vLLM."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .stream.layout import StreamFormat, dequantize


def bf16_copy(
    values: torch.Tensor, scales: torch.Tensor | None, fmt: StreamFormat, chunk: int = 16
) -> torch.Tensor:
    """bf16 copy of a weight stored in `fmt`, a stack dequantized `chunk` experts at a time
    (bounded scratch): what the grouped GEMMs read, since no library offers an MXFP4 or
    block-FP8 grouped GEMM here."""
    if values.dim() == 2:
        return dequantize(values, scales, fmt).to(torch.bfloat16)
    out = None
    for i in range(0, values.shape[0], chunk):
        part = dequantize(
            values[i : i + chunk], None if scales is None else scales[i : i + chunk], fmt
        ).to(torch.bfloat16)
        if out is None:
            out = torch.empty(
                values.shape[0], *part.shape[1:], dtype=part.dtype, device=part.device
            )
        out[i : i + chunk] = part
    return out


def grouped_experts(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """fp32 [S, N] routed output: each row's top-k experts (`ids` [S, k]) as one grouped
    GEMM per projection (`torch._grouped_mm` over the bf16 stacks `w13` [E, 2I, K] and
    `w2` [E, N, I]), `act` between them, summed with `weights` [S, k]."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    counts = torch.zeros(w13.shape[0], dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat.to(torch.int64), torch.ones_like(flat, dtype=torch.int32))
    offs = counts.cumsum(0, dtype=torch.int32)
    xa = x.repeat_interleave(k, 0)[order]
    gu = torch._grouped_mm(xa, w13.transpose(-1, -2), offs=offs)
    y = torch._grouped_mm(act(gu), w2.transpose(-1, -2), offs=offs)
    back = torch.empty_like(y)
    back[order] = y
    return (back.view(-1, k, y.shape[-1]).float() * weights[..., None]).sum(1)
