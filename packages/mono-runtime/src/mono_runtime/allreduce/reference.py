"""The all-reduce in plain torch: the oracle the kernel is tested against."""

from __future__ import annotations

import torch


def allreduce_reference(
    parts: list[torch.Tensor],
    residual: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, residual_out) for the ranks' bf16 partials `parts`, summed in rank order in
    fp32. With `residual`: z = bf16(sum + residual) is residual_out; with `weight` too,
    out = bf16(z * rsqrt(mean(z^2) + eps) * weight), else out = z."""
    acc = torch.zeros(parts[0].shape, dtype=torch.float32)
    for p in parts:
        acc += p.float()
    if residual is None:
        return acc.to(torch.bfloat16), None
    z = (acc + residual.float()).to(torch.bfloat16)
    if weight is None:
        return z, z
    zf = z.float()
    rstd = torch.rsqrt(zf.pow(2).mean(-1, keepdim=True) + eps)
    return (zf * rstd * weight.float()).to(torch.bfloat16), z
