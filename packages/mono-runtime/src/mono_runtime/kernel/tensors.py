"""The one check of a tensor a launch reads or writes, for every runner and weight bundle:
a wrong shape, dtype, layout or device becomes a ValueError naming the tensor, raised
before anything is launched (a kernel would read past it or compute garbage)."""

from __future__ import annotations

from typing import Any

import torch


def check_tensor(
    name: str, t: Any, shape: tuple[int, ...], dtype: torch.dtype, device: Any = None
) -> None:
    """Raise ValueError naming `name` unless `t` is a contiguous tensor of `shape` and
    `dtype` (on `device` when given)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {tuple(shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{name}: dtype {t.dtype}, expected {dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (strides {t.stride()})")
    if device is not None and not same_device(t.device, device):
        raise ValueError(f"{name}: on {t.device}, expected {device}")


def same_device(a: Any, b: Any) -> bool:
    """Whether `a` and `b` name one device: "cuda" is the current CUDA device, so a tensor
    on cuda:0 is on a runner built for "cuda" (a plain `!=` says they differ)."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.type != "cuda" or (a.index is not None and b.index is not None):
        return a.index == b.index
    current = torch.cuda.current_device()
    return (current if a.index is None else a.index) == (current if b.index is None else b.index)
