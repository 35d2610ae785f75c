"""``mxfp4-frag``: MXFP4 laid out in the register fragments of mma.sync (pure torch).

The Gluon engine (`frag_gluon`) feeds the tensor cores' m16n8k16 A operand straight from
decoded words: a thread's 32-bit word holds exactly the eight codes of its fragment of a
16 x 16 block (rows g and g + 8, columns 2t, 2t + 1, 2t + 8, 2t + 9 for lane 4 g + t),
bit-placed as ``mxfp4-rot`` places them (`layout.SOURCE_BITS`: the same nine-instruction
decode), so a word decodes into the four registers the MMA reads: no shuffle through
shared memory, no wgmma descriptors (what the Triton engine's loop spends a third of its
instructions on).

- Words: int32 ``[..., N/16, K/64, 128]``. Per block of 16 rows and 64 columns, lane
  ``l``'s four words (16-column steps j = 0..3) at ``4 l + j``: a warp copies a block as
  one 512-byte run and reads it back conflict-free, one 16-byte load a lane. Word output
  ``i`` (``layout.ROTATIONS``) is row ``g + 8 (i % 2)``, columns ``16 j + 8 (i // 2) +
  2 t`` (low lane) and ``+ 1`` (high lane).
- Scales: int32 ``[..., N/16, K/64, 8]``: for row ``g`` of a block, the e8m0 bytes
  ``(s[g, 2c], s[g + 8, 2c], s[g, 2c + 1], s[g + 8, 2c + 1])`` of its two 32-column groups:
  the pair a word needs in one 16-bit half.
"""

from __future__ import annotations

import torch

from .layout import MX_GROUP, SOURCE_BITS, _check_codes, _check_scale_codes, _codes

FRAG_ROWS = 16  # rows of a block: one m16 tile
FRAG_COLS = 64  # columns of a block: four k16 steps, one 16-byte load a lane


