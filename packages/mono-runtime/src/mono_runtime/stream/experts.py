"""The layouts a weight bundle's stacked MXFP4 experts can be in, named once for every
kernel package: the checkpoint's ``mxfp4-k32``, the Triton engine's ``mxfp4-rot`` and
the Gluon engine's ``mxfp4-frag``; packing is in place and one way (k32 to a packed one)."""

from __future__ import annotations

import torch

from .frag import pack_experts_frag, unpack_experts_frag
from .layout import pack_experts_rot, unpack_mxfp4_rot

K32, ROT, FRAG = "mxfp4-k32", "mxfp4-rot", "mxfp4-frag"
FP8_FRAG = "fp8-frag"  # FP8 experts packed for the Gluon engine (`frag8`)


def expert_layout(rot: bool, frag: bool) -> str:
    """The layout a bundle's `rot` / `frag` flags name."""
    return FRAG if frag else ROT if rot else K32


def pack_experts(
    experts: dict[str, tuple[torch.Tensor, torch.Tensor]], have: str, want: str
) -> None:
    """Convert {name: (codes, scales)} from layout `have` to `want` in place, all or none
    (each packer checks every tensor first). Only k32 packs: ValueError otherwise."""
    if have != K32:
        raise ValueError(f"weights: already packed as {have}; the kernel wants {want}")
    if want == FRAG:
        pack_experts_frag(experts)
    elif want == ROT:
        pack_experts_rot(experts)


def to_k32(
    values: torch.Tensor, scales: torch.Tensor, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, e8m0 scales) in ``mxfp4-k32`` of experts stored in `layout` (copies where
    packed; the tensors themselves for k32)."""
    if layout == ROT:
        return unpack_mxfp4_rot(values, scales)
    if layout == FRAG:
        return unpack_experts_frag(values, scales)
    return values, scales
