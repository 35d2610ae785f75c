"""Weight layouts the engine streams, and the packing into them (pure torch).

- ``bf16``: ``w[N, K]`` row-major.
- ``fp8-b128``: e4m3 ``w[N, K]`` with fp32 scales ``[ceil(N/128), ceil(K/128)]``.
- ``mxfp4-s{BK}`` (kernel-owned): e2m1 codes ``uint8[N, K/2]`` whose byte ``j`` of each
  ``BK/2``-byte chunk holds ``k0 + j`` in its low nibble and ``k0 + BK/2 + j`` in its high
  nibble, where ``k0`` is the chunk's first column; e8m0 scales ``uint8[N, K/32]`` as in
  the checkpoint. A K step of BK columns then decodes into two contiguous halves that feed
  two dots directly: no interleave of nibbles on the device.

The checkpoint's MXFP4 (``mxfp4-k32``: the even k in the low nibble) converts to
``mxfp4-s{BK}`` in place, so packing at load never doubles expert memory.
"""

from __future__ import annotations

import enum

import torch

MX_GROUP = 32
FP8_BLOCK = 128


class StreamFormat(enum.IntEnum):
    """The device code of a streamed weight format (a constexpr of every build)."""

    BF16 = 0
    MXFP4 = 1  # mxfp4-s{BK}
    FP8 = 2
    MXFP4_K32 = 3  # the checkpoint's layout, streamed as it is (an interleave per step)


BF16 = StreamFormat.BF16
MXFP4_SPLIT = StreamFormat.MXFP4
FP8_B128 = StreamFormat.FP8
MXFP4_K32 = StreamFormat.MXFP4_K32


def _check_split(values: torch.Tensor, bk: int) -> None:
    if values.dtype != torch.uint8:
        raise ValueError(f"values: dtype {values.dtype}, expected torch.uint8")
    if bk < MX_GROUP or bk & (bk - 1):
        raise ValueError(f"bk={bk}: a power of two >= {MX_GROUP}")
    if (2 * values.shape[-1]) % bk:
        raise ValueError(f"values: K = {2 * values.shape[-1]} is not a multiple of bk={bk}")


def _codes(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return values & 0x0F, values >> 4


def pack_mxfp4_split(
    values: torch.Tensor, bk: int, out: torch.Tensor | None = None, rows_per_pass: int = 4096
) -> torch.Tensor:
    """``mxfp4-k32`` codes ``uint8[..., K/2]`` -> ``mxfp4-s{bk}`` (same shape).

    `out` may be `values` itself (in place): rows are converted `rows_per_pass` at a time,
    so the extra memory is one pass's temporary, not a second copy of the weight."""
    _check_split(values, bk)
    out = torch.empty_like(values) if out is None else out
    if out.shape != values.shape or out.dtype != torch.uint8:
        raise ValueError(
            f"out: {tuple(out.shape)} {out.dtype}, expected {tuple(values.shape)} torch.uint8"
        )
    flat, dst = values.reshape(-1, values.shape[-1]), out.view(-1, values.shape[-1])
    half = bk // 2
    for r0 in range(0, flat.shape[0], rows_per_pass):
        rows = flat[r0 : r0 + rows_per_pass]
        lo, hi = _codes(rows)
        codes = torch.stack((lo, hi), -1).reshape(rows.shape[0], -1, bk)  # k order
        dst[r0 : r0 + rows_per_pass] = (codes[..., :half] | (codes[..., half:] << 4)).reshape(
            rows.shape[0], -1
        )
    return out


def unpack_mxfp4_split(values: torch.Tensor, bk: int) -> torch.Tensor:
    """``mxfp4-s{bk}`` -> ``mxfp4-k32`` (the inverse of `pack_mxfp4_split`, bit for bit)."""
    _check_split(values, bk)
    lo, hi = _codes(values.reshape(*values.shape[:-1], -1, bk // 2))
    codes = torch.cat((lo, hi), -1).reshape(*values.shape[:-1], -1)  # k order
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


# e2m1 magnitudes indexed by the low 3 bits of a code (bit 3 is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """fp32 value of each 4-bit e2m1 code (integer tensor of 0..15)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    mag = table[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """2**(s - 127) for uint8 e8m0 codes (255 is NaN in OCP; read as 2**128 = inf)."""
    return torch.exp2(scales.to(torch.float32) - 127.0)


def unpack_mxfp4_k32(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 ``[..., K]`` of ``mxfp4-k32`` codes ``[..., K/2]`` and e8m0 ``[..., K/32]``."""
    lo, hi = _codes(values)
    codes = torch.stack((lo, hi), dim=-1).reshape(*values.shape[:-1], values.shape[-1] * 2)
    vals = decode_e2m1(codes)
    k = vals.shape[-1]
    vals = vals.reshape(*vals.shape[:-1], k // MX_GROUP, MX_GROUP)
    return (vals * e8m0_to_float(scales).unsqueeze(-1)).reshape(*values.shape[:-1], k)


def unpack_fp8_b128(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 ``[..., N, K]`` of e4m3 values with fp32 scales per 128x128 block."""
    n, k = values.shape[-2:]
    s = scales.repeat_interleave(FP8_BLOCK, -2).repeat_interleave(FP8_BLOCK, -1)
    return values.float() * s[..., :n, :k]


def dequantize(
    values: torch.Tensor, scales: torch.Tensor | None, fmt: StreamFormat, bk: int = 0
) -> torch.Tensor:
    """fp32 ``[..., N, K]`` of a weight stored in `fmt`'s streamed layout (`bk`: the
    ``mxfp4-s{bk}`` step; scales None for bf16)."""
    if fmt == BF16:
        return values.float()
    if fmt == MXFP4_SPLIT:
        return unpack_mxfp4_k32(unpack_mxfp4_split(values, bk), scales)
    if fmt == MXFP4_K32:
        return unpack_mxfp4_k32(values, scales)
    return unpack_fp8_b128(values, scales)
