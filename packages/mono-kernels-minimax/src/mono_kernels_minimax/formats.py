"""Expert weight formats and the layouts vLLM 0.33 keeps them in, re-implemented in torch.

Layouts (the names a build key carries):

- ``bf16``: ``w[..., N, K]`` bfloat16, row-major (vLLM's unquantized MoE keeps this).
- ``mxfp4-k32``: OCP MXFP4 as vLLM's ``Mxfp4MoEMethod.create_weights`` loads the checkpoint:
  values ``uint8[..., N, K // 2]``, two e2m1 codes per byte, the even k in the LOW nibble
  (vLLM's ``break_fp4_bytes`` order), and e8m0 scales ``uint8[..., N, K // 32]``, one per
  32 consecutive k (value = code * 2**(scale - 127)). The backends that read this layout
  unchanged are vLLM's B12X and EMULATION MXFP4 backends; on sm_90 vLLM 0.33 prefers its
  HUMMING backend, which repacks into a private tensor-core layout (a compiled op).
- ``fp8-b128``: e4m3 (``torch.float8_e4m3fn``) ``w[..., N, K]`` with fp32 scales
  ``[..., ceil(N/128), ceil(K/128)]``, one per 128x128 block (vLLM's block-FP8 MoE layout;
  the checkpoint calls them ``weight_scale_inv``).
"""

from __future__ import annotations

import enum

import torch

# One definition of each format's numbers and decoding: mono_runtime's streaming engine.
from mono_runtime.stream.layout import (
    E2M1_VALUES,
    FP8_BLOCK,
    decode_e2m1,
    e8m0_to_float,
)
from mono_runtime.stream.layout import MX_GROUP as MX_BLOCK
from mono_runtime.stream.layout import quantize_mxfp4_k32 as pack_mxfp4
from mono_runtime.stream.layout import unpack_fp8_b128 as unpack_fp8
from mono_runtime.stream.layout import unpack_mxfp4_k32 as unpack_mxfp4

__all__ = [
    "E2M1_VALUES",
    "FP8_BLOCK",
    "MX_BLOCK",
    "WeightFormat",
    "decode_e2m1",
    "dequantize",
    "e8m0_to_float",
    "pack_fp8",
    "pack_mxfp4",
    "quantize",
    "unpack_fp8",
    "unpack_mxfp4",
]


class WeightFormat(str, enum.Enum):
    BF16 = "bf16"
    MXFP4 = "mxfp4"
    FP8 = "fp8"

    @property
    def layout(self) -> str:
        return {"bf16": "bf16", "mxfp4": "mxfp4-k32", "fp8": "fp8-b128"}[self.value]

    @property
    def shared_format(self) -> WeightFormat:
        """The shared expert is a plain linear MLP: vLLM's Mxfp4Config leaves linear layers
        unquantized (bf16), while an FP8 checkpoint quantizes them like the experts."""
        return WeightFormat.FP8 if self is WeightFormat.FP8 else WeightFormat.BF16


def pack_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``w[..., N, K]`` to ``fp8-b128``: e4m3 values and fp32 per-128x128-block
    scales (amax / 448)."""
    n, k = w.shape[-2:]
    nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    padded = torch.nn.functional.pad(w.float(), (0, kb * FP8_BLOCK - k, 0, nb * FP8_BLOCK - n))
    blocks = padded.reshape(*w.shape[:-2], nb, FP8_BLOCK, kb, FP8_BLOCK)
    amax = blocks.abs().amax(dim=(-3, -1))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q = blocks / scale[..., :, None, :, None]
    q = q.reshape(padded.shape)[..., :n, :k].to(torch.float8_e4m3fn)
    return q.contiguous(), scale.contiguous()


def quantize(w: torch.Tensor, fmt: WeightFormat) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values, scales) of ``w[..., N, K]`` in ``fmt``'s layout (scales None for bf16)."""
    if fmt is WeightFormat.BF16:
        return w.to(torch.bfloat16).contiguous(), None
    if fmt is WeightFormat.MXFP4:
        return pack_mxfp4(w)
    return pack_fp8(w)


def dequantize(
    values: torch.Tensor, scales: torch.Tensor | None, fmt: WeightFormat
) -> torch.Tensor:
    """fp32 ``[..., N, K]`` of a weight stored in ``fmt``'s layout."""
    if fmt is WeightFormat.BF16:
        return values.float()
    if fmt is WeightFormat.MXFP4:
        return unpack_mxfp4(values, scales)
    return unpack_fp8(values, scales)
