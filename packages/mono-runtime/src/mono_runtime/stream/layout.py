"""Weight layouts the engine streams, and the packing into them (pure torch).

- ``bf16``: ``w[N, K]`` row-major.
- ``fp8-b128``: e4m3 ``w[N, K]`` with fp32 scales ``[ceil(N/128), ceil(K/128)]``.
- ``mxfp4-rot`` (kernel-owned): e2m1 codes ``uint8[N, K/2]``, each 32-column scale group
  16 bytes = four little-endian 32-bit words, with every code's four bits placed where
  the device decode wants them (`rotate_codes`). Column ``8 i + e`` of a group (``i`` <
  4, ``e`` < 8) is 16-bit lane ``e % 2`` of word ``e // 2`` after that word is rotated
  right by ``ROTATIONS[i]`` and masked: its sign at bit 15 of the lane and its magnitude
  at bits 8..6, which read as bf16 are the e2m1 value times 2^-126. So one word gives
  eight values in nine integer instructions (a mask, three rotations and five masks), two
  values per register, already in the order the dot wants them. e8m0 scales
  ``uint8[N, K/32]``. Codes and scales are stored tile-major (`tile_rows`): each block of
  TILE_ROWS = 16 rows group by group, the block's 16 rows of a group one contiguous run
  (256 bytes of codes, 16 of scales), so a warp's loads are whole runs and the staged
  tile is read from shared memory without bank conflicts (2.1x the GEMV bandwidth of
  row-major rows on the H200).
- ``mxfp4-k32``: the checkpoint's MXFP4 (the even k in the low nibble), streamed as is.
- ``mxfp4-frag`` (kernel-owned, `frag`): the ``mxfp4-rot`` bits laid out in mma.sync's
  register fragments, for the Gluon engine (`frag_gluon`).
- ``fp8-frag`` (kernel-owned, `frag8`): ``fp8-b128``'s bytes laid out so, its scales as
  they are, for the Gluon engine.

``mxfp4-k32`` converts to ``mxfp4-rot`` in place (a pass's temporary at a time), so
packing at load never doubles expert memory.
"""

from __future__ import annotations

import enum
import math

import torch

MX_GROUP = 32
FP8_BLOCK = 128
ROT_SCALE_MAX = 191  # the largest e8m0 code the mxfp4-rot decode scales exactly (2^64)


class StreamFormat(enum.IntEnum):
    """The device code of a streamed weight format (a constexpr of every build)."""

    BF16 = 0
    MXFP4 = 1  # mxfp4-rot
    FP8 = 2
    MXFP4_K32 = 3  # the checkpoint's layout, streamed as it is
    MXFP4_FRAG = 4  # mma.sync fragments, streamed by the Gluon engine (`frag`)
    FP8_FRAG = 5  # fp8-b128 in mma.sync fragments, streamed by the Gluon engine (`frag8`)


BF16 = StreamFormat.BF16
MXFP4_ROT = StreamFormat.MXFP4
FP8_B128 = StreamFormat.FP8
MXFP4_K32 = StreamFormat.MXFP4_K32
MXFP4_FRAG = StreamFormat.MXFP4_FRAG
FP8_FRAG = StreamFormat.FP8_FRAG
TILE_ROWS = 16  # rows of a tile-major block
# Fewest weight rows an MXFP4 tile should stream at real shapes: on the H200 tiles of 16
# or 32 rows ran at 0.2-0.6 TB/s against 1.5-2.5 in 64 or 128 (tools/stream_probe.py,
# docs/PERFORMANCE.md stop 29); the kernels' planners hold their MXFP4 tiles to it.
MX_FAST_ROWS = 64

# Output i of a word's decode: for each target bit of a lane (sign 15, magnitude 8, 7, 6),
# the right rotation of the word that brings its source bit there. Outputs 0-2 rotate the
# whole word once; output 3 takes bit 6 from one rotation and bits 7, 8, 15 from another
# (four translates of one mask cannot tile 32 bits).
TARGET_BITS = (6, 7, 8, 15)  # e2m1 code bits 0 (mantissa), 1, 2 (exponent), 3 (sign)
ROTATIONS = ((0, 0, 0, 0), (4, 4, 4, 4), (10, 10, 10, 10), (14, 6, 6, 6))


