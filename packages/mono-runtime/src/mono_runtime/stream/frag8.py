"""``fp8-frag``: FP8 (e4m3, ``fp8-b128``'s values) laid out in mma.sync's register
fragments (pure torch), the Gluon engine's FP8 layout (`frag_gluon`).

Why: the m16n8k16 A fragment of lane 4 g + t is rows g and g + 8 at columns 2t, 2t + 1,
2t + 8, 2t + 9 of each 16-column step; read from a row-major tile that is four 2-byte
shared-memory loads a step. Packed at load, a lane's fragments of 16 rows x 32 columns
are 16 contiguous bytes: one 16-byte load, conflict-free across the warp, and each
32-bit word decodes into two of the MMA's bf16x2 registers in five integer instructions
and a multiply (`decode_words`, the device's bits). The values and the fp32 128 x 128
block scales stay those of ``fp8-b128``; only the bytes move.

- Words: int32 ``[..., N/16, K/64, 256]``. Per block of 16 rows and 64 columns, word
  ``128 jh + 4 (4 g + t) + 2 jl + h`` holds, for the 16-column step ``j = 2 jh + jl`` and
  its column half ``h``, column ``c = 16 j + 8 h + 2 t`` of rows g and g + 8: bytes
  (row g, c), (row g + 8, c), (row g, c + 1), (row g + 8, c + 1), low byte first.
- Decode (`decode_words`): bytes 0 and 2 become the bf16x2 of row g, bytes 1 and 3 that
  of row g + 8; an e4m3 byte's sign, exponent and mantissa shifted into bf16 place read
  as its value times 2^-120 (subnormals included), times 2^120 in bf16: exact. e4m3's NaN
  codes would read as +-240, so the packer refuses them.
"""

from __future__ import annotations

import torch

FRAG8_ROWS = 16  # rows of a block: one m16 tile
FRAG8_COLS = 64  # columns of a block: four k16 steps, two 16-byte loads a lane
_NAN = 0x7F  # e4m3fn's NaN codes are 0x7F and 0xFF
_LIFT = 2.0**120  # the power of two the shifted bits leave out


def _check(values: torch.Tensor) -> tuple[int, int]:
    if values.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8-frag: values are {values.dtype}, expected float8_e4m3fn")
    n, k = values.shape[-2:]
    if n % FRAG8_ROWS or k % FRAG8_COLS:
        raise ValueError(
            f"fp8-frag: [{n}, {k}] must be rows in blocks of {FRAG8_ROWS} and columns in "
            f"blocks of {FRAG8_COLS}"
        )
    if bool(((values.view(torch.uint8) & 0x7F) == _NAN).any()):
        raise ValueError("fp8-frag: the values hold e4m3 NaN codes (the decode has no NaN)")
    return n, k


def pack_fp8_frag(values: torch.Tensor) -> torch.Tensor:
    """e4m3 ``[..., N, K]`` (row-major) -> ``fp8-frag`` words int32 ``[..., N/16, K/64,
    256]`` (the same bytes, moved)."""
    n, k = _check(values)
    lead = values.shape[:-2]
    b = values.contiguous().view(torch.uint8).reshape(-1, 2, 8, k // 64, 2, 2, 2, 4, 2)
    # [R, mr, g, C, jh, jl, h, t, mk] -> [R, C, jh, g, t, jl, h, mk, mr]
    b = b.permute(0, 3, 4, 2, 7, 5, 6, 8, 1).contiguous()
    return b.reshape(-1, 4).view(torch.int32).reshape(*lead, n // 16, k // 64, 256)


def unpack_fp8_frag(words: torch.Tensor) -> torch.Tensor:
    """``fp8-frag`` words -> e4m3 ``[..., N, K]``: the inverse of `pack_fp8_frag`."""
    if words.dtype != torch.int32 or words.shape[-1] != 256:
        raise ValueError(f"words: {tuple(words.shape)} {words.dtype}, expected int32 [..., 256]")
    *lead, nb, kb, _ = words.shape
    b = words.contiguous().view(torch.uint8).reshape(-1, kb, 2, 8, 4, 2, 2, 2, 2)
    # [R, C, jh, g, t, jl, h, mk, mr] -> [R, mr, g, C, jh, jl, h, t, mk]
    b = b.permute(0, 8, 3, 1, 2, 5, 6, 4, 7).contiguous()
    return b.reshape(*lead, 16 * nb, 64 * kb).view(torch.float8_e4m3fn)


def decode_words(words: torch.Tensor) -> torch.Tensor:
    """bf16 ``[..., N, K]`` of ``fp8-frag`` words through the device decode's own bit
    operations (`frag_gluon`): what the CPU tests hold the GPU's decode to."""
    *lead, nb, kb, _ = words.shape
    q = words.to(torch.int64) & 0xFFFFFFFF

    def halves(v: torch.Tensor) -> torch.Tensor:  # bytes 1 and 3 of v as bf16 x 2^-120
        bits = (v & 0x80008000) | ((v & 0x7F007F00) >> 4)
        pair = torch.stack((bits & 0xFFFF, bits >> 16), -1).to(torch.int32)
        return (pair << 16).view(torch.float32) * _LIFT  # exact: a power of two

    row_g8 = halves(q)  # bytes 1, 3: row g + 8, columns c, c + 1
    row_g = halves((q << 8) & 0xFFFFFFFF)  # bytes 0, 2: row g
    v = torch.stack((row_g, row_g8), -2)  # [..., word, mr, mk]
    v = v.reshape(-1, kb, 2, 8, 4, 2, 2, 2, 2)  # R, C, jh, g, t, jl, h, mr, mk
    v = v.permute(0, 7, 3, 1, 2, 5, 6, 4, 8)  # R, mr, g, C, jh, jl, h, t, mk
    return v.reshape(*lead, 16 * nb, 64 * kb).to(torch.bfloat16)


def pack_experts_fp8_frag(weights: dict[str, torch.Tensor]) -> None:
    """Convert e4m3 tensors ({name: [..., N, K]}, contiguous) to ``fp8-frag`` in place, all
    or none: every tensor is checked first (ValueError naming it), then each matrix is
    rewritten through a temporary of its own size (the tensors keep their e4m3 dtype and
    shape; `unpack_experts_fp8_frag` reads them back)."""
    for name, values in weights.items():
        try:
            _check(values)
        except ValueError as err:
            raise ValueError(f"weights.{name}: {err}") from None
        if not values.is_contiguous():
            raise ValueError(f"weights.{name}: packing in place needs contiguous tensors")
    for values in weights.values():
        n, k = values.shape[-2:]
        for m in values.view(-1, n, k):
            m.view(-1).view(torch.int32).copy_(pack_fp8_frag(m).view(-1))


def unpack_experts_fp8_frag(values: torch.Tensor) -> torch.Tensor:
    """Row-major e4m3 copies of tensors `pack_experts_fp8_frag` packed in place."""
    n, k = values.shape[-2:]
    lead = values.shape[:-2]
    words = values.contiguous().view(-1).view(torch.int32).reshape(*lead, n // 16, k // 64, 256)
    return unpack_fp8_frag(words)