def _check_frag(values: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    _check_codes(values)
    n, k = values.shape[-2], 2 * values.shape[-1]
    if n % FRAG_ROWS or k % FRAG_COLS:
        raise ValueError(
            f"mxfp4-frag: [{n}, {k}] must be rows in blocks of {FRAG_ROWS} and columns in "
            f"blocks of {FRAG_COLS}"
        )
    if scales.dtype != torch.uint8 or scales.shape != (*values.shape[:-1], k // MX_GROUP):
        raise ValueError(
            f"scales: {tuple(scales.shape)} {scales.dtype}, expected uint8 "
            f"{(*values.shape[:-1], k // MX_GROUP)} for codes {tuple(values.shape)}"
        )
    _check_scale_codes("scales", scales)
    return n, k


def _blocks(t: torch.Tensor, k: int) -> torch.Tensor:
    """[rows, k] per-column -> [R, c, g, t, j, mk, mr, h]: block R, 64-column step c, lane
    (g, t), 16-column step j, the fragment's column half mk and row half mr, lane half h."""
    r = t.shape[0]
    v = t.reshape(r // 16, 2, 8, k // 64, 4, 2, 4, 2)  # R, mr, g, c, j, mk, t, h
    return v.permute(0, 3, 2, 6, 4, 5, 1, 7)


def pack_mxfp4_frag(
    values: torch.Tensor, scales: torch.Tensor, rows_per_pass: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mxfp4-k32`` (codes ``uint8[..., N, K/2]``, e8m0 ``uint8[..., N, K/32]``) ->
    ``mxfp4-frag`` (words int32 ``[..., N/16, K/64, 128]``, scales int32 ``[..., N/16,
    K/64, 8]``), `rows_per_pass` rows at a time (the temporaries stay small)."""
    n, k = _check_frag(values, scales)
    lead = values.shape[:-2]
    flat = values.reshape(-1, k // 2)
    words = torch.empty(flat.shape[0] // 16, k // 64, 128, dtype=torch.int32, device=values.device)
    src = SOURCE_BITS.tolist()
    for r0 in range(0, flat.shape[0], rows_per_pass):
        lo, hi = _codes(flat[r0 : r0 + rows_per_pass])
        codes = torch.stack((lo, hi), -1).reshape(lo.shape[0], k).to(torch.int32)
        blk = _blocks(codes, k)  # [..., mk, mr, h]
        w = torch.zeros(blk.shape[:5], dtype=torch.int32, device=values.device)
        for i in range(4):
            for h in range(2):
                c = blk[..., i // 2, i % 2, h]
                for b in range(4):
                    w |= ((c >> b) & 1) << src[i][h][b]
        words[r0 // 16 : (r0 + codes.shape[0]) // 16] = w.reshape(-1, k // 64, 128)
    s = scales.reshape(-1, 2, 8, k // 64, 2).permute(0, 3, 2, 4, 1)  # R, c, g, group, mr
    sw = s.reshape(-1, k // 64, 8, 4).contiguous().view(torch.int32).reshape(-1, k // 64, 8)
    return words.reshape(*lead, n // 16, k // 64, 128), sw.reshape(*lead, n // 16, k // 64, 8)


def unpack_mxfp4_frag(
    words: torch.Tensor, scale_words: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mxfp4-frag`` -> ``mxfp4-k32`` (codes, scales): the inverse of `pack_mxfp4_frag`."""
    if words.dtype != torch.int32 or words.shape[-1] != 128:
        raise ValueError(f"words: {tuple(words.shape)} {words.dtype}, expected int32 [..., 128]")
    if scale_words.dtype != torch.int32 or scale_words.shape != (*words.shape[:-1], 8):
        raise ValueError(
            f"scale_words: {tuple(scale_words.shape)} {scale_words.dtype}, expected int32 "
            f"{(*words.shape[:-1], 8)}"
        )
    *lead, nb, kb, _ = words.shape
    n, k = 16 * nb, 64 * kb
    w = words.reshape(-1, kb, 8, 4, 4)  # R, c, g, t, j
    codes = torch.zeros((*w.shape, 2, 2, 2), dtype=torch.int32, device=words.device)
    for i in range(4):
        for h in range(2):
            for b in range(4):
                codes[..., i // 2, i % 2, h] |= ((w >> SOURCE_BITS[i, h, b].item()) & 1) << b
    codes = codes.permute(0, 6, 2, 1, 4, 5, 3, 7).reshape(-1, k)  # R, mr, g, c, j, mk, t, h
    values = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    s = scale_words.contiguous().view(torch.uint8).reshape(-1, kb, 8, 2, 2)  # R, c, g, grp, mr
    scales = s.permute(0, 4, 2, 1, 3).reshape(-1, k // MX_GROUP)
    return values.reshape(*lead, n, k // 2), scales.reshape(*lead, n, k // MX_GROUP).contiguous()


def pack_experts_frag(experts: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Convert a weight bundle's ``mxfp4-k32`` tensors ({name: (codes uint8 [..., N, K/2],
    e8m0 uint8 [..., N, K/32])}) to ``mxfp4-frag`` in place, one matrix at a time (the
    packed words and scale words take exactly the bytes of the codes and scales), all or
    none: every tensor is checked first, so a refusal (ValueError naming it) leaves nothing
    half converted."""
    for name, (values, scales) in experts.items():
        try:
            _check_frag(values, scales)
        except ValueError as err:
            raise ValueError(f"weights.{name}: {err}") from None
        if not (values.is_contiguous() and scales.is_contiguous()):
            raise ValueError(f"weights.{name}: packing in place needs contiguous tensors")
    for values, scales in experts.values():
        n, half = values.shape[-2:]
        flat_v, flat_s = values.view(-1, n, half), scales.view(-1, n, scales.shape[-1])
        for v, s in zip(flat_v, flat_s, strict=True):
            words, scale_words = pack_mxfp4_frag(v, s)
            v.view(-1).view(torch.int32).copy_(words.view(-1))
            s.view(-1).view(torch.int32).copy_(scale_words.view(-1))


def unpack_experts_frag(
    values: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mxfp4-k32`` copies (codes, scales) of tensors `pack_experts_frag` packed in place
    (their uint8 shapes kept)."""
    n, k = values.shape[-2], 2 * values.shape[-1]
    lead = values.shape[:-2]
    words = values.contiguous().view(-1).view(torch.int32).reshape(*lead, n // 16, k // 64, 128)
    scale_words = scales.contiguous().view(-1).view(torch.int32)
    scale_words = scale_words.reshape(*lead, n // 16, k // 64, 8)
    return unpack_mxfp4_frag(words, scale_words)