def _source_bits() -> torch.Tensor:
    """int64 [4 outputs, 2 lanes, 4 code bits]: the word bit that holds each code bit."""
    src = torch.empty(4, 2, 4, dtype=torch.int64)
    for i, rot in enumerate(ROTATIONS):
        for lane in range(2):
            for b, t in enumerate(TARGET_BITS):
                src[i, lane, b] = (t + 16 * lane + rot[b]) % 32
    if sorted(src.flatten().tolist()) != list(range(32)):
        raise AssertionError("mxfp4-rot: the rotations do not place 32 distinct bits")
    return src


SOURCE_BITS = _source_bits()


def _check_codes(values: torch.Tensor) -> None:
    if values.dtype != torch.uint8:
        raise ValueError(f"values: dtype {values.dtype}, expected torch.uint8")
    if (2 * values.shape[-1]) % MX_GROUP:
        raise ValueError(f"values: K = {2 * values.shape[-1]} is not a multiple of {MX_GROUP}")


def _codes(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return values & 0x0F, values >> 4


def _rot_of_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [R, K/2] mxfp4-rot bytes of k-ordered 4-bit codes [R, K]."""
    r = codes.shape[0]
    c = codes.reshape(r, -1, 4, 4, 2).to(torch.int64)  # group, i, word (e // 2), lane (e % 2)
    bits = (c[..., None] >> torch.arange(4, device=c.device)) & 1  # [..., code bit]
    src = SOURCE_BITS.to(c.device)[:, None, :, :]  # [i, 1 (word), lane, code bit]
    words = (bits << src).sum((2, 4, 5))  # over i, lane and code bit: [R, G, word]
    as_bytes = (words[..., None] >> (8 * torch.arange(4, device=c.device))) & 0xFF
    return as_bytes.to(torch.uint8).reshape(r, -1)


def _codes_of_rot(values: torch.Tensor) -> torch.Tensor:
    """k-ordered 4-bit codes [R, K] (uint8) of mxfp4-rot bytes [R, K/2]."""
    r = values.shape[0]
    b = values.reshape(r, -1, 4, 4).to(torch.int64)
    words = (b << (8 * torch.arange(4, device=b.device))).sum(-1)  # [R, G, word]
    src = SOURCE_BITS.to(b.device)  # [i, lane, code bit]
    bits = (words[:, :, None, :, None, None] >> src[:, None, :, :]) & 1  # [R, G, i, w, L, b]
    codes = (bits << torch.arange(4, device=b.device)).sum(-1)
    return codes.to(torch.uint8).reshape(r, -1)


def rotate_codes(
    values: torch.Tensor, out: torch.Tensor | None = None, rows_per_pass: int = 4096
) -> torch.Tensor:
    """``mxfp4-k32`` codes ``uint8[..., K/2]`` with each group's codes placed for the device
    decode (same shape, rows still row-major: `pack_mxfp4_rot` also tiles them).

    `out` may be `values` itself (in place): rows are converted `rows_per_pass` at a time,
    so the extra memory is one pass's temporary, not a second copy of the weight."""
    _check_codes(values)
    out = torch.empty_like(values) if out is None else out
    if out.shape != values.shape or out.dtype != torch.uint8:
        raise ValueError(
            f"out: {tuple(out.shape)} {out.dtype}, expected {tuple(values.shape)} torch.uint8"
        )
    flat, dst = values.reshape(-1, values.shape[-1]), out.view(-1, values.shape[-1])
    for r0 in range(0, flat.shape[0], rows_per_pass):
        lo, hi = _codes(flat[r0 : r0 + rows_per_pass])
        codes = torch.stack((lo, hi), -1).reshape(lo.shape[0], -1)  # k order
        dst[r0 : r0 + rows_per_pass] = _rot_of_codes(codes)
    return out


def unrotate_codes(values: torch.Tensor, rows_per_pass: int = 4096) -> torch.Tensor:
    """The inverse of `rotate_codes`, bit for bit; `rows_per_pass` rows at a time (a whole
    expert weight at once needs 36 GiB for one temporary: 32 bytes a code)."""
    _check_codes(values)
    flat = values.reshape(-1, values.shape[-1])
    out = torch.empty_like(flat)
    for r0 in range(0, flat.shape[0], rows_per_pass):
        codes = _codes_of_rot(flat[r0 : r0 + rows_per_pass])
        out[r0 : r0 + rows_per_pass] = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return out.reshape(values.shape)


def pack_mxfp4_rot(
    values: torch.Tensor, scales: torch.Tensor, inplace: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mxfp4-k32`` (codes ``uint8[..., N, K/2]``, e8m0 ``uint8[..., N, K/32]``) ->
    ``mxfp4-rot`` (same shapes): codes placed by `rotate_codes`, then codes and scales
    tile-major (`tile_rows`; N a multiple of TILE_ROWS). `inplace`: rewrite the tensors
    given (a pass's temporary, never a second copy of the weight)."""
    _check_rot(values, scales)
    _check_scale_codes("scales", scales)
    v = values if inplace else values.clone()
    sc = scales if inplace else scales.clone()
    return _rotate_and_tile(v, sc)


def _check_rot(values: torch.Tensor, scales: torch.Tensor) -> None:
    """The codes, the scales' shape and the row count `pack_mxfp4_rot` needs."""
    _check_codes(values)
    if scales.dtype != torch.uint8 or scales.shape != (*values.shape[:-1], values.shape[-1] // 16):
        raise ValueError(
            f"scales: {tuple(scales.shape)} {scales.dtype}, expected uint8 "
            f"{(*values.shape[:-1], values.shape[-1] // 16)} for codes {tuple(values.shape)}"
        )
    if values.shape[-2] % TILE_ROWS:
        raise ValueError(f"mxfp4-rot: {values.shape[-2]} rows are not a multiple of {TILE_ROWS}")


def _rotate_and_tile(v: torch.Tensor, sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked ``mxfp4-k32`` codes and scales rewritten in place as ``mxfp4-rot``."""
    rotate_codes(v, out=v)
    return tile_rows(v, 16, out=v), tile_rows(sc, 1, out=sc)


def unpack_mxfp4_rot(
    values: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mxfp4-rot`` -> ``mxfp4-k32`` (codes, scales): the inverse of `pack_mxfp4_rot`."""
    codes = unrotate_codes(tile_rows(values, 16, inverse=True))
    return codes, tile_rows(scales, 1, inverse=True)


def pack_experts_rot(experts: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Convert a weight bundle's ``mxfp4-k32`` tensors ({name: (codes, e8m0 scales)}) to
    ``mxfp4-rot`` in place, all or none: every scale and shape is checked first, so a
    refusal (ValueError naming the tensor) leaves nothing half converted."""
    for name, (values, scales) in experts.items():
        _check_scale_codes(f"weights.{name}_scale", scales)
        if values.shape[-2] % TILE_ROWS:
            raise ValueError(
                f"weights.{name}: {values.shape[-2]} rows a matrix; mxfp4-rot packs them "
                f"in blocks of {TILE_ROWS}"
            )
        _check_rot(values, scales)
    for values, scales in experts.values():
        _rotate_and_tile(values, scales)


def _check_scale_codes(name: str, scales: torch.Tensor) -> None:
    """Refuse e8m0 codes past ROT_SCALE_MAX: the device decode adds no clamp (one
    shift-add a scale), so a packed weight must never hold one."""
    top = int(scales.max()) if scales.numel() else 0
    if top > ROT_SCALE_MAX:
        raise ValueError(
            f"{name}: e8m0 code {top} (2^{top - 127}) is past the largest "
            f"scale the packed layout decodes exactly ({ROT_SCALE_MAX}: 2^64)"
        )


def tile_rows(
    t: torch.Tensor, unit: int, out: torch.Tensor | None = None, inverse: bool = False
) -> torch.Tensor:
    """A row-major ``[..., N, C]`` tensor of per-group runs of `unit` elements (mxfp4
    values: 16 bytes a group; e8m0 scales: 1) stored tile-major, same shape: each block of
    TILE_ROWS rows group by group, a group's TILE_ROWS runs contiguous. `inverse` undoes
    it. `out` may be `t` (in place: 64 blocks at a time through a temporary)."""
    n, c = t.shape[-2:]
    if n % TILE_ROWS or c % unit:
        raise ValueError(
            f"tile_rows: [{n}, {c}] must be rows in blocks of {TILE_ROWS}, runs of {unit}"
        )
    out = torch.empty_like(t) if out is None else out
    shape = (-1, TILE_ROWS, c // unit, unit)
    src, dst = t.reshape(shape), out.view(shape)
    for b0 in range(0, src.shape[0], 64):
        chunk = src[b0 : b0 + 64]
        if inverse:  # stored [block, group, row]: back to [block, row, group]
            moved = chunk.reshape(-1, c // unit, TILE_ROWS, unit).transpose(1, 2)
        else:
            moved = chunk.transpose(1, 2)
        dst[b0 : b0 + 64] = moved.contiguous().reshape(chunk.shape)
    return out


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


def quantize_mxfp4_k32(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``w[..., K]`` to ``mxfp4-k32``: (codes uint8[..., K/2], e8m0 uint8[..., K/32]).
    Scale = 2**(floor(log2(amax)) - 2) (OCP), codes rounded to the nearest e2m1 magnitude
    and saturated at 6: how the tests make checkpoint-format weights."""
    k = w.shape[-1]
    if k % MX_GROUP:
        raise ValueError(f"w: last dim {k} is not a multiple of {MX_GROUP}")
    blocks = w.float().reshape(*w.shape[:-1], k // MX_GROUP, MX_GROUP)
    amax = blocks.abs().amax(-1, keepdim=True)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0**-126))) - 2, -127.0)
    exp = exp.clamp(-127, 127)
    scaled = blocks / torch.exp2(exp)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=w.device)
    mag = scaled.abs().clamp(max=6.0)
    idx = (mag.unsqueeze(-1) - table).abs().argmin(-1)
    codes = (idx | torch.where(scaled < 0, 8, 0)).to(torch.uint8).reshape(*w.shape[:-1], k)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.contiguous(), (exp + 127).to(torch.uint8).squeeze(-1).contiguous()


E2M1_RMS = 2.93  # root mean square of the 16 e2m1 values: sets the e8m0 scale of a std


def random_mxfp4_k32(
    shape: tuple[int, ...], std: float, generator: torch.Generator, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``mxfp4-k32`` weights of ``shape`` ([..., N, K]) and about `std`, drawn in
    the stored format (every code byte a valid pair, e8m0 scales within one binade of
    std / E2M1_RMS): full-size benchmark layers in seconds, no fp32 weight in between."""
    *lead, k = shape
    if k % MX_GROUP:
        raise ValueError(f"shape: last dim {k} is not a multiple of {MX_GROUP}")
    g, dev = generator, device
    codes = torch.randint(0, 256, (*lead, k // 2), generator=g, device=dev, dtype=torch.uint8)
    e = 127 + round(math.log2(std / E2M1_RMS))
    scales = torch.randint(
        e - 1, e + 2, (*lead, k // MX_GROUP), generator=g, device=dev, dtype=torch.uint8
    )
    return codes, scales


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
    values: torch.Tensor, scales: torch.Tensor | None, fmt: StreamFormat
) -> torch.Tensor:
    """fp32 ``[..., N, K]`` of a weight stored in `fmt`'s streamed layout (scales None for
    bf16)."""
    if fmt == BF16:
        return values.float()
    if fmt == MXFP4_ROT:
        return unpack_mxfp4_k32(*unpack_mxfp4_rot(values, scales))
    if fmt == MXFP4_K32:
        return unpack_mxfp4_k32(values, scales)
    if fmt == MXFP4_FRAG:
        from .frag import unpack_mxfp4_frag

        return unpack_mxfp4_k32(*unpack_mxfp4_frag(values, scales))
    if fmt == FP8_FRAG:
        from .frag8 import unpack_fp8_frag

        return unpack_fp8_b128(unpack_fp8_frag(values), scales)
    return unpack_fp8_b128(values, scales)
